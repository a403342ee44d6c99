//! Live sync while a workspace has an open session (a `shell.exec`
//! command or a terminal): one follower task per workspace, started by the
//! first [`LiveHold`] and stopped when the last one is dropped.
//!
//! The follower long-polls wsd (`Sync.waitChanges`, no fixed interval) and
//! pulls as soon as wsd's rev moves, so what a running command writes
//! reaches dofs (and `fs.read`, `fs.watch`) as wsd settles it, not only at
//! the command's end. It also wakes on every dofs commit and pushes what
//! wsd lacks, so an `fs.write` during a session reaches the command. Each
//! round runs under the workspace's bracket lock, like every other sync:
//! a live pull never overlaps the end-of-command pull, a push or another
//! live pull of the same workspace. The entries a live pull applies are
//! handed to every open hold, so a command's result still lists what
//! changed while it ran.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wsd_client::{AppliedEntry, WsdHandle};

use crate::domains::workspace::Workspace;

/// How long one `waitChanges` long poll is held before it is renewed.
const LONG_POLL: Duration = Duration::from_secs(30);
/// First wait after a failed round or poll; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The entries live pulls applied while one hold was open.
type Collected = Arc<Mutex<Vec<AppliedEntry>>>;

/// One workspace's follower and the holds keeping it running.
#[derive(Debug)]
struct Follower {
    generation: u64,
    cancel: CancellationToken,
    holds: HashMap<u64, Collected>,
}

/// The live followers by workspace id.
#[derive(Debug, Default)]
pub struct LiveSync {
    followers: Mutex<HashMap<String, Follower>>,
    ids: AtomicU64,
    /// Set at kernel shutdown: no follower starts after it.
    stopped: AtomicBool,
}

/// Keeps workspace `workspace_id` following its wsd while it lives.
#[derive(Debug)]
pub struct LiveHold {
    live: Arc<LiveSync>,
    workspace_id: String,
    id: u64,
    collected: Collected,
}

impl LiveHold {
    /// The entries live pulls applied since the last call.
    pub fn take_applied(&self) -> Vec<AppliedEntry> {
        std::mem::take(&mut *self.collected.lock().unwrap())
    }
}

impl Drop for LiveHold {
    fn drop(&mut self) {
        let mut followers = self.live.followers.lock().unwrap();
        if let Some(f) = followers.get_mut(&self.workspace_id) {
            f.holds.remove(&self.id);
            if f.holds.is_empty() {
                f.cancel.cancel();
                followers.remove(&self.workspace_id);
            }
        }
    }
}

impl LiveSync {
    /// A hold on workspace `w`'s follower, starting it (on `handle`) if
    /// none runs. `commits` ticks on every commit of `w`'s store (none:
    /// the follower only pulls).
    pub fn hold(
        self: &Arc<Self>,
        w: &Arc<Workspace>,
        handle: &WsdHandle,
        commits: Option<watch::Receiver<u64>>,
    ) -> LiveHold {
        self.hold_from(w, handle, commits, None)
    }

    /// [`LiveSync::hold`] right after a sync both ways under the bracket
    /// lock (`synced`): a follower started here skips its first round and
    /// long-polls from there. `commits` must have been subscribed before
    /// that sync's push, so a commit after it still wakes the follower.
    pub fn hold_from(
        self: &Arc<Self>,
        w: &Arc<Workspace>,
        handle: &WsdHandle,
        commits: Option<watch::Receiver<u64>>,
        synced: Option<Synced>,
    ) -> LiveHold {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let collected = Collected::default();
        let mut followers = self.followers.lock().unwrap();
        let stopped = self.stopped.load(Ordering::Relaxed);
        let follower = followers.entry(w.id.clone()).or_insert_with(|| {
            let cancel = CancellationToken::new();
            let generation = self.ids.fetch_add(1, Ordering::Relaxed);
            if stopped {
                cancel.cancel();
            } else {
                tokio::spawn(follow(
                    Arc::downgrade(self),
                    generation,
                    w.clone(),
                    handle.clone(),
                    (commits, synced),
                    cancel.clone(),
                ));
            }
            Follower {
                generation,
                cancel,
                holds: HashMap::new(),
            }
        });
        follower.holds.insert(id, collected.clone());
        LiveHold {
            live: self.clone(),
            workspace_id: w.id.clone(),
            id,
            collected,
        }
    }

    /// Stops every follower (kernel shutdown); holds dropped later change
    /// nothing.
    pub fn stop_all(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        for f in self.followers.lock().unwrap().values() {
            f.cancel.cancel();
        }
    }

    /// Hands `applied` to every hold of follower `generation` of `id`.
    fn deliver(&self, id: &str, generation: u64, applied: &[AppliedEntry]) {
        if applied.is_empty() {
            return;
        }
        let followers = self.followers.lock().unwrap();
        if let Some(f) = followers.get(id).filter(|f| f.generation == generation) {
            for c in f.holds.values() {
                c.lock().unwrap().extend_from_slice(applied);
            }
        }
    }
}

/// Where a sync both ways left a workspace and its wsd.
#[derive(Debug, Clone, Copy)]
pub struct Synced {
    /// The wsd rev through which everything is in dofs (our fetch
    /// cursor's complete rev).
    pub wsd_rev: u64,
    /// The dofs rev through which everything is in the wsd.
    pub dofs_rev: u64,
}

/// What one sync round should do.
struct Due {
    pull: bool,
    push: bool,
}

/// Follows `w`'s wsd until `cancel`: pulls when wsd's rev moves, pushes
/// when dofs commits something wsd lacks.
async fn follow(
    live: Weak<LiveSync>,
    generation: u64,
    w: Arc<Workspace>,
    handle: WsdHandle,
    (commits, synced): (Option<watch::Receiver<u64>>, Option<Synced>),
    cancel: CancellationToken,
) {
    // Without a feed, a receiver that never ticks (its sender kept here).
    let (_no_feed, never) = watch::channel(0u64);
    let mut commits = commits.unwrap_or(never);
    let mut commits_open = true;
    tracing::debug!(workspace = %w.id, "live sync started");
    // The wsd rev last pulled at, and the dofs rev wsd is known to have
    // (0: not known, so the first round pulls and pushes).
    let (mut wsd_rev, mut pushed_rev) = synced.map_or((0, 0), |s| (s.wsd_rev, s.dofs_rev));
    let mut due = Due {
        pull: synced.is_none(),
        push: synced.is_none(),
    };
    let mut backoff = MIN_BACKOFF;
    loop {
        if due.pull || due.push {
            // Raced with `cancel` only until it has the lock: a round
            // once under way finishes, so a pull is never cut half-way.
            let deliver = |applied: &[AppliedEntry]| {
                if let Some(live) = live.upgrade() {
                    live.deliver(&w.id, generation, applied);
                }
            };
            match round(&w, &handle, &due, &mut pushed_rev, deliver, &cancel).await {
                Ok(()) => {
                    due = Due {
                        pull: false,
                        push: false,
                    };
                    backoff = MIN_BACKOFF;
                }
                Err(e) => {
                    tracing::warn!(workspace = %w.id, error = %e, ?backoff, "live sync round failed; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = handle.wait_changes(wsd_rev, LONG_POLL) => match r {
                Ok(rev) => {
                    // A lower rev is a re-created wsd store: pull it too.
                    due.pull = rev != wsd_rev;
                    wsd_rev = rev;
                }
                Err(e) => {
                    tracing::debug!(workspace = %w.id, error = %e, ?backoff, "waitChanges failed");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    due.pull = true;
                }
            },
            r = commits.changed(), if commits_open => match r {
                Ok(()) => due.push = true,
                // The store was closed (an archive): nothing more to push.
                Err(_) => commits_open = false,
            },
        }
    }
    tracing::debug!(workspace = %w.id, "live sync stopped");
}

/// A failed round.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("pulling from wsd: {0}")]
    Pull(wsd_client::WsdError),
    #[error("pushing to wsd: {0}")]
    Push(wsd_client::WsdError),
    #[error("reading the store's rev: {0}")]
    Rev(String),
}

/// One sync round under the bracket lock: the pull if due, then a push if
/// dofs has a rev wsd lacks. What the pull applied goes to `deliver` before
/// the lock is released, so a command's end-of-run pull (under the same
/// lock) finds it already handed to its hold. Cancelled while it waits for
/// the lock, it does nothing (the last hold's owner syncs instead).
async fn round(
    w: &Workspace,
    handle: &WsdHandle,
    due: &Due,
    pushed_rev: &mut u64,
    deliver: impl FnOnce(&[AppliedEntry]),
    cancel: &CancellationToken,
) -> Result<(), RoundError> {
    let _bracket = tokio::select! {
        guard = w.bracket.lock() => guard,
        () = cancel.cancelled() => return Ok(()),
    };
    let before = dofs_rev(w).await?;
    if due.pull {
        let report = handle
            .pull(w.dofs.clone())
            .await
            .map_err(RoundError::Pull)?;
        deliver(&report.applied);
    }
    let after = dofs_rev(w).await?;
    if before <= *pushed_rev {
        // Nothing local was pending: what the pull added came from wsd.
        *pushed_rev = after;
    }
    if after > *pushed_rev {
        handle
            .push(w.dofs.clone())
            .await
            .map_err(RoundError::Push)?;
        *pushed_rev = after;
    }
    Ok(())
}

async fn dofs_rev(w: &Workspace) -> Result<u64, RoundError> {
    let store = w.dofs.clone();
    tokio::task::spawn_blocking(move || {
        store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .current_rev()
    })
    .await
    .map_err(|e| RoundError::Rev(e.to_string()))?
    .map_err(|e| RoundError::Rev(e.to_string()))
}

/// `applied` with only the last entry of each path, in the order of those
/// last entries (a command's result lists each path's final state once).
pub fn latest_per_path(applied: Vec<AppliedEntry>) -> Vec<AppliedEntry> {
    let mut last: HashMap<wsd_sync::SyncPath, usize> = HashMap::new();
    for (i, e) in applied.iter().enumerate() {
        last.insert(e.path.clone(), i);
    }
    applied
        .into_iter()
        .enumerate()
        .filter(|(i, e)| last.get(&e.path) == Some(i))
        .map(|(_, e)| e)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wsd_sync::{Kind, SyncPath};

    fn entry(path: &str, size: u64) -> AppliedEntry {
        AppliedEntry {
            path: SyncPath::new(path).unwrap(),
            kind: Some(Kind::File),
            size,
            mode: 0o644,
        }
    }

    #[test]
    fn each_path_keeps_its_last_entry_in_the_order_of_the_last_entries() {
        let got = latest_per_path(vec![
            entry("a", 1),
            entry("b", 1),
            entry("a", 2),
            entry("c", 1),
        ]);
        let got: Vec<(String, u64)> = got
            .iter()
            .map(|e| (e.path.as_str().to_owned(), e.size))
            .collect();
        assert_eq!(got, vec![("b".into(), 1), ("a".into(), 2), ("c".into(), 1)]);
    }
}
