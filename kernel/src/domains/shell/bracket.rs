//! The first half of a command's bracket, under the workspace lock: dofs is
//! pushed to the workspace's wsd, then the command starts there.
//!
//! The push is skipped when it has nothing to send: no commit to dofs since
//! the last push to this wsd (the store's commit feed has not ticked, so no
//! `fs.write`, from any connection, and no pull landed meanwhile), and the
//! command starts on the very connection that push used (a re-dialled wsd
//! may have restarted without what was pushed; then it pushes first). An
//! idle workspace's command thus costs no push at all, not even the local
//! reads of a no-op one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;
use wsd_client::{ExecEvents, ExecRequest, WsdError, WsdHandle};
use wsd_dofs::Dofs;

use crate::domains::shell::live::Synced;
use crate::domains::watch::{StoreKey, Watches};
use crate::domains::workspace::Workspace;

/// The last push of each workspace, by workspace id.
#[derive(Debug, Default)]
pub struct PushMarks {
    marks: Mutex<HashMap<String, Mark>>,
}

/// What a push to a workspace's wsd left behind.
#[derive(Debug)]
struct Mark {
    /// The store pushed from (a store closed and opened again is another).
    store: Weak<Mutex<Dofs>>,
    /// The connection it went over ([`WsdHandle::connection`]).
    connection: u64,
    /// The store's commit feed, subscribed before the push: it has changed
    /// iff something was committed since.
    commits: watch::Receiver<u64>,
    synced: Synced,
}

/// A command started by [`PushMarks::push_and_exec`].
#[derive(Debug)]
pub struct Started {
    pub events: ExecEvents,
    /// The store's commit feed, subscribed before the push the command
    /// runs after (none: the feed could not be had).
    pub commits: Option<watch::Receiver<u64>>,
    /// Where that push left the workspace and the wsd the command runs on
    /// (none: not known).
    pub synced: Option<Synced>,
}

/// Why a command did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("push to wsd failed: {0}")]
    Push(WsdError),
    #[error("wsd refused the command: {0}")]
    Exec(WsdError),
}

impl StartError {
    pub fn wsd(&self) -> &WsdError {
        match self {
            StartError::Push(e) | StartError::Exec(e) => e,
        }
    }
}

impl PushMarks {
    /// Pushes `w`'s dofs to `handle`'s wsd unless nothing changed since
    /// the last push (the commit feed from `watches` says), then starts
    /// `request` there. Runs under `w`'s bracket lock.
    pub async fn push_and_exec(
        &self,
        watches: &Watches,
        w: &Workspace,
        handle: &WsdHandle,
        request: ExecRequest,
    ) -> Result<Started, StartError> {
        if let Some((connection, commits, synced)) = self.unchanged(w) {
            match handle.exec_on(connection, request.clone()).await {
                Ok(Some(events)) => {
                    tracing::debug!(workspace = %w.id, "nothing committed since the last push: not pushing");
                    return Ok(Started {
                        events,
                        commits: Some(commits),
                        synced: Some(synced),
                    });
                }
                // The connection was lost since: push on the new one first.
                Ok(None) => {}
                Err(e) => return Err(StartError::Exec(e)),
            }
        }
        let commits = match watches.feed(&StoreKey::Workspace(w.id.clone()), &w.dofs) {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(workspace = %w.id, error = %e, "no commit feed: every command pushes, and writes reach wsd at the next command");
                None
            }
        };
        let pushed = handle
            .push(w.dofs.clone())
            .await
            .map_err(StartError::Push)?;
        let synced = Synced {
            wsd_rev: pushed.fetch_cursor.complete_rev(),
            dofs_rev: pushed.local_rev,
        };
        let connection = handle.connection();
        let events = match handle.exec_on(connection, request.clone()).await {
            Ok(Some(events)) => events,
            // Lost right after the push: the command starts on a new
            // connection, and where the push left the wsd is not known.
            Ok(None) => {
                let events = handle.exec(request).await.map_err(StartError::Exec)?;
                return Ok(Started {
                    events,
                    commits,
                    synced: None,
                });
            }
            Err(e) => return Err(StartError::Exec(e)),
        };
        if let Some(rx) = &commits {
            self.marks.lock().unwrap().insert(
                w.id.clone(),
                Mark {
                    store: Arc::downgrade(&w.dofs),
                    connection,
                    commits: rx.clone(),
                    synced,
                },
            );
        }
        Ok(Started {
            events,
            commits,
            synced: Some(synced),
        })
    }

    /// The last push's connection, commit feed and sync point when nothing
    /// was committed to `w`'s store since it.
    fn unchanged(&self, w: &Workspace) -> Option<(u64, watch::Receiver<u64>, Synced)> {
        let mut marks = self.marks.lock().unwrap();
        let mark = marks.get(&w.id)?;
        if !std::ptr::eq(mark.store.as_ptr(), Arc::as_ptr(&w.dofs)) {
            marks.remove(&w.id);
            return None;
        }
        // `Err`: the feed's sender is gone; treat as changed.
        matches!(mark.commits.has_changed(), Ok(false))
            .then(|| (mark.connection, mark.commits.clone(), mark.synced))
    }
}
