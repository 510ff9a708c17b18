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
use crate::config::{BootSource, LoggerConfig, MetricsConfig};
use crate::files::{FilesError, OpenRequest, OpenResult, OpenSpec, Opened, OPEN_TIMEOUT};
use crate::vstate::linux::image::{initrd_request, kernel_request};
use crate::vstate::linux::ImageFile;

use super::Vmm;

/// The kernel and initrd of the boot source in force, open.
#[derive(Debug, Clone)]
pub struct BootFiles {
    /// The kernel.
    pub kernel: ImageFile,
    /// The initrd, if any.
    pub initrd: Option<ImageFile>,
}

/// A section waiting for its files.
#[derive(Debug)]
pub(super) enum Pending {
    /// `PUT /boot-source` with a kernel.
    BootSource(BootSource),
    /// `PUT /logger` with a log path.
    Logger(LoggerConfig),
    /// `PUT /metrics`.
    Metrics(MetricsConfig),
}

/// An open under way.
#[derive(Debug)]
pub(super) struct PendingOpen {
    id: u64,
    deadline: Instant,
    section: Pending,
    reply: Sender<ActionResult>,
    first: OpenRequest,
}

/// What the `files` thread sends back.
pub(super) struct OpenDone {
    id: u64,
    result: OpenResult,
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
    /// The drives to attach: each configured drive with the file opened
    /// when it was put, the root drive first (as Firecracker orders them).
    pub(super) fn drive_specs(&self) -> Vec<crate::vmm::devices::DriveSpec> {
        Vec::new()
    }

    /// The network interfaces to attach, each with the tap opened when it
    /// was put.
    pub(super) fn net_specs(&self) -> Vec<crate::vmm::devices::NetSpec> {
        Vec::new()
    }

    /// The vsock to attach, with the socket bound when it was put.
    pub(super) fn vsock_spec(&self) -> Option<crate::vmm::devices::VsockSpec> {
        None
    }

    /// Opens `requests` on the `files` thread, then applies `section` and
    /// answers `reply` ([`Vmm::on_files_done`]).
    pub(super) fn open_then(
        &mut self,
        requests: Vec<OpenRequest>,
        section: Pending,
        reply: Sender<ActionResult>,
    ) {
        let Some(first) = requests.first().cloned() else {
            return self.apply_opened(section, Vec::new(), reply);
        };
        self.next_open_id += 1;
        let id = self.next_open_id;
        let tx = self.files_tx.clone();
        let wake = self.files_evt.try_clone();
        let wake = match wake {
            Ok(w) => w,
            Err(e) => {
                let _ = reply.send(Err(VmmActionError::Internal(format!(
                    "cannot clone an eventfd: {e}"
                ))));
                return;
            }
        };
        self.pending_opens.push(PendingOpen {
            id,
            deadline: Instant::now() + OPEN_TIMEOUT,
            section,
            reply,
            first,
        });
        self.opts.files.submit(requests, move |result| {
            let _ = tx.send(OpenDone { id, result });
            let _ = wake.write(1);
        });
    }

    /// The `files` thread finished some opens.
    pub(super) fn on_files_done(&mut self) {
        while let Ok(OpenDone { id, result }) = self.files_rx.try_recv() {
            let Some(at) = self.pending_opens.iter().position(|p| p.id == id) else {
                // Answered already (timed out); what it opened closes here.
                log::info!("files: a late open finished after its request was answered");
                continue;
            };
            let p = self.pending_opens.remove(at);
            match result {
                Ok(files) => self.apply_opened(p.section, files, p.reply),
                Err(e) => {
                    crate::metrics::record_failure("PUT", section_path(&p.section));
                    let _ = p.reply.send(Err(bad(e)));
                }
            }
        }
    }

    /// Answers the opens past their deadline.
    pub(super) fn expire_opens(&mut self, now: Instant) {
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
    pub(super) fn next_open_deadline(&self) -> Option<Instant> {
        self.pending_opens.iter().map(|p| p.deadline).min()
    }

    /// Whether a boot source is still being opened (a start waits for none:
    /// it is refused meanwhile).
    pub(super) fn boot_source_opening(&self) -> bool {
        self.pending_opens
            .iter()
            .any(|p| matches!(p.section, Pending::BootSource(_)))
    }

    fn apply_opened(&mut self, section: Pending, files: Vec<Opened>, reply: Sender<ActionResult>) {
        let path = section_path(&section);
        let result = match section {
            Pending::BootSource(b) => {
                if self.state() != super::VmState::NotStarted {
                    Err(bad(format!(
                        "changing the boot source is not allowed in state \"{}\"",
                        self.state().as_str()
                    )))
                } else {
                    self.boot_files = boot_files(&b, files);
                    self.config.boot_source = b;
                    Ok(VmmData::Empty)
                }
            }
            Pending::Logger(c) => {
                let file = files.into_iter().next().map(|o| o.file);
                crate::logger::configure(&c, file)
                    .map(|()| VmmData::Empty)
                    .map_err(bad)
            }
            Pending::Metrics(c) => match files.into_iter().next() {
                Some(o) => crate::metrics::configure(&c, o.file)
                    .map(|()| VmmData::Empty)
                    .map_err(bad),
                None => Err(VmmActionError::Internal(
                    "the metrics path was not opened".into(),
                )),
            },
        };
        if result.is_err() {
            crate::metrics::record_failure("PUT", path);
        }
        let _ = reply.send(result);
    }
}

fn section_path(s: &Pending) -> &'static str {
    match s {
        Pending::BootSource(_) => "/boot-source",
        Pending::Logger(_) => "/logger",
        Pending::Metrics(_) => "/metrics",
    }
}
