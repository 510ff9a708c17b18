use super::*;

const ALL: SnapGuest = SnapGuest {
    size_gib: 2,
    touch_mib: None,
};
const SPARSE: SnapGuest = SnapGuest {
    size_gib: 64,
    touch_mib: Some(2048),
};

fn sample(guest: SnapGuest, method: SnapMethod, run: u32, seconds: f64) -> SnapSample {
    SnapSample {
        guest,
        method,
        run,
        seconds,
        answer_s: seconds,
        first_line_s: (!method.is_create()).then_some(seconds),
        cpu: UserSys {
            user_s: 0.01,
            sys_s: seconds / 2.0,
        },
        file: method.is_create().then_some(FileSize {
            len: guest.full_bytes(),
            disk: guest.touched_bytes(),
        }),
        resident_bytes: (!method.is_create()).then_some(20 << 20),
        touched_mib: 2000,
    }
}

#[test]
fn the_rows_are_named_as_the_issue_names_them() {
    let names: Vec<String> = snapshot_methods(true, &[1, 2])
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "snapshot-create-firecracker",
            "snapshot-create-teravm-1",
            "snapshot-create-teravm-2",
            "snapshot-load-firecracker",
            "snapshot-load-teravm-lazy",
            "snapshot-load-teravm-eager-1",
            "snapshot-load-teravm-eager-2",
        ]
    );
    let without: Vec<String> = snapshot_methods(false, &[4])
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(
        without,
        [
            "snapshot-create-teravm-4",
            "snapshot-load-teravm-lazy",
            "snapshot-load-teravm-eager-4"
        ]
    );
    assert_eq!(SnapMethod::LoadTeravmEager(3).workers(), Some(3));
    assert_eq!(SnapMethod::LoadTeravmLazy.workers(), None);
    assert_eq!(
        SnapMethod::LoadTeravmLazy.firecracker_row(),
        SnapMethod::LoadFirecracker
    );
    assert_eq!(
        SnapMethod::CreateTeravm(2).firecracker_row(),
        SnapMethod::CreateFirecracker
    );
}

#[test]
fn the_guest_says_what_it_touched_and_ticks() {
    assert_eq!(ALL.boot_args(), format!("touch=all tick={TICK_MS}"));
    assert_eq!(SPARSE.boot_args(), format!("touch=2048 tick={TICK_MS}"));
    assert_eq!(ALL.to_string(), "2 GiB, all touched");
    assert_eq!(SPARSE.to_string(), "64 GiB, 2048 MiB touched");
    assert_eq!(SPARSE.full_bytes(), 64 << 30);
    assert_eq!(SPARSE.touched_bytes(), 2 << 30);
    assert_eq!(ALL.touched_bytes(), 2 << 30);
}

#[test]
fn user_and_system_time_are_read_apart() {
    let line = "4242 (fc_vcpu 0) S 1 2 3 4 5 6 7 8 9 10 250 30 0 0 20 0 1 0";
    assert_eq!(parse_user_sys(line), Some((250, 30)));
    assert_eq!(parse_user_sys("7 (x) R 1"), None);
}

#[test]
fn rows_take_medians_and_compare_with_firecracker_of_the_same_kind() {
    let samples = [
        sample(ALL, SnapMethod::CreateFirecracker, 1, 4.0),
        sample(ALL, SnapMethod::CreateFirecracker, 2, 6.0),
        sample(ALL, SnapMethod::CreateTeravm(2), 1, 2.0),
        sample(ALL, SnapMethod::CreateTeravm(2), 2, 3.0),
        sample(ALL, SnapMethod::LoadFirecracker, 1, 0.1),
        sample(ALL, SnapMethod::LoadTeravmLazy, 1, 0.05),
        sample(SPARSE, SnapMethod::CreateTeravm(2), 1, 1.0),
    ];
    let rows = rows(&samples);
    assert_eq!(rows.len(), 5);
    let fc = &rows[0];
    assert_eq!(fc.method, SnapMethod::CreateFirecracker);
    assert_eq!(fc.summary.median_s, 5.0);
    assert_eq!(fc.vs_firecracker, None);
    assert_eq!(fc.file_disk, Some((2u64 << 30) as f64));
    let tv = &rows[1];
    assert_eq!(tv.summary.median_s, 2.5);
    assert_eq!(tv.vs_firecracker, Some(2.0));
    assert_eq!(tv.cpu.unwrap().sys_s, 1.25);
    assert_eq!(rows[3].vs_firecracker, Some(2.0));
    assert_eq!(rows[3].first_line_s, Some(0.05));
    // No Firecracker row for the sparse guest: no ratio.
    assert_eq!(rows[4].guest, SPARSE);
    assert_eq!(rows[4].vs_firecracker, None);
}

#[test]
fn the_table_names_every_row_and_says_why_one_is_missing() {
    let samples = [
        sample(ALL, SnapMethod::CreateFirecracker, 1, 4.0),
        sample(ALL, SnapMethod::CreateTeravm(1), 1, 2.0),
        sample(ALL, SnapMethod::LoadFirecracker, 1, 0.1),
        sample(ALL, SnapMethod::LoadTeravmEager(1), 1, 0.5),
        sample(SPARSE, SnapMethod::CreateTeravm(1), 1, 1.0),
    ];
    let missing = [SnapUnavailable {
        guest: SPARSE,
        method: SnapMethod::CreateFirecracker,
        reason: "its memory file is written whole (64 GiB); /x has 50 GiB free".into(),
    }];
    let text = table(&rows(&samples), &missing);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("method "), "{text}");
    assert!(lines[0].ends_with("vs firecracker"), "{text}");
    let firsts: Vec<&str> = lines[1..7]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        firsts,
        [
            "snapshot-create-firecracker",
            "snapshot-create-teravm-1",
            "snapshot-load-firecracker",
            "snapshot-load-teravm-eager-1",
            "snapshot-create-firecracker",
            "snapshot-create-teravm-1",
        ]
    );
    assert!(lines[2].contains("2 GiB, all touched"), "{}", lines[2]);
    assert!(lines[2].contains("2048 MiB"), "{}", lines[2]);
    assert!(lines[2].ends_with("2.00x"), "{}", lines[2]);
    assert!(lines[4].ends_with("0.20x"), "{}", lines[4]);
    assert!(
        lines[5].contains("64 GiB, 2048 MiB touched"),
        "{}",
        lines[5]
    );
    assert!(lines[5].contains("not possible"), "{}", lines[5]);
    assert!(text.contains(
        "snapshot-create-firecracker (64 GiB, 2048 MiB touched): not possible here: its memory \
         file is written whole (64 GiB); /x has 50 GiB free\n"
    ));
    // Without Firecracker's rows, no ratio column.
    let alone = table(&rows(&samples[1..2]), &[]);
    assert!(!alone.contains("vs firecracker"), "{alone}");
}

#[test]
fn the_csv_has_one_line_per_run_and_the_loads_resident_size() {
    let samples = [
        sample(ALL, SnapMethod::CreateTeravm(2), 1, 2.0),
        sample(SPARSE, SnapMethod::LoadTeravmLazy, 1, 0.05),
    ];
    let text = csv(&samples);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert_eq!(
        lines[1],
        "snapshot-create-teravm-2,2,,2000,2,1,2.000000,2.000000,,0.01,1.00,2147483648,2147483648,"
    );
    assert_eq!(
        lines[2],
        "snapshot-load-teravm-lazy,64,2048,2000,,1,0.050000,0.050000,0.050000,0.01,0.03,,,20.0"
    );
    assert_eq!(
        resident_text(&rows(&samples)),
        "resident after the load (median VmRSS; lazy: at the guest's first line, eager: at the \
         answer):\n  \
         snapshot-load-teravm-lazy (64 GiB, 2048 MiB touched): 20 MiB\n"
    );
}
