//! The tests of `report.rs`: the CSV, the rows, the table and the texts
//! below it, over made-up samples.

use super::*;
use crate::model::Pages;
use teravm::config::Backing;

fn sample(method: Method, pages: Pages, run: u32, seconds: f64) -> Sample {
    Sample {
        case: Case {
            pages,
            backing: Backing::Anonymous,
        },
        method,
        size_gib: 8,
        chunk_mib: method.uses_chunks().then_some(1024),
        run,
        seconds,
        reply_ms: None,
        phases: [None; 4],
        live: None,
        resident: None,
        populate_ms: None,
        touched_mib: None,
    }
}

fn samples() -> Vec<Sample> {
    let mut v = Vec::new();
    for run in 1..=2 {
        v.push(sample(Method::Munmap, Pages::FourK, run, 2.0));
        v.push(sample(Method::Exit, Pages::FourK, run, 1.0 + run as f64));
        v.push(sample(Method::Mrelease, Pages::FourK, run, 1.0));
        v.push(sample(Method::Teravm(2), Pages::FourK, run, 0.5));
    }
    v.push(sample(Method::Munmap, Pages::Thp, 1, 0.2));
    v.push(sample(Method::Teravm(1), Pages::Thp, 1, 0.1));
    v
}

/// `samples()` plus a `--vm` round in the 4k case.
fn vm_samples() -> Vec<Sample> {
    let mut v = samples();
    v.push(sample(Method::VmKill, Pages::FourK, 1, 3.0));
    v.push(sample(Method::VmMrelease, Pages::FourK, 1, 2.0));
    let mut sync = sample(Method::VmShutdown(2), Pages::FourK, 1, 1.5);
    sync.phases = [Some(1.0), Some(0.5), Some(1400.0), None];
    v.push(sync);
    for (run, ms) in [(1, 0.8), (2, 3.5), (3, 1.0)] {
        let mut a = sample(Method::VmAsync(2), Pages::FourK, run, 1.2);
        a.reply_ms = Some(ms);
        v.push(a);
    }
    v
}

#[test]
fn csv_has_the_header_and_one_row_per_run() {
    let text = csv(&samples());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert!(CSV_HEADER.starts_with("method,pages,backing,size_gib,workers,chunk_mib,run,seconds,"));
    assert_eq!(lines.len(), 1 + 10);
    assert_eq!(
        lines[1],
        "munmap,4k,anonymous,8,1,,1,2.000000,1.0000,1.2500,0.5000,,,,,,,,,,,,,,,,,,,,,,,"
    );
    assert_eq!(
        lines[4],
        "teravm-2,4k,anonymous,8,2,1024,1,0.500000,4.0000,5.0000,2.0000,,,,,,,,,,,,,,,,,,,,,,,"
    );
    // No exit or mrelease in the THP case: empty ratios, not 4k's.
    assert_eq!(
        lines[10],
        "teravm-1,thp,anonymous,8,1,1024,1,0.100000,2.0000,,,,,,,,,,,,,,,,,,,,,,,,,"
    );
    for line in &lines {
        assert_eq!(line.split(',').count(), 34, "{line}");
    }
}

#[test]
fn csv_has_reply_latencies_and_phases_of_the_vm_runs() {
    let text = csv(&vm_samples());
    let row = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
            .split(',')
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let sync = row("vm-teravm-2,");
    // Compared with the microVM killed (3 s) and mrelease'd (2 s).
    assert_eq!((sync[9].as_str(), sync[10].as_str()), ("2.0000", "1.3333"));
    assert_eq!(&sync[15..19], ["1.000", "0.500", "1400.000", ""]);
    let a = row("vm-async-2,4k,anonymous,8,2,1024,2,");
    assert_eq!(&a[11..15], ["3.500", "1.000", "3.500", "3.500"]);
}

/// `samples()` plus a `--live` round in the 4k case.
fn live_samples() -> Vec<Sample> {
    let mut v = samples();
    for (method, seconds) in [
        (Method::ReportSerial, 1.0),
        (Method::ReportTeravm(1), 0.8),
        (Method::ReportTeravm(2), 0.5),
    ] {
        let mut s = sample(method, Pages::FourK, 1, seconds);
        s.chunk_mib = None;
        s.live = Some(crate::model::Live {
            discard_bytes_per_s: 16 << 30,
            discarded_bytes: 8 << 30,
            rss_before_bytes: 9 << 30,
            rss_after_bytes: 1 << 30,
            cpu: crate::cputime::CpuSplit {
                vcpu_s: seconds / 10.0,
                discard_s: seconds,
                device_s: 0.0,
            },
        });
        v.push(s);
    }
    v
}

#[test]
fn live_rows_are_compared_with_serial_only() {
    let text = csv(&live_samples());
    let row = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
            .split(',')
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let serial = row("report-serial,");
    assert_eq!(&serial[4..6], ["0", ""]);
    let t = row("report-teravm-2,");
    // vs munmap (2 s), no kill to compare with, 2x serial.
    assert_eq!(&t[8..11], ["4.0000", "", ""]);
    assert_eq!(
        &t[19..24],
        ["2.0000", "16384.0", "8192.0", "9216.0", "1024.0"]
    );
    assert_eq!(row("teravm-2,")[19], "");
    let rows = rows(&live_samples());
    let r = rows
        .iter()
        .find(|r| r.method == Method::ReportTeravm(1))
        .unwrap();
    assert_eq!(r.vs_serial, Some(1.25));
    let table = table(&rows, &[]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].ends_with("vs serial"), "{table}");
    let line = lines
        .iter()
        .find(|l| l.starts_with("report-teravm-2"))
        .unwrap();
    assert!(line.ends_with("2.00x"), "{line}");
    assert!(table.contains("report-* rows:"), "{table}");
    let text = live_text(&live_samples());
    assert!(
        text.contains("report-serial 4k anonymous: discard 16384 MiB/s, 8192 MiB discarded, RSS 9216 -> 1024 MiB"),
        "{text}"
    );
    // The CPU split beside the time, and how quiet the host was.
    assert!(
        text.contains("report-teravm-2 4k anonymous: discard 16384 MiB/s, 8192 MiB discarded, RSS 9216 -> 1024 MiB, cpu vcpu/discard/dev 0.05/0.50/0.00 s"),
        "{text}"
    );
    assert!(
        text.contains("same run, in process 4k anonymous: teravm-"),
        "{text}"
    );
    assert!(table.contains("cpu vcpu/discard/dev s"), "{table}");
    assert!(line.contains("0.05/0.50/0.00"), "{line}");
    let t = row("report-teravm-2,");
    assert_eq!(t[t.len() - 3..], ["0.050", "0.500", "0.000"]);
    assert_eq!(live_text(&samples()), "");
}

#[test]
fn csv_of_no_runs_is_the_header() {
    assert_eq!(csv(&[]), format!("{CSV_HEADER}\n"));
}

#[test]
fn rows_are_grouped_by_case_with_ratios_to_the_baselines_of_the_case() {
    let rows = rows(&samples());
    let names: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {}", r.method, r.case.pages))
        .collect();
    assert_eq!(
        names,
        [
            "munmap 4k",
            "exit 4k",
            "mrelease 4k",
            "teravm-2 4k",
            "munmap thp",
            "teravm-1 thp"
        ]
    );
    let exit = &rows[1];
    assert_eq!(exit.summary.median_s, 2.5);
    assert_eq!((exit.summary.min_s, exit.summary.max_s), (2.0, 3.0));
    let t = &rows[3];
    assert_eq!(t.vs_munmap, Some(4.0));
    assert_eq!(t.vs_exit, Some(5.0));
    assert_eq!(t.vs_mrelease, Some(2.0));
    assert_eq!(t.gib_per_s(), Some(16.0));
    // The THP case has no exit run: no ratio, rather than one from 4k.
    assert_eq!(rows[5].vs_munmap, Some(2.0));
    assert_eq!(rows[5].vs_exit, None);
    assert_eq!(rows[5].vs_mrelease, None);
}

#[test]
fn vm_rows_are_compared_with_the_microvm_killed() {
    let rows = rows(&vm_samples());
    let sync = rows
        .iter()
        .find(|r| r.method == Method::VmShutdown(2))
        .unwrap();
    assert_eq!(sync.vs_exit, Some(2.0));
    assert_eq!(sync.vs_mrelease, Some(2.0 / 1.5));
    assert_eq!(sync.vs_munmap, Some(2.0 / 1.5));
}

#[test]
fn table_has_a_header_and_a_line_per_row() {
    let text = table(&rows(&samples()), &[]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("method"));
    assert!(lines[0].ends_with("vs mrelease"));
    assert_eq!(lines.len(), 1 + 6 + 1);
    assert!(lines[4].starts_with("teravm-2"));
    assert!(lines[4].contains("4.00x"));
    assert!(lines[4].contains("5.00x"));
    assert!(lines[4].ends_with("2.00x"));
    assert!(lines[6].ends_with('-'), "{}", lines[6]);
}

#[test]
fn an_unavailable_method_has_a_row_and_a_reason() {
    let mut s = vm_samples();
    s.retain(|s| !matches!(s.method, Method::Mrelease | Method::VmMrelease));
    let unavailable = [Method::Mrelease, Method::VmMrelease].map(|method| Unavailable {
        method,
        case: None,
        reason: "process_mrelease: ENOSYS (Linux < 5.15)".into(),
    });
    let text = table(&rows(&s), &unavailable);
    let lines: Vec<&str> = text.lines().collect();
    let methods: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        &methods[..10],
        [
            "munmap",
            "exit",
            "mrelease",
            "teravm-2",
            "vm-kill",
            "vm-mrelease",
            "vm-teravm-2",
            "vm-async-2",
            // The THP case ran no --vm method: no vm-mrelease row there.
            "munmap",
            "mrelease"
        ]
    );
    assert!(lines[3].contains("unavailable"), "{}", lines[3]);
    assert!(text.contains("mrelease: unavailable here: process_mrelease: ENOSYS"));
    assert!(text.contains("vm-mrelease: unavailable here"));
}

#[test]
fn reply_latencies_are_summarised_by_percentile() {
    let text = reply_text(&vm_samples());
    assert!(text.starts_with("async Shutdown reply"), "{text}");
    assert!(
        text.contains("vm-async-2 4k anonymous: p50 1.000 ms, p99 3.500 ms, max 3.500 ms (3 runs)"),
        "{text}"
    );
    assert_eq!(reply_text(&samples()), "");
}

#[test]
fn phases_are_medians_of_what_teravm_reported() {
    let text = phases_text(&vm_samples());
    assert!(
        text.contains("vm-teravm-2 4k anonymous: stop_vcpus 1.0, close_vm 0.5, reclaim 1400.0"),
        "{text}"
    );
    assert!(!text.contains("unmap"), "{text}");
    assert_eq!(phases_text(&samples()), "");
}

/// A `--peers-only` round in the 4k case: qemu's rows and teravm's beside.
fn peer_samples() -> Vec<Sample> {
    use crate::model::{Resident, Stop};
    let mut v = Vec::new();
    for (method, seconds) in [
        (Method::Peer(Peer::Qemu, Stop::Graceful), 0.75),
        (Method::Peer(Peer::Qemu, Stop::Kill), 0.5),
        (Method::VmPrealloc(2), 0.5),
        (Method::VmShutdown(2), 0.375),
    ] {
        let mut s = sample(method, Pages::FourK, 1, seconds);
        if !matches!(method, Method::VmShutdown(_)) {
            s.resident = Some(Resident {
                bytes: 8300 << 20,
                huge_bytes: 0,
            });
        }
        v.push(s);
    }
    v
}

#[test]
fn peer_rows_are_compared_with_the_peers_graceful_stop() {
    let samples = peer_samples();
    let text = csv(&samples);
    let row = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
            .split(',')
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // vs_qemu, vs_firecracker, vs_cloud_hypervisor, resident_mib, huge_mib,
    // populate_ms, touched_mib, then the CPU times of --live rows.
    assert_eq!(
        &row("vm-prealloc-teravm-2,")[24..],
        ["1.5000", "", "", "8300.0", "0.0", "", "", "", "", ""]
    );
    assert_eq!(&row("qemu-prealloc-kill,")[4..6], ["1", ""]);
    assert_eq!(&row("qemu-prealloc-quit,")[24..25], ["1.0000"]);
    assert_eq!(
        &row("vm-teravm-2,")[24..],
        ["2.0000", "", "", "", "", "", "", "", "", ""]
    );

    let rows = rows(&samples);
    let names: Vec<String> = rows.iter().map(|r| r.method.to_string()).collect();
    assert_eq!(
        names,
        [
            "qemu-prealloc-quit",
            "qemu-prealloc-kill",
            "vm-prealloc-teravm-2",
            "vm-teravm-2"
        ]
    );
    assert_eq!(rows[2].vs_peers, [Some(1.5), None, None]);
    let unavailable = [Unavailable {
        method: Method::PeerGuest(Peer::Firecracker, crate::model::Stop::Graceful),
        case: None,
        reason: "not found: no firecracker on PATH".into(),
    }];
    let table = table(&rows, &unavailable);
    let lines: Vec<&str> = table.lines().collect();
    // No in-process baseline ran: no vs munmap, exit or mrelease; vs qemu.
    assert!(lines[0].ends_with("GiB/s  vs qemu"), "{table}");
    assert!(!lines[0].contains("vs munmap"), "{table}");
    assert!(lines[1].starts_with("qemu-prealloc-quit "), "{table}");
    assert!(lines[1].ends_with("1.00x"), "{table}");
    // The kill shows no workers.
    assert!(lines[2].contains("  -  "), "{}", lines[2]);
    assert!(lines[3].ends_with("1.50x"), "{table}");
    assert!(
        lines[4].starts_with("firecracker-guest-ctrlaltdel") && lines[4].contains("unavailable"),
        "{table}"
    );
    assert!(table.contains("vs <peer>: median time of the peer's graceful stop"));
    assert!(table.contains("firecracker-guest-ctrlaltdel: unavailable here: not found"));
}

#[test]
fn guest_rows_are_compared_with_the_peers_guest_rows() {
    use crate::model::Stop;
    let mut samples = peer_samples();
    let base = samples[0];
    for (method, seconds, touched) in [
        (Method::PeerGuest(Peer::Qemu, Stop::Graceful), 0.8, 8170),
        (Method::PeerGuest(Peer::Qemu, Stop::Kill), 0.8, 8170),
        (
            Method::PeerGuest(Peer::Firecracker, Stop::Graceful),
            1.0,
            8170,
        ),
        (Method::PeerGuest(Peer::Firecracker, Stop::Kill), 0.5, 8170),
        (Method::VmGuestShutdown(2), 0.4, 8170),
        (Method::VmGuestSigterm(2), 0.5, 8170),
    ] {
        samples.push(Sample {
            method,
            seconds,
            touched_mib: Some(touched),
            ..base
        });
    }
    let rows = rows(&samples);
    let of = |name: &str| {
        rows.iter()
            .find(|r| r.method.to_string() == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    // Against the guest rows of each peer, not the preallocated ones.
    assert_eq!(
        of("vm-guest-teravm-2").vs_peers,
        [Some(2.0), Some(2.5), None]
    );
    assert_eq!(
        of("firecracker-guest-kill").vs_peers,
        [Some(1.6), Some(2.0), None]
    );
    // The preallocated teravm row is still against qemu-prealloc-quit only.
    assert_eq!(of("vm-prealloc-teravm-2").vs_peers, [Some(1.5), None, None]);
    let names: Vec<String> = rows.iter().map(|r| r.method.to_string()).collect();
    assert_eq!(
        names,
        [
            "qemu-prealloc-quit",
            "qemu-prealloc-kill",
            "vm-prealloc-teravm-2",
            "qemu-guest-quit",
            "qemu-guest-kill",
            "firecracker-guest-ctrlaltdel",
            "firecracker-guest-kill",
            "vm-guest-teravm-2",
            "vm-guest-sigterm-2",
            "vm-teravm-2"
        ]
    );
    let table = table(&rows, &[]);
    assert!(
        table
            .lines()
            .next()
            .unwrap()
            .ends_with("vs qemu  vs firecracker"),
        "{table}"
    );
    let text = csv(&samples);
    let line = text
        .lines()
        .find(|l| l.starts_with("vm-guest-sigterm-2,"))
        .unwrap();
    assert!(line.ends_with(",8170,,,"), "{line}");
}

#[test]
fn a_peer_without_a_backing_skips_that_case_only() {
    let mut samples = peer_samples();
    let mut memfd: Vec<Sample> = samples.clone();
    for s in &mut memfd {
        s.case.backing = Backing::Memfd;
    }
    memfd.retain(|s| !matches!(s.method, Method::Peer(..)));
    samples.extend(memfd);
    let unavailable = [Unavailable {
        method: Method::Peer(Peer::Qemu, crate::model::Stop::Graceful),
        case: Some(Case {
            pages: Pages::FourK,
            backing: Backing::Memfd,
        }),
        reason: "no such backend".into(),
    }];
    let table = table(&rows(&samples), &unavailable);
    let unavailable_rows: Vec<&str> = table
        .lines()
        .filter(|l| l.contains("unavailable"))
        .collect();
    assert_eq!(unavailable_rows.len(), 1, "{table}");
    assert!(unavailable_rows[0].contains("memfd"), "{table}");
    assert!(table.contains("qemu-prealloc-quit 4k memfd: unavailable here: no such backend"));
}
