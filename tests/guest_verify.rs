//! The test guest's `verify-every=<ms>` (issue 36's contract: after
//! `touch=`, every `<ms>` the guest re-reads each page it touched and
//! prints `verify <N> MiB ok` or `verify <N> MiB bad at 0x<guest
//! address>`), on the real binary, /dev/kvm and the default flags
//! (seccomp on): a guest left alone says ok, again and again, alone or
//! between `tick=`'s ticks; one page changed from the host under the
//! running guest (through `/proc/<pid>/mem`, at the host address of its
//! guest address) is named, and once put back the guest says ok again: the
//! check can fail, and fails on the page that changed (a guest that never
//! said bad fails it). A bad period is said as other bad words are.

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::api::*;
use common::guests::Guest;
use common::*;

/// The guest's RAM and what it touches (from `_guest_end`, 20 MiB today:
/// guest/guest.ld).
const RAM_MIB: u64 = 256;
const TOUCH_MIB: u64 = 64;
/// A page in the middle of what the guest touched: the guest wrote its own
/// guest address into its first word ([`verified_host_addr`] checks).
const CORRUPT_GPA: u64 = 48 * MIB;
const VERIFY: &str = "teravm guest: verify ";

/// Configures the test guest with `words` in RAM_MIB, one vCPU, and starts
/// it through the API; returns teravm and its socket.
fn boot(name: &str, words: &str) -> (Vmm, std::path::PathBuf) {
    let (vmm, sock, _dir) = start_api(name, &[]);
    put_ok(
        &sock,
        "/machine-config",
        &format!(r#"{{"vcpu_count": 1, "mem_size_mib": {RAM_MIB}}}"#),
    );
    put_ok(&sock, "/boot-source", &Guest::TestGuest.boot_source(words));
    let (s, b) = action(&sock, r#"{"action_type": "InstanceStart"}"#);
    assert_eq!(s, 204, "{b}");
    (vmm, sock)
}

/// The next `verify ...` line.
fn next_verify(vmm: &mut Vmm) -> String {
    vmm.wait_line(VERIFY, T)
}

/// Reads `verify` lines until `want`, allowing a few `before` (printed
/// before the change under test reached the guest's next verify) and
/// nothing else.
fn until(vmm: &mut Vmm, want: &str, before: &str) {
    for _ in 0..5 {
        let line = next_verify(vmm);
        if line == want {
            return;
        }
        assert_eq!(line, before, "{:?}", vmm.stdout);
    }
    panic!("no {want:?} within 5 verifies: {:?}", vmm.stdout);
}

fn ok_line() -> String {
    format!("{VERIFY}{TOUCH_MIB} MiB ok")
}

#[test]
fn a_guest_left_alone_verifies_ok_every_period() {
    if !kvm_or_skip("verify_every_ok") {
        return;
    }
    let (mut vmm, sock) = boot("verify-ok", &format!("touch={TOUCH_MIB} verify-every=200"));
    vmm.wait_line(&format!("teravm guest: touched {TOUCH_MIB} MiB in "), T);
    for _ in 0..2 {
        assert_eq!(next_verify(&mut vmm), ok_line(), "{:?}", vmm.stdout);
    }
    assert!(
        !vmm.stdout.iter().any(|l| l.contains("bad command line")),
        "{:?}",
        vmm.stdout
    );
    shutdown_ok(vmm, &sock);
}

#[test]
fn verifies_come_between_ticks() {
    if !kvm_or_skip("verify_every_ticks") {
        return;
    }
    let (mut vmm, sock) = boot(
        "verify-ticks",
        &format!("touch={TOUCH_MIB} tick=50 verify-every=200"),
    );
    for _ in 0..2 {
        assert_eq!(next_verify(&mut vmm), ok_line(), "{:?}", vmm.stdout);
    }
    // The ticks go on around them: some before the first, some between.
    let verifies: Vec<usize> = (0..vmm.stdout.len())
        .filter(|&i| vmm.stdout[i].starts_with(VERIFY))
        .collect();
    let ticks = |from: usize, to: usize| {
        vmm.stdout[from..to]
            .iter()
            .filter(|l| l.starts_with("teravm guest: tick "))
            .count()
    };
    assert!(ticks(0, verifies[0]) >= 1, "{:?}", vmm.stdout);
    assert!(ticks(verifies[0], verifies[1]) >= 2, "{:?}", vmm.stdout);
    shutdown_ok(vmm, &sock);
}

/// The slice of guest RAM that holds `gpa`, as `GET /memory` shows it:
/// (its guest address, its size).
fn slice_of(sock: &Path, gpa: u64) -> (u64, u64) {
    let memory = get(sock, "/memory");
    memory["slices"]
        .as_array()
        .expect("slices")
        .iter()
        .map(|s| (u(s, "guest_addr"), u(s, "size_bytes")))
        .find(|&(g, n)| g <= gpa && gpa < g + n)
        .unwrap_or_else(|| panic!("no slice holds {gpa:#x}: {memory}"))
}

/// The read-write mappings of process `pid` of exactly `size` bytes: where
/// teravm mapped a slice of that size (anonymous, private, from the
/// slice's first byte: src/memory/mapping.rs).
fn mappings_of_size(pid: u32, size: u64) -> Vec<u64> {
    rw_mappings(pid)
        .into_iter()
        .filter(|&(a, b)| b - a == size)
        .map(|(a, _)| a)
        .collect()
}

fn read_u64(mem: &File, at: u64) -> u64 {
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, at).expect("read guest memory");
    u64::from_le_bytes(b)
}

/// The host address of guest address `gpa` in teravm `pid`: the mapping
/// of its slice's size whose page at `gpa`'s offset holds what the guest's
/// `touch=` wrote there (`gpa` itself), as does the next page. Panics when
/// no mapping or more than one fits: then the test proves nothing.
fn verified_host_addr(pid: u32, mem: &File, sock: &Path, gpa: u64) -> u64 {
    let (guest_addr, size) = slice_of(sock, gpa);
    let offset = gpa - guest_addr;
    let fits: Vec<u64> = mappings_of_size(pid, size)
        .into_iter()
        .filter(|&base| {
            read_u64(mem, base + offset) == gpa && read_u64(mem, base + offset + 4096) == gpa + 4096
        })
        .collect();
    assert_eq!(
        fits.len(),
        1,
        "one mapping of {size} bytes holds the guest's words at {gpa:#x}: {fits:x?}\n{}",
        std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap()
    );
    fits[0] + offset
}

#[test]
fn a_page_changed_from_the_host_is_named_then_ok_once_restored() {
    if !kvm_or_skip("verify_every_bad") {
        return;
    }
    let (mut vmm, sock) = boot("verify-bad", &format!("touch={TOUCH_MIB} verify-every=100"));
    // The guest touched and verified once: every page holds its word.
    assert_eq!(next_verify(&mut vmm), ok_line(), "{:?}", vmm.stdout);
    let pid = vmm.child.id();
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .expect("open teravm's memory (root)");
    let hva = verified_host_addr(pid, &mem, &sock, CORRUPT_GPA);

    // One word of one page changed under the running guest.
    mem.write_all_at(&(!CORRUPT_GPA).to_le_bytes(), hva)
        .expect("write guest memory");
    let bad = format!("{VERIFY}{TOUCH_MIB} MiB bad at {CORRUPT_GPA:#x}");
    // Lines printed before the write landed (or by a verify under way, past
    // the page) still say ok; the next verify may not.
    until(&mut vmm, &bad, &ok_line());
    // Again at the next period: the check reads memory each time.
    assert_eq!(next_verify(&mut vmm), bad, "{:?}", vmm.stdout);

    // Put back, it is ok again.
    mem.write_all_at(&CORRUPT_GPA.to_le_bytes(), hva)
        .expect("write guest memory");
    until(&mut vmm, &ok_line(), &bad);
    drop(mem);
    shutdown_ok(vmm, &sock);
}

#[test]
fn a_bad_period_is_said_as_other_bad_words_are() {
    if !kvm_or_skip("verify_every_bad_value") {
        return;
    }
    for value in ["0", "200ms", ""] {
        let (mut vmm, sock) = boot("verify-bad-value", &format!("touch=1 verify-every={value}"));
        vmm.wait_line("teravm guest: bad command line (verify-every=)", T);
        vmm.wait_line("teravm guest: idle", T);
        assert!(
            !vmm.stdout.iter().any(|l| l.starts_with(VERIFY)),
            "{:?}",
            vmm.stdout
        );
        shutdown_ok(vmm, &sock);
    }
}
