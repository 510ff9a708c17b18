//! Fault injection for the reliability tests: `TERAVM_FAULT_INJECT` holds a
//! comma-separated list of faults to inject into this process, read once.
//!
//! - `reclaim-worker-panic`: the first reclaim worker to take a chunk panics
//!   (the executor must still free everything and report the failure);
//! - `vcpu-panic`: vCPU 0 panics at its first port I/O exit (the VMM must
//!   shut the microVM down as crashed and still free its memory).
//!
//! Nothing is injected unless the variable names the fault.

use std::sync::OnceLock;

/// The environment variable that names faults to inject.
pub const FAULT_INJECT_ENV: &str = "TERAVM_FAULT_INJECT";

/// Whether the fault `name` was asked for.
pub fn injected(name: &str) -> bool {
    static FAULTS: OnceLock<Vec<String>> = OnceLock::new();
    FAULTS
        .get_or_init(|| {
            let list = std::env::var(FAULT_INJECT_ENV).unwrap_or_default();
            let faults: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            if !faults.is_empty() {
                log::warn!("fault injection on: {faults:?}");
            }
            faults
        })
        .iter()
        .any(|f| f == name)
}
