//! `wsd serve` prunes tombstones on its own schedule, once the peer that
//! pulls from it has acknowledged them, and never before.

use std::time::{Duration, Instant};

use wsd_tests::hub::{Hub, InProcessDaemon, block_on_local, p};

/// Tombstones in the daemon's index.
fn tombstones(state: &std::path::Path) -> i64 {
    let db = rusqlite::Connection::open(state.join(wsd::store::INDEX_FILE)).unwrap();
    db.query_row("SELECT count(*) FROM nodes WHERE kind = 3", [], |r| {
        r.get(0)
    })
    .unwrap()
}

#[test]
fn the_daemon_prunes_acknowledged_tombstones_on_its_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    let (served, state) = (tmp.path().join("served"), tmp.path().join("state"));
    let daemon = InProcessDaemon::start_with(&served, &state, Some(Duration::from_millis(20)));
    let mut hub = Hub::open(&tmp.path().join("authority.dofs"), &daemon.addr);
    block_on_local(async {
        hub.put("keep.txt", b"k", 0o644);
        hub.put("gone.txt", b"g", 0o644);
        hub.converge().await.unwrap();
        // Deleted in the workspace: a tombstone the peer has not pulled yet.
        std::fs::remove_file(served.canonicalize().unwrap().join("gone.txt")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while tombstones(&state) == 0 {
            assert!(Instant::now() < deadline, "the delete was never indexed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Many ticks pass: the peer has not seen the delete, so it stays.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(tombstones(&state), 1, "pruned before the peer saw it");
        hub.converge().await.unwrap();
        assert!(
            hub.dofs.stat(&p("gone.txt")).is_err(),
            "the peer pulled the delete"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while tombstones(&state) > 0 {
            assert!(
                Instant::now() < deadline,
                "the acknowledged tombstone was never pruned"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    drop(daemon);
}
