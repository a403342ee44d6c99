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

    pub(crate) fn changes_inner(
        &self,
        q: ChangesQuery<'_>,
    ) -> Result<Vec<ChangeEntry>, DofsError> {
        let mut out = Vec::new();
        let mut after = q.after.clone();
        while out.len() < q.limit {
            let want = (q.limit - out.len()).min(SCAN_PAGE);
            let page = self.scan(&after, q.through, q.exclude_applied_from, want)?;
            let exhausted = page.len() < want;
            for row in page {
                after = ChangeCursor::within(row.rev, wsd_sync::SyncPath::new(row.path.clone())?);
                let ignored = match row.node.kind() {
                    Some(kind) => q.ignore.is_ignored(after.path.as_ref().expect("set"), kind == Kind::Dir),
                    None => q.ignore.is_ignored_any_kind(after.path.as_ref().expect("set")),
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
        rows::get_row(&self.conn, path.as_str())?.map(|row| to_entry(&self.conn, row)).transpose()
    }
}
