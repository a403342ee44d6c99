//! Two (or three) `Dofs` stores synced through the real push/pull driver
//! over the in-process `StoreRemote`: the protocol rules end to end.

use crate::util::{Node, Peer, faulty, noise, p, pull, pull_via, push, push_via, quiesce};
use futures::executor::block_on;
use wsd_sync::limits::BATCH_ENTRIES;
use wsd_sync::{ChangeCursor, ErrorCode, Store, driver};

fn sample_tree(a: &Peer) {
    a.put("README.md", b"# hello\n");
    a.put("src/main.rs", b"fn main() {}\n");
    a.put("src/big.bin", &noise(700 * 1024, 1));
    a.put("empty", b"");
    let mut s = a.store.borrow_mut();
    s.mkdir(&p("src/empty-dir"), false).unwrap();
    s.symlink("src/main.rs", &p("link")).unwrap();
    s.symlink("../nowhere", &p("src/dangling")).unwrap();
    s.chmod(&p("src/main.rs"), 0o755).unwrap();
    s.chmod(&p("src/empty-dir"), 0o700).unwrap();
}

fn check(peers: &[&Peer]) {
    for peer in peers {
        peer.store.borrow().check_integrity().unwrap();
    }
}

#[test]
fn a_baseline_from_rev_zero_copies_the_whole_tree() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    let report = push(&a, &b).unwrap();
    assert_eq!(report.entries as usize, a.tree().len());
    assert_eq!(b.tree(), a.tree());
    let wm = a.store.borrow().remote_watermarks("B").unwrap();
    assert_eq!(wm.push_rev(), a.rev());
    assert_eq!(
        b.store
            .borrow()
            .remote_watermarks("A")
            .unwrap()
            .fetch_cursor,
        ChangeCursor::at(a.rev())
    );
    check(&[&a, &b]);
}

#[test]
fn an_incremental_push_sends_only_changed_paths_and_chunks() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    let mut big = noise(700 * 1024, 1);
    big[350 * 1024] ^= 1;
    a.put("src/big.bin", &big);
    let report = push(&a, &b).unwrap();
    assert_eq!(report.entries, 1);
    assert!(
        report.objects <= 2,
        "a one-byte edit moved {} chunks",
        report.objects
    );
    assert!(report.deduplicated_bytes > 300 * 1024);
    assert_eq!(b.tree(), a.tree());
    assert_eq!(push(&a, &b).unwrap().entries, 0);
}

#[test]
fn renames_arrive_as_new_paths_plus_deletes_in_both_directions() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    a.store.borrow_mut().rename(&p("src"), &p("lib")).unwrap();
    let report = push(&a, &b).unwrap();
    assert!(report.objects == 0, "a rename moves no bytes");
    assert_eq!(b.tree(), a.tree());
    assert!(!b.store.borrow().exists(&p("src")).unwrap());
    b.store
        .borrow_mut()
        .rename(&p("lib/main.rs"), &p("main.rs"))
        .unwrap();
    pull(&a, &b).unwrap();
    assert_eq!(a.tree(), b.tree());
    assert!(a.store.borrow().exists(&p("main.rs")).unwrap());
    check(&[&a, &b]);
}

#[test]
fn deletes_propagate_and_delete_then_recreate_is_one_live_entry() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    a.store.borrow_mut().rm(&p("src"), true).unwrap();
    push(&a, &b).unwrap();
    assert_eq!(b.tree(), a.tree());
    a.store.borrow_mut().rm(&p("README.md"), false).unwrap();
    a.put("README.md", b"recreated");
    assert_eq!(push(&a, &b).unwrap().entries, 1);
    assert_eq!(
        b.store.borrow().read_file(&p("README.md")).unwrap(),
        b"recreated"
    );
    check(&[&a, &b]);
}

#[test]
fn a_mode_only_change_propagates_both_ways() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    a.store.borrow_mut().chmod(&p("README.md"), 0o600).unwrap();
    assert_eq!(
        push(&a, &b).unwrap().applied,
        0,
        "applied is only counted by pulls"
    );
    assert_eq!(b.store.borrow().stat(&p("README.md")).unwrap().mode, 0o600);
    b.store.borrow_mut().chmod(&p("src"), 0o750).unwrap();
    b.store
        .borrow_mut()
        .chmod(&p("src/main.rs"), 0o644)
        .unwrap();
    assert_eq!(pull(&a, &b).unwrap().applied, 2);
    assert_eq!(a.store.borrow().stat(&p("src")).unwrap().mode, 0o750);
    assert_eq!(a.tree(), b.tree());
}

#[test]
fn symlinks_propagate_and_retarget() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    {
        let mut s = a.store.borrow_mut();
        s.rm(&p("link"), false).unwrap();
        s.symlink("README.md", &p("link")).unwrap();
    }
    push(&a, &b).unwrap();
    assert_eq!(b.store.borrow().readlink(&p("link")).unwrap(), "README.md");
}

#[test]
fn kind_changes_replace_the_subtree_on_the_other_side() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    let to_file = |s: &Peer| {
        s.store.borrow_mut().rm(&p("src"), true).unwrap();
        s.put("src", b"a file now");
    };
    let to_symlink = |s: &Peer| {
        s.store.borrow_mut().rm(&p("src"), true).unwrap();
        s.store
            .borrow_mut()
            .symlink("README.md", &p("src"))
            .unwrap();
    };
    let to_dir = |s: &Peer| {
        s.store.borrow_mut().rm(&p("src"), true).unwrap();
        s.put("src/x/y", b"deep");
    };
    // Every one of the six transitions, alternating which side makes it.
    type Step<'a> = (&'a dyn Fn(&Peer), bool);
    let steps: [Step<'_>; 6] = [
        (&to_file, true),     // dir -> file, pushed
        (&to_symlink, false), // file -> symlink, pulled
        (&to_dir, true),      // symlink -> dir, pushed
        (&to_symlink, false), // dir -> symlink, pulled
        (&to_file, true),     // symlink -> file, pushed
        (&to_dir, false),     // file -> dir, pulled
    ];
    for (step, on_a) in steps {
        if on_a {
            step(&a);
            push(&a, &b).unwrap();
        } else {
            step(&b);
            pull(&a, &b).unwrap();
        }
        assert_eq!(a.tree(), b.tree());
        check(&[&a, &b]);
    }
    assert_eq!(quiesce(&a, &b), 0, "{:?}", a.tree());
}

#[test]
fn a_path_rewritten_after_the_stream_opened_is_deferred_to_the_next_pull() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    b.put("stable", b"1");
    b.put("racy", b"before");
    let (mut remote, faults) = faulty(&b, &a);
    let b2 = b.clone();
    *faults.after_open.borrow_mut() = Some(Box::new(move || b2.put("racy", b"after")));
    let opened_at = b.rev();
    let report = pull_via(&a, "B", &mut remote).unwrap();
    assert_eq!(
        report.entries, 1,
        "only the untouched path is in this stream"
    );
    assert_eq!(
        report.cursor,
        ChangeCursor::at(opened_at),
        "never beyond the advertised cursor"
    );
    assert!(!a.store.borrow().exists(&p("racy")).unwrap());
    *faults.after_open.borrow_mut() = None;
    pull_via(&a, "B", &mut remote).unwrap();
    assert_eq!(a.store.borrow().read_file(&p("racy")).unwrap(), b"after");
}

#[test]
fn a_child_streamed_before_its_chmoded_parent_applies() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    b.store.borrow_mut().mkdir(&p("d"), false).unwrap();
    b.put("d/f", b"child");
    b.store.borrow_mut().chmod(&p("d"), 0o700).unwrap();
    let first = b
        .store
        .borrow_mut()
        .read_entry(&p("d/f"))
        .unwrap()
        .unwrap()
        .rev;
    assert!(
        first < b.store.borrow().stat(&p("d")).unwrap().rev,
        "the child streams first"
    );
    pull(&a, &b).unwrap();
    assert_eq!(a.tree(), b.tree());
    assert_eq!(a.store.borrow().stat(&p("d")).unwrap().mode, 0o700);
}

#[test]
fn more_than_a_hundred_hashes_go_in_one_probe() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    for i in 0..150 {
        a.put(&format!("f{i:03}"), format!("content {i}").as_bytes());
    }
    let (mut remote, faults) = faulty(&b, &a);
    push_via(&a, "B", &mut remote).unwrap();
    assert!(
        faults.max_probe.get() >= 150,
        "largest probe {}",
        faults.max_probe.get()
    );
    assert_eq!(b.tree(), a.tree());
}

#[test]
fn revs_that_produce_no_entries_do_not_strand_the_push_rev() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    b.put("from-b", b"x");
    pull(&a, &b).unwrap();
    assert!(a.rev() > 0);
    let report = push(&a, &b).unwrap();
    assert_eq!(report.entries, 0, "what came from B is not echoed back");
    assert_eq!(
        a.store.borrow().remote_watermarks("B").unwrap().push_rev(),
        a.rev()
    );
    a.store.borrow_mut().mkdir(&p("from-b"), true).unwrap_err();
    a.store.borrow_mut().mkdir(&p("d"), true).unwrap();
    let rev = a.rev();
    a.store.borrow_mut().mkdir(&p("d"), true).unwrap();
    assert_eq!(a.rev(), rev, "mkdir -p of an existing dir burns no rev");
}

#[test]
fn a_push_whose_chunks_never_arrived_rolls_back_entirely() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    b.put("already", b"there");
    let b_rev = b.rev();
    a.put("dir/one", b"one");
    a.put("dir/two", b"two");
    let (mut remote, faults) = faulty(&b, &a);
    faults.drop_objects.set(true);
    let err = push_via(&a, "B", &mut remote).unwrap_err();
    assert_eq!(err.code(), ErrorCode::UnknownHash);
    assert!(err.to_string().contains("dir/"), "{err}");
    assert_eq!(b.rev(), b_rev, "the rev counter is unchanged");
    assert!(!b.store.borrow().exists(&p("dir")).unwrap());
    assert_eq!(
        a.store.borrow().remote_watermarks("B").unwrap().push_cursor,
        ChangeCursor::ZERO
    );
    faults.drop_objects.set(false);
    push_via(&a, "B", &mut remote).unwrap();
    assert!(b.store.borrow().exists(&p("dir/two")).unwrap());
    check(&[&a, &b]);
}

#[test]
fn a_push_refused_for_unknown_hashes_is_retried_a_bounded_number_of_times() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    a.put("dir/one", b"one");
    a.put("dir/two", b"two");
    let (mut remote, faults) = faulty(&b, &a);
    // The first probe claims everything held: nothing is uploaded, the push
    // fails with EUNKNOWN_HASH, the re-probe tells the truth.
    faults.claim_held.set(1);
    push_via(&a, "B", &mut remote).unwrap();
    assert_eq!(faults.probes.get(), 2);
    assert_eq!(b.tree(), a.tree());
    // A probe that always lies: the first try plus three retries, then the
    // error.
    a.put("dir/three", b"three");
    faults.probes.set(0);
    faults.claim_held.set(usize::MAX);
    let err = push_via(&a, "B", &mut remote).unwrap_err();
    assert_eq!(err.code(), ErrorCode::UnknownHash);
    assert_eq!(faults.probes.get(), 4);
    assert!(!b.store.borrow().exists(&p("dir/three")).unwrap());
    faults.claim_held.set(0);
    push_via(&a, "B", &mut remote).unwrap();
    assert_eq!(b.tree(), a.tree());
    check(&[&a, &b]);
}

#[test]
fn a_corrupted_chunk_is_rejected_by_the_receiver() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    a.put("f", b"precious bytes");
    let (mut remote, faults) = faulty(&b, &a);
    faults.corrupt_objects.set(true);
    let err = push_via(&a, "B", &mut remote).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Protocol);
    assert_eq!(b.rev(), 0);
    let hash = wsd_sync::Hash::of(b"precious bytes");
    assert!(
        b.store
            .borrow_mut()
            .has_objects(&[hash])
            .unwrap()
            .is_empty()
    );
}

#[test]
fn an_interrupted_pull_resumes_without_replaying_more_than_a_batch() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    for i in 0..300 {
        b.put(&format!("old/f{i:03}"), b"x");
    }
    pull(&a, &b).unwrap();
    b.store.borrow_mut().rename(&p("old"), &p("new")).unwrap();
    let total = 2 * 301; // new paths live + old paths as tombstones, one rev
    let (mut remote, faults) = faulty(&b, &a);
    // fetch_changes, the first next_batch, then fail on the second.
    faults.calls_left.set(Some(2));
    let err = pull_via(&a, "B", &mut remote).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Io);
    let first = faults.streamed.get();
    assert_eq!(first, BATCH_ENTRIES);
    let cursor = a
        .store
        .borrow()
        .remote_watermarks("B")
        .unwrap()
        .fetch_cursor;
    assert_eq!(cursor.rev, b.rev());
    assert!(cursor.path.is_some(), "a same-rev partial cursor: {cursor}");

    let (mut remote, faults) = faulty(&b, &a);
    let report = pull_via(&a, "B", &mut remote).unwrap();
    assert!(faults.streamed.get() <= total - first + BATCH_ENTRIES);
    assert_eq!(
        faults.streamed.get(),
        total - first,
        "the checkpoint is atomic with the apply"
    );
    assert_eq!(report.cursor, ChangeCursor::at(b.rev()));
    assert_eq!(a.tree(), b.tree());
    assert!(!a.store.borrow().exists(&p("old")).unwrap());
    check(&[&a, &b]);
}

#[test]
fn an_interrupted_push_resumes_after_the_last_acknowledged_batch() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    for i in 0..600 {
        a.put(&format!("f{i:03}"), format!("{i}").as_bytes());
    }
    let (mut remote, faults) = faulty(&b, &a);
    // watermarks-free push: has, push_objects, has (the next batch is probed
    // before this one is pushed), push for batch one, then fail.
    faults.calls_left.set(Some(4));
    push_via(&a, "B", &mut remote).unwrap_err();
    let acked = a.store.borrow().remote_watermarks("B").unwrap().push_cursor;
    assert!(
        acked.path.is_some() && acked > ChangeCursor::ZERO,
        "{acked}"
    );
    faults.calls_left.set(None);
    let report = push_via(&a, "B", &mut remote).unwrap();
    assert_eq!(report.entries as usize, 600 - BATCH_ENTRIES);
    assert_eq!(b.tree(), a.tree());
}

#[test]
fn a_remote_that_lost_its_state_is_rebaselined_including_what_came_from_it() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    b.put("made-on-b", b"echo-suppressed on A");
    pull(&a, &b).unwrap();
    assert_eq!(push(&a, &b).unwrap().entries, 0);

    let fresh = Peer::new("B");
    let mut remote = fresh.remote_for(&a);
    block_on(driver::reconcile(
        &mut *a.store.borrow_mut(),
        &mut remote,
        "B",
    ))
    .unwrap();
    assert_eq!(
        a.store.borrow().remote_watermarks("B").unwrap().push_cursor,
        ChangeCursor::ZERO
    );
    push(&a, &fresh).unwrap();
    assert_eq!(fresh.tree(), a.tree());
    assert!(fresh.store.borrow().exists(&p("made-on-b")).unwrap());
    check(&[&a, &fresh]);
}

#[test]
fn a_puller_behind_the_prune_horizon_gets_a_baseline_that_sweeps_stale_paths() {
    let (a, b, c) = (Peer::new("A"), Peer::new("B"), Peer::new("C"));
    a.put("keep", b"1");
    a.put("doomed/child", b"2");
    pull(&c, &a).unwrap();
    a.store.borrow_mut().rm(&p("doomed"), true).unwrap();
    a.put("new", b"3");
    push(&a, &b).unwrap();
    let pruned = a.store.borrow_mut().prune_tombstones().unwrap();
    assert_eq!(pruned.pruned, 2);
    assert_eq!(a.store.borrow_mut().read_entry(&p("doomed")).unwrap(), None);
    // C's cursor predates the pruned tombstones: it cannot learn of the
    // delete incrementally, so it gets everything and drops what is unlisted.
    let report = pull(&c, &a).unwrap();
    assert!(report.rebaselined);
    assert_eq!(c.tree(), a.tree());
    assert!(!c.store.borrow().exists(&p("doomed")).unwrap());
    check(&[&a, &b, &c]);
}

#[test]
fn a_remote_registered_after_pruning_is_pushed_a_sweeping_baseline() {
    let (a, b, c) = (Peer::new("A"), Peer::new("B"), Peer::new("C"));
    a.put("x", b"1");
    a.put("y", b"1");
    push(&a, &c).unwrap();
    a.store.borrow_mut().rm(&p("y"), false).unwrap();
    a.store.borrow_mut().forget_remote("C").unwrap();
    push(&a, &b).unwrap();
    assert_eq!(a.store.borrow_mut().prune_tombstones().unwrap().pruned, 1);
    // C comes back (e.g. a restored container) holding the stale `y`.
    a.store.borrow_mut().register_remote("C").unwrap();
    let report = push(&a, &c).unwrap();
    assert!(report.rebaselined);
    assert_eq!(c.tree(), a.tree());
}

#[test]
fn what_a_peer_pushed_is_not_pulled_back_and_a_settled_pair_stays_settled() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    sample_tree(&a);
    push(&a, &b).unwrap();
    assert_eq!(pull(&a, &b).unwrap().entries, 0);
    b.put("from-b", b"x");
    b.store.borrow_mut().chmod(&p("README.md"), 0o640).unwrap();
    assert_eq!(pull(&a, &b).unwrap().entries, 2);
    assert_eq!(push(&a, &b).unwrap().entries, 0);
    assert_eq!(quiesce(&a, &b), 0);
    assert_eq!(a.tree(), b.tree());
}

#[test]
fn a_pull_that_overwrites_an_unpushed_local_write_reports_it() {
    let (a, b) = (Peer::new("A"), Peer::new("B"));
    a.put("shared", b"v1");
    push(&a, &b).unwrap();
    a.put("shared", b"authority edit");
    b.put("shared", b"command output");
    let report = pull(&a, &b).unwrap();
    assert_eq!(report.overwrote_local, 1);
    assert_eq!(
        a.store.borrow().read_file(&p("shared")).unwrap(),
        b"command output"
    );
    quiesce(&a, &b);
    assert_eq!(a.tree(), b.tree());
    let Node::File { bytes, .. } = &b.tree()["shared"] else {
        panic!()
    };
    assert_eq!(bytes, b"command output");
}

#[test]
fn a_first_pull_from_a_remote_behind_the_horizon_does_not_hide_its_paths_from_the_baseline() {
    let (a, b, c) = (Peer::new("A"), Peer::new("B"), Peer::new("C"));
    a.put("gone", b"1");
    a.store.borrow_mut().rm(&p("gone"), false).unwrap();
    a.put("shared", b"1");
    push(&a, &c).unwrap();
    assert_eq!(a.store.borrow_mut().prune_tombstones().unwrap().pruned, 1);
    // B first meets A after the prune: A pulls first, then pushes.
    b.put("made-on-b/file", b"precious");
    pull(&a, &b).unwrap();
    let report = push(&a, &b).unwrap();
    assert!(report.rebaselined, "B's push cursor is behind the horizon");
    assert!(
        b.store.borrow().exists(&p("made-on-b/file")).unwrap(),
        "swept by its own baseline"
    );
    quiesce(&a, &b);
    assert_eq!(a.tree(), b.tree());
    assert!(a.store.borrow().exists(&p("made-on-b/file")).unwrap());
}

#[test]
fn an_interrupted_baseline_push_starts_over_and_still_sweeps() {
    let (a, b, c) = (Peer::new("A"), Peer::new("B"), Peer::new("C"));
    a.put("stale", b"1");
    push(&a, &c).unwrap();
    a.store.borrow_mut().rm(&p("stale"), false).unwrap();
    a.store.borrow_mut().forget_remote("C").unwrap();
    push(&a, &b).unwrap();
    assert!(a.store.borrow_mut().prune_tombstones().unwrap().pruned >= 1);
    a.store.borrow_mut().register_remote("C").unwrap();
    // Written after the prune: a baseline's first batch passes the horizon,
    // so resuming from its cursor would no longer be a baseline.
    for i in 0..(2 * BATCH_ENTRIES + 10) {
        a.put(&format!("later/f{i:04}"), &noise(50, i as u64));
    }
    let (mut remote, faults) = faulty(&c, &a);
    faults.calls_left.set(Some(4));
    assert!(
        push_via(&a, "C", &mut remote).is_err(),
        "the push was cut after one batch"
    );
    let report = push(&a, &c).unwrap();
    assert!(report.rebaselined, "{report:?}");
    assert_eq!(c.tree(), a.tree());
    check(&[&a, &b, &c]);
}

#[test]
fn an_interrupted_baseline_pull_starts_over_and_still_sweeps() {
    let (a, b, c) = (Peer::new("A"), Peer::new("B"), Peer::new("C"));
    a.put("stale", b"1");
    pull(&c, &a).unwrap();
    a.store.borrow_mut().rm(&p("stale"), false).unwrap();
    push(&a, &b).unwrap();
    assert!(a.store.borrow_mut().prune_tombstones().unwrap().pruned >= 1);
    for i in 0..(2 * BATCH_ENTRIES + 10) {
        a.put(&format!("later/f{i:04}"), &noise(50, i as u64));
    }
    let (mut remote, faults) = faulty(&a, &c);
    faults.calls_left.set(Some(3));
    assert!(
        pull_via(&c, "A", &mut remote).is_err(),
        "the pull was cut after one batch"
    );
    let report = pull(&c, &a).unwrap();
    assert!(report.rebaselined, "{report:?}");
    assert_eq!(c.tree(), a.tree());
    check(&[&a, &b, &c]);
}
