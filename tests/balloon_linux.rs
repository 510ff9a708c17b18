//! The balloon under a driver that behaves as Linux's may (issue 34), on
//! the real binary, /dev/kvm and the default flags, with every discard
//! made 2 s slow (`slow-discard`): the test guest's
//!
//! - `bcheck-linux-reset` inflates, writes 0 to Status without polling it
//!   (Linux's `vm_reset`), writes a pattern into the inflated pages at once
//!   (a kernel started by kexec reuses them), sets the device up again,
//!   waits 3 s and checks the pattern: the write of 0 must not return to
//!   the guest while a discard of those pages may still run;
//! - `balloon-no-tell` does not accept MUST_TELL_HOST, inflates, deflates
//!   and reuses the pages before the deflate is answered (virtio 1.2,
//!   5.5.6.1 lets it): no discard of them may be left to run once the
//!   inflate was answered.
//!
//! Each run also without the fault, where nothing is slow.

mod common;

use std::time::{Duration, Instant};

use common::api::*;
use common::guests::Guest;
use common::*;

/// The balloon's target: 4 MiB of the 64 MiB the guest touched, four
/// batches of 256 pages (under `slow-discard`, 2 s each: a driver without
/// MUST_TELL_HOST waits for each one's discard).
const AMOUNT_MIB: u64 = 4;

/// teravm with the test guest running `word` against a balloon of
/// AMOUNT_MIB, the fault `fault` injected; returns the guest's verdict line
/// (`balloon <what> pattern ...` or `balloon no-tell refused`) and the time
/// from the start to it.
fn run(name: &str, word: &str, what: &str, fault: Option<&str>) -> (String, Duration) {
    let env: Vec<(&str, &str)> = fault
        .map(|f| ("TERAVM_FAULT_INJECT", f))
        .into_iter()
        .collect();
    let (mut vmm, sock, _dir) = start_api_env(name, &[], &env);
    put_ok(
        &sock,
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "None"}"#,
    );
    put_ok(
        &sock,
        "/balloon",
        &format!(r#"{{"amount_mib": {AMOUNT_MIB}, "deflate_on_oom": false}}"#),
    );
    put_ok(
        &sock,
        "/boot-source",
        &Guest::TestGuest.boot_source(&format!("touch=64 {word} then=idle")),
    );
    let t = Instant::now();
    let (status, body) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(status, 204, "{body}");
    let ends = [
        format!("teravm guest: balloon {what} pattern "),
        "teravm guest: balloon no-tell refused".to_string(),
        "teravm guest: balloon error".to_string(),
        format!("teravm guest: balloon {what} error"),
    ];
    let line = loop {
        let l = vmm.wait_line("teravm guest: balloon ", T);
        if ends.iter().any(|e| l.contains(e.as_str())) {
            break l;
        }
    };
    let took = t.elapsed();
    assert_eq!(state(&sock), "Running", "{line}");
    shutdown_ok(vmm, &sock);
    (line, took)
}

#[test]
fn a_reset_written_as_linux_does_returns_only_once_the_discards_end() {
    if !kvm_or_skip("balloon_linux_reset") {
        return;
    }
    let _big = big_memory();
    for fault in [None, Some("slow-discard")] {
        let (line, took) = run(
            "balloon-linux-reset",
            "bcheck-linux-reset",
            "linux-reset",
            fault,
        );
        eprintln!("teravm ({fault:?}): {line} after {took:?}");
        assert!(
            line.contains("balloon linux-reset pattern ok"),
            "a discard outlived the reset ({fault:?}): {line}"
        );
    }
}

#[test]
fn a_driver_without_must_tell_host_reuses_deflated_pages_intact() {
    if !kvm_or_skip("balloon_no_tell") {
        return;
    }
    let _big = big_memory();
    for fault in [None, Some("slow-discard")] {
        let (line, took) = run("balloon-no-tell", "balloon-no-tell", "no-tell", fault);
        eprintln!("teravm ({fault:?}): {line} after {took:?}");
        assert!(
            line.contains("balloon no-tell pattern ok"),
            "a deflated page was zeroed behind the driver ({fault:?}): {line}"
        );
    }
}
