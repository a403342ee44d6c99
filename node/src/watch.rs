//! `fs.watch` / `fs.unwatch` on the node: a `notify` watcher (inotify on
//! Linux) per watch, its events coalesced into one `fs.changed` batch per
//! quiet moment, filtered by the protocol's [`PathFilter`].
//!
//! Level-based like the kernel's feeds: an event only says which path to
//! look at; the batch reports what each path *is* when it is sent (its
//! `lstat` beneath the root), so a burst of writes to a file is one change
//! and a temporary file created and removed within the window (an atomic
//! save) is none. The coalescing keeps a set of paths, not a queue of
//! events, so a flood costs one entry per distinct path. notify's own
//! debouncers are not used: the mini one drops the event kinds that tell a
//! short-lived file from a deleted one, and either adds a per-path timer
//! where one window per watch is what is wanted.
//!
//! A watch lives on one driver connection: its signals go to that
//! connection's queue, and the connection dropping stops every watch (the
//! kernel has ended them for their watchers). There is no change index
//! here, so no replay or resume: `after` other than `"now"` is
//! `ECURSOR_EXPIRED` with `resync: true`. A batch's `rev` and cursor count
//! the watch's batches.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gsv_protocol::fs::FsError;
use gsv_protocol::watch::{
    AFTER_NOW, Change, ChangeType, ChangedSignal, DEVICE_WATCHES_ARE_LIVE, EndedSignal,
    ExpiredFailure, PathFilter, UnwatchArgs, UnwatchResult, WatchArgs, WatchFailure, WatchOutcome,
    WatchResult,
};
use gsv_protocol::{Done, OpFailure, OpResult};
use notify::{EventKind, RecursiveMode, Watcher};
use rustix::fs::{FileType, Mode, OFlags};
use tokio::sync::{Notify, mpsc};

use crate::NodeRoot;

/// How long a watch gathers events after the first one before it looks
/// at the paths and sends their batch.
pub const DEBOUNCE: Duration = Duration::from_millis(20);
/// Signals queued for the driver connection; a full queue makes the
/// watches wait (their paths keep coalescing meanwhile).
const SIGNAL_QUEUE: usize = 64;
/// Longest watch id the kernel may give.
const MAX_WATCH_ID: usize = 128;

/// A signal of a node watch for the driver to send.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchSignal {
    Changed(ChangedSignal),
    Ended(EndedSignal),
}

impl WatchSignal {
    /// The signal's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            WatchSignal::Changed(_) => "fs.changed",
            WatchSignal::Ended(_) => "fs.watch.ended",
        }
    }

    pub fn payload(&self) -> serde_json::Value {
        match self {
            WatchSignal::Changed(s) => serde_json::to_value(s),
            WatchSignal::Ended(s) => serde_json::to_value(s),
        }
        .unwrap_or_default()
    }
}

/// One running watch: dropping the watcher stops its events, aborting the
/// task stops its batches.
#[derive(Debug)]
struct Running {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::AbortHandle,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The node's watches and the connection their signals go to.
#[derive(Debug, Default)]
pub(crate) struct NodeWatches {
    live: Mutex<HashMap<String, Running>>,
    signals: Mutex<Option<mpsc::Sender<WatchSignal>>>,
}

/// What the watcher's callback leaves for the batching task.
#[derive(Debug, Default)]
struct Pending {
    /// Each path seen since the last batch, and whether its first event in
    /// this window created it (gone again by then: not reported).
    paths: BTreeMap<PathBuf, bool>,
    /// The watcher failed or lost events: the watch must end.
    failed: Option<String>,
}

fn invalid(message: String) -> WatchFailure {
    WatchFailure::Op(OpFailure {
        ok: false,
        error: message,
        code: Some("invalid_argument".into()),
    })
}

fn fs_failure(e: FsError) -> WatchFailure {
    WatchFailure::Op(e.into())
}

impl NodeWatches {
    /// A new connection: every earlier watch stops, and signals of the
    /// watches opened from now on are queued on the receiver returned.
    pub(crate) fn connect(&self) -> mpsc::Receiver<WatchSignal> {
        let (tx, rx) = mpsc::channel(SIGNAL_QUEUE);
        self.live.lock().unwrap().clear();
        *self.signals.lock().unwrap() = Some(tx);
        rx
    }

    /// The connection dropped: every watch stops.
    pub(crate) fn disconnect(&self) {
        *self.signals.lock().unwrap() = None;
        self.live.lock().unwrap().clear();
    }

    pub(crate) fn count(&self) -> usize {
        self.live.lock().unwrap().len()
    }

    /// `fs.watch`: `watchId` is the kernel's id for it.
    pub(crate) fn watch(
        self: &Arc<Self>,
        root: &Arc<NodeRoot>,
        a: WatchArgs,
    ) -> WatchOutcome<WatchResult> {
        match self.start(root, a) {
            Ok(r) => OpResult::Done(Done::new(r)),
            Err(f) => OpResult::Failed(f),
        }
    }

    fn start(
        self: &Arc<Self>,
        root: &Arc<NodeRoot>,
        a: WatchArgs,
    ) -> Result<WatchResult, WatchFailure> {
        if a.after.as_deref().is_some_and(|x| x != AFTER_NOW) {
            return Err(WatchFailure::Expired(ExpiredFailure::new(
                DEVICE_WATCHES_ARE_LIVE,
            )));
        }
        if a.durable {
            return Err(invalid(format!(
                "durable watches are not kept on a node: {DEVICE_WATCHES_ARE_LIVE}"
            )));
        }
        let id = match a.watch_id {
            Some(id) if !id.is_empty() && id.len() <= MAX_WATCH_ID => id,
            _ => {
                return Err(invalid(format!(
                    "watchId (the kernel's id for the watch, 1 to {MAX_WATCH_ID} bytes) is required"
                )));
            }
        };
        let filter = PathFilter::new(a.recursive, &a.include, &a.exclude)
            .map_err(|e| invalid(e.to_string()))?;
        let fd = root
            .open_beneath(&a.path, OFlags::PATH, Mode::empty())
            .map_err(|e| fs_failure(e.into()))?;
        let watched = root.real_path(&fd);
        let is_dir = rustix::fs::fstat(&fd)
            .map(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            .map_err(|e| fs_failure(FsError::io("stat", watched.display().to_string(), e)))?;
        let Some(signals) = self.signals.lock().unwrap().clone() else {
            return Err(invalid("no kernel connection to send changes on".into()));
        };
        let mut live = self.live.lock().unwrap();
        if live.contains_key(&id) {
            return Err(invalid(format!("watch id {id} is in use")));
        }
        let pending = Arc::new(Mutex::new(Pending::default()));
        let wake = Arc::new(Notify::new());
        let (p, w) = (pending.clone(), wake.clone());
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(
            move |r: notify::Result<notify::Event>| {
                note(&p, r);
                w.notify_one();
            },
            config,
        )
        .map_err(|e| watcher_failure(&watched, e))?;
        let mode = if is_dir && a.recursive {
            RecursiveMode::Recursive
        } else {
            RecursiveMode::NonRecursive
        };
        watcher
            .watch(&watched, mode)
            .map_err(|e| watcher_failure(&watched, e))?;
        let batcher = Batcher {
            id: id.clone(),
            root: root.clone(),
            watched: watched.clone(),
            filter,
            seq: 0,
        };
        let task = tokio::spawn(batches(self.clone(), batcher, pending, wake, signals));
        live.insert(
            id.clone(),
            Running {
                _watcher: watcher,
                task: task.abort_handle(),
            },
        );
        tracing::debug!(watch = %id, path = %watched.display(), "watching");
        Ok(WatchResult {
            cursor: cursor(&id, 0),
            watch_id: id,
            durable: false,
            expires_at: None,
        })
    }

    /// `fs.unwatch`.
    pub(crate) fn unwatch(&self, a: UnwatchArgs) -> WatchOutcome<UnwatchResult> {
        match self.live.lock().unwrap().remove(&a.watch_id) {
            Some(_) => OpResult::Done(Done::new(UnwatchResult {
                watch_id: a.watch_id,
            })),
            None => OpResult::Failed(WatchFailure::Op(OpFailure {
                ok: false,
                error: format!("Unknown watch: {}", a.watch_id),
                code: Some("not_found".into()),
            })),
        }
    }
}

fn watcher_failure(path: &Path, e: notify::Error) -> WatchFailure {
    fs_failure(FsError::io("watch", path.display().to_string(), e))
}

fn cursor(id: &str, seq: u64) -> String {
    format!("n1.{id}.{seq}")
}

/// Records what one watcher event names (on notify's thread).
fn note(pending: &Mutex<Pending>, r: notify::Result<notify::Event>) {
    let mut p = pending.lock().unwrap();
    let ev = match r {
        Ok(ev) => ev,
        Err(e) => {
            p.failed = Some(format!("the node's watcher failed: {e}"));
            return;
        }
    };
    if ev.need_rescan() {
        p.failed = Some("the node's watcher lost events (its queue overflowed)".into());
        return;
    }
    // Opening or reading a file changes nothing.
    if matches!(ev.kind, EventKind::Access(_)) {
        return;
    }
    let created = matches!(
        ev.kind,
        EventKind::Create(_)
            | EventKind::Modify(notify::event::ModifyKind::Name(
                notify::event::RenameMode::To
            ))
    );
    for path in ev.paths {
        p.paths.entry(path).or_insert(created);
    }
}

/// What a watch's task needs to turn paths into changes.
struct Batcher {
    id: String,
    root: Arc<NodeRoot>,
    watched: PathBuf,
    filter: PathFilter,
    seq: u64,
}

impl Batcher {
    /// The changes for the paths of one window, in path order; whether
    /// the watched path itself is gone.
    fn changes(&mut self, paths: BTreeMap<PathBuf, bool>) -> (Vec<Change>, bool) {
        let rev = self.seq + 1;
        let mut out = Vec::new();
        let mut root_gone = false;
        for (path, created) in paths {
            let Ok(rel) = path.strip_prefix(&self.watched) else {
                continue;
            };
            let (Some(rel), Some(name)) = (rel.to_str(), path.file_name().and_then(|n| n.to_str()))
            else {
                continue;
            };
            if !self.filter.keeps(rel, name) {
                continue;
            }
            let shown = path.display().to_string();
            let change =
                match self
                    .root
                    .open_beneath(&shown, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())
                {
                    Ok(fd) => match rustix::fs::fstat(&fd) {
                        Ok(st) => {
                            let mode = Some(st.st_mode & 0o7777);
                            let (kind, size) = match FileType::from_raw_mode(st.st_mode) {
                                FileType::Directory => (ChangeType::Dir, None),
                                FileType::Symlink => (ChangeType::Symlink, None),
                                _ => (ChangeType::File, Some(st.st_size as u64)),
                            };
                            Change {
                                path: shown,
                                kind,
                                rev,
                                size,
                                mode,
                                hash: None,
                            }
                        }
                        Err(_) => continue,
                    },
                    Err(crate::PathError::NotFound { .. }) if created => continue,
                    Err(crate::PathError::NotFound { .. }) => {
                        root_gone |= rel.is_empty();
                        Change {
                            path: shown,
                            kind: ChangeType::Deleted,
                            rev,
                            size: None,
                            mode: None,
                            hash: None,
                        }
                    }
                    // Gone out of the root (a swapped-in link), or unreadable.
                    Err(_) => continue,
                };
            out.push(change);
        }
        if !out.is_empty() {
            self.seq = rev;
        }
        (out, root_gone)
    }
}

/// A watch's task: after each first event, waits [`DEBOUNCE`], then sends
/// the window's changes as one batch; ends the watch when its watcher
/// fails or the watched path goes away.
async fn batches(
    watches: Arc<NodeWatches>,
    mut b: Batcher,
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
    signals: mpsc::Sender<WatchSignal>,
) {
    let id = b.id.clone();
    let ended = loop {
        wake.notified().await;
        tokio::time::sleep(DEBOUNCE).await;
        let (paths, failed) = {
            let mut p = pending.lock().unwrap();
            (std::mem::take(&mut p.paths), p.failed.take())
        };
        if let Some(why) = failed {
            break why;
        }
        // A stat per path, off the async threads.
        let Ok((back, (changes, root_gone))) = tokio::task::spawn_blocking(move || {
            let r = b.changes(paths);
            (b, r)
        })
        .await
        else {
            break "the node's watch task failed".to_owned();
        };
        b = back;
        if !changes.is_empty() {
            let batch = ChangedSignal {
                watch_id: b.id.clone(),
                cursor: cursor(&b.id, b.seq),
                changes,
            };
            if signals.send(WatchSignal::Changed(batch)).await.is_err() {
                return;
            }
        }
        if root_gone {
            break format!("the watched path {} was deleted", b.watched.display());
        }
    };
    tracing::debug!(watch = %id, reason = %ended, "watch ended");
    let _ = signals
        .send(WatchSignal::Ended(EndedSignal {
            watch_id: id.clone(),
            reason: ended,
            resync: true,
        }))
        .await;
    // Last: this drops the watcher and aborts this very task.
    watches.live.lock().unwrap().remove(&id);
}

#[cfg(test)]
mod tests {
    use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};

    use super::*;

    fn event(kind: EventKind, path: &Path) -> notify::Result<notify::Event> {
        Ok(notify::Event::new(kind).add_path(path.to_path_buf()))
    }

    #[test]
    fn a_file_created_and_gone_within_a_window_is_not_reported_but_a_deleted_one_is() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::write(dir.join("kept.txt"), "abc").unwrap();
        let root = Arc::new(NodeRoot::new(&dir).unwrap());
        let pending = Mutex::new(Pending::default());
        let (tmp_file, kept, old) = (dir.join(".x.tmp"), dir.join("kept.txt"), dir.join("old"));
        note(
            &pending,
            event(EventKind::Create(CreateKind::File), &tmp_file),
        );
        note(
            &pending,
            event(
                EventKind::Modify(ModifyKind::Name(RenameMode::From)),
                &tmp_file,
            ),
        );
        note(
            &pending,
            event(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &kept),
        );
        note(&pending, event(EventKind::Remove(RemoveKind::File), &old));
        // Reading changes nothing.
        note(
            &pending,
            event(
                EventKind::Access(notify::event::AccessKind::Any),
                &dir.join("r"),
            ),
        );
        let mut b = Batcher {
            id: "w".into(),
            root,
            watched: dir.clone(),
            filter: PathFilter::new(true, &[], &[]).unwrap(),
            seq: 0,
        };
        let paths = std::mem::take(&mut pending.lock().unwrap().paths);
        let (changes, root_gone) = b.changes(paths);
        let got: Vec<(String, ChangeType, Option<u64>)> = changes
            .iter()
            .map(|c| (c.path.clone(), c.kind, c.size))
            .collect();
        assert_eq!(
            got,
            vec![
                (kept.display().to_string(), ChangeType::File, Some(3)),
                (old.display().to_string(), ChangeType::Deleted, None),
            ]
        );
        assert!(!root_gone);
        assert_eq!((changes[0].rev, b.seq), (1, 1));
        // An overflow ends the watch.
        let overflow = notify::Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        note(&pending, Ok(overflow));
        assert!(pending.lock().unwrap().failed.is_some());
    }
}
