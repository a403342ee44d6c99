//! The [`Store`] contract, one rule per function. Each takes a factory of
//! fresh stores; [`crate::store_conformance_tests!`] turns them into tests.

use std::collections::BTreeMap;

use super::{LocalOp, Node, StoreUnderTest, live_tree, rows, stage_file};
use crate::{
    ApplyBatch, ApplyOutcome, Baseline, ChangeCursor, ChangeEntry, ChangesQuery, EntryState,
    ErrorCode, Hash, IgnoreRules, Object, Store, SyncPath, chunk,
};

const R: &str = "R";

fn p(s: &str) -> SyncPath {
    SyncPath::new(s).unwrap()
}

fn write<S: StoreUnderTest>(s: &mut S, path: &str, bytes: &[u8]) {
    s.local(&LocalOp::Write {
        path: path.into(),
        bytes: bytes.to_vec(),
        mode: 0o644,
    })
    .unwrap();
    // Stores that find local changes by looking settle here.
    s.open_changes(&ChangeCursor::ZERO).unwrap();
}

fn remove<S: StoreUnderTest>(s: &mut S, path: &str) {
    s.local(&LocalOp::Remove { path: path.into() }).unwrap();
    s.open_changes(&ChangeCursor::ZERO).unwrap();
}

/// A file entry from a peer, its chunks staged.
fn peer_file<S: Store>(s: &mut S, path: &str, bytes: &[u8], rev: u64) -> ChangeEntry {
    ChangeEntry {
        rev,
        path: p(path),
        state: stage_file(s, bytes, 0o644).unwrap(),
    }
}

fn apply<S: Store>(
    s: &mut S,
    sender: ChangeCursor,
    entries: &[ChangeEntry],
    baseline: Baseline,
) -> ApplyOutcome {
    s.apply(ApplyBatch {
        remote: R,
        sender: Some(sender),
        entries,
        baseline,
        ignore: &IgnoreRules::none(),
    })
    .unwrap()
}

fn paths_for<S: Store>(s: &mut S, exclude: Option<&str>) -> Vec<String> {
    let through = s.open_changes(&ChangeCursor::ZERO).unwrap().through;
    s.changes(ChangesQuery {
        after: &ChangeCursor::ZERO,
        through: &through,
        ignore: &IgnoreRules::none(),
        exclude_applied_from: exclude,
        limit: 1000,
    })
    .unwrap()
    .into_iter()
    .map(|e| e.path.into_string())
    .collect()
}

fn live<S: Store>(s: &mut S) -> BTreeMap<String, Node> {
    live_tree(s).unwrap()
}

pub fn first_write_stamps_rev_one_and_reads_back<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    assert_eq!(s.current_rev().unwrap(), 0);
    assert_eq!(s.watermarks(R).unwrap(), Default::default());
    write(&mut s, "a/f", b"hello");
    assert_eq!(s.current_rev().unwrap(), 1, "one write, one rev");
    let expected: BTreeMap<String, Node> = [
        ("a".to_owned(), Node::Dir { mode: 0o755 }),
        ("a/f".to_owned(), Node::file(b"hello", 0o644)),
    ]
    .into();
    assert_eq!(live(&mut s), expected);
    let hash = Hash::of(b"hello");
    assert_eq!(s.has_objects(&[hash]).unwrap(), vec![hash]);
    assert_eq!(s.read_object(&hash).unwrap(), b"hello");
}

pub fn changes_are_coalesced_and_ordered_by_rev_then_path<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    for i in 0..3u8 {
        write(&mut s, "f", &[i]);
    }
    write(&mut s, "b", b"1");
    write(&mut s, "a", b"1");
    let all = rows(&mut s).unwrap();
    let paths: Vec<&str> = all.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["f", "b", "a"], "one entry per path, by rev");
    assert!(
        all.windows(2)
            .all(|w| (w[0].rev, &w[0].path) < (w[1].rev, &w[1].path))
    );
    assert_eq!(
        all[0].state,
        EntryState::File {
            mode: 0o644,
            mtime: match all[0].state {
                EntryState::File { mtime, .. } => mtime,
                _ => unreachable!(),
            },
            size: 1,
            chunks: chunk::chunk_slice(&[2])
                .into_iter()
                .map(|(_, c)| c)
                .collect(),
        }
    );
}

pub fn a_path_rewritten_after_the_window_opened_is_deferred<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    write(&mut s, "a", b"1");
    write(&mut s, "b", b"1");
    let window = s.open_changes(&ChangeCursor::ZERO).unwrap();
    write(&mut s, "a", b"2");
    let page = s
        .changes(ChangesQuery {
            after: &ChangeCursor::ZERO,
            through: &window.through,
            ignore: &IgnoreRules::none(),
            exclude_applied_from: None,
            limit: 10,
        })
        .unwrap();
    let paths: Vec<&str> = page.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["b"]);
}

pub fn a_batch_with_a_missing_chunk_changes_nothing<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    let ok = peer_file(&mut s, "ok", b"staged", 1);
    let missing = ChangeEntry {
        rev: 1,
        path: p("missing"),
        state: EntryState::File {
            mode: 0o644,
            mtime: 1,
            size: 5,
            chunks: chunk::chunk_slice(b"never")
                .into_iter()
                .map(|(_, c)| c)
                .collect(),
        },
    };
    let err = s
        .apply(ApplyBatch {
            remote: R,
            sender: Some(ChangeCursor::at(1)),
            entries: &[ok, missing],
            baseline: Baseline::Off,
            ignore: &IgnoreRules::none(),
        })
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::UnknownHash, "{err}");
    assert_eq!(s.current_rev().unwrap(), 0);
    assert!(live(&mut s).is_empty());
    assert_eq!(s.watermarks(R).unwrap().fetch_cursor, ChangeCursor::ZERO);
}

pub fn a_bad_object_is_refused_and_not_stored<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    let claimed = Hash::of(b"claimed");
    let err = s
        .stage_objects(&[Object {
            hash: claimed,
            bytes: b"other".to_vec(),
        }])
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Protocol, "{err}");
    assert!(s.has_objects(&[claimed]).unwrap().is_empty());
    assert_eq!(
        s.read_object(&claimed).unwrap_err().code(),
        ErrorCode::UnknownHash
    );
}

pub fn an_identical_entry_from_a_peer_is_skipped<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    write(&mut s, "f", b"same");
    let rev = s.current_rev().unwrap();
    let e = peer_file(&mut s, "f", b"same", 7);
    let out = apply(&mut s, ChangeCursor::at(7), &[e], Baseline::Off);
    assert_eq!((out.applied, out.skipped), (0, 1));
    assert_eq!(s.current_rev().unwrap(), rev, "a skip stamps no rev");
    assert_eq!(out.fetch_cursor, ChangeCursor::at(7));
}

pub fn the_fetch_cursor_never_moves_backwards_by_apply<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    let a = peer_file(&mut s, "a", b"1", 5);
    apply(&mut s, ChangeCursor::at(5), &[a], Baseline::Off);
    let b = peer_file(&mut s, "b", b"1", 3);
    let out = apply(&mut s, ChangeCursor::at(3), &[b], Baseline::Off);
    assert_eq!(out.fetch_cursor, ChangeCursor::at(5));
    assert_eq!(s.watermarks(R).unwrap().fetch_cursor, ChangeCursor::at(5));
}

pub fn a_push_cursor_beyond_the_current_rev_is_einval<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    let err = s.set_push_cursor(R, &ChangeCursor::at(1)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Invalid, "{err}");
    assert_eq!(s.watermarks(R).unwrap().push_cursor, ChangeCursor::ZERO);
    write(&mut s, "f", b"1");
    s.set_push_cursor(R, &ChangeCursor::at(1)).unwrap();
    assert_eq!(s.watermarks(R).unwrap().push_rev(), 1);
}

pub fn applied_paths_are_not_echoed_to_their_remote<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    let e = peer_file(&mut s, "from-r", b"1", 1);
    apply(&mut s, ChangeCursor::at(1), &[e], Baseline::Off);
    write(&mut s, "mine", b"1");
    assert_eq!(paths_for(&mut s, Some(R)), ["mine"]);
    assert_eq!(paths_for(&mut s, Some("other")), ["from-r", "mine"]);
    // A local change of an applied path makes it ours again.
    write(&mut s, "from-r", b"2");
    assert_eq!(paths_for(&mut s, Some(R)), ["mine", "from-r"]);
}

pub fn a_push_cursor_rewind_clears_the_echo_markers<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    let e = peer_file(&mut s, "pulled", b"1", 1);
    apply(&mut s, ChangeCursor::at(1), &[e], Baseline::Off);
    write(&mut s, "mine", b"1");
    let rev = s.current_rev().unwrap();
    s.set_push_cursor(R, &ChangeCursor::at(rev)).unwrap();
    assert_eq!(paths_for(&mut s, Some(R)), ["mine"]);
    // R lost its state: what we pulled from it must go back with the rest.
    s.set_push_cursor(R, &ChangeCursor::ZERO).unwrap();
    assert_eq!(paths_for(&mut s, Some(R)), ["pulled", "mine"]);
}

pub fn a_fetch_cursor_rewind_clears_the_echo_markers<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    let e = peer_file(&mut s, "pulled", b"1", 4);
    apply(&mut s, ChangeCursor::at(4), &[e], Baseline::Off);
    s.set_fetch_cursor(R, &ChangeCursor::at(9)).unwrap();
    assert!(paths_for(&mut s, Some(R)).is_empty(), "forward keeps them");
    s.set_fetch_cursor(R, &ChangeCursor::ZERO).unwrap();
    assert_eq!(paths_for(&mut s, Some(R)), ["pulled"]);
    assert_eq!(s.watermarks(R).unwrap().fetch_cursor, ChangeCursor::ZERO);
}

pub fn a_sweep_deletes_unlisted_paths_and_keeps_listed_ones<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    write(&mut s, "x", b"x");
    write(&mut s, "y", b"y");
    let x = peer_file(&mut s, "x", b"x", 3);
    apply(&mut s, ChangeCursor::ZERO, &[x], Baseline::Mark);
    assert_eq!(live(&mut s).len(), 2, "marking deletes nothing");
    apply(&mut s, ChangeCursor::at(3), &[], Baseline::Sweep);
    let tree = live(&mut s);
    assert_eq!(tree.keys().collect::<Vec<_>>(), ["x"]);
    assert_eq!(s.watermarks(R).unwrap().fetch_cursor, ChangeCursor::at(3));
}

pub fn a_sweep_keeps_a_listed_file_whose_parent_was_not_listed<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    write(&mut s, "d/f", b"f");
    write(&mut s, "d/g", b"g");
    // The sender's `d` is newer than the stream's window: only `d/f` came.
    let df = peer_file(&mut s, "d/f", b"f", 2);
    apply(&mut s, ChangeCursor::ZERO, &[df], Baseline::Mark);
    apply(&mut s, ChangeCursor::at(2), &[], Baseline::Sweep);
    let tree = live(&mut s);
    assert_eq!(tree.keys().collect::<Vec<_>>(), ["d", "d/f"]);
}

pub fn a_sweep_spares_paths_the_senders_exclusions_match<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    write(&mut s, "keep", b"k");
    write(&mut s, "gone", b"g");
    write(&mut s, "target/out.o", b"o");
    write(&mut s, "logs/today.log", b"l");
    let keep = peer_file(&mut s, "keep", b"k", 2);
    apply(&mut s, ChangeCursor::ZERO, &[keep], Baseline::Mark);
    let ignore = IgnoreRules::new(&["target/", "*.log"]).unwrap();
    s.apply(ApplyBatch {
        remote: R,
        sender: Some(ChangeCursor::at(2)),
        entries: &[],
        baseline: Baseline::Sweep,
        ignore: &ignore,
    })
    .unwrap();
    let tree = live(&mut s);
    // `logs` is not excluded itself, but sweeping it would take the
    // excluded file below it along.
    assert_eq!(
        tree.keys().collect::<Vec<_>>(),
        ["keep", "logs", "logs/today.log", "target", "target/out.o"]
    );
}

pub fn a_delete_of_a_directory_spares_what_the_senders_exclusions_match<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    for path in [
        "d/app.log",
        "d/src/main.rs",
        "d/cache/x.log",
        "d/mixed/y.txt",
        "d/mixed/z.log",
        "other/w.log",
    ] {
        write(&mut s, path, path.as_bytes());
    }
    let ignore = IgnoreRules::new(&["*.log"]).unwrap();
    let del = |path: &str| ChangeEntry {
        rev: 2,
        path: p(path),
        state: EntryState::Delete,
    };
    s.apply(ApplyBatch {
        remote: R,
        sender: Some(ChangeCursor::at(2)),
        entries: &[del("d"), del("other")],
        baseline: Baseline::Off,
        ignore: &ignore,
    })
    .unwrap();
    let tree = live(&mut s);
    assert_eq!(
        tree.keys().collect::<Vec<_>>(),
        [
            "d",
            "d/app.log",
            "d/cache",
            "d/cache/x.log",
            "d/mixed",
            "d/mixed/z.log",
            "other",
            "other/w.log"
        ]
    );
}

pub fn a_rewound_baseline_restarts_its_marks<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    write(&mut s, "a", b"a");
    write(&mut s, "b", b"b");
    let a = peer_file(&mut s, "a", b"a", 5);
    apply(&mut s, ChangeCursor::ZERO, &[a], Baseline::Mark);
    // The sender starts over (its first entry is not after the last one
    // marked) and no longer lists `a`.
    let b = peer_file(&mut s, "b", b"b", 1);
    apply(&mut s, ChangeCursor::ZERO, &[b], Baseline::Mark);
    apply(&mut s, ChangeCursor::at(6), &[], Baseline::Sweep);
    assert_eq!(live(&mut s).keys().collect::<Vec<_>>(), ["b"]);
}

pub fn a_remote_due_a_baseline_gets_everything_back<S: StoreUnderTest>(mut f: impl FnMut() -> S) {
    let mut s = f();
    write(&mut s, "gone", b"1");
    remove(&mut s, "gone");
    write(&mut s, "kept", b"1");
    let rev = s.current_rev().unwrap();
    s.set_push_cursor(R, &ChangeCursor::at(rev)).unwrap();
    if !s.prune().unwrap() {
        // Never prunes, so it never owes anyone a baseline.
        assert!(!s.open_changes(&ChangeCursor::ZERO).unwrap().baseline);
        return;
    }
    assert!(s.open_changes(&ChangeCursor::ZERO).unwrap().baseline);
    assert!(!s.open_changes(&ChangeCursor::at(rev)).unwrap().baseline);
    // R lost its state; before our baseline push reaches it, it sends us a
    // file. Our baseline must list it, or R's sweep deletes it there.
    s.set_push_cursor(R, &ChangeCursor::ZERO).unwrap();
    let e = peer_file(&mut s, "from-r", b"1", 1);
    apply(&mut s, ChangeCursor::at(1), &[e], Baseline::Off);
    assert_eq!(paths_for(&mut s, Some(R)), ["kept", "from-r"]);
}

pub fn read_entry_gives_live_then_tombstone_then_nothing<S: StoreUnderTest>(
    mut f: impl FnMut() -> S,
) {
    let mut s = f();
    write(&mut s, "f", b"1");
    let e = s.read_entry(&p("f")).unwrap().unwrap();
    assert_eq!(Node::of(&e.state), Some(Node::file(b"1", 0o644)));
    remove(&mut s, "f");
    let e = s.read_entry(&p("f")).unwrap().unwrap();
    assert_eq!(e.state, EntryState::Delete);
    assert_eq!(e.rev, s.current_rev().unwrap());
    assert_eq!(s.read_entry(&p("never")).unwrap(), None);
}
