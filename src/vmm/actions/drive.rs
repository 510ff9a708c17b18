//! `PATCH /drives/{drive_id}`: a new backing file (opened on the `files`
//! thread first, [`super::opens`]) or new rate limits. Before the start
//! they change the configuration; while the microVM runs, the device too
//! (its thread takes them between two requests) and the guest is told a new
//! capacity.

use std::sync::{Arc, MutexGuard, PoisonError};

use super::bad;
use crate::api::{ActionResult, VmmActionError, VmmData};
use crate::config::DriveConfig;
use crate::devices::virtio::block::Block;
use crate::memory::GuestView;
use crate::vmm::lifecycle::Phase;
use crate::vmm::Vmm;

/// A drive's configuration, and its device (locked) while the microVM runs.
type DriveAndDevice<'a> = (
    &'a mut DriveConfig,
    Option<MutexGuard<'a, Block<GuestView>>>,
);

/// Drive `drive_id`'s configuration, and its device while the microVM runs.
fn drive_and_device<'a>(
    drives: &'a mut [DriveConfig],
    phase: &'a Phase,
    drive_id: &str,
) -> Result<DriveAndDevice<'a>, VmmActionError> {
    let Some(d) = drives.iter_mut().find(|d| d.drive_id == drive_id) else {
        return Err(bad(format!("drives: no drive {drive_id:?} (PUT it first)")));
    };
    let Phase::Running(m) = phase else {
        return Ok((d, None));
    };
    let Some(b) = m.blocks().iter().find(|b| b.drive_id == drive_id) else {
        return Err(bad(format!("drives: {drive_id:?} is not attached")));
    };
    Ok((
        d,
        Some(b.device.lock().unwrap_or_else(PoisonError::into_inner)),
    ))
}

impl Vmm {
    /// `PATCH /drives/{id}` with a new file: before start the drive is
    /// simply reopened; while it runs, the device swaps it in between two
    /// requests and tells the guest the new capacity.
    pub(super) fn swap_drive(
        &mut self,
        drive_id: &str,
        path: std::path::PathBuf,
        file: std::fs::File,
    ) -> ActionResult {
        let file = Arc::new(file);
        let (d, device) = drive_and_device(&mut self.config.drives, &self.phase, drive_id)?;
        if let Some(device) = device {
            device
                .update_file(file.try_clone().map_err(bad)?)
                .map_err(bad)?;
        }
        d.path_on_host = path;
        self.resources.drives.insert(drive_id.to_string(), file);
        Ok(VmmData::Empty)
    }

    /// `PATCH /drives/{id}` with a `rate_limiter`: before start the
    /// configuration's limiter is patched; while running, the device's as
    /// well (its thread applies it between two requests).
    pub(super) fn patch_drive_limiter(
        &mut self,
        drive_id: &str,
        update: &Option<crate::rate_limiter::RateLimiterConfig>,
    ) -> ActionResult {
        let Some(update) = update else {
            return Ok(VmmData::Empty);
        };
        let (d, device) = drive_and_device(&mut self.config.drives, &self.phase, drive_id)?;
        if let Some(device) = device {
            device.update_rate_limiter(update).map_err(bad)?;
        }
        let next = d.rate_limiter.unwrap_or_default().patched(update);
        d.rate_limiter = next.limits().then_some(next);
        Ok(VmmData::Empty)
    }
}
