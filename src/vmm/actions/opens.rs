//! Paths a client names (`PUT /boot-source`, `PUT /logger`, `PUT /metrics`)
//! are opened by the `files` thread ([`crate::files`]), never on the event
//! loop: the loop submits the opens and keeps the client's reply channel;
//! the thread's callback sends the result back and writes an eventfd; the
//! loop then applies the section and answers. A request whose open has not
//! finished by its deadline ([`OPEN_TIMEOUT`]) is answered with a 400 and
//! its late result is dropped (closing what was opened).

use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use crate::api::{ActionResult, VmmActionError, VmmData};
use crate::config::{
    BootSource, DriveConfig, DriveUpdate, LoggerConfig, MetricsConfig, NetConfig, VsockConfig,
};
use crate::devices::virtio::net::Tap;
use std::os::unix::net::UnixListener;

use crate::files::{FilesError, OpenRequest, OpenResult, OpenSpec, Opened, OPEN_TIMEOUT};
use crate::vmm::device_opens::{check_count_with, with_drive, with_net};
use crate::vstate::linux::image::{initrd_request, kernel_request};
use crate::vstate::linux::ImageFile;

use crate::vmm::lifecycle::builder::BootFiles;
use crate::vmm::Vmm;

/// A section waiting for its files.
#[derive(Debug)]
pub(in crate::vmm) enum Pending {
    /// `PUT /boot-source` with a kernel.
    BootSource(BootSource),
    /// `PUT /logger` with a log path.
    Logger(LoggerConfig),
    /// `PUT /metrics`.
    Metrics(MetricsConfig),
    /// `PUT /drives/{id}`.
    Drive(DriveConfig),
    /// `PATCH /drives/{id}` with a new file.
    DrivePatch(DriveUpdate),
    /// `PUT /network-interfaces/{id}` (its tap).
    Net(NetConfig),
    /// `PUT /vsock` (its socket).
    Vsock(VsockConfig),
    /// `PUT /serial` (its output file).
    Serial,
    /// `PUT /snapshot/load` (its state file, memory file, devices' files).
    Snapshot(crate::snapshot::LoadSnapshotParams),
    /// `PUT /snapshot/create`: its two files made under temporary names.
    SnapshotCreate {
        /// Full, not Diff.
        full: bool,
    },
    /// `PUT /snapshot/create`: its written files renamed.
    SnapshotCommit {
        /// Full, not Diff.
        full: bool,
        /// When the create job began (the latency metric).
        started: Instant,
    },
}

/// What the `files` thread gives back.
pub(in crate::vmm) enum Opening {
    /// Files.
    Files(OpenResult),
    /// A tap.
    Tap(Result<Tap, String>),
    /// A listening socket.
    Listener(Result<UnixListener, String>),
    /// A snapshot's files.
    Snapshot(Box<Result<crate::vmm::snapshot_opens::OpenedSnapshot, String>>),
    /// A create's files, made.
    SnapshotFiles(Box<Result<crate::vmm::snapshot_files::SnapshotFiles, String>>),
    /// A create's files, renamed.
    SnapshotCommitted(Result<(), String>),
}

/// An open under way.
#[derive(Debug)]
pub(in crate::vmm) struct PendingOpen {
    id: u64,
    deadline: Instant,
    section: Pending,
    reply: Sender<ActionResult>,
    first: OpenRequest,
}

/// What the `files` thread sends back.
pub(in crate::vmm) struct OpenDone {
    id: u64,
    result: Opening,
}

/// The opens of a boot source (none for the firmware).
pub fn boot_requests(b: &BootSource) -> Vec<OpenRequest> {
    let mut r = Vec::new();
    if let Some(k) = &b.kernel_image_path {
        r.push(kernel_request("boot-source.kernel_image_path", k));
    }
    if let Some(i) = &b.initrd_path {
        r.push(initrd_request("boot-source.initrd_path", i));
    }
    r
}

/// The open of an append-only output path.
pub fn output_request(what: &'static str, path: &Path, blocking: bool) -> OpenRequest {
    OpenRequest {
        what,
        path: path.to_path_buf(),
        spec: OpenSpec::Output { blocking },
    }
}

/// The opened files of a boot source, in [`boot_requests`] order.
pub fn boot_files(b: &BootSource, files: Vec<Opened>) -> Option<BootFiles> {
    let mut files = files.into_iter().map(|o| ImageFile {
        path: o.path,
        file: Arc::new(o.file),
    });
    b.kernel_image_path.as_ref()?;
    let kernel = files.next()?;
    let initrd = b.initrd_path.as_ref().and_then(|_| files.next());
    Some(BootFiles { kernel, initrd })
}

fn bad(e: impl std::fmt::Display) -> VmmActionError {
    VmmActionError::BadRequest(e.to_string())
}

impl Vmm {
    /// Opens `requests` on the `files` thread, then applies `section` and
    /// answers `reply` ([`Vmm::on_files_done`]).
    pub(in crate::vmm) fn open_then(
        &mut self,
        requests: Vec<OpenRequest>,
        section: Pending,
        reply: Sender<ActionResult>,
    ) {
        let Some(first) = requests.first().cloned() else {
            return self.apply_opened(section, Opening::Files(Ok(Vec::new())), reply);
        };
        let Some((id, tx, wake)) = self.begin_open(first, section, reply) else {
            return;
        };
        self.opts.files.submit(requests, move |result| {
            let _ = tx.send(OpenDone {
                id,
                result: Opening::Files(result),
            });
            let _ = wake.write(1);
        });
    }

    /// Runs `open` on the `files` thread (a tap, a socket), then applies
    /// `section` with its result and answers `reply`.
    pub(in crate::vmm) fn run_then(
        &mut self,
        what: &'static str,
        open: impl FnOnce() -> Opening + Send + 'static,
        section: Pending,
        reply: Sender<ActionResult>,
    ) {
        let first = OpenRequest {
            what,
            path: std::path::PathBuf::new(),
            spec: OpenSpec::Output { blocking: false },
        };
        let Some((id, tx, wake)) = self.begin_open(first, section, reply) else {
            return;
        };
        self.opts.files.run(open, move |result| {
            let result = result.unwrap_or(Opening::Files(Err(FilesError::Gone)));
            let _ = tx.send(OpenDone { id, result });
            let _ = wake.write(1);
        });
    }

    /// Records an open under way (`first` names it in a timeout's answer)
    /// and gives its id and what its callback answers through; `None`, with
    /// `reply` answered, when no eventfd could be made for it.
    fn begin_open(
        &mut self,
        first: OpenRequest,
        section: Pending,
        reply: Sender<ActionResult>,
    ) -> Option<(u64, Sender<OpenDone>, vmm_sys_util::eventfd::EventFd)> {
        let wake = match self.files_evt.try_clone() {
            Ok(w) => w,
            Err(e) => {
                let _ = reply.send(Err(VmmActionError::Internal(format!(
                    "cannot clone an eventfd: {e}"
                ))));
                return None;
            }
        };
        self.next_open_id += 1;
        let id = self.next_open_id;
        self.pending_opens.push(PendingOpen {
            id,
            deadline: Instant::now() + OPEN_TIMEOUT,
            section,
            reply,
            first,
        });
        Some((id, self.files_tx.clone(), wake))
    }

    /// The `files` thread finished some opens.
    pub(in crate::vmm) fn on_files_done(&mut self) {
        while let Ok(OpenDone { id, result }) = self.files_rx.try_recv() {
            let Some(at) = self.pending_opens.iter().position(|p| p.id == id) else {
                // Answered already (timed out); what it opened closes here.
                log::info!("files: a late open finished after its request was answered");
                continue;
            };
            let p = self.pending_opens.remove(at);
            if let Opening::Files(Err(e)) = result {
                crate::metrics::record_failure("PUT", section_path(&p.section));
                let _ = p.reply.send(Err(bad(e)));
                continue;
            }
            self.apply_opened(p.section, result, p.reply);
        }
    }

    /// Answers the opens past their deadline.
    pub(in crate::vmm) fn expire_opens(&mut self, now: Instant) {
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending_opens)
            .into_iter()
            .partition(|p| p.deadline <= now);
        self.pending_opens = kept;
        for p in expired {
            let e = FilesError::TimedOut {
                what: p.first.what,
                path: p.first.path.clone(),
                ms: OPEN_TIMEOUT.as_millis(),
            };
            log::warn!("{e}");
            crate::metrics::record_failure("PUT", section_path(&p.section));
            let _ = p.reply.send(Err(bad(e)));
        }
    }

    /// The earliest deadline of the opens under way.
    pub(in crate::vmm) fn next_open_deadline(&self) -> Option<Instant> {
        self.pending_opens.iter().map(|p| p.deadline).min()
    }

    /// Whether a snapshot create's files are being made or renamed.
    pub(in crate::vmm) fn snapshot_create_pending(&self) -> bool {
        self.pending_opens.iter().any(|p| {
            matches!(
                p.section,
                Pending::SnapshotCreate { .. } | Pending::SnapshotCommit { .. }
            )
        })
    }

    /// Whether any open is under way.
    pub(in crate::vmm) fn pending_opens_any(&self) -> bool {
        !self.pending_opens.is_empty()
    }

    /// Whether a boot source is still being opened (a start waits for none:
    /// it is refused meanwhile).
    pub(in crate::vmm) fn boot_source_opening(&self) -> bool {
        self.pending_opens
            .iter()
            .any(|p| matches!(p.section, Pending::BootSource(_)))
    }

    /// Applies a section whose open came back. The state is checked once,
    /// here: a start may have begun while the files thread worked, and the
    /// sections that only a microVM not started takes are refused then.
    fn apply_opened(&mut self, section: Pending, opened: Opening, reply: Sender<ActionResult>) {
        let path = section_path(&section);
        let state = self.state();
        let result = match (section, opened) {
            (s, _) if state != crate::vmm::VmState::NotStarted && before_start(&s).is_some() => {
                Err(bad(format!(
                    "{} is not allowed in state \"{}\"",
                    before_start(&s).unwrap_or_default(),
                    state.as_str()
                )))
            }
            (Pending::Snapshot(p), Opening::Snapshot(opened)) => match *opened {
                Ok(o) => return self.begin_restore(o, &p, reply),
                Err(e) => Err(bad(e)),
            },
            (Pending::SnapshotCreate { full }, Opening::SnapshotFiles(made)) => match *made {
                Ok(files) => return self.begin_create(full, files, reply),
                Err(e) => Err(bad(e)),
            },
            (Pending::SnapshotCommit { full, started }, Opening::SnapshotCommitted(r)) => {
                self.snapshot_committed(full, started, r)
            }
            (Pending::BootSource(b), Opening::Files(Ok(files))) => {
                self.boot_files = boot_files(&b, files);
                self.config.boot_source = b;
                Ok(VmmData::Empty)
            }
            (Pending::Logger(c), Opening::Files(Ok(files))) => {
                let file = files.into_iter().next().map(|o| o.file);
                crate::logger::configure(&c, file)
                    .map(|()| VmmData::Empty)
                    .map_err(bad)
            }
            (Pending::Metrics(c), Opening::Files(Ok(files))) => match files.into_iter().next() {
                Some(o) => crate::metrics::configure(&c, o.file)
                    .map(|()| VmmData::Empty)
                    .map_err(bad),
                None => Err(VmmActionError::Internal(
                    "the metrics path was not opened".into(),
                )),
            },
            (Pending::Serial, Opening::Files(Ok(files))) => match files.into_iter().next() {
                // Firecracker: the serial output goes to the file instead of
                // stdout.
                Some(o) => {
                    self.serial_file = Some(o.file);
                    self.serial_replaces_stdout = true;
                    Ok(VmmData::Empty)
                }
                None => Err(VmmActionError::Internal(
                    "the serial path was not opened".into(),
                )),
            },
            (Pending::Drive(d), Opening::Files(Ok(files))) => match files.into_iter().next() {
                Some(o) => match with_drive(&self.config.drives, d.clone()).and_then(|next| {
                    check_count_with(&self.config, &self.topology, |c| c.drives.clone_from(&next))?;
                    Ok(next)
                }) {
                    Ok(next) => {
                        self.config.drives = next;
                        self.resources
                            .drives
                            .insert(d.drive_id.clone(), Arc::new(o.file));
                        Ok(VmmData::Empty)
                    }
                    Err(e) => Err(bad(e)),
                },
                None => Err(VmmActionError::Internal("the drive was not opened".into())),
            },
            (Pending::DrivePatch(u), Opening::Files(Ok(files))) => {
                match (files.into_iter().next(), u.path_on_host.clone()) {
                    (Some(o), Some(p)) => self
                        .swap_drive(&u.drive_id, p, o.file)
                        .and_then(|_| self.patch_drive_limiter(&u.drive_id, &u.rate_limiter)),
                    _ => Err(VmmActionError::Internal("the drive was not opened".into())),
                }
            }
            (Pending::Net(n), Opening::Tap(Ok(tap))) => {
                match with_net(&self.config.network_interfaces, n.clone()).and_then(|next| {
                    check_count_with(&self.config, &self.topology, |c| {
                        c.network_interfaces.clone_from(&next)
                    })?;
                    Ok(next)
                }) {
                    Ok(next) => {
                        self.config.network_interfaces = next;
                        self.resources
                            .taps
                            .insert(n.iface_id.clone(), Arc::new(tap));
                        Ok(VmmData::Empty)
                    }
                    Err(e) => Err(bad(e)),
                }
            }
            (Pending::Vsock(v), Opening::Listener(Ok(l))) => {
                match check_count_with(&self.config, &self.topology, |c| c.vsock = Some(v.clone()))
                {
                    Ok(()) => {
                        self.config.vsock = Some(v);
                        self.resources.vsock = Some(Arc::new(l));
                        Ok(VmmData::Empty)
                    }
                    Err(e) => Err(bad(e)),
                }
            }
            (_, Opening::Tap(Err(e)) | Opening::Listener(Err(e))) => Err(bad(e)),
            (_, Opening::Files(Err(e))) => Err(bad(e)),
            _ => Err(VmmActionError::Internal(
                "an open came back in the wrong shape".into(),
            )),
        };
        if result.is_err() {
            crate::metrics::record_failure("PUT", path);
        }
        let _ = reply.send(result);
    }
}

/// What a section that only a microVM not started takes does, as a
/// refusal names it; `None` for the sections taken in any state.
fn before_start(s: &Pending) -> Option<&'static str> {
    match s {
        Pending::BootSource(_) => Some("changing the boot source"),
        Pending::Drive(_) => Some("adding a drive"),
        Pending::Net(_) => Some("adding a network interface"),
        Pending::Vsock(_) => Some("adding a vsock"),
        Pending::Serial => Some("configuring the serial output"),
        Pending::Snapshot(_) => Some("loading a snapshot"),
        Pending::SnapshotCreate { .. } | Pending::SnapshotCommit { .. } => None,
        Pending::Logger(_) | Pending::Metrics(_) | Pending::DrivePatch(_) => None,
    }
}

fn section_path(s: &Pending) -> &'static str {
    match s {
        Pending::BootSource(_) => "/boot-source",
        Pending::Logger(_) => "/logger",
        Pending::Metrics(_) => "/metrics",
        Pending::Drive(_) | Pending::DrivePatch(_) => "/drives",
        Pending::Net(_) => "/network-interfaces",
        Pending::Vsock(_) => "/vsock",
        Pending::Serial => "/serial",
        Pending::Snapshot(_) => "/snapshot/load",
        Pending::SnapshotCreate { .. } | Pending::SnapshotCommit { .. } => "/snapshot/create",
    }
}
