//! A transport's state in a snapshot ([`TransportState`]): what
//! [`MmioTransport::save_state`] reads and [`MmioTransport::restore_state`]
//! puts back, in Firecracker's shape (`MmioTransportState` and
//! `VirtioDeviceState` with its `QueueState`s).
//!
//! A restore comes from a file that may be hostile: every number is
//! checked against the device the transport fronts (its queue count and
//! maximum sizes, the features it offers, guest memory for the rings), and
//! a state that does not fit is a [`MmioError::BadState`] naming what,
//! never a panic. A device that ran (`DRIVER_OK`) is started through the
//! same path as a driver's `DRIVER_OK` (the transport's `activate_with`),
//! its queues at their saved positions.

use serde::{Deserialize, Serialize};
use virtio_queue::Queue;

use super::mmio::{lock, MmioError, MmioTransport, QueueRegs};
use crate::devices::virtio::device::{status, QueuePosition, VIRTIO_F_VERSION_1};
use crate::devices::virtio::memory::DeviceMemory;

/// `VIRTIO_RING_F_EVENT_IDX` (bit 29).
const EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// One queue: its registers as the driver wrote them and, for a device
/// that ran, where it stood.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// The device's maximum (checked against the device on restore).
    pub max_size: u16,
    /// The size the driver chose.
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// The descriptor table's guest address.
    pub desc_table: u64,
    /// The available (driver) ring's guest address.
    pub avail_ring: u64,
    /// The used (device) ring's guest address.
    pub used_ring: u64,
    /// The next available entry the device takes.
    pub next_avail: u16,
    /// The next used entry the device writes.
    pub next_used: u16,
    /// `VIRTIO_RING_F_EVENT_IDX` in use.
    pub event_idx: bool,
}

/// A virtio-mmio transport's registers and its device's queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// The device status.
    pub status: u32,
    /// `DeviceFeaturesSel`.
    pub device_features_sel: u32,
    /// `DriverFeaturesSel`.
    pub driver_features_sel: u32,
    /// The features the driver accepted.
    pub acked_features: u64,
    /// `QueueSel`.
    pub queue_sel: u32,
    /// `InterruptStatus`.
    pub interrupt_status: u32,
    /// `ConfigGeneration` as the device answered it (the device's own state
    /// puts it back where the device keeps one).
    pub config_generation: u32,
    /// One per queue of the device.
    pub queues: Vec<QueueState>,
}

impl TransportState {
    /// Whether the device ran: `DRIVER_OK` and not stopped since
    /// (`DEVICE_NEEDS_RESET`).
    pub fn device_ran(&self) -> bool {
        self.status & status::DRIVER_OK != 0 && self.status & status::DEVICE_NEEDS_RESET == 0
    }
}

/// Every status bit a driver or the device may set.
const KNOWN_STATUS: u32 = status::ACKNOWLEDGE
    | status::DRIVER
    | status::FEATURES_OK
    | status::DRIVER_OK
    | status::DEVICE_NEEDS_RESET
    | status::FAILED;

fn bad(why: String) -> MmioError {
    MmioError::BadState(why)
}

impl<M: DeviceMemory> MmioTransport<M> {
    /// The transport's state and, if its device runs, where its queues
    /// stand. Call with the device held still (no device pass runs,
    /// [`crate::devices::virtio::Gate`]) and the vCPUs paused.
    pub fn save_state(&self) -> TransportState {
        let device = lock(&self.device);
        let positions = if self.status & status::DRIVER_OK != 0 {
            device.queue_positions()
        } else {
            None
        };
        let config_generation = device.config_generation();
        drop(device);
        let queues = self
            .queues
            .iter()
            .zip(&self.max_sizes)
            .enumerate()
            .map(|(i, (r, &max_size))| {
                let p = positions
                    .as_ref()
                    .and_then(|p| p.get(i).copied())
                    .unwrap_or_default();
                QueueState {
                    max_size,
                    size: r.size,
                    ready: r.ready,
                    desc_table: r.desc,
                    avail_ring: r.driver,
                    used_ring: r.device,
                    next_avail: p.next_avail,
                    next_used: p.next_used,
                    event_idx: p.event_idx,
                }
            })
            .collect();
        TransportState {
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            acked_features: self.driver_features,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt.status(),
            config_generation,
            queues,
        }
    }

    /// Checks `s` against this transport's device (see the module's
    /// rules).
    fn check_state(&self, s: &TransportState) -> Result<(), MmioError> {
        if self.status != 0 {
            return Err(bad(format!(
                "the transport is in use already (status {:#x})",
                self.status
            )));
        }
        if s.status & !KNOWN_STATUS != 0 {
            return Err(bad(format!("unknown status bits in {:#x}", s.status)));
        }
        let needs = [
            (status::DRIVER, status::ACKNOWLEDGE),
            (status::FEATURES_OK, status::DRIVER),
            (status::DRIVER_OK, status::FEATURES_OK),
        ];
        if let Some((bit, _)) = needs
            .iter()
            .find(|&&(bit, before)| s.status & bit != 0 && s.status & before == 0)
        {
            return Err(bad(format!(
                "status {:#x} has bit {bit:#x} without the step before it",
                s.status
            )));
        }
        if s.acked_features & !self.device_features != 0 {
            return Err(bad(format!(
                "acked features {:#x} beyond those offered ({:#x})",
                s.acked_features, self.device_features
            )));
        }
        if s.status & status::FEATURES_OK != 0 && s.acked_features & VIRTIO_F_VERSION_1 == 0 {
            return Err(bad("FEATURES_OK without VIRTIO_F_VERSION_1".into()));
        }
        if s.queues.len() != self.max_sizes.len() {
            return Err(bad(format!(
                "{} queues saved, the device has {}",
                s.queues.len(),
                self.max_sizes.len()
            )));
        }
        for (i, (q, &max)) in s.queues.iter().zip(&self.max_sizes).enumerate() {
            if q.max_size != max {
                return Err(bad(format!(
                    "queue {i}: maximum size {} saved, the device's is {max}",
                    q.max_size
                )));
            }
            if q.size == 0 || q.size > max || !q.size.is_power_of_two() {
                return Err(bad(format!("queue {i}: size {} (maximum {max})", q.size)));
            }
        }
        Ok(())
    }

    /// Puts the transport back as `s` says, on a transport that no driver
    /// has touched since it was made, and, if the device ran, starts it
    /// with its queues where they stood (the path of `DRIVER_OK`), then
    /// signals the guest for each `InterruptStatus` bit saved. Guest memory
    /// must hold the snapshot's contents already. On an error the transport
    /// is reset (no device runs) and the error says what did not fit.
    pub fn restore_state(&mut self, s: &TransportState) -> Result<(), MmioError> {
        self.check_state(s)?;
        for (regs, q) in self.queues.iter_mut().zip(&s.queues) {
            *regs = QueueRegs {
                size: q.size,
                size_ok: true,
                ready: q.ready,
                stopped: false,
                desc: q.desc_table,
                driver: q.avail_ring,
                device: q.used_ring,
            };
        }
        self.device_features_sel = s.device_features_sel;
        self.driver_features_sel = s.driver_features_sel;
        self.driver_features = s.acked_features;
        self.driver_features_beyond = false;
        self.queue_sel = s.queue_sel;
        if s.device_ran() {
            if let Err(e) = self.start_saved(s) {
                self.write(super::mmio::regs::STATUS, &0u32.to_le_bytes())
                    .ok();
                return Err(e);
            }
        }
        self.status = s.status;
        self.interrupt
            .restore(s.interrupt_status)
            .map_err(MmioError::Interrupt)
    }

    /// Starts the device with the saved queues at their positions.
    fn start_saved(&mut self, s: &TransportState) -> Result<(), MmioError> {
        let mut queues: Vec<Queue> = self.queues_from_regs()?;
        let event_idx = s.acked_features & EVENT_IDX != 0;
        for (q, saved) in queues.iter_mut().zip(&s.queues) {
            if saved.ready {
                QueuePosition {
                    next_avail: saved.next_avail,
                    next_used: saved.next_used,
                    event_idx: saved.event_idx && event_idx,
                }
                .apply(q);
            }
        }
        self.activate_with(queues)
    }
}
