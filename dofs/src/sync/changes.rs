//! Serving changes: keyset pages over the `(rev, path)` index.
//!
//! `entries` holds exactly one row per path (its state now, live or
//! tombstone), so a scan of `entries_by_rev` is already coalesced, and a
//! path rewritten after the window opened carries a rev beyond `through`
//! and simply falls outside it (deferred to the next stream).

use rusqlite::params;
use wsd_sync::{ChangeCursor, ChangeEntry, ChangesQuery, ChangesWindow, Kind};

use crate::rows::{self, ROW_COLUMNS, Row, row_from_sql, to_entry};
use crate::{Dofs, DofsError};

/// Rows read per statement while filling a page; ignored rows make the
/// loop read more, but never more than this at a time.
const SCAN_PAGE: usize = 512;

impl Dofs {
    pub(crate) fn open_changes_inner(
        &self,
        after: &ChangeCursor,
    ) -> Result<ChangesWindow, DofsError> {
        let current = rows::current_rev(&self.conn)?;
        let horizon = self.prune_horizon()?;
        Ok(ChangesWindow {
            through: ChangeCursor::at(current),
            // Tombstones at or below the horizon are gone: a reader that has
            // not seen every rev up to it would miss deletes.
            baseline: horizon > 0 && after.complete_rev() < horizon,
        })
    }

    pub(crate) fn changes_inner(&self, q: ChangesQuery<'_>) -> Result<Vec<ChangeEntry>, DofsError> {
        let mut out = Vec::new();
        let mut after = q.after.clone();
        while out.len() < q.limit {
            let want = (q.limit - out.len()).min(SCAN_PAGE);
            let page = self.scan(&after, q.through, q.exclude_applied_from, want)?;
            let exhausted = page.len() < want;
            for row in page {
                after = ChangeCursor::within(row.rev, wsd_sync::SyncPath::new(row.path.clone())?);
                let ignored = match row.node.kind() {
                    Some(kind) => q
                        .ignore
                        .is_ignored(after.path.as_ref().expect("set"), kind == Kind::Dir),
                    None => q
                        .ignore
                        .is_ignored_any_kind(after.path.as_ref().expect("set")),
                };
                if !ignored {
                    out.push(to_entry(&self.conn, row)?);
                }
            }
            if exhausted {
                break;
            }
        }
        Ok(out)
    }

    /// Rows with `after < (rev, path) <= through` in `(rev, path)` order.
    fn scan(
        &self,
        after: &ChangeCursor,
        through: &ChangeCursor,
        exclude_applied_from: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Row>, DofsError> {
        // Four shapes so each is a plain range over `entries_by_rev`.
        let lower = match after.path {
            None => "rev > ?1",
            Some(_) => "(rev, path) > (?1, ?2)",
        };
        let upper = match through.path {
            None => "rev <= ?3",
            Some(_) => "(rev, path) <= (?3, ?4)",
        };
        let sql = format!(
            "SELECT {ROW_COLUMNS} FROM entries
             WHERE {lower} AND {upper}
               AND (?5 IS NULL OR applied_from IS NULL OR applied_from <> ?5)
             ORDER BY rev, path LIMIT ?6"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(
            params![
                after.rev,
                after.path.as_ref().map(|p| p.as_str()),
                through.rev,
                through.path.as_ref().map(|p| p.as_str()),
                exclude_applied_from,
                limit as u64
            ],
            row_from_sql,
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub(crate) fn read_entry_inner(
        &self,
        path: &wsd_sync::SyncPath,
    ) -> Result<Option<ChangeEntry>, DofsError> {
        rows::get_row(&self.conn, path.as_str())?
            .map(|row| to_entry(&self.conn, row))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use wsd_sync::{ChangeCursor, EntryState, IgnoreRules, Store};

    use crate::Dofs;
    use crate::test_util::{p, put, store};

    fn all(
        d: &mut Dofs,
        after: ChangeCursor,
        limit: usize,
        ignore: &IgnoreRules,
    ) -> Vec<(u64, String, bool)> {
        let through = d.open_changes(&after).unwrap().through;
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let page = d
                .changes(wsd_sync::ChangesQuery {
                    after: &cursor,
                    through: &through,
                    ignore,
                    exclude_applied_from: None,
                    limit,
                })
                .unwrap();
            let done = page.len() < limit;
            if let Some(e) = page.last() {
                cursor = ChangeCursor::within(e.rev, e.path.clone());
            }
            out.extend(
                page.into_iter()
                    .map(|e| (e.rev, e.path.into_string(), e.state == EntryState::Delete)),
            );
            if done {
                return out;
            }
        }
    }

    #[test]
    fn five_rewrites_of_one_path_cost_one_entry() {
        let mut d = store();
        for i in 0..5u8 {
            put(&mut d, "f", &[i]);
        }
        assert_eq!(
            all(&mut d, ChangeCursor::ZERO, 100, &IgnoreRules::none()),
            vec![(5, "f".into(), false)]
        );
    }

    #[test]
    fn delete_then_recreate_is_one_live_entry() {
        let mut d = store();
        put(&mut d, "f", b"1");
        d.rm(&p("f"), false).unwrap();
        put(&mut d, "f", b"2");
        assert_eq!(
            all(&mut d, ChangeCursor::ZERO, 100, &IgnoreRules::none()),
            vec![(3, "f".into(), false)]
        );
    }

    #[test]
    fn changes_come_in_rev_then_byte_order_and_resume_mid_rev() {
        let mut d = store();
        put(&mut d, "z", b"1"); // rev 1
        d.mkdir(&p("old"), false).unwrap(); // rev 2
        for name in ["b", "a", "c"] {
            put(&mut d, &format!("old/{name}"), b"x"); // revs 3..5
        }
        d.rename(&p("old"), &p("new")).unwrap(); // rev 6
        let expected = vec![
            (1, "z".to_string(), false),
            (6, "new".into(), false),
            (6, "new/a".into(), false),
            (6, "new/b".into(), false),
            (6, "new/c".into(), false),
            (6, "old".into(), true),
            (6, "old/a".into(), true),
            (6, "old/b".into(), true),
            (6, "old/c".into(), true),
        ];
        assert_eq!(
            all(&mut d, ChangeCursor::ZERO, 100, &IgnoreRules::none()),
            expected
        );
        for limit in 1..4 {
            assert_eq!(
                all(&mut d, ChangeCursor::ZERO, limit, &IgnoreRules::none()),
                expected
            );
        }
        let mid = ChangeCursor::within(6, p("new/b"));
        assert_eq!(
            all(&mut d, mid, 2, &IgnoreRules::none()),
            expected[4..].to_vec()
        );
        assert!(all(&mut d, ChangeCursor::at(6), 10, &IgnoreRules::none()).is_empty());
    }

    #[test]
    fn a_path_rewritten_after_the_window_opened_is_deferred_to_the_next_window() {
        let mut d = store();
        put(&mut d, "a", b"1");
        put(&mut d, "b", b"1");
        let window = d.open_changes(&ChangeCursor::ZERO).unwrap();
        put(&mut d, "a", b"2");
        let ignore = IgnoreRules::none();
        let page = d
            .changes(wsd_sync::ChangesQuery {
                after: &ChangeCursor::ZERO,
                through: &window.through,
                ignore: &ignore,
                exclude_applied_from: None,
                limit: 10,
            })
            .unwrap();
        assert_eq!(
            page.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        let next = all(&mut d, window.through, 10, &ignore);
        assert_eq!(next, vec![(3, "a".into(), false)]);
    }

    #[test]
    fn ignored_paths_are_left_out_without_ending_the_page_early() {
        let mut d = store();
        for i in 0..600 {
            put(&mut d, &format!("node_modules/m{i:03}"), b"x");
        }
        put(&mut d, "src/main.rs", b"fn main() {}");
        d.rm(&p("node_modules/m000"), false).unwrap();
        let ignore = IgnoreRules::new(&["node_modules/"]).unwrap();
        let got = all(&mut d, ChangeCursor::ZERO, 5, &ignore);
        assert_eq!(
            got.iter().map(|(_, p, _)| p.as_str()).collect::<Vec<_>>(),
            ["src", "src/main.rs"]
        );
    }

    #[test]
    fn read_entry_gives_live_state_else_tombstone_else_nothing() {
        let mut d = store();
        put(&mut d, "f", b"1");
        let live = d.read_entry(&p("f")).unwrap().unwrap();
        assert!(matches!(live.state, EntryState::File { size: 1, .. }));
        d.rm(&p("f"), false).unwrap();
        let gone = d.read_entry(&p("f")).unwrap().unwrap();
        assert_eq!((gone.rev, gone.state), (2, EntryState::Delete));
        assert_eq!(d.read_entry(&p("never")).unwrap(), None);
    }
}
