//! The balloon's snapshot: held, it sends no new batch and is settled once
//! its batches end; its state (the target, `actual`, the statistics buffer
//! it holds) saved and restored on a fresh balloon; hostile states refused.

use super::*;

#[test]
fn a_held_balloon_sends_no_batch_and_settles_when_its_batches_end() {
    let mut r = balloon(opts(), PAGE, true);
    let mem = r.mem.clone();
    let qs = start(&mut r, &mem, TELL | STATS_VQ | REPORTING, 256);
    inflate(&mut r, &mem, &qs, &[0x100, 0x101]);
    assert_eq!(r.sink.got.lock().unwrap().len(), 1);
    r.b.hold_discards(true);
    assert!(!r.b.settled(), "a batch is in flight");
    add_pfns(&mem, &qs[0], 1, BUF + 0x1000, &[0x200]);
    queue(&mut r.b, 0);
    assert_eq!(
        r.sink.got.lock().unwrap().len(),
        1,
        "a batch sent while held"
    );
    assert_eq!(used(&qs[0]), 1, "a chain taken while held");
    r.sink.held.lock().unwrap().pop().unwrap().freed();
    assert!(r.b.settled());
    r.b.hold_discards(false);
    wake(&mut r.b);
    assert_eq!(r.sink.got.lock().unwrap().len(), 2);
    assert_eq!(used(&qs[0]), 2);
}

/// A balloon whose driver posted its statistics buffer (head 0), with a
/// target of 100 MiB and 7 pages `actual`.
fn with_stats<'a>(r: &mut Rig, mem: &'a GuestMemoryMmap<()>) -> Vec<Mock<'a>> {
    let qs = start(r, mem, TELL | STATS_VQ | REPORTING, 256);
    qs[2].add_desc_chains(&[desc(BUF, 10, 0, 0)], 0).unwrap();
    queue(&mut r.b, 2);
    r.b.set_target(100).unwrap();
    r.b.write_config(4, &7u32.to_le_bytes());
    qs
}

#[test]
fn a_restored_balloon_has_the_target_actual_and_the_statistics_buffer() {
    let mut r = balloon(opts(), PAGE, false);
    let mem = r.mem.clone();
    let _qs = with_stats(&mut r, &mem);
    let saved = r.b.save_state();
    assert_eq!(saved.stats_desc_index, Some(0));
    assert_eq!(saved.target_pages, 100 * 256);
    assert_eq!(saved.actual_pages, 7);
    let saved: BalloonState =
        serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();

    let mut fresh = balloon(opts(), PAGE, false);
    let mem = fresh.mem.clone();
    let qs = start(&mut fresh, &mem, TELL | STATS_VQ | REPORTING, 256);
    fresh.b.restore_state(&saved).unwrap();
    assert_eq!(fresh.b.save_state(), saved);
    assert_eq!(fresh.b.target_mib(), 100);
    // The held buffer goes back at the next update.
    fresh
        .b
        .process_stats_timer(Instant::now() + Duration::from_secs(2));
    assert_eq!(used(&qs[2]), 1);
}

#[test]
fn hostile_balloon_states_are_refused() {
    let mut r = balloon(opts(), PAGE, false);
    let mem = r.mem.clone();
    let _qs = with_stats(&mut r, &mem);
    let saved = r.b.save_state();
    let refused = |f: &dyn Fn(&mut BalloonState)| {
        let mut s = saved.clone();
        f(&mut s);
        let mut fresh = balloon(opts(), PAGE, false);
        let mem = fresh.mem.clone();
        let _qs = start(&mut fresh, &mem, TELL | STATS_VQ | REPORTING, 16);
        let e = fresh.b.restore_state(&s).unwrap_err();
        assert_eq!(fresh.b.target_pages(), 0, "{e}: changed the balloon");
    };
    refused(&|s| s.stats_desc_index = Some(16));
    refused(&|s| s.stats_desc_index = Some(u16::MAX));
    refused(&|s| s.deflate_on_oom = !s.deflate_on_oom);
    refused(&|s| s.stats_polling_interval_s = 0);
    refused(&|s| s.target_mib = u64::MAX);
    refused(&|s| s.target_pages += 1);
}
