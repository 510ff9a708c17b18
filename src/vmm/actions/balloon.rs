//! The balloon's actions: `PUT /balloon` before the start (checked
//! against the memory size and the device count), `PATCH /balloon` (a new
//! target: in the configuration before the start, on the device while it
//! runs), `GET /balloon`, and its statistics (`GET`/`PATCH
//! /balloon/statistics`: the guest's counters beside teravm's own discard
//! counters).

use super::{bad, lock, misrouted, no_balloon, refused, to_json};
use crate::api::{shapes, ActionResult, VmmAction, VmmActionError, VmmData};
use crate::config::check_balloon_target;
use crate::vmm::device_opens::check_count_with;
use crate::vmm::lifecycle::Phase;
use crate::vmm::{VmState, Vmm};

impl Vmm {
    /// One balloon action (the others are not routed here).
    pub(super) fn balloon_action(&mut self, action: VmmAction, state: VmState) -> ActionResult {
        let not_started = state == VmState::NotStarted;
        match action {
            VmmAction::PutBalloon(b) if not_started => {
                check_balloon_target(b.amount_mib, self.config.machine_config.mem_size_mib)
                    .map_err(bad)?;
                check_count_with(&self.config, &self.topology, |c| c.balloon = Some(b))
                    .map_err(bad)?;
                self.config.balloon = Some(b);
                Ok(VmmData::Empty)
            }
            VmmAction::PutBalloon(_) => refused("configuring the balloon (PUT /balloon)", state),
            VmmAction::PatchBalloon(u) => self.patch_balloon(u.amount_mib),
            VmmAction::GetBalloon => match (&self.phase, &self.config.balloon) {
                (Phase::Running(m), _) if m.balloon().is_some() => {
                    let b = m.balloon().map(|b| lock(&b.device).options());
                    to_json(&b.as_ref().map(shapes::BalloonShape::from))
                }
                (_, Some(b)) => to_json(&shapes::BalloonShape::from(b)),
                (_, None) => Err(no_balloon()),
            },
            VmmAction::GetBalloonStatistics => self.balloon_statistics(),
            VmmAction::PatchBalloonStatistics(u) => {
                let Some(config) = self.config.balloon.as_mut() else {
                    return Err(no_balloon());
                };
                match &self.phase {
                    Phase::Running(m) => {
                        if let Some(b) = m.balloon() {
                            lock(&b.device)
                                .set_stats_polling_interval(u.stats_polling_interval_s)
                                .map_err(bad)?;
                        }
                    }
                    Phase::Configuring => {}
                    _ => return refused("changing the balloon statistics", state),
                }
                config.stats_polling_interval_s = u.stats_polling_interval_s;
                Ok(VmmData::Empty)
            }
            other => Err(misrouted(&other, "balloon_action")),
        }
    }

    /// `PATCH /balloon`: a new target, before start in the configuration,
    /// while running on the device (the guest is told by a configuration
    /// interrupt).
    fn patch_balloon(&mut self, amount_mib: u32) -> ActionResult {
        check_balloon_target(amount_mib, self.config.machine_config.mem_size_mib).map_err(bad)?;
        let state = self.state();
        let Some(config) = self.config.balloon.as_mut() else {
            return Err(no_balloon());
        };
        match &self.phase {
            Phase::Running(m) => {
                let Some(b) = m.balloon() else {
                    return Err(no_balloon());
                };
                lock(&b.device)
                    .set_target(u64::from(amount_mib))
                    .map_err(bad)?;
            }
            Phase::Configuring => {}
            _ => return refused("changing the balloon target", state),
        }
        config.amount_mib = amount_mib;
        Ok(VmmData::Empty)
    }

    /// `GET /balloon/statistics`: the target and actual size, the guest's
    /// counters (when its statistics queue is on) and teravm's own discard
    /// counters.
    fn balloon_statistics(&self) -> ActionResult {
        let Phase::Running(m) = &self.phase else {
            return match self.config.balloon {
                Some(_) => Err(VmmActionError::BadRequest(format!(
                    "the balloon's statistics exist while the microVM runs; it is \"{}\"",
                    self.state().as_str()
                ))),
                None => Err(no_balloon()),
            };
        };
        let Some(b) = m.balloon() else {
            return Err(no_balloon());
        };
        let teravm = b
            .discard
            .snapshot()
            .map(|s| shapes::BalloonTeravmCounters {
                discarded_bytes: s.bytes_discarded,
                discarded_bytes_per_node: s.per_node.iter().map(|n| (n.node, n.bytes)).collect(),
                ranges: s.ranges,
                refused_bytes: s.refused_bytes,
                failures: s.failures,
                discard_bytes_per_s: s.rate_bytes_per_sec as u64,
            })
            .unwrap_or_default();
        let device = lock(&b.device);
        let sizes = shapes::BalloonSizes {
            target_pages: device.target_pages(),
            actual_pages: device.actual_pages(),
            target_mib: device.target_mib(),
            actual_mib: device.actual_mib(),
        };
        let none = crate::devices::virtio::balloon::BalloonStats::default();
        let guest = device.latest_stats().unwrap_or(&none);
        to_json(&shapes::BalloonStatisticsShape::new(sizes, guest, &teravm))
    }
}
