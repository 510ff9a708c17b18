//! `PUT /snapshot/load` on the event loop: the `files` thread opens and
//! checks the snapshot ([`crate::vmm::snapshot_opens`]); when it comes
//! back, the process takes the snapshot's configuration and devices'
//! files, and the `start` job restores it ([`super::restore`]). A load
//! that fails puts the configuration back as it was (a fresh process), so
//! it may be retried.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use super::restore::RestoreSpec;
use crate::api::{ActionResult, VmmActionError};
use crate::snapshot::LoadSnapshotParams;
use crate::vmm::actions::opens::{Opening, Pending};
use crate::vmm::snapshot_opens::{open_snapshot, OpenedSnapshot};
use crate::vmm::Vmm;

impl Vmm {
    /// Sends the load's opens to the `files` thread (the caller checked the
    /// process may load).
    pub(in crate::vmm) fn begin_load(
        &mut self,
        params: LoadSnapshotParams,
        reply: Sender<ActionResult>,
    ) {
        let workers = self.config.reclaim.workers_per_node;
        let p = params.clone();
        let open = move || Opening::Snapshot(Box::new(open_snapshot(&p, workers)));
        self.run_then("snapshot_path", open, Pending::Snapshot(params), reply);
    }

    /// The snapshot is open: take its configuration and files, then
    /// restore it on the `start` job.
    pub(in crate::vmm) fn begin_restore(
        &mut self,
        opened: OpenedSnapshot,
        params: &LoadSnapshotParams,
        reply: Sender<ActionResult>,
    ) {
        if let Some(why) = self.load_refusal() {
            // Something was configured while the files were opened.
            let _ = reply.send(Err(VmmActionError::BadRequest(why)));
            return;
        }
        let OpenedSnapshot {
            state,
            memory,
            resources,
        } = opened;
        let mut config = state.config.clone();
        config.machine_config.track_dirty_pages = params.track_dirty_pages;
        // The loading process's own logger, metrics and reclaim settings.
        config.logger = self.config.logger.clone();
        config.metrics = self.config.metrics.clone();
        config.reclaim = self.config.reclaim.clone();
        let before = std::mem::replace(&mut self.config, config);
        let resources = std::mem::replace(&mut self.resources, resources);
        self.before_load = Some((Box::new(before), resources, std::time::Instant::now()));
        self.boot_files = None;
        log::info!(
            "loading the snapshot {} ({} vCPUs, {} MiB)",
            params.snapshot_path.display(),
            self.config.machine_config.vcpu_count,
            self.config.machine_config.mem_size_mib
        );
        self.start_with(
            Some(reply),
            Some(RestoreSpec {
                state: Arc::new(state),
                memory,
                resume: params.resume_vm,
            }),
        );
    }
}
