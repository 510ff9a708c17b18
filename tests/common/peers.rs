//! The test guest (`target/<profile>/teravm-guest`, issue 25) on the other
//! VMMs: QEMU `-M microvm` and Firecracker, each a child process whose
//! serial console (its stdout) is a [`Vmm`]'s lines, built from the same
//! device list ([`Launch`]): drives, a tap in a network namespace
//! ([`Netns`]), a vsock (Firecracker's Unix-socket host side; QEMU's
//! vhost-vsock, AF_VSOCK on the host), a balloon. A [`Peer`] holds the VMM's
//! control channel (QMP, or Firecracker's API socket) to set the balloon's
//! target, read what the VMM says of it, and stop the VMM as its users do.
//!
//! The command lines, as built here (the guest's words in `-append` /
//! `boot_args`; both VMMs add the `virtio_mmio.device=` words, QEMU's
//! microvm only with `acpi=off`):
//!
//! ```text
//! qemu-system-x86_64 -M microvm,x-option-roms=off,rtc=off,acpi=off
//!   -enable-kvm -cpu host,arch-capabilities=off -m <MiB> -smp 1 -nodefaults -no-user-config
//!   -nographic -serial stdio -no-reboot -device i8042
//!   -global virtio-mmio.force-legacy=false
//!   -kernel <guest> -append <args>
//!   -qmp unix:<dir>/qmp.sock,server=on,wait=off
//!   [-drive id=d<i>,file=<path>,format=raw,if=none[,readonly=on]
//!    -device virtio-blk-device,drive=d<i>,serial=<id>]
//!   [-netdev tap,id=n0,ifname=tap0,script=no,downscript=no
//!    -device virtio-net-device,netdev=n0,mac=<mac>]
//!   [-device vhost-vsock-device,guest-cid=<cid>]
//!   [-device virtio-balloon-device,id=bal0[,free-page-reporting=on]]
//! firecracker --api-sock <dir>/fc.sock --config-file <dir>/fc.json
//!   --log-path <dir>/fc.log
//! ```
//!
//! A network device runs the VMM under `ip netns exec <ns>`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::netns::Netns;
use super::{client, guest, Vmm};

mod sockets;
// Not every test binary uses every part.
#[allow(unused_imports)]
pub use sockets::*;

/// How long any one wait here lasts.
pub const T: Duration = Duration::from_secs(60);

/// Which VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// QEMU 7.2, `-M microvm`.
    Qemu,
    /// Firecracker (the shared build).
    Firecracker,
}

/// One of Firecracker's example uffd handlers (`bin`, beside its binary)
/// serving the memory file `mem` on `socket`; returns once the socket is
/// there (it binds it first thing).
pub fn uffd_handler(bin: &Path, socket: &Path, mem: &Path) -> Child {
    let child = Command::new(bin)
        .arg(socket)
        .arg(mem)
        .stdin(Stdio::null())
        .spawn()
        .expect("start the uffd handler");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "no socket from {}",
            bin.display()
        );
        std::thread::yield_now();
    }
    child
}

/// `qemu-system-x86_64` on PATH, or None having said why (a failure in
/// CI, where it is installed: [`super::skip`]).
pub fn qemu(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("qemu-system-x86_64"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        super::skip(
            test,
            "no qemu-system-x86_64 on PATH (apt-get install qemu-system-x86)",
        );
    }
    found
}

/// Whether this host has vhost-vsock, which QEMU's vsock device needs.
/// Where it has not, a QEMU vsock test cannot run anywhere on this host
/// (CI's included): the caller prints why and passes, not a CI failure.
pub fn vhost_vsock() -> Result<(), String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/vhost-vsock")
    {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "/dev/vhost-vsock: {e} (QEMU's vsock is vhost only)"
        )),
    }
}

/// One drive.
#[derive(Clone, Debug)]
pub struct Drive {
    pub path: PathBuf,
    pub read_only: bool,
    /// QEMU's `serial=` (what GET_ID answers there) and Firecracker's
    /// `drive_id` (which GET_ID does not answer: see [`firecracker_blk_id`]).
    pub id: String,
    /// Firecracker's `rate_limiter` body for it (Firecracker only).
    pub rate_limiter: Option<Value>,
}

/// What a Firecracker drive answers to GET_ID: not its `drive_id` but
/// `format!("{st_dev}{st_rdev}{st_ino}")` of the file (as kvmtool does it),
/// cut to the 20 bytes of the request (src/vmm/src/devices/virtio/block/
/// virtio/device.rs, `build_device_id`).
pub fn firecracker_blk_id(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    let mut id = format!("{}{}{}", m.dev(), m.rdev(), m.ino());
    id.truncate(20);
    id
}

/// A microVM to start: the VMM, the guest's command line, its devices.
pub struct Launch {
    kind: Kind,
    bin: PathBuf,
    dir: PathBuf,
    args: String,
    mem_mib: u64,
    drives: Vec<Drive>,
    tap: Option<(String, String)>,
    vsock: Option<(u32, Option<PathBuf>)>,
    balloon: Option<bool>,
    mmds: Option<(Value, Option<PathBuf>)>,
    machine: Value,
    entropy: Option<Value>,
    sections: Vec<(&'static str, Value)>,
}

impl Launch {
    /// The guest on `bin` (QEMU or Firecracker, as `kind` says), with `args`
    /// on its command line, files in `dir`, 256 MiB.
    pub fn new(kind: Kind, bin: &Path, dir: &Path, args: &str) -> Launch {
        Launch {
            kind,
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            args: args.to_string(),
            mem_mib: 256,
            drives: Vec::new(),
            tap: None,
            vsock: None,
            balloon: None,
            mmds: None,
            machine: json!({}),
            entropy: None,
            sections: Vec::new(),
        }
    }

    /// Firecracker `machine-config` fields beside `mem_size_mib` (e.g.
    /// `{"vcpu_count": 2, "smt": true, "cpu_template": "T2"}`); QEMU takes
    /// none of them.
    pub fn machine(mut self, fields: Value) -> Launch {
        assert_eq!(
            self.kind,
            Kind::Firecracker,
            "machine-config is Firecracker's"
        );
        self.machine = fields;
        self
    }

    /// Another section of Firecracker's config file (e.g. `cpu-config`).
    pub fn section(mut self, name: &'static str, value: Value) -> Launch {
        assert_eq!(self.kind, Kind::Firecracker, "{name} is Firecracker's");
        self.sections.push((name, value));
        self
    }

    /// Firecracker's entropy device with `rate_limiter` (`null`: none).
    pub fn entropy(mut self, rate_limiter: Value) -> Launch {
        self.entropy = Some(rate_limiter);
        self
    }

    /// Guest RAM in MiB.
    pub fn mem_mib(mut self, mib: u64) -> Launch {
        self.mem_mib = mib;
        self
    }

    /// A virtio-blk on `path`.
    pub fn drive(mut self, path: &Path, read_only: bool, id: &str) -> Launch {
        self.drives.push(Drive {
            path: path.to_path_buf(),
            read_only,
            id: id.to_string(),
            rate_limiter: None,
        });
        self
    }

    /// Firecracker's `rate_limiter` (its JSON body) on the last drive.
    pub fn drive_rate_limiter(mut self, limiter: Value) -> Launch {
        assert_eq!(
            self.kind,
            Kind::Firecracker,
            "a rate limiter is Firecracker's"
        );
        self.drives.last_mut().expect("a drive first").rate_limiter = Some(limiter);
        self
    }

    /// A virtio-net on `tap0` of `ns`, with `mac`; the VMM runs in `ns`.
    pub fn tap(mut self, ns: &Netns, mac: &str) -> Launch {
        self.tap = Some((ns.name.clone(), mac.to_string()));
        self
    }

    /// A virtio-vsock with `cid`. Firecracker's host side is the Unix
    /// socket `uds` (connect, `CONNECT <port>\n`; the guest's connections
    /// to port P go to `<uds>_P`); QEMU's is the host's AF_VSOCK (`uds`
    /// unused).
    pub fn vsock(mut self, cid: u32, uds: &Path) -> Launch {
        self.vsock = Some((cid, Some(uds.to_path_buf())));
        self
    }

    /// A virtio-balloon, starting at 0 pages, statistics on (Firecracker
    /// polls them every second; QEMU is asked to with
    /// `guest-stats-polling-interval`), free page reporting where
    /// `reporting`.
    pub fn balloon(mut self, reporting: bool) -> Launch {
        self.balloon = Some(reporting);
        self
    }

    /// Firecracker's `mmds-config` section, and `--metadata` (the MMDS's
    /// first contents) where given.
    pub fn mmds(mut self, config: Value, metadata: Option<&Path>) -> Launch {
        self.mmds = Some((config, metadata.map(Path::to_path_buf)));
        self
    }

    /// QEMU's arguments.
    pub fn qemu_args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            "-M",
            "microvm,x-option-roms=off,rtc=off,acpi=off",
            "-enable-kvm",
            "-cpu",
            // arch-capabilities off: QEMU 7.2 sets MSR 0x10a, which KVM on
            // an AMD PVM host refuses (an assertion kills QEMU at start).
            "host,arch-capabilities=off",
            "-smp",
            "1",
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-serial",
            "stdio",
            "-no-reboot",
            // An i8042, which microvm lacks: the guest's reset line, and
            // where QMP `send-key` puts a Ctrl-Alt-Del. Without one, port
            // 0x64 reads 0xff, which the guest takes for a pending key.
            "-device",
            "i8042",
            // QEMU 7.2's virtio-mmio is legacy (Version 1, no VERSION_1)
            // unless told: modern, as Firecracker's and teravm's are.
            "-global",
            "virtio-mmio.force-legacy=false",
        ]
        .map(String::from)
        .into();
        let guest = guest();
        a.extend(["-m".into(), self.mem_mib.to_string()]);
        a.extend(["-kernel".into(), guest.display().to_string()]);
        a.extend(["-append".into(), self.args.clone()]);
        let qmp = self.dir.join("qmp.sock");
        a.extend([
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", qmp.display()),
        ]);
        for (i, d) in self.drives.iter().enumerate() {
            let ro = if d.read_only { ",readonly=on" } else { "" };
            a.extend([
                "-drive".into(),
                format!("id=d{i},file={},format=raw,if=none{ro}", d.path.display()),
                "-device".into(),
                format!("virtio-blk-device,drive=d{i},serial={}", d.id),
            ]);
        }
        if let Some((_, mac)) = &self.tap {
            a.extend([
                "-netdev".into(),
                "tap,id=n0,ifname=tap0,script=no,downscript=no".into(),
                "-device".into(),
                format!("virtio-net-device,netdev=n0,mac={mac}"),
            ]);
        }
        if let Some((cid, _)) = &self.vsock {
            a.extend([
                "-device".into(),
                format!("vhost-vsock-device,guest-cid={cid}"),
            ]);
        }
        if let Some(reporting) = self.balloon {
            let r = if reporting {
                ",free-page-reporting=on"
            } else {
                ""
            };
            a.extend([
                "-device".into(),
                format!("virtio-balloon-device,id=bal0{r}"),
            ]);
        }
        a
    }

    /// Firecracker's config file.
    pub fn firecracker_config(&self) -> Value {
        let mut c = json!({
            "boot-source": {
                "kernel_image_path": guest(),
                "boot_args": self.args,
            },
            "machine-config": {"vcpu_count": 1, "mem_size_mib": self.mem_mib},
        });
        if let Value::Object(fields) = &self.machine {
            for (k, v) in fields {
                c["machine-config"][k] = v.clone();
            }
        }
        c["drives"] = self
            .drives
            .iter()
            .map(|d| {
                json!({"drive_id": d.id, "path_on_host": d.path,
                       "is_root_device": false, "is_read_only": d.read_only,
                       "rate_limiter": d.rate_limiter})
            })
            .collect();
        if let Some((_, mac)) = &self.tap {
            c["network-interfaces"] =
                json!([{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": mac}]);
        }
        if let Some((cid, uds)) = &self.vsock {
            c["vsock"] = json!({"guest_cid": cid, "uds_path": uds});
        }
        if let Some((mmds, _)) = &self.mmds {
            c["mmds-config"] = mmds.clone();
        }
        if let Some(l) = &self.entropy {
            c["entropy"] = json!({ "rate_limiter": l });
        }
        if let Some(reporting) = self.balloon {
            c["balloon"] = json!({"amount_mib": 0, "deflate_on_oom": false,
                                  "stats_polling_interval_s": 1,
                                  "free_page_reporting": reporting});
        }
        for (name, value) in &self.sections {
            c[*name] = value.clone();
        }
        c
    }

    /// Starts the VMM; returns once its control channel answers.
    pub fn start(self) -> Peer {
        let (program, args, control) = match self.kind {
            Kind::Qemu => (
                self.bin.clone(),
                self.qemu_args(),
                self.dir.join("qmp.sock"),
            ),
            Kind::Firecracker => {
                let config = self.dir.join("fc.json");
                std::fs::write(&config, self.firecracker_config().to_string()).unwrap();
                let sock = self.dir.join("fc.sock");
                // Firecracker's log goes to stdout unless told: whole lines
                // written between the bytes of a console line, which then
                // matches nothing. The file must exist.
                let log = self.dir.join("fc.log");
                std::fs::write(&log, "").unwrap();
                let mut args = vec![
                    "--api-sock".to_string(),
                    sock.display().to_string(),
                    "--config-file".to_string(),
                    config.display().to_string(),
                    "--log-path".to_string(),
                    log.display().to_string(),
                ];
                if let Some((_, Some(metadata))) = &self.mmds {
                    args.extend(["--metadata".into(), metadata.display().to_string()]);
                }
                (self.bin.clone(), args, sock)
            }
        };
        let mut cmd = match &self.tap {
            None => Command::new(&program),
            Some((ns, _)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&program);
                c
            }
        };
        cmd.args(&args);
        let command = format!("{program:?} {}", args.join(" "));
        let mut vmm = Vmm::spawn_command(cmd);
        let control = match self.kind {
            Kind::Qemu => Control::Qmp(Qmp::connect(&control, &mut vmm, &command)),
            Kind::Firecracker => {
                wait_for_socket(&control, &mut vmm, &command);
                Control::Api(control)
            }
        };
        Peer {
            vmm,
            kind: self.kind,
            mem_mib: self.mem_mib,
            control,
            command,
        }
    }
}

/// Waits until `sock` accepts a connection, or panics with the VMM's
/// stderr if it exits first.
fn wait_for_socket(sock: &Path, vmm: &mut Vmm, command: &str) -> UnixStream {
    let deadline = Instant::now() + T;
    loop {
        match UnixStream::connect(sock) {
            Ok(s) => return s,
            Err(e) => {
                if let Ok(Some(status)) = vmm.child.try_wait() {
                    let (out, err) = vmm.drain(Duration::from_secs(2));
                    panic!(
                        "{command} exited ({status}) before {} answered: {e}\n\
                         stdout {out:?}\nstderr {err:?}",
                        sock.display()
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "{command}: no {} within {T:?}: {e}",
                    sock.display()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A minimal QMP client: greeting, `qmp_capabilities`, commands; events
/// skipped.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    fn connect(sock: &Path, vmm: &mut Vmm, command: &str) -> Qmp {
        let writer = wait_for_socket(sock, vmm, command);
        writer.set_read_timeout(Some(T)).unwrap();
        let mut qmp = Qmp {
            reader: BufReader::new(writer.try_clone().unwrap()),
            writer,
        };
        let greeting = qmp.read().expect("the QMP greeting");
        assert!(greeting.get("QMP").is_some(), "{greeting}");
        qmp.execute("qmp_capabilities", json!({}));
        qmp
    }

    fn read(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("QMP {line:?}: {e}")))
            }
        }
    }

    /// Runs `command` and returns its `return`; panics on an error reply.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Value {
        self.try_execute(command, arguments)
            .unwrap_or_else(|e| panic!("QMP {command}: {e}"))
    }

    /// Runs `command`: `Ok(return)` or `Err(the error or why none came)`.
    pub fn try_execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let msg = json!({"execute": command, "arguments": arguments});
        writeln!(self.writer, "{msg}").map_err(|e| e.to_string())?;
        loop {
            let m = self.read().ok_or("QEMU closed QMP")?;
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                return Err(e.to_string());
            }
        }
    }
}

enum Control {
    Qmp(Qmp),
    Api(PathBuf),
}

/// What the VMM says of its balloon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BalloonView {
    /// The pages the guest says it holds (the config's `actual`).
    pub actual_pages: u64,
    /// The guest's last statistics, in bytes, where it sent them: total
    /// (VIRTIO_BALLOON_S_MEMTOT), free (MEMFREE), available (AVAIL).
    pub total: Option<u64>,
    pub free: Option<u64>,
    pub available: Option<u64>,
}

/// A running QEMU or Firecracker with the test guest.
pub struct Peer {
    /// Its serial console (stdout) and stderr.
    pub vmm: Vmm,
    pub kind: Kind,
    mem_mib: u64,
    control: Control,
    /// How it was started (for messages).
    pub command: String,
}

impl Peer {
    /// Waits for a console line containing `needle`.
    pub fn wait_line(&mut self, needle: &str) -> String {
        self.vmm.wait_line(needle, T)
    }

    /// Firecracker's API socket (panics on QEMU).
    pub fn api(&self) -> &Path {
        match &self.control {
            Control::Api(p) => p,
            Control::Qmp(_) => panic!("QEMU has no Firecracker API"),
        }
    }

    /// Sets the balloon's target to `pages` 4 KiB pages (QMP `balloon`
    /// takes the guest's size left, in bytes; Firecracker `PATCH /balloon`
    /// takes MiB, so `pages` must be a multiple of 256 there).
    pub fn set_balloon_pages(&mut self, pages: u64) {
        let mem = self.mem_mib << 20;
        match &mut self.control {
            Control::Qmp(q) => {
                q.execute("balloon", json!({"value": mem - pages * 4096}));
            }
            Control::Api(sock) => {
                assert_eq!(pages % 256, 0, "Firecracker's target is in MiB");
                let body = json!({"amount_mib": pages / 256}).to_string();
                let (status, reply) =
                    client::request(sock, "PATCH", "/balloon", Some(&body)).unwrap();
                assert_eq!(status, 204, "PATCH /balloon {body}: {reply}");
            }
        }
    }

    /// The balloon as the VMM reports it (QMP `query-balloon` and the
    /// `guest-stats` property; Firecracker `GET /balloon/statistics`).
    pub fn balloon(&mut self) -> BalloonView {
        let mem = self.mem_mib << 20;
        match &mut self.control {
            Control::Qmp(q) => {
                let actual = q.execute("query-balloon", json!({}))["actual"]
                    .as_u64()
                    .expect("query-balloon's actual");
                let stats = q.execute(
                    "qom-get",
                    json!({"path": "/machine/peripheral/bal0", "property": "guest-stats"}),
                );
                // QEMU says -1 for a statistic the guest never sent.
                let stat = |k: &str| stats["stats"][k].as_u64();
                BalloonView {
                    actual_pages: (mem - actual) / 4096,
                    total: stat("stat-total-memory"),
                    free: stat("stat-free-memory"),
                    available: stat("stat-available-memory"),
                }
            }
            Control::Api(sock) => {
                let (status, body) =
                    client::request(sock, "GET", "/balloon/statistics", None).unwrap();
                assert_eq!(status, 200, "GET /balloon/statistics: {body}");
                let v: Value = serde_json::from_str(&body).unwrap();
                BalloonView {
                    actual_pages: v["actual_pages"].as_u64().expect("actual_pages"),
                    total: v["total_memory"].as_u64(),
                    free: v["free_memory"].as_u64(),
                    available: v["available_memory"].as_u64(),
                }
            }
        }
    }

    /// Asks QEMU to poll the guest's statistics every `secs` (QOM
    /// `guest-stats-polling-interval`; Firecracker's is in its config).
    pub fn poll_stats(&mut self, secs: u64) {
        if let Control::Qmp(q) = &mut self.control {
            q.execute(
                "qom-set",
                json!({"path": "/machine/peripheral/bal0",
                       "property": "guest-stats-polling-interval", "value": secs}),
            );
        }
    }

    /// Polls [`Peer::balloon`] until `done` holds; panics after [`T`].
    pub fn balloon_until(
        &mut self,
        what: &str,
        done: impl Fn(&BalloonView) -> bool,
    ) -> BalloonView {
        let deadline = Instant::now() + T;
        loop {
            let v = self.balloon();
            if done(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{:?}: never {what}; last {v:?}",
                self.kind
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the VMM to exit (the guest reset itself): (code, console
    /// lines, stderr).
    pub fn wait(self) -> (i32, Vec<String>, String) {
        self.vmm.wait(T)
    }

    /// Stops the VMM through the guest: a Ctrl-Alt-Del (QMP `send-key
    /// ctrl-alt-delete`; Firecracker `SendCtrlAltDel`), which the guest's
    /// serve loop takes and answers with an i8042 reset, on which both
    /// exit (QEMU for `-no-reboot`). So a stop also shows the guest was
    /// still serving. Returns as [`Peer::wait`].
    pub fn stop(mut self) -> (i32, Vec<String>, String) {
        match &mut self.control {
            Control::Qmp(q) => {
                let key = |k: &str| json!({"type": "qcode", "data": k});
                q.execute(
                    "send-key",
                    json!({"keys": [key("ctrl"), key("alt"), key("delete")]}),
                );
            }
            Control::Api(sock) => {
                let body = r#"{"action_type": "SendCtrlAltDel"}"#;
                let (status, reply) = client::request(sock, "PUT", "/actions", Some(body)).unwrap();
                assert_eq!(status, 204, "SendCtrlAltDel: {reply}");
            }
        }
        self.wait()
    }
}
