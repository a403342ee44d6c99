//! Applying a batch of entries from a peer or an external writer
//! (`sync-protocol.md` rules 3–6 and 10), all in one transaction.

use rusqlite::{Connection, OptionalExtension, params};
use wsd_sync::{ApplyBatch, ApplyOutcome, Baseline, ChangeCursor, ChangeEntry, EntryState, SyncError, SyncPath};

use crate::fs::DEFAULT_DIR_MODE;
use crate::rows::{
    self, Mutation, Node, Row, ensure_manifest, get_row, has_chunk, live, put_node,
    subtree_bounds, tombstone_subtree,
};
use crate::sync::watermarks;
use crate::{Dofs, DofsError};

/// Who a batch comes from, as the rows it writes will remember it.
struct Source<'a> {
    remote: &'a str,
    /// `Some(remote)` for a peer: rows record it in `applied_from`, so they
    /// are not echoed back to it. `None` for an external writer.
    marker: Option<&'a str>,
    /// Our push cursor for that remote: a row beyond it (and not the
    /// remote's own state) is a local change the remote has not seen.
    pushed: ChangeCursor,
}

impl Source<'_> {
    fn is_unpushed(&self, row: &Row) -> Result<bool, DofsError> {
        if self.marker.is_none() || row.applied_from.as_deref() == self.marker {
            return Ok(false);
        }
        Ok(self.pushed.is_before(row.rev, &SyncPath::new(row.path.clone())?))
    }

    /// Whether any live strict descendant of `path` is an unpushed change.
    fn subtree_unpushed(&self, conn: &Connection, path: &str) -> Result<bool, DofsError> {
        let Some(marker) = self.marker else { return Ok(false) };
        let (lo, hi) = subtree_bounds(path);
        let mut stmt = conn.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM entries
             WHERE path >= ?1 AND path < ?2 AND kind <> 'delete'
               AND (applied_from IS NULL OR applied_from <> ?3)
               AND (rev > ?4 OR (rev = ?4 AND ?5 IS NOT NULL AND path > ?5)))",
        )?;
        Ok(stmt.query_row(
            params![
                lo,
                hi,
                marker,
                self.pushed.rev,
                self.pushed.path.as_ref().map(|p| p.as_str())
            ],
            |r| r.get(0),
        )?)
    }
}

enum Applied {
    Skipped,
    Changed { overwrote_local: bool },
}

impl Dofs {
    pub(crate) fn apply_inner(&mut self, batch: ApplyBatch<'_>) -> Result<ApplyOutcome, DofsError> {
        for e in batch.entries {
            e.validate()?;
        }
        let mut m = Mutation::begin(&mut self.conn)?;
        let pushed = match batch.sender {
            Some(_) => {
                watermarks::register(&m, batch.remote)?;
                watermarks::cursors(&m, batch.remote)?.map(|(p, _)| p).unwrap_or_default()
            }
            None => ChangeCursor::ZERO,
        };
        let src = Source {
            remote: batch.remote,
            marker: batch.sender.as_ref().map(|_| batch.remote),
            pushed,
        };
        if batch.baseline != Baseline::Off {
            restart_baseline_if_rewound(&m, batch.remote, batch.entries)?;
        }
        let mut outcome = ApplyOutcome::default();
        for e in batch.entries {
            match apply_entry(&mut m, &src, e)? {
                Applied::Skipped => outcome.skipped += 1,
                Applied::Changed { overwrote_local } => {
                    outcome.applied += 1;
                    if overwrote_local {
                        outcome.overwrote_local += 1;
                        tracing::warn!(remote = batch.remote, path = %e.path,
                            "applied entry overwrote a local change not yet pushed to that remote");
                    }
                }
            }
            if batch.baseline != Baseline::Off {
                mark(&m, batch.remote, e)?;
            }
        }
        if batch.baseline == Baseline::Sweep {
            outcome.overwrote_local += sweep(&mut m, &src)?;
        }
        if let Some(sender) = &batch.sender {
            let (_, stored) = watermarks::cursors(&m, batch.remote)?.unwrap_or_default();
            // Never backwards: a stalled older pull or a replayed batch must
            // not undo a newer checkpoint.
            if *sender > stored {
                watermarks::write_fetch_cursor(&m, batch.remote, sender)?;
            }
        }
        outcome.fetch_cursor =
            watermarks::cursors(&m, batch.remote)?.map(|(_, f)| f).unwrap_or_default();
        let stamped = m.stamped();
        m.commit()?;
        outcome.rev = rows::current_rev(&self.conn)?;
        if let Some(rev) = stamped {
            tracing::debug!(remote = batch.remote, rev, applied = outcome.applied,
                skipped = outcome.skipped, "applied batch");
        }
        Ok(outcome)
    }
}

fn apply_entry(m: &mut Mutation<'_>, src: &Source<'_>, e: &ChangeEntry) -> Result<Applied, DofsError> {
    let path = e.path.as_str();
    let current = get_row(m, path)?;
    let current_live = current.as_ref().filter(|r| r.node.is_live());
    if let EntryState::Delete = e.state {
        let Some(cur) = current_live else { return Ok(Applied::Skipped) };
        let overwrote = src.is_unpushed(cur)? || src.subtree_unpushed(m, path)?;
        let rev = m.rev()?;
        tombstone_subtree(m, path, true, rev, src.marker)?;
        return Ok(Applied::Changed { overwrote_local: overwrote });
    }
    let node = Node::from_state(&e.state);
    if src.marker.is_some()
        && let Some(cur) = current_live
        && cur.node.same_content(&node)
    {
        return Ok(Applied::Skipped);
    }
    // Every chunk must be held before anything changes; the whole batch
    // rolls back otherwise, so a half-linked file is never visible.
    for c in e.chunks() {
        if !has_chunk(m, &c.hash)? {
            return Err(SyncError::UnknownHash { hash: c.hash, path: Some(path.to_owned()) }.into());
        }
    }
    let mut overwrote = match &current {
        Some(cur) => src.is_unpushed(cur)?,
        None => false,
    };
    overwrote |= ensure_parent_dirs(m, src, &e.path)?;
    if let Some(cur) = current_live
        && cur.node.is_dir()
        && !node.is_dir()
    {
        // A kind change replaces the whole local subtree (rule 6).
        overwrote |= src.subtree_unpushed(m, path)?;
        let rev = m.rev()?;
        tombstone_subtree(m, path, false, rev, src.marker)?;
    }
    if let EntryState::File { chunks, .. } = &e.state {
        ensure_manifest(m, chunks)?;
    }
    let rev = m.rev()?;
    put_node(m, &e.path, rev, &node, src.marker)?;
    Ok(Applied::Changed { overwrote_local: overwrote })
}

/// Creates `path`'s missing ancestors (a child may stream before a parent
/// whose rev is newer, rule 3) and replaces a non-directory in the way.
/// Returns whether that replaced an unpushed local change.
///
/// Created parents are recorded as local writes, not as the remote's: if
/// the parent's own entry is not in this stream (it was older than our
/// cursor and we had since deleted it), our guess of its mode must flow
/// back to the remote for both sides to agree. When the parent's entry does
/// follow, it overwrites the guess and the marker.
fn ensure_parent_dirs(
    m: &mut Mutation<'_>,
    src: &Source<'_>,
    path: &SyncPath,
) -> Result<bool, DofsError> {
    let mut overwrote = false;
    for anc in path.ancestors() {
        let cur = live(m, anc.as_str())?;
        match &cur {
            Some(Row { node: Node::Dir { .. }, .. }) => continue,
            Some(row) => overwrote |= src.is_unpushed(row)?,
            None => {}
        }
        let rev = m.rev()?;
        let mtime = match cur.map(|r| r.node) {
            Some(Node::File { mtime, .. } | Node::Symlink { mtime, .. }) => mtime,
            _ => rows::now_ms(),
        };
        put_node(m, &anc, rev, &Node::Dir { mode: DEFAULT_DIR_MODE, mtime }, None)?;
    }
    Ok(overwrote)
}

/// A baseline that starts again (its first entry is not after the last one
/// marked) is a new attempt: marks from the abandoned one would spare paths
/// the sender no longer has.
fn restart_baseline_if_rewound(
    conn: &Connection,
    remote: &str,
    entries: &[ChangeEntry],
) -> Result<(), DofsError> {
    let Some(first) = entries.first() else { return Ok(()) };
    let progress: Option<(u64, String)> = conn
        .prepare_cached("SELECT rev, path FROM baseline_progress WHERE remote = ?1")?
        .query_row([remote], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some((rev, path)) = progress
        && !ChangeCursor::within(rev, SyncPath::new(path)?).is_before(first.rev, &first.path)
    {
        tracing::info!(remote, "baseline restarted; dropping the marks of the previous attempt");
        clear_baseline(conn, remote)?;
    }
    Ok(())
}

fn clear_baseline(conn: &Connection, remote: &str) -> Result<(), DofsError> {
    conn.prepare_cached("DELETE FROM baseline_marks WHERE remote = ?1")?.execute([remote])?;
    conn.prepare_cached("DELETE FROM baseline_progress WHERE remote = ?1")?.execute([remote])?;
    Ok(())
}

/// Remembers that the baseline listed `e.path`, and for a live entry its
/// ancestors too: they exist on the sender even if their own entry was
/// deferred out of this stream, and sweeping them would orphan `e.path`.
fn mark(conn: &Connection, remote: &str, e: &ChangeEntry) -> Result<(), DofsError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO baseline_marks (remote, path) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
    )?;
    stmt.execute(params![remote, e.path.as_str()])?;
    if e.state.kind().is_some() {
        for anc in e.path.ancestors() {
            stmt.execute(params![remote, anc.as_str()])?;
        }
    }
    conn.prepare_cached(
        "INSERT INTO baseline_progress (remote, rev, path) VALUES (?1, ?2, ?3)
         ON CONFLICT (remote) DO UPDATE SET rev = excluded.rev, path = excluded.path",
    )?
    .execute(params![remote, e.rev, e.path.as_str()])?;
    Ok(())
}

/// The end of a baseline: every live path it did not list is deleted (with
/// tombstones marked as the remote's), then the marks are forgotten.
/// Returns how many of the deleted paths were unpushed local changes.
fn sweep(m: &mut Mutation<'_>, src: &Source<'_>) -> Result<usize, DofsError> {
    const UNMARKED: &str = "kind <> 'delete' AND NOT EXISTS (
        SELECT 1 FROM baseline_marks bm WHERE bm.remote = ?1 AND bm.path = entries.path)";
    let victims: u64 = m.query_row(
        &format!("SELECT count(*) FROM entries WHERE {UNMARKED}"),
        [src.remote],
        |r| r.get(0),
    )?;
    let mut overwrote = 0usize;
    if victims > 0 {
        if let Some(marker) = src.marker {
            overwrote = m.query_row(
                &format!(
                    "SELECT count(*) FROM entries WHERE {UNMARKED}
                       AND (applied_from IS NULL OR applied_from <> ?2)
                       AND (rev > ?3 OR (rev = ?3 AND ?4 IS NOT NULL AND path > ?4))"
                ),
                params![
                    src.remote,
                    marker,
                    src.pushed.rev,
                    src.pushed.path.as_ref().map(|p| p.as_str())
                ],
                |r| r.get::<_, u64>(0),
            )? as usize;
        }
        let rev = m.rev()?;
        let swept = m.execute(
            &format!(
                "UPDATE entries SET kind = 'delete', rev = ?2, mode = NULL, mtime = NULL,
                        size = NULL, target = NULL, manifest = NULL, applied_from = ?3
                 WHERE {UNMARKED}"
            ),
            params![src.remote, rev, src.marker],
        )?;
        tracing::info!(remote = src.remote, swept, overwrote, "baseline sweep deleted unlisted paths");
    }
    clear_baseline(m, src.remote)?;
    Ok(overwrote)
}
