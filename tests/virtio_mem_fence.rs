//! The virtio-mem fence on the real binary and /dev/kvm with the default
//! flags (issue 27): with every discard made slow (the `slow-discard`
//! fault, 2 s per part), a PLUG of blocks whose UNPLUG's discard still runs
//! waits for it before it is acknowledged, so no discard zeroes memory the
//! guest has plugged again.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::api::*;
use common::*;

fn request_mib(sock: &Path, mib: u64) {
    let body = format!(r#"{{"requested_size_mib": {mib}}}"#);
    let (status, reply) = common::client::request(sock, "PATCH", "/hotplug/memory", Some(&body))
        .expect("the API answers");
    assert_eq!(status, 204, "PATCH requested_size_mib {mib}: {reply}");
}

fn discarded(sock: &Path) -> u64 {
    get(sock, "/hotplug/memory")["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["discarded_bytes"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn a_replug_waits_for_the_discard_of_its_blocks() {
    if !kvm_or_skip("virtio_mem_fence") {
        return;
    }
    let _big = big_memory();
    let (mut vmm, sock, _dir) = {
        let dir = temp_dir("mem-fence");
        let sock = dir.join("api.sock");
        let vmm = Vmm::spawn_env(
            &["--api-sock", sock.to_str().unwrap()],
            &[("TERAVM_FAULT_INJECT", "slow-discard")],
        );
        wait_for_api(&sock, T);
        (vmm, sock, dir)
    };
    for (path, body) in [
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None"}"#,
        ),
        ("/hotplug/memory", r#"{"total_size_mib": 512}"#),
        ("/boot-source", r#"{"boot_args": "mem then=idle"}"#),
    ] {
        let (status, reply) = put(&sock, path, body);
        assert_eq!(status, 204, "PUT {path}: {reply}");
    }
    let (status, reply) = put(&sock, "/actions", r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{reply}");
    vmm.wait_line("teravm firmware: idle", T);
    request_mib(&sock, 256);
    vmm.wait_line("teravm firmware: mem plugged 256 MiB (256 MiB plugged)", T);

    // Unplugged: acknowledged at once, freed behind, slowly.
    request_mib(&sock, 0);
    vmm.wait_line("teravm firmware: mem unplugged 256 MiB (0 MiB plugged)", T);
    let unplugged = Instant::now();
    let v = get(&sock, "/hotplug/memory");
    assert!(
        v["discards_in_flight"].as_u64().unwrap_or(0) > 0 && discarded(&sock) < 256 << 20,
        "the slow discard should still run: {v}"
    );

    // Plugged again at once: each PLUG waits for its blocks' discard.
    request_mib(&sock, 256);
    vmm.wait_line("teravm firmware: mem plugged 256 MiB (256 MiB plugged)", T);
    let waited = unplugged.elapsed();
    let freed = discarded(&sock);
    assert!(
        freed >= 256 << 20,
        "the replug was acknowledged with only {} MiB of its blocks' discard done (after {waited:?})",
        freed >> 20
    );
    assert!(
        waited >= Duration::from_secs(1),
        "the replug came {waited:?} after the unplug: it did not wait for the 2 s discards"
    );
    // Nothing zeroes the replugged blocks later: once every discard has
    // ended, what the guest wrote into them is still resident (a discard
    // that ran behind the replug would have freed it: teravm's RSS, not its
    // counters, says so).
    let replugged = vmm.rss_bytes();
    discards_done(&sock);
    let settled = vmm.rss_bytes();
    assert!(
        settled + (16 << 20) >= replugged && replugged >= 256 << 20,
        "RSS {} MiB after the replug, {} MiB once the discards ended: a late discard freed replugged blocks",
        replugged >> 20,
        settled >> 20
    );
    let lines = shutdown_ok(vmm, &sock);
    for l in &lines {
        assert!(
            !l.contains("teravm firmware: mem dirty") && !l.contains("teravm firmware: mem error"),
            "{l:?}"
        );
    }
}
