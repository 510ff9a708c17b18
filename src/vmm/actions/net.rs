//! `PATCH /network-interfaces/{id}`: new rate limiters for an interface of
//! a started microVM (before the start the VMM refuses it, as Firecracker
//! does: [`crate::api::VmmAction::only_once_started`]). They change the
//! device's limiters (checked whole first, so a refused update changes
//! nothing) and the configuration, which `GET /vm/config` shows.

use crate::api::{ActionResult, VmmActionError, VmmData};
use crate::config::net::NetUpdate;
use crate::vmm::lifecycle::Phase;
use crate::vmm::Vmm;

impl Vmm {
    pub(in crate::vmm) fn patch_net(&mut self, u: NetUpdate) -> ActionResult {
        let bad = |m: String| Err(VmmActionError::BadRequest(m));
        let Some(at) = self
            .config
            .network_interfaces
            .iter()
            .position(|n| n.iface_id == u.iface_id)
        else {
            return bad(format!(
                "network-interfaces: no interface {:?} (PUT it first)",
                u.iface_id
            ));
        };
        if let Phase::Running(m) = &self.phase {
            let dev = m.nets().iter().find(|n| {
                n.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iface_id()
                    == u.iface_id
            });
            if let Some(dev) = dev {
                let mut net = dev
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Err(e) =
                    net.update_limiters(u.rx_rate_limiter.as_ref(), u.tx_rate_limiter.as_ref())
                {
                    return bad(format!("network-interfaces.{}: {e}", u.iface_id));
                }
            }
        }
        let next = u.applied_to(&self.config.network_interfaces[at]);
        self.config.network_interfaces[at] = next;
        Ok(VmmData::Empty)
    }
}
