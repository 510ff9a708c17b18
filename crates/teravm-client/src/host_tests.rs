//! Unit tests of [`crate::host`].

use std::path::Path;

use crate::host::*;

#[test]
fn mem_available_is_parsed_in_bytes() {
    let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
    assert_eq!(parse_mem_available(text), Some(20_000_000 * 1024));
    assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    assert_eq!(parse_mem_available("MemAvailable: x kB\n"), None);
    assert_eq!(parse_mem_available("MemAvailable: 5 MB\n"), None);
}

#[test]
fn a_missing_meminfo_is_an_error_naming_the_file() {
    let e = read_mem_available(Path::new("/nonexistent/meminfo")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/meminfo"), "{e}");
}

#[test]
fn rss_is_parsed_in_bytes_and_read_for_this_process() {
    assert_eq!(parse_vm_rss("Name: x\nVmRSS:\t  2048 kB\n"), Some(2 << 20));
    assert_eq!(parse_vm_rss("Name: x\nState: Z (zombie)\n"), None);
    assert!(rss_bytes(std::process::id()).unwrap() > 0);
}

#[test]
fn touched_line_gives_its_mib() {
    assert_eq!(
        parse_touched_mib("teravm firmware: touched 1024 MiB in 812 ms"),
        Some(1024)
    );
    assert_eq!(
        parse_touched_mib("partial guest textteravm firmware: touched 16 MiB in 3 ms"),
        Some(16)
    );
    assert_eq!(parse_touched_mib("teravm firmware: idle"), None);
    assert_eq!(parse_touched_mib("teravm firmware: touched x MiB"), None);
}

#[test]
fn summary_line_is_parsed_and_others_are_not() {
    let line = "teravm: reclaimed 1021 MiB in 140 ms (7.1 GiB/s, 2 workers, 1 nodes)";
    let s = parse_summary(line).unwrap();
    assert_eq!((s.mib, s.ms, s.workers, s.nodes), (1021, 140, 2, 1));
    // Only at the start of a line: a guest's console text is never teravm's.
    assert_eq!(parse_summary(&format!("guest half line{line}")), None);
    assert_eq!(parse_summary("teravm: reclaimed lots"), None);
    let more =
        "teravm: reclaimed 8 MiB in 2 ms (4.0 GiB/s, 1 workers, 1 nodes); console dropped 3 bytes";
    let m = parse_summary(more).unwrap();
    assert_eq!((m.mib, m.ms, m.workers, m.nodes), (8, 2, 1, 1));
    assert_eq!(parse_summary("teravm firmware: idle"), None);
    let lines = ["a", line, "b"];
    assert_eq!(find_summary(lines), Some(s));
    assert_eq!(find_summary(["a"]), None);
}
