//! Per-remote watermarks, remote registration and tombstone pruning.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use wsd_sync::{ChangeCursor, Watermarks};

use crate::rows::{self, cursor_from};
use crate::{Dofs, DofsError};

/// What [`Dofs::prune_tombstones`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PruneOutcome {
    /// Tombstones deleted.
    pub pruned: usize,
    /// The prune horizon now: every tombstone at or below it is gone, and a
    /// reader whose cursor is older gets a full baseline.
    pub horizon: u64,
}

/// `(push cursor, fetch cursor)` of a registered remote.
pub(crate) fn cursors(
    conn: &Connection,
    remote: &str,
) -> Result<Option<(ChangeCursor, ChangeCursor)>, DofsError> {
    let mut stmt = conn.prepare_cached(
        "SELECT push_rev, push_path, fetch_rev, fetch_path FROM remotes WHERE name = ?1",
    )?;
    let raw: Option<(u64, Option<String>, u64, Option<String>)> = stmt
        .query_row([remote], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    raw.map(|(pr, pp, fr, fp)| Ok((cursor_from(pr, pp)?, cursor_from(fr, fp)?)))
        .transpose()
}

pub(crate) fn register(conn: &Connection, remote: &str) -> Result<(), DofsError> {
    conn.prepare_cached("INSERT INTO remotes (name) VALUES (?1) ON CONFLICT (name) DO NOTHING")?
        .execute([remote])?;
    Ok(())
}

pub(crate) fn write_fetch_cursor(
    conn: &Connection,
    remote: &str,
    c: &ChangeCursor,
) -> Result<(), DofsError> {
    register(conn, remote)?;
    conn.prepare_cached("UPDATE remotes SET fetch_rev = ?2, fetch_path = ?3 WHERE name = ?1")?
        .execute(params![remote, c.rev, c.path.as_ref().map(|p| p.as_str())])?;
    Ok(())
}

/// The remote no longer holds what we believed it did: forget which of our
/// paths hold its state, so echo suppression does not keep them from it.
fn forget_applied_markers(conn: &Connection, remote: &str) -> Result<usize, DofsError> {
    Ok(conn
        .prepare_cached("UPDATE entries SET applied_from = NULL WHERE applied_from = ?1")?
        .execute([remote])?)
}

impl Dofs {
    /// The watermarks kept for `remote` (zero cursors when unregistered).
    pub fn remote_watermarks(&self, remote: &str) -> Result<Watermarks, DofsError> {
        let (push_cursor, fetch_cursor) = cursors(&self.conn, remote)?.unwrap_or_default();
        Ok(Watermarks {
            current_rev: rows::current_rev(&self.conn)?,
            push_cursor,
            fetch_cursor,
        })
    }

    /// Registers `remote` with zero cursors (a no-op when registered). A
    /// registered remote holds back tombstone pruning until its push cursor
    /// passes them; applying a batch from a remote registers it too.
    pub fn register_remote(&mut self, remote: &str) -> Result<(), DofsError> {
        register(&self.conn, remote)
    }

    /// Drops `remote`'s watermarks, baseline marks and echo markers, so it
    /// no longer holds back pruning.
    pub fn forget_remote(&mut self, remote: &str) -> Result<(), DofsError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // The foreign key clears `entries.applied_from` (ON DELETE SET NULL).
        tx.execute("DELETE FROM remotes WHERE name = ?1", [remote])?;
        tx.execute("DELETE FROM baseline_marks WHERE remote = ?1", [remote])?;
        tx.execute("DELETE FROM baseline_progress WHERE remote = ?1", [remote])?;
        tx.commit()?;
        Ok(())
    }

    /// Registered remotes, in byte order.
    pub fn remotes(&self) -> Result<Vec<String>, DofsError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name FROM remotes ORDER BY name")?;
        let names = stmt
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        Ok(names)
    }

    /// Every tombstone at or below this rev has been pruned.
    pub fn prune_horizon(&self) -> Result<u64, DofsError> {
        rows::meta(&self.conn, "prune_horizon")
    }

    /// Deletes the tombstones every registered remote has acknowledged
    /// (rev <= the smallest complete push rev among them) and raises the
    /// prune horizon to match. With no registered remote nothing is pruned:
    /// nobody is known to have seen anything.
    pub fn prune_tombstones(&mut self) -> Result<PruneOutcome, DofsError> {
        self.prune(None)
    }

    /// [`Dofs::prune_tombstones`], never past `hold` (what other readers,
    /// such as durable change feeds, still need). With no registered remote
    /// the bound is `hold` alone.
    pub fn prune_tombstones_holding(&mut self, hold: u64) -> Result<PruneOutcome, DofsError> {
        self.prune(Some(hold))
    }

    fn prune(&mut self, hold: Option<u64>) -> Result<PruneOutcome, DofsError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let old = rows::meta(&tx, "prune_horizon")?;
        let acked: Option<u64> = {
            let mut stmt = tx.prepare("SELECT push_rev, push_path FROM remotes")?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get::<_, u64>(0)?, r.get::<_, Option<String>>(1)?))
            })?;
            let mut min: Option<u64> = None;
            for r in rows {
                let (rev, path) = r?;
                let complete = cursor_from(rev, path)?.complete_rev();
                min = Some(min.map_or(complete, |m| m.min(complete)));
            }
            min
        };
        let acked = match (acked, hold) {
            (Some(a), Some(h)) => Some(a.min(h)),
            (a, h) => a.or(h),
        };
        let Some(acked) = acked else {
            return Ok(PruneOutcome {
                pruned: 0,
                horizon: old,
            });
        };
        let horizon = old.max(acked);
        let pruned = tx.execute(
            "DELETE FROM entries WHERE kind = 'delete' AND rev <= ?1",
            [horizon],
        )?;
        rows::set_meta(&tx, "prune_horizon", horizon)?;
        tx.commit()?;
        if pruned > 0 {
            tracing::debug!(pruned, horizon, "pruned tombstones");
        }
        Ok(PruneOutcome { pruned, horizon })
    }

    pub(crate) fn set_push_cursor_inner(
        &mut self,
        remote: &str,
        cursor: &ChangeCursor,
    ) -> Result<(), DofsError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let current = rows::current_rev(&tx)?;
        if cursor.rev > current {
            return Err(DofsError::invalid(
                remote,
                "push cursor beyond this store's current rev",
            ));
        }
        let (old, _) = cursors(&tx, remote)?.unwrap_or_default();
        register(&tx, remote)?;
        tx.prepare_cached("UPDATE remotes SET push_rev = ?2, push_path = ?3 WHERE name = ?1")?
            .execute(params![
                remote,
                cursor.rev,
                cursor.path.as_ref().map(|p| p.as_str())
            ])?;
        if *cursor < old || *cursor == ChangeCursor::ZERO {
            // Also the start of every baseline push; only worth a warning
            // when it made us forget something. Zero is a reset even when
            // the cursor was already there (we had only pulled from it).
            let cleared = forget_applied_markers(&tx, remote)?;
            if cleared > 0 {
                tracing::warn!(remote, from = %old, to = %cursor, cleared,
                    "push cursor moved back: the remote lost state; its echo markers are cleared");
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub(crate) fn set_fetch_cursor_inner(
        &mut self,
        remote: &str,
        cursor: &ChangeCursor,
    ) -> Result<(), DofsError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (_, old) = cursors(&tx, remote)?.unwrap_or_default();
        write_fetch_cursor(&tx, remote, cursor)?;
        if *cursor < old || *cursor == ChangeCursor::ZERO {
            let cleared = forget_applied_markers(&tx, remote)?;
            tracing::warn!(remote, from = %old, to = %cursor, cleared,
                "fetch cursor moved back: the remote lost state; its echo markers are cleared");
        }
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use wsd_sync::{ApplyBatch, Baseline, ChangeCursor, ErrorCode, Store};

    use super::*;
    use crate::test_util::{p, put, store};

    fn tombstone_count(d: &Dofs) -> u64 {
        d.conn
            .query_row(
                "SELECT count(*) FROM entries WHERE kind = 'delete'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    }

    #[test]
    fn pruning_waits_for_every_registered_remote_and_raises_the_horizon() {
        let mut d = store();
        put(&mut d, "a", b"1"); // rev 1
        d.rm(&p("a"), false).unwrap(); // rev 2
        put(&mut d, "b", b"1"); // rev 3
        d.rm(&p("b"), false).unwrap(); // rev 4
        assert_eq!(
            d.prune_tombstones().unwrap(),
            PruneOutcome {
                pruned: 0,
                horizon: 0
            }
        );
        d.register_remote("R").unwrap();
        d.register_remote("S").unwrap();
        d.set_push_cursor("R", &ChangeCursor::at(4)).unwrap();
        assert_eq!(
            d.prune_tombstones().unwrap().pruned,
            0,
            "S has seen nothing"
        );
        d.set_push_cursor("S", &ChangeCursor::within(4, p("a")))
            .unwrap();
        assert_eq!(
            d.prune_tombstones().unwrap(),
            PruneOutcome {
                pruned: 1,
                horizon: 3
            }
        );
        assert_eq!(d.read_entry(&p("a")).unwrap(), None);
        assert_eq!(tombstone_count(&d), 1);
        d.forget_remote("S").unwrap();
        assert_eq!(
            d.prune_tombstones().unwrap(),
            PruneOutcome {
                pruned: 1,
                horizon: 4
            }
        );
        assert_eq!(d.prune_horizon().unwrap(), 4);
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_hold_bounds_pruning_with_or_without_registered_remotes() {
        let mut d = store();
        put(&mut d, "a", b"1"); // 1
        d.rm(&p("a"), false).unwrap(); // 2
        put(&mut d, "b", b"1"); // 3
        d.rm(&p("b"), false).unwrap(); // 4
        // No remote: the hold alone decides.
        assert_eq!(
            d.prune_tombstones_holding(3).unwrap(),
            PruneOutcome {
                pruned: 1,
                horizon: 3
            }
        );
        assert_eq!(tombstone_count(&d), 1);
        // A remote behind the hold wins.
        put(&mut d, "c", b"1"); // 5
        d.rm(&p("c"), false).unwrap(); // 6
        d.set_push_cursor("R", &ChangeCursor::at(4)).unwrap();
        assert_eq!(d.prune_tombstones_holding(10).unwrap().horizon, 4);
        assert_eq!(tombstone_count(&d), 1, "c's tombstone at 6 stays");
        // A hold behind the remote wins, and the horizon never goes back.
        d.set_push_cursor("R", &ChangeCursor::at(6)).unwrap();
        assert_eq!(d.prune_tombstones_holding(2).unwrap().horizon, 4);
        assert_eq!(tombstone_count(&d), 1);
        d.check_integrity().unwrap();
    }

    #[test]
    fn every_store_has_its_own_incarnation_kept_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.dofs");
        let first = Dofs::open(&path).unwrap().incarnation().unwrap();
        assert_eq!(Dofs::open(&path).unwrap().incarnation().unwrap(), first);
        let other = Dofs::open(dir.path().join("b.dofs")).unwrap();
        assert_ne!(other.incarnation().unwrap(), first);
    }

    #[test]
    fn the_commit_listener_hears_each_committed_mutation() {
        let mut d = store();
        let heard = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = heard.clone();
        d.on_commit(move || {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
        put(&mut d, "a", b"1");
        put(&mut d, "b", b"1");
        assert!(heard.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    }

    #[test]
    fn a_reader_older_than_the_prune_horizon_is_told_to_take_a_baseline() {
        let mut d = store();
        put(&mut d, "a", b"1");
        d.rm(&p("a"), false).unwrap();
        put(&mut d, "b", b"1");
        assert!(
            !d.open_changes(&ChangeCursor::ZERO).unwrap().baseline,
            "nothing pruned yet"
        );
        d.set_push_cursor("R", &ChangeCursor::at(2)).unwrap();
        d.prune_tombstones().unwrap();
        let window = d.open_changes(&ChangeCursor::at(1)).unwrap();
        assert_eq!(window.through, ChangeCursor::at(3));
        assert!(window.baseline);
        assert!(d.open_changes(&ChangeCursor::ZERO).unwrap().baseline);
        assert!(
            d.open_changes(&ChangeCursor::within(2, p("a")))
                .unwrap()
                .baseline
        );
        assert!(!d.open_changes(&ChangeCursor::at(2)).unwrap().baseline);
    }

    #[test]
    fn a_push_cursor_beyond_the_current_rev_is_einval() {
        let mut d = store();
        let err = d.set_push_cursor("R", &ChangeCursor::at(1)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Invalid);
    }

    #[test]
    fn a_cursor_moving_back_or_a_forgotten_remote_clears_its_echo_markers() {
        let marked = |d: &Dofs| -> u64 {
            d.conn
                .query_row(
                    "SELECT count(*) FROM entries WHERE applied_from = 'R'",
                    [],
                    |r| r.get(0),
                )
                .unwrap()
        };
        let mut d = store();
        let dir = |path: &str| wsd_sync::ChangeEntry {
            rev: 1,
            path: p(path),
            state: wsd_sync::EntryState::Dir {
                mode: 0o755,
                mtime: 0,
            },
        };
        let apply = |d: &mut Dofs, path: &str| {
            d.apply(ApplyBatch {
                remote: "R",
                sender: Some(ChangeCursor::at(5)),
                entries: &[dir(path)],
                baseline: Baseline::Off,
                ignore: &wsd_sync::IgnoreRules::none(),
            })
            .unwrap();
        };
        apply(&mut d, "a");
        assert_eq!(marked(&d), 1);
        d.set_fetch_cursor("R", &ChangeCursor::at(9)).unwrap();
        assert_eq!(marked(&d), 1, "forward moves keep the markers");
        d.set_fetch_cursor("R", &ChangeCursor::ZERO).unwrap();
        assert_eq!(marked(&d), 0);
        apply(&mut d, "b");
        d.set_push_cursor("R", &ChangeCursor::at(2)).unwrap();
        d.set_push_cursor("R", &ChangeCursor::ZERO).unwrap();
        assert_eq!(marked(&d), 0);
        apply(&mut d, "c");
        assert_eq!(marked(&d), 1);
        d.forget_remote("R").unwrap();
        assert_eq!(marked(&d), 0);
        assert!(d.remotes().unwrap().is_empty());
        d.check_integrity().unwrap();
    }
}
