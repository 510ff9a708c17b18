//! The VMM's MMDS actions (`GET`/`PUT`/`PATCH /mmds`, `PUT /mmds/config`)
//! and the MMDS detour of the network interfaces the configuration names,
//! given to their devices at start.

use crate::api::{ActionResult, VmmAction, VmmActionError, VmmData};
use crate::devices::virtio::net::mmds::MmdsLink;
use crate::mmds::{lock, StoreError};
use crate::vmm::devices::NetSpec;
use crate::vmm::{VmState, Vmm};

fn store_error(e: StoreError) -> VmmActionError {
    match e {
        StoreError::LimitExceeded => {
            VmmActionError::TooLarge(format!("MMDS limit exceeded error: {e}"))
        }
        other => VmmActionError::BadRequest(format!("MMDS error: {other}")),
    }
}

impl Vmm {
    /// One MMDS action. The contents change in any state (the guest sees
    /// the new ones at once); the configuration only before start, as
    /// Firecracker.
    pub(in crate::vmm) fn mmds_action(&mut self, action: VmmAction) -> ActionResult {
        let mmds = &self.opts.mmds;
        match action {
            VmmAction::GetMmds => {
                let v = lock(mmds).store().value().clone();
                // Firecracker shows an empty store as `{}`.
                Ok(VmmData::Json(if v.is_null() {
                    serde_json::json!({})
                } else {
                    v
                }))
            }
            VmmAction::PutMmds(v) => {
                lock(mmds).store_mut().put(v).map_err(store_error)?;
                Ok(VmmData::Empty)
            }
            VmmAction::PatchMmds(v) => {
                lock(mmds).store_mut().patch(&v).map_err(store_error)?;
                Ok(VmmData::Empty)
            }
            VmmAction::PutMmdsConfig(c) => {
                let state = self.state();
                if state != VmState::NotStarted {
                    return Err(VmmActionError::BadRequest(format!(
                        "configuring the MMDS (PUT /mmds/config) is not allowed in state \"{}\"",
                        state.as_str()
                    )));
                }
                let ids: Vec<&str> = self
                    .config
                    .network_interfaces
                    .iter()
                    .map(|n| n.iface_id.as_str())
                    .collect();
                c.check_ifaces(&ids)
                    .map_err(|e| VmmActionError::BadRequest(format!("MMDS config error: {e}")))?;
                lock(mmds).configure(&c);
                self.config.mmds_config = Some(c);
                Ok(VmmData::Empty)
            }
            other => Err(VmmActionError::Internal(format!(
                "{other:?} is not an MMDS action"
            ))),
        }
    }

    /// Firecracker's `mmds` metrics group (its names where they mean the
    /// same; `tx_dropped` and `idle_aborts` are teravm's), summed over the
    /// interfaces with the MMDS; `None` when none has it.
    pub(in crate::vmm) fn mmds_metrics(
        &self,
        nets: &[std::sync::Arc<
            std::sync::Mutex<crate::devices::virtio::net::Net<crate::memory::GuestView>>,
        >],
    ) -> Option<serde_json::Value> {
        let mut sum = crate::devices::virtio::net::mmds::MmdsCounts::default();
        let mut any = false;
        for n in nets {
            let n = n.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(c) = n.mmds_counts() {
                any = true;
                sum.rx_frames += c.rx_frames;
                sum.rx_unusual += c.rx_unusual;
                sum.tx_frames += c.tx_frames;
                sum.tx_dropped += c.tx_dropped;
                sum.requests += c.requests;
                sum.idle_aborts += c.idle_aborts;
            }
        }
        if !any {
            return None;
        }
        let tokens = lock(&self.opts.mmds).counters;
        Some(serde_json::json!({
            "rx_accepted": sum.rx_frames,
            "rx_accepted_unusual": sum.rx_unusual,
            "rx_count": sum.requests,
            "tx_frames": sum.tx_frames,
            "tx_dropped": sum.tx_dropped,
            "idle_aborts": sum.idle_aborts,
            "rx_no_token": tokens.no_token,
            "rx_invalid_token": tokens.invalid_token,
        }))
    }

    /// `specs` with the MMDS link on the interfaces the MMDS configuration
    /// names (and the configuration's version applied to the store).
    pub(in crate::vmm) fn with_mmds(&self, mut specs: Vec<NetSpec>) -> Vec<NetSpec> {
        let Some(c) = &self.config.mmds_config else {
            return specs;
        };
        lock(&self.opts.mmds).configure(c);
        for s in &mut specs {
            if c.network_interfaces.contains(&s.opts.iface_id) {
                s.mmds = Some(MmdsLink {
                    mmds: self.opts.mmds.clone(),
                    ipv4: c.ipv4(),
                });
            }
        }
        specs
    }
}
