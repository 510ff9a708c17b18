//! The command line: the firmware's words (unknown words are ignored) and
//! the `virtio_mmio.device=` entries Linux would take its devices from.

/// How much RAM `touch=` dirties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    /// `touch=<MiB>`.
    Mib(u64),
    /// `touch=all`.
    All,
}

/// What `vsock=` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vsock {
    /// `vsock=echo:<port>`: listen and echo each connection.
    Echo(u32),
    /// `vsock=connect:<port>`: connect to the host's port, greet, shut down.
    Connect(u32),
}

/// One `virtio_mmio.device=<size>@<addr>:<irq>` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioDevice {
    /// Guest physical address of its registers.
    pub addr: u64,
    /// Size of its register window.
    pub size: u64,
    /// Its interrupt line (unused: the guest polls).
    pub irq: u32,
}

/// Most `virtio_mmio.device=` entries kept.
pub const MAX_DEVICES: usize = 32;

/// The parsed command line.
#[derive(Clone, Debug)]
pub struct Options {
    /// `touch=`.
    pub touch: Option<Touch>,
    /// `then=reset` (else idle).
    pub reset: bool,
    /// `balloon`.
    pub balloon: bool,
    /// `report=<MiB>`.
    pub report_mib: u64,
    /// `blk`.
    pub blk: bool,
    /// `blk-read=<MiB>`.
    pub blk_read_mib: Option<u64>,
    /// `blk-dev=<n>`: which virtio-blk (from 0) the blk words drive.
    pub blk_dev: usize,
    /// `blk-watch` (blk.rs).
    pub blk_watch: bool,
    /// `vsock=`.
    pub vsock: Option<Vsock>,
    /// `net=echo`.
    pub net_echo: bool,
    /// `mmds=<path>` (mmds.rs).
    pub mmds: Option<alloc::string::String>,
    /// `mmds-addr=<a.b.c.d>` (169.254.169.254 without it).
    pub mmds_addr: [u8; 4],
    /// `mmds-ip=<a.b.c.d>`: the guest's own (169.254.0.2 without it).
    pub mmds_ip: [u8; 4],
    /// `mmds-no-token`: `GET` without asking for a token first.
    pub mmds_no_token: bool,
    /// `mmds-watch`: after the first `GET`, again until the answer changes
    /// (mmds.rs).
    pub mmds_watch: bool,
    /// `cpuid=` (cpuid.rs).
    pub cpuid: Option<crate::cpuid::Leaves>,
    /// `tick=<ms>` (cpuid.rs).
    pub tick_ms: Option<u64>,
    /// `net-send=<N>x<bytes>`: N frames of that many bytes (after the
    /// virtio-net header) after the hello.
    pub net_send: Option<(u32, u32)>,
    /// `rng=<bytes>`: read that many bytes from the first virtio-rng.
    pub rng: Option<u64>,
    /// `rng-dump`: with `rng=`, print every byte read (rng.rs).
    pub rng_dump: bool,
    /// `vmem-hostile` (vmem.rs).
    pub vmem_hostile: bool,
    /// `vmem-touch-unplugged` (vmem.rs).
    pub vmem_touch_unplugged: bool,
    /// `mem-blk` (vmem.rs).
    pub mem_blk: bool,
    /// `touch-check` (main.rs).
    pub touch_check: bool,
    /// `verify-every=<ms>` (verify.rs): at least 1.
    pub verify_every_ms: Option<u64>,
    /// `bcheck-linux-reset` (balloon/check.rs).
    pub bcheck_linux_reset: bool,
    /// `balloon-no-tell` (balloon/check.rs).
    pub balloon_no_tell: bool,
    /// The devices, in command-line order.
    pub devices: [Option<MmioDevice>; MAX_DEVICES],
    /// Words that were understood but had a bad value.
    pub bad: Option<&'static str>,
}

/// Parses a number as Linux's `memparse` does: decimal, or hex after `0x`,
/// then an optional K, M or G.
pub fn memparse(s: &str) -> Option<u64> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n = number(digits)?;
    n.checked_mul(1u64 << shift)
}

fn number(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// Parses `a.b.c.d`.
pub fn ipv4(s: &str) -> Option<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut out {
        *o = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// Parses `<size>@<addr>:<irq>[:<id>]`.
pub fn mmio_device(value: &str) -> Option<MmioDevice> {
    let (size, rest) = value.split_once('@')?;
    let mut parts = rest.split(':');
    let addr = number(parts.next()?)?;
    let irq = number(parts.next()?)?;
    Some(MmioDevice {
        addr,
        size: memparse(size)?,
        irq: u32::try_from(irq).ok()?,
    })
}

impl Options {
    /// Parses the command line.
    pub fn parse(line: &str) -> Options {
        let mut o = Options {
            touch: None,
            reset: false,
            balloon: false,
            report_mib: 0,
            blk: false,
            blk_read_mib: None,
            blk_dev: 0,
            blk_watch: false,
            vsock: None,
            net_echo: false,
            mmds: None,
            mmds_addr: [169, 254, 169, 254],
            mmds_ip: [169, 254, 0, 2],
            mmds_no_token: false,
            mmds_watch: false,
            cpuid: None,
            tick_ms: None,
            net_send: None,
            rng: None,
            rng_dump: false,
            vmem_hostile: false,
            vmem_touch_unplugged: false,
            mem_blk: false,
            touch_check: false,
            verify_every_ms: None,
            bcheck_linux_reset: false,
            balloon_no_tell: false,
            devices: [None; MAX_DEVICES],
            bad: None,
        };
        let mut n = 0;
        for word in line.split_ascii_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, ""));
            match key {
                "touch" if value == "all" => o.touch = Some(Touch::All),
                "touch" => match value.parse() {
                    Ok(mib) => o.touch = Some(Touch::Mib(mib)),
                    Err(_) => o.bad = Some("touch="),
                },
                "then" => match value {
                    "reset" => o.reset = true,
                    "idle" => o.reset = false,
                    _ => o.bad = Some("then="),
                },
                "balloon" if value.is_empty() => o.balloon = true,
                "report" => match value.parse() {
                    Ok(mib) => o.report_mib = mib,
                    Err(_) => o.bad = Some("report="),
                },
                "blk" if value.is_empty() => o.blk = true,
                "blk-watch" if value.is_empty() => o.blk_watch = true,
                "blk-dev" => match value.parse() {
                    Ok(n) => o.blk_dev = n,
                    Err(_) => o.bad = Some("blk-dev="),
                },
                "vmem-hostile" if value.is_empty() => o.vmem_hostile = true,
                "vmem-touch-unplugged" if value.is_empty() => o.vmem_touch_unplugged = true,
                "mem-blk" if value.is_empty() => o.mem_blk = true,
                "touch-check" if value.is_empty() => o.touch_check = true,
                "bcheck-linux-reset" if value.is_empty() => o.bcheck_linux_reset = true,
                "balloon-no-tell" if value.is_empty() => o.balloon_no_tell = true,
                "blk-read" => match value.parse() {
                    Ok(mib) => o.blk_read_mib = Some(mib),
                    Err(_) => o.bad = Some("blk-read="),
                },
                "net" if value == "echo" => o.net_echo = true,
                "mmds" if value.starts_with('/') => o.mmds = Some(value.into()),
                "mmds" => o.bad = Some("mmds="),
                "mmds-no-token" if value.is_empty() => o.mmds_no_token = true,
                "mmds-watch" if value.is_empty() => o.mmds_watch = true,
                "mmds-addr" => match ipv4(value) {
                    Some(a) => o.mmds_addr = a,
                    None => o.bad = Some("mmds-addr="),
                },
                "mmds-ip" => match ipv4(value) {
                    Some(a) => o.mmds_ip = a,
                    None => o.bad = Some("mmds-ip="),
                },
                "net-send" => {
                    let nx = value.split_once('x');
                    o.net_send = nx.and_then(|(n, b)| Some((n.parse().ok()?, b.parse().ok()?)));
                    if o.net_send.is_none() {
                        o.bad = Some("net-send=");
                    }
                }
                "rng" => match memparse(value) {
                    Some(n) => o.rng = Some(n),
                    None => o.bad = Some("rng="),
                },
                "rng-dump" if value.is_empty() => o.rng_dump = true,
                "vsock" => {
                    let port = |p: &str| p.parse::<u32>().ok();
                    o.vsock = match value.split_once(':') {
                        Some(("echo", p)) => port(p).map(Vsock::Echo),
                        Some(("connect", p)) => port(p).map(Vsock::Connect),
                        _ => None,
                    };
                    if o.vsock.is_none() {
                        o.bad = Some("vsock=");
                    }
                }
                "cpuid" => {
                    o.cpuid = crate::cpuid::parse(value);
                    if o.cpuid.is_none() {
                        o.bad = Some("cpuid=");
                    }
                }
                "tick" => match value.parse() {
                    Ok(ms) => o.tick_ms = Some(ms),
                    Err(_) => o.bad = Some("tick="),
                },
                "verify-every" => match value.parse() {
                    Ok(ms) if ms > 0 => o.verify_every_ms = Some(ms),
                    _ => o.bad = Some("verify-every="),
                },
                "virtio_mmio.device" => {
                    if let Some(d) = mmio_device(value) {
                        if n < MAX_DEVICES {
                            o.devices[n] = Some(d);
                            n += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        o
    }
}
