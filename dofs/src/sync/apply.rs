//! Applying a batch of entries from a peer or an external writer
//! (sync rules 3–6, 10, 11 and 13 in sync/DESIGN.md), all in one
//! transaction.

use rusqlite::{Connection, OptionalExtension, params};
use wsd_sync::plan::{self, Disk, Plan};
use wsd_sync::{
    ApplyBatch, ApplyOutcome, Baseline, ChangeCursor, ChangeEntry, EntryState, SyncError, SyncPath,
};

use crate::rows::{
    self, Mutation, Node, Row, ensure_manifest, get_row, put_node, subtree_bounds,
    tombstone_subtree,
};
use crate::sync::watermarks;
use crate::{Dofs, DofsError};

/// Who a batch comes from, as the rows it writes will remember it.
struct Source<'a> {
    remote: &'a str,
    /// The sender's exclusions: a delete spares what they match.
    ignore: &'a wsd_sync::IgnoreRules,
    /// `Some(remote)` for a peer (rules 4 and 6 apply), `None` for an
    /// external writer.
    peer: Option<&'a str>,
    /// What written rows record in `applied_from`, so they are not echoed
    /// back: the peer, unless that peer is due a baseline from us (see
    /// `apply_inner`); `None` for an external writer.
    marker: Option<&'a str>,
    /// Our push cursor for that remote: a row beyond it (and not the
    /// remote's own state) is a local change the remote has not seen.
    pushed: ChangeCursor,
}

impl Source<'_> {
    /// The batch as [`plan`] sees it: no disk, no conflict copies, parents
    /// created as local writes, a subtree replaced whole.
    fn plan_options(&self) -> plan::Options<'_> {
        plan::Options {
            peer: self.peer.is_some(),
            push_cursor: self.peer.map(|_| &self.pushed),
            conflict_copies: false,
            ignore: self.ignore,
            implied_dirs: plan::ImpliedDirs::Local,
            refuse_replacing_excluded: false,
        }
    }

    /// What the plan is told of a row: `entry`, when given, is what it is
    /// compared with (rule 4).
    fn index_row(&self, row: &Row, entry: Option<&Node>) -> plan::IndexRow {
        plan::IndexRow {
            kind: row.node.kind(),
            mode: match &row.node {
                Node::File { mode, .. } | Node::Dir { mode, .. } | Node::Symlink { mode, .. } => {
                    *mode
                }
                Node::Deleted => 0,
            },
            rev: row.rev,
            from_sender: row.applied_from.as_deref() == Some(self.remote),
            matches_entry: entry.is_some_and(|n| row.node.is_live() && row.node.same_content(n)),
        }
    }

    /// Whether any live strict descendant of `path` is an unpushed change.
    fn subtree_unpushed(&self, conn: &Connection, path: &str) -> Result<bool, DofsError> {
        let Some(peer) = self.peer else {
            return Ok(false);
        };
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
                peer,
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
        // Staged chunks' rows go in first (the entries may name them); the
        // transaction commits only once their uploads succeeded, which
        // they do meanwhile.
        let staged = std::mem::take(&mut self.staged);
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        for uploading in &staged {
            m.chunks().index_stored(&uploading.rows)?;
        }
        let pushed = match batch.sender {
            Some(_) => {
                watermarks::register(&m, batch.remote)?;
                watermarks::cursors(&m, batch.remote)?
                    .map(|(p, _)| p)
                    .unwrap_or_default()
            }
            None => ChangeCursor::ZERO,
        };
        let peer = batch.sender.as_ref().map(|_| batch.remote);
        // A peer whose push cursor is below our prune horizon will get a
        // sweeping baseline from us; every live path must be listed in it,
        // so nothing may be hidden from it as "its own". (A cursor only
        // gets there by registering late or by a reset, never by pruning.)
        let horizon = rows::meta(&m, "prune_horizon")?;
        let due_baseline = horizon > 0 && pushed.complete_rev() < horizon;
        let src = Source {
            remote: batch.remote,
            ignore: batch.ignore,
            peer,
            marker: if due_baseline { None } else { peer },
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
            if !batch.ignore.is_empty() {
                mark_ignored(&m, batch.remote, batch.ignore)?;
            }
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
        outcome.fetch_cursor = watermarks::cursors(&m, batch.remote)?
            .map(|(_, f)| f)
            .unwrap_or_default();
        for uploading in staged {
            uploading.pending.finish()?;
        }
        let stamped = m.stamped();
        m.commit()?;
        outcome.rev = rows::current_rev(&self.conn)?;
        if let Some(rev) = stamped {
            tracing::debug!(
                remote = batch.remote,
                rev,
                applied = outcome.applied,
                skipped = outcome.skipped,
                "applied batch"
            );
        }
        Ok(outcome)
    }
}

/// The live entries strictly below `path`, in path order, with whether
/// each is a directory.
fn live_below(conn: &Connection, path: &str) -> Result<Vec<(SyncPath, bool)>, DofsError> {
    let rows: Vec<(String, bool)> = conn
        .prepare_cached(
            "SELECT path, kind = 'dir' FROM entries
             WHERE path >= ?1 AND path < ?2 AND kind <> 'delete' ORDER BY path",
        )?
        .query_map(params![format!("{path}/"), format!("{path}0")], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    rows.into_iter()
        .map(|(p, d)| Ok((SyncPath::new(p)?, d)))
        .collect()
}

/// The rows below a path, as the plan asks.
struct Subtree<'s> {
    conn: &'s Connection,
    src: &'s Source<'s>,
    path: &'s str,
}

impl plan::Below for Subtree<'_> {
    type Error = DofsError;
    fn live(&mut self) -> Result<Vec<(SyncPath, bool)>, DofsError> {
        live_below(self.conn, self.path)
    }
    fn unpushed(&mut self) -> Result<bool, DofsError> {
        self.src.subtree_unpushed(self.conn, self.path)
    }
    /// No disk beside the rows: nothing below is unsettled.
    fn unsettled(&mut self) -> Result<bool, DofsError> {
        Ok(false)
    }
}

/// Applies one entry as [`plan::entry`] decides.
fn apply_entry(
    m: &mut Mutation<'_>,
    src: &Source<'_>,
    e: &ChangeEntry,
) -> Result<Applied, DofsError> {
    let path = e.path.as_str();
    let node = Node::from_state(&e.state);
    let row = get_row(m, path)?.map(|r| src.index_row(&r, Some(&node)));
    let planned = plan::entry(
        e,
        row.as_ref(),
        Disk::as_indexed(row.as_ref()),
        &src.plan_options(),
        &mut Subtree { conn: m, src, path },
    )?;
    let write = match planned {
        Plan::Skip => return Ok(Applied::Skipped),
        Plan::DeleteSparing(tops) => {
            let mut overwrote_local = false;
            for top in tops {
                let del = ChangeEntry {
                    rev: e.rev,
                    path: top,
                    state: EntryState::Delete,
                };
                if let Applied::Changed { overwrote_local: o } = apply_entry(m, src, &del)? {
                    overwrote_local |= o;
                }
            }
            return Ok(Applied::Changed { overwrote_local });
        }
        Plan::Write(w) => w,
    };
    if let EntryState::Delete = e.state {
        let rev = m.rev()?;
        tombstone_subtree(m, path, true, rev, src.marker)?;
        return Ok(Applied::Changed {
            overwrote_local: write.overwrites_local,
        });
    }
    // Every chunk must be held before anything changes; the whole batch
    // rolls back otherwise, so a half-linked file is never visible.
    for c in e.chunks() {
        if !m.chunks().holds(&c.hash)? {
            return Err(SyncError::UnknownHash {
                hash: c.hash,
                path: Some(path.to_owned()),
            }
            .into());
        }
    }
    let overwrote = ensure_parent_dirs(m, src, &e.path)? | write.overwrites_local;
    if write.replaced_dir.is_some() {
        // A kind change replaces the whole local subtree (rule 6).
        let rev = m.rev()?;
        tombstone_subtree(m, path, false, rev, src.marker)?;
    }
    if let EntryState::File { chunks, .. } = &e.state {
        ensure_manifest(m, chunks)?;
    }
    let rev = m.rev()?;
    put_node(m, &e.path, rev, &node, src.marker)?;
    Ok(Applied::Changed {
        overwrote_local: overwrote,
    })
}

/// Creates `path`'s missing ancestors (a child may stream before a parent
/// whose rev is newer, rule 3) and replaces a non-directory in the way, as
/// [`plan::implied_dir`] decides. Returns whether that replaced an unpushed
/// local change.
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
        let cur = get_row(m, anc.as_str())?;
        let live = cur.as_ref().filter(|r| r.node.is_live());
        if live.is_some_and(|r| r.node.is_dir()) {
            continue;
        }
        let row = cur.as_ref().map(|r| src.index_row(r, None));
        let implied = plan::implied_dir(
            &anc,
            row.as_ref(),
            Disk::as_indexed(row.as_ref()),
            &src.plan_options(),
        );
        overwrote |= implied.overwrites_local;
        let rev = m.rev()?;
        let mtime = match live.map(|r| &r.node) {
            Some(Node::File { mtime, .. } | Node::Symlink { mtime, .. }) => *mtime,
            _ => rows::now_ms(),
        };
        let marker = match implied.origin {
            plan::Origin::Local => None,
            plan::Origin::Sender => src.marker,
        };
        put_node(
            m,
            &anc,
            rev,
            &Node::Dir {
                mode: implied.mode,
                mtime,
            },
            marker,
        )?;
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
    let Some(first) = entries.first() else {
        return Ok(());
    };
    let progress: Option<(u64, String)> = conn
        .prepare_cached("SELECT rev, path FROM baseline_progress WHERE remote = ?1")?
        .query_row([remote], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some((rev, path)) = progress
        && !ChangeCursor::within(rev, SyncPath::new(path)?).is_before(first.rev, &first.path)
    {
        tracing::info!(
            remote,
            "baseline restarted; dropping the marks of the previous attempt"
        );
        clear_baseline(conn, remote)?;
    }
    Ok(())
}

fn clear_baseline(conn: &Connection, remote: &str) -> Result<(), DofsError> {
    conn.prepare_cached("DELETE FROM baseline_marks WHERE remote = ?1")?
        .execute([remote])?;
    conn.prepare_cached("DELETE FROM baseline_progress WHERE remote = ?1")?
        .execute([remote])?;
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

/// Marks every live path the sender's exclusions match, and its ancestors,
/// so the sweep spares them: the sender never lists what it excludes.
fn mark_ignored(
    conn: &Connection,
    remote: &str,
    ignore: &wsd_sync::IgnoreRules,
) -> Result<(), DofsError> {
    let live: Vec<(String, bool)> = conn
        .prepare_cached("SELECT path, kind = 'dir' FROM entries WHERE kind <> 'delete'")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut ins = conn.prepare_cached(
        "INSERT INTO baseline_marks (remote, path) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
    )?;
    for (p, is_dir) in live {
        let path = SyncPath::new(p)?;
        if ignore.is_ignored(&path, is_dir) {
            ins.execute(params![remote, path.as_str()])?;
            for anc in path.ancestors() {
                ins.execute(params![remote, anc.as_str()])?;
            }
        }
    }
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
        if let Some(peer) = src.peer {
            overwrote = m.query_row(
                &format!(
                    "SELECT count(*) FROM entries WHERE {UNMARKED}
                       AND (applied_from IS NULL OR applied_from <> ?2)
                       AND (rev > ?3 OR (rev = ?3 AND ?4 IS NOT NULL AND path > ?4))"
                ),
                params![
                    src.remote,
                    peer,
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
                        size = NULL, target = NULL, manifest = NULL, chunk = NULL,
                        applied_from = ?3
                 WHERE {UNMARKED}"
            ),
            params![src.remote, rev, src.marker],
        )?;
        tracing::info!(
            remote = src.remote,
            swept,
            overwrote,
            "baseline sweep deleted unlisted paths"
        );
    }
    clear_baseline(m, src.remote)?;
    Ok(overwrote)
}

#[cfg(test)]
mod tests {
    use wsd_sync::{
        ApplyBatch, ApplyOutcome, Baseline, ChangeCursor, ChangeEntry, ChangesQuery, ChunkRef,
        EntryState, ErrorCode, Hash, IgnoreRules, Kind, Object, Store, SyncError, chunk,
    };

    use crate::Dofs;
    use crate::test_util::{p, put, store};

    fn file(d: &mut Dofs, path: &str, bytes: &[u8], mode: u32, rev: u64) -> ChangeEntry {
        let chunks: Vec<ChunkRef> = chunk::chunk_slice(bytes)
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        let objects: Vec<Object> = chunk::chunk_slice(bytes)
            .into_iter()
            .map(|(off, c)| Object {
                hash: c.hash,
                bytes: bytes[off..off + c.size as usize].to_vec(),
            })
            .collect();
        d.stage_objects(&objects).unwrap();
        let size = bytes.len() as u64;
        ChangeEntry {
            rev,
            path: p(path),
            state: EntryState::File {
                mode,
                mtime: 1,
                size,
                chunks,
            },
        }
    }

    fn dir(path: &str, mode: u32, rev: u64) -> ChangeEntry {
        ChangeEntry {
            rev,
            path: p(path),
            state: EntryState::Dir {
                mode,
                mtime: rev as i64,
            },
        }
    }

    fn link(path: &str, target: &str, rev: u64) -> ChangeEntry {
        ChangeEntry {
            rev,
            path: p(path),
            state: EntryState::Symlink {
                target: target.into(),
                mode: 0o777,
                mtime: 1,
            },
        }
    }

    fn del(path: &str, rev: u64) -> ChangeEntry {
        ChangeEntry {
            rev,
            path: p(path),
            state: EntryState::Delete,
        }
    }

    fn apply_as(
        d: &mut Dofs,
        sender: Option<ChangeCursor>,
        entries: &[ChangeEntry],
        baseline: Baseline,
    ) -> Result<ApplyOutcome, SyncError> {
        d.apply(ApplyBatch {
            remote: "R",
            sender,
            entries,
            baseline,
            ignore: &wsd_sync::IgnoreRules::none(),
        })
    }

    fn from_r(d: &mut Dofs, rev: u64, entries: &[ChangeEntry]) -> ApplyOutcome {
        apply_as(d, Some(ChangeCursor::at(rev)), entries, Baseline::Off).unwrap()
    }

    fn applied_from(d: &Dofs, path: &str) -> Option<String> {
        d.conn
            .query_row(
                "SELECT applied_from FROM entries WHERE path = ?1",
                [path],
                |r| r.get(0),
            )
            .unwrap()
    }

    #[test]
    fn a_peer_entry_matching_local_state_is_skipped_but_a_mode_only_change_applies() {
        let mut d = store();
        let f = file(&mut d, "f", b"content", 0o644, 1);
        assert_eq!(
            from_r(&mut d, 1, &[f.clone(), dir("d", 0o755, 1)]).applied,
            2
        );
        let rev = d.current_rev().unwrap();
        let again = from_r(&mut d, 2, &[f.clone(), dir("d", 0o755, 99)]);
        assert_eq!((again.applied, again.skipped), (0, 2));
        assert_eq!(
            d.current_rev().unwrap(),
            rev,
            "skips stamp no rev, mtime alone is no change"
        );
        assert_eq!(
            d.stat(&p("d")).unwrap().mtime,
            1,
            "a skipped dir keeps its mtime"
        );
        let mut chmod = f.clone();
        if let EntryState::File { mode, .. } = &mut chmod.state {
            *mode = 0o755;
        }
        if let EntryState::File { mtime, .. } = &mut chmod.state {
            *mtime = 42;
        }
        assert_eq!(from_r(&mut d, 3, &[chmod]).applied, 1);
        let st = d.stat(&p("f")).unwrap();
        assert_eq!(
            (st.mode, st.mtime),
            (0o755, 42),
            "an applied entry carries its mtime"
        );
        assert_eq!(from_r(&mut d, 4, &[dir("d", 0o700, 4)]).applied, 1);
        assert_eq!(d.stat(&p("d")).unwrap().mode, 0o700);
        assert_eq!(d.current_rev().unwrap(), rev + 2);
    }

    #[test]
    fn a_batch_is_stamped_with_one_rev_and_advances_the_fetch_cursor() {
        let mut d = store();
        let entries = [
            dir("a", 0o755, 7),
            file(&mut d, "a/x", b"1", 0o644, 7),
            link("a/l", "x", 7),
        ];
        let out = apply_as(
            &mut d,
            Some(ChangeCursor::within(7, p("a/x"))),
            &entries,
            Baseline::Off,
        )
        .unwrap();
        assert_eq!(out.rev, 1);
        assert_eq!(out.fetch_cursor, ChangeCursor::within(7, p("a/x")));
        for path in ["a", "a/x", "a/l"] {
            assert_eq!(d.stat(&p(path)).unwrap().rev, 1);
            assert_eq!(applied_from(&d, path).as_deref(), Some("R"));
        }
        assert_eq!(
            d.remote_watermarks("R").unwrap().fetch_cursor,
            out.fetch_cursor
        );
        d.check_integrity().unwrap();
    }

    #[test]
    fn the_fetch_cursor_never_moves_backwards() {
        let mut d = store();
        assert_eq!(from_r(&mut d, 10, &[]).fetch_cursor, ChangeCursor::at(10));
        assert_eq!(from_r(&mut d, 5, &[]).fetch_cursor, ChangeCursor::at(10));
        let partial = apply_as(
            &mut d,
            Some(ChangeCursor::within(10, p("z"))),
            &[],
            Baseline::Off,
        );
        assert_eq!(partial.unwrap().fetch_cursor, ChangeCursor::at(10));
        assert_eq!(
            d.current_rev().unwrap(),
            0,
            "cursor moves are not tree mutations"
        );
        // A push covering rev 11 whole supersedes a partial pull cursor in it.
        let partial = apply_as(
            &mut d,
            Some(ChangeCursor::within(11, p("m"))),
            &[],
            Baseline::Off,
        );
        assert_eq!(
            partial.unwrap().fetch_cursor,
            ChangeCursor::within(11, p("m"))
        );
        assert_eq!(from_r(&mut d, 11, &[]).fetch_cursor, ChangeCursor::at(11));
    }

    #[test]
    fn a_missing_chunk_fails_naming_hash_and_path_and_changes_nothing() {
        let mut d = store();
        put(&mut d, "existing", b"x");
        let rev = d.current_rev().unwrap();
        let held = file(&mut d, "a/held", b"held bytes", 0o644, 3);
        let missing_bytes = b"never staged";
        let missing = ChangeEntry {
            rev: 3,
            path: p("a/missing"),
            state: EntryState::File {
                mode: 0o644,
                mtime: 1,
                size: missing_bytes.len() as u64,
                chunks: vec![ChunkRef {
                    hash: Hash::of(missing_bytes),
                    size: 12,
                }],
            },
        };
        let err = from_r_err(
            &mut d,
            &[dir("a", 0o755, 3), held, del("existing", 3), missing],
        );
        assert_eq!(err.code(), ErrorCode::UnknownHash);
        assert!(
            err.to_string()
                .contains(&Hash::of(missing_bytes).to_string()),
            "{err}"
        );
        assert!(err.to_string().contains("a/missing"), "{err}");
        assert_eq!(d.current_rev().unwrap(), rev);
        assert!(!d.exists(&p("a")).unwrap());
        assert!(d.exists(&p("existing")).unwrap());
        assert_eq!(
            d.remote_watermarks("R").unwrap().fetch_cursor,
            ChangeCursor::ZERO
        );
        d.check_integrity().unwrap();
    }

    fn from_r_err(d: &mut Dofs, entries: &[ChangeEntry]) -> SyncError {
        apply_as(d, Some(ChangeCursor::at(3)), entries, Baseline::Off).unwrap_err()
    }

    #[test]
    fn an_invalid_entry_rejects_the_whole_batch() {
        let mut d = store();
        let mut bad = file(&mut d, "f", b"abc", 0o644, 1);
        if let EntryState::File { size, .. } = &mut bad.state {
            *size = 4;
        }
        let err = from_r_err(&mut d, &[dir("d", 0o755, 1), bad]);
        assert_eq!(err.code(), ErrorCode::Invalid);
        assert!(!d.exists(&p("d")).unwrap());
    }

    #[test]
    fn a_child_before_its_parent_creates_the_missing_parents() {
        let mut d = store();
        let f = file(&mut d, "x/y/z", b"deep", 0o600, 2);
        from_r(&mut d, 2, &[f]);
        assert_eq!(d.stat(&p("x")).unwrap().kind, Kind::Dir);
        assert_eq!(d.stat(&p("x/y")).unwrap().mode, crate::DEFAULT_DIR_MODE);
        assert_eq!(d.read_file(&p("x/y/z")).unwrap(), b"deep");
        // The parent's own (later) entry then sets its real mode.
        from_r(&mut d, 3, &[dir("x/y", 0o700, 3)]);
        assert_eq!(d.stat(&p("x/y")).unwrap().mode, 0o700);
        d.check_integrity().unwrap();
    }

    #[test]
    fn kind_changes_replace_the_local_subtree_with_tombstones_marked_as_the_remotes() {
        let mut d = store();
        put(&mut d, "d/a", b"1");
        put(&mut d, "d/b/c", b"2");
        let f = file(&mut d, "d", b"now a file", 0o644, 5);
        from_r(&mut d, 5, &[f]);
        assert_eq!(d.read_file(&p("d")).unwrap(), b"now a file");
        for gone in ["d/a", "d/b", "d/b/c"] {
            assert_eq!(
                d.read_entry(&p(gone)).unwrap().unwrap().state,
                EntryState::Delete
            );
            assert_eq!(applied_from(&d, gone).as_deref(), Some("R"), "{gone}");
        }
        from_r(&mut d, 6, &[dir("d", 0o755, 6)]);
        assert_eq!(d.stat(&p("d")).unwrap().kind, Kind::Dir);
        from_r(&mut d, 7, &[link("d", "elsewhere", 7)]);
        assert_eq!(d.readlink(&p("d")).unwrap(), "elsewhere");
        let f = file(&mut d, "d", b"file again", 0o644, 8);
        from_r(&mut d, 8, &[f]);
        assert_eq!(d.read_file(&p("d")).unwrap(), b"file again");
        // A file in the way of an incoming child becomes a directory.
        let child = file(&mut d, "d/inner", b"x", 0o644, 9);
        from_r(&mut d, 9, &[child]);
        assert_eq!(d.stat(&p("d")).unwrap().kind, Kind::Dir);
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_delete_removes_the_subtree_and_a_delete_of_nothing_is_skipped() {
        let mut d = store();
        put(&mut d, "d/a/b", b"1");
        let out = from_r(&mut d, 2, &[del("d", 2), del("d/a", 2), del("never", 2)]);
        assert_eq!((out.applied, out.skipped), (1, 2));
        assert!(d.readdir(None).unwrap().is_empty());
        d.check_integrity().unwrap();
    }

    #[test]
    fn an_external_writer_applies_fresh_local_revs_and_moves_no_watermark() {
        let mut d = store();
        let f = file(&mut d, "f", b"same", 0o644, 0);
        apply_as(&mut d, None, std::slice::from_ref(&f), Baseline::Off).unwrap();
        let out = apply_as(&mut d, None, std::slice::from_ref(&f), Baseline::Off).unwrap();
        assert_eq!(out.applied, 1, "an external write is never skipped");
        assert_eq!(d.current_rev().unwrap(), 2);
        assert_eq!(out.fetch_cursor, ChangeCursor::ZERO);
        assert!(
            d.remotes().unwrap().is_empty(),
            "an external writer is not a remote"
        );
        assert_eq!(applied_from(&d, "f"), None, "streamed on to every remote");
    }

    #[test]
    fn overwriting_an_unpushed_local_change_is_counted() {
        let mut d = store();
        put(&mut d, "mine", b"local");
        put(&mut d, "dir/child", b"local");
        put(&mut d, "deleted", b"x");
        d.rm(&p("deleted"), false).unwrap();
        let entries = [
            file(&mut d, "mine", b"theirs", 0o644, 1),
            file(&mut d, "dir", b"file over my dir", 0o644, 1),
            file(&mut d, "deleted", b"resurrected", 0o644, 1),
            file(&mut d, "fresh", b"no conflict", 0o644, 1),
        ];
        let out = from_r(&mut d, 1, &entries);
        assert_eq!((out.applied, out.overwrote_local), (4, 3));
        // Overwriting the remote's own earlier state is not a lost write,
        // nor is overwriting local state the remote has acknowledged.
        let again = file(&mut d, "mine", b"theirs v2", 0o644, 2);
        assert_eq!(from_r(&mut d, 2, &[again]).overwrote_local, 0);
        put(&mut d, "acked", b"local");
        let rev = d.current_rev().unwrap();
        d.set_push_cursor("R", &ChangeCursor::at(rev)).unwrap();
        let over = file(&mut d, "acked", b"theirs", 0o644, 3);
        assert_eq!(from_r(&mut d, 3, &[over]).overwrote_local, 0);
    }

    #[test]
    fn entries_applied_from_a_remote_are_not_streamed_back_to_it_until_changed_locally() {
        let mut d = store();
        let f = file(&mut d, "f", b"theirs", 0o644, 1);
        from_r(&mut d, 1, &[f, dir("d", 0o755, 1)]);
        let stream = |d: &mut Dofs, exclude: &str| -> Vec<String> {
            let ignore = IgnoreRules::none();
            let through = d.open_changes(&ChangeCursor::ZERO).unwrap().through;
            d.changes(ChangesQuery {
                after: &ChangeCursor::ZERO,
                through: &through,
                ignore: &ignore,
                exclude_applied_from: Some(exclude),
                limit: 10,
            })
            .unwrap()
            .into_iter()
            .map(|e| e.path.into_string())
            .collect()
        };
        assert!(stream(&mut d, "R").is_empty());
        assert_eq!(stream(&mut d, "S"), ["d", "f"]);
        d.chmod(&p("f"), 0o600).unwrap();
        assert_eq!(stream(&mut d, "R"), ["f"]);
    }

    #[test]
    fn a_baseline_sweep_deletes_every_unlisted_live_path_and_keeps_listed_ancestors() {
        let mut d = store();
        for path in ["keep", "stale", "tree/leaf", "tree/stale", "other/x"] {
            put(&mut d, path, b"old");
        }
        let keep = file(&mut d, "keep", b"old", 0o644, 1);
        let leaf = file(&mut d, "tree/leaf", b"old", 0o644, 3);
        let batch1 = apply_as(
            &mut d,
            Some(ChangeCursor::within(1, p("keep"))),
            &[keep],
            Baseline::Mark,
        );
        assert_eq!(batch1.unwrap().skipped, 1);
        let rev = d.current_rev().unwrap();
        let out = apply_as(
            &mut d,
            Some(ChangeCursor::at(3)),
            &[leaf, del("gone", 2)],
            Baseline::Sweep,
        )
        .unwrap();
        let mut live: Vec<String> = Vec::new();
        for e in d.readdir(None).unwrap() {
            live.push(e.name.clone());
            if e.stat.kind == Kind::Dir {
                live.extend(
                    d.readdir(Some(&e.path))
                        .unwrap()
                        .into_iter()
                        .map(|c| c.path.into_string()),
                );
            }
        }
        assert_eq!(live, ["keep", "tree", "tree/leaf"]);
        assert_eq!(d.current_rev().unwrap(), rev + 1, "the sweep is one rev");
        assert_eq!(applied_from(&d, "stale").as_deref(), Some("R"));
        assert_eq!(
            out.overwrote_local, 4,
            "the swept paths were unpushed local writes"
        );
        let marks: u64 = d
            .conn
            .query_row("SELECT count(*) FROM baseline_marks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(marks, 0);
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_restarted_baseline_forgets_the_marks_of_the_abandoned_attempt() {
        let mut d = store();
        put(&mut d, "a", b"1");
        put(&mut d, "b", b"1");
        let a = file(&mut d, "a", b"1", 0o644, 5);
        let b = file(&mut d, "b", b"1", 0o644, 6);
        apply_as(
            &mut d,
            Some(ChangeCursor::within(6, p("b"))),
            &[a.clone(), b],
            Baseline::Mark,
        )
        .unwrap();
        // The sender deleted `b` and its tombstone was pruned; the baseline
        // starts over and no longer lists it.
        apply_as(&mut d, Some(ChangeCursor::at(9)), &[a], Baseline::Sweep).unwrap();
        assert!(d.exists(&p("a")).unwrap());
        assert!(!d.exists(&p("b")).unwrap());
    }
}
