//! `teravm-bench`: how fast fully touched guest memory goes back to the
//! host, the teardowns a user can reach today and teravm's parallel reclaim
//! side by side.
//!
//! Methods (see `docs/bench/README.md`):
//!
//! - `munmap`: one thread unmaps the region (what a VMM's `Drop` does);
//! - `exit`: a child process holding the memory is killed with `SIGKILL`,
//!   timed from the kill until `waitpid` returns;
//! - `mrelease`: the same child killed and reaped from the parent with
//!   `process_mrelease(pidfd)`, timed until `waitpid` returns;
//! - `teravm-<w>`: teravm's reclaim executor with `w` workers per node;
//! - with `--vm`, end to end against a real microVM: `vm-kill`,
//!   `vm-mrelease`, `vm-teravm-<w>` (sync `Shutdown` through the API) and
//!   `vm-async-<w>` (async `Shutdown`, timed until the process is gone; its
//!   reply latency is reported apart);
//! - with `--live`, live reclaim of a running microVM whose guest reports
//!   `--size-gib` as free (free page reporting): `report-serial` (freed on
//!   the balloon thread, one `madvise` per range, as Firecracker does) and
//!   `report-teravm-<w>` (teravm's per-node discard pool);
//!   and live unplug of virtio-mem memory the guest plugged and touched:
//!   `unplug-serial` (freed on the device's thread before each answer, as
//!   Firecracker does), `unplug-teravm-<w>` and `unplug-all-teravm-<w>`
//!   (the guest sends UNPLUG_ALL) (`live_unplug`);
//! - with `--peers`, the VMMs users run today beside teravm, each timed
//!   from its stop until `waitpid`: preallocated (all guest RAM resident,
//!   the guest never run): `qemu-prealloc-quit` (QMP `quit`) and
//!   `qemu-prealloc-kill` (`SIGKILL`) against `vm-prealloc-teravm-<w>`
//!   (teravm populated, the firmware touching nothing, `SIGTERM`); with the
//!   test guest (`teravm-guest`, `touch=all`: it writes all its RAM
//!   itself): `qemu-guest-quit`, `qemu-guest-kill`,
//!   `firecracker-guest-ctrlaltdel` (`SendCtrlAltDel`: the guest resets,
//!   Firecracker exits), `firecracker-guest-kill` against
//!   `vm-guest-teravm-<w>` (API `Shutdown`) and `vm-guest-sigterm-<w>`;
//!   and `vm-teravm-<w>`. The table's `vs <peer>` is the peer's graceful
//!   stop of the same kind over a row's (Cloud Hypervisor is found and
//!   reported, not driven yet);
//! - with `--snapshot` (instead of the rows above), Firecracker's snapshot
//!   API on teravm and, with `--peers firecracker`, on the real Firecracker:
//!   `snapshot-create-firecracker` and `snapshot-create-teravm-<w>` (the
//!   paused test guest, `PUT /snapshot/create` Full until its answer),
//!   `snapshot-load-firecracker`, `snapshot-load-teravm-lazy` (a fresh
//!   process, `PUT /snapshot/load` until the guest's first line after
//!   resume) and `snapshot-load-teravm-eager-<w>` (`"memory_load":
//!   "Eager"`, until the answer); with `--sparse-gib`, the same for a large
//!   guest that touched `--sparse-touch-mib`.
//!
//! The benchmark is a tool, not part of the library it measures: this module
//! tree is private to the binary. Who uses whom (no circle):
//!
//! ```text
//! main    → cli
//! cli     → args, child, runner, snapshot
//! snapshot → args, firecracker, guest, held, model, peers, snapshot_svg,
//!           snapshot_text, snapshot_vmm, vm
//! snapshot_vmm → args, cputime, guest, model, resident, snapshot_text
//! snapshot_svg → snapshot_text, svg      snapshot_text → stats
//! runner  → args, child, firecracker, guest, held, live, live_unplug,
//!           model, mrelease, peers, peers_text, report, stats, svg, vm
//! live, live_unplug → args, cputime, model, vm
//! vm      → args, model, mrelease, resident
//! peers   → args, firecracker, guest, model, qemu
//! qemu    → guest, model, mrelease, qmp, resident
//! firecracker → guest, model, mrelease, resident
//! guest   → args, model, mrelease, resident, vm
//! child   → args, held, model, mrelease
//! held    → args, model          args → model          mrelease → model
//! report  → model, stats         svg  → model, report
//! peers_text → model, report, stats                    resident → model
//! model   → cputime
//! cputime, qmp, stats → nothing here
//! ```
//!
//! The HTTP client, the parsers of `/proc` and of teravm's output and the
//! guest_memfd count are the `teravm-client` crate's (`crates/teravm-client`),
//! which the integration tests use too.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod args;
mod child;
mod cli;
mod cputime;
mod firecracker;
mod guest;
mod held;
mod live;
mod live_unplug;
mod model;
mod mrelease;
mod peers;
mod peers_text;
mod qemu;
mod qmp;
mod report;
mod resident;
mod runner;
mod snapshot;
mod snapshot_svg;
mod snapshot_text;
mod snapshot_vmm;
mod stats;
mod svg;
mod vm;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main_with(std::env::args_os())
}
