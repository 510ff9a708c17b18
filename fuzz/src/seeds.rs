//! The committed seeds (fuzz/corpus/<target>/) replayed as tests of the fuzz
//! crate: `cargo test --release` in fuzz/, which `fuzz/run.sh` runs before it
//! fuzzes. Each seed must reach as far as it means to, so a harness or a
//! device change that makes a seed stop short fails here.

#![cfg(test)]

use std::collections::HashMap;
use std::path::Path;

/// Runs every committed seed of `target` through `f`: what each gave, by
/// file name.
fn replay<T>(target: &str, f: fn(&[u8]) -> T) -> HashMap<String, T> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut out = HashMap::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        out.insert(name, f(&std::fs::read(&p).unwrap()));
    }
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

fn seed<'a, T: std::fmt::Debug>(got: &'a HashMap<String, T>, name: &str) -> &'a T {
    got.get(name)
        .unwrap_or_else(|| panic!("no seed {name} in {got:?}"))
}

#[test]
fn virtio_mmio_seeds_reach_their_step() {
    let got = replay("virtio_mmio", crate::balloon::virtio_mmio);
    for (name, driver_ok) in [
        ("init_full", true),
        ("init_plain", true),
        ("reset_and_again", true),
        ("feature_not_offered", false),
        ("no_version_1", false),
        ("bad_queue_size", false),
        ("rings_in_hole", false),
    ] {
        assert_eq!(*seed(&got, name), driver_ok, "{name}");
    }
}

#[test]
fn balloon_queues_seeds_reach_the_sink() {
    let got = replay("balloon_queues", crate::balloon::balloon_queues);
    // inflate_deflate: the inflate's ranges (a deflate no longer calls the
    // sink).
    for (name, ranges) in [
        ("inflate_deflate", 1),
        ("report", 2),
        ("hostile_pfns", 1),
        ("hostile_reports", 1),
        ("huge_pages", 1),
    ] {
        assert!(*seed(&got, name) >= ranges, "{name}: {got:?}");
    }
}

#[test]
fn block_queues_seeds_answer_what_they_send() {
    let got = replay("block_queues", crate::block::block_queues);
    let rw = seed(&got, "read_write");
    assert!(
        rw.read_count.get() >= 1 && rw.write_count.get() >= 1,
        "{rw:?}"
    );
    let ro = seed(&got, "read_only_write");
    assert!(
        ro.invalid_reqs_count.get() >= 1 && ro.write_count == 0,
        "{ro:?}"
    );
    assert!(seed(&got, "bad_status").dropped_reqs_count.get() >= 1);
    assert!(seed(&got, "loop").dropped_reqs_count.get() >= 1);
    assert!(seed(&got, "swap_file").update_count.get() >= 1);
}

#[test]
fn net_queues_seeds_send_and_receive() {
    let got = replay("net_queues", crate::net::net_queues);
    // (frames sent, received)
    for (name, frames) in [
        ("tx_frame", (1, 0)),
        ("rx_frame", (0, 1)),
        ("rx_merged", (0, 1)),
        ("rx_too_big_unmerged", (0, 1)),
        ("hostile_tx", (0, 0)),
        ("hostile_rx", (0, 1)),
        ("flood_no_buffers", (0, 1)),
        ("reset_mid_rx", (0, 1)),
        // An rx chain through an indirect table is refused (no device
        // offers INDIRECT_DESC): answered with nothing, no frame in it.
        ("indirect_rx", (0, 0)),
        ("offload_not_acked", (0, 1)),
        ("tx_write_fails", (1, 0)),
    ] {
        assert_eq!(*seed(&got, name), frames, "{name}");
    }
    seed(&got, "loop");
    seed(&got, "ring_index_garbage");
}

#[test]
fn vsock_queues_seeds_reach_the_guest() {
    let got = replay("vsock_queues", crate::vsock::vsock_queues);
    // Packets the guest received.
    for (name, packets) in [
        ("host_connect", 3),
        ("guest_connect", 3),
        ("refused", 3),
        ("credit_flood", 2),
        ("reset_mid_io", 1),
    ] {
        assert!(*seed(&got, name) >= packets, "{name}: {got:?}");
    }
    // The hostile seed's packets are dropped but for one that is answered;
    // a change means the device answers hostile packets differently.
    assert_eq!(*seed(&got, "hostile"), HOSTILE_RX_PACKETS, "{got:?}");
}

#[test]
fn virtio_mem_seeds_reach_the_sink() {
    let got = replay("virtio_mem", crate::mem::virtio_mem);
    // Sink calls each seed makes (plugs, busy and failed ones included,
    // unplugs); the hostile seed's requests but its first are refused
    // before the sink.
    for (name, calls) in [
        ("plug_unplug", 3),
        ("slots", 5),
        ("busy", 3),
        ("hostile", 1),
        ("reset_keeps", 3),
        ("not_acked", 0),
    ] {
        assert_eq!(*seed(&got, name), calls, "{name}: {got:?}");
    }
}

/// What the `hostile` vsock seed makes the device send to the guest
/// (measured on this harness).
const HOSTILE_RX_PACKETS: usize = 1;

#[test]
fn the_harnesses_take_empty_and_short_inputs() {
    assert!(!crate::balloon::virtio_mmio(&[]));
    assert_eq!(crate::balloon::balloon_queues(&[1, 2]), 0);
    crate::balloon::virtio_mmio(&[0xff; 100]);
    crate::balloon::balloon_queues(&[0xff; 100]);
    let _ = crate::block::block_queues(&[]);
    let _ = crate::block::block_queues(&[1, 2]);
    let _ = crate::block::block_queues(&[0xff; 200]);
    assert_eq!(crate::net::net_queues(&[]), (0, 0));
    assert_eq!(crate::net::net_queues(&[1]), (0, 0));
    crate::net::net_queues(&[0xff; 200]);
    crate::net::net_queues(&[4; 300]);
    assert_eq!(crate::vsock::vsock_queues(&[]), 0);
    crate::vsock::vsock_queues(&[0xff; 300]);
    assert_eq!(crate::mem::virtio_mem(&[]), 0);
    crate::mem::virtio_mem(&[0xff; 300]);
    crate::mem::virtio_mem(&[7; 300]);
}
