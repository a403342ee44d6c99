//! The inotify watcher (via `notify`) that narrows settle to the paths that
//! changed, and the cookie barrier that makes "everything written before
//! settle started is in the dirty set" hold without sleeping.
//!
//! Every directory gets its own non-recursive watch, added by the settle
//! that first sees the directory and *before* that settle lists it: a file
//! created in a new directory is either listed by that walk or reported by
//! the watch, never neither. (notify's recursive mode adds the watch for a
//! new directory only after delivering its event, which leaves that gap
//! open, and cannot leave out the state directory.)
//!
//! Barrier: inotify queues events of one instance in the order the
//! modifying syscalls happened. Settle creates `cookies/<n>` in the state
//! directory (watched by the same instance) and waits until the handler has
//! seen it; by then every event of a write that returned before the cookie
//! was created has been handled. This is watchman's cookie technique.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use notify::event::EventKind;
use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};

/// Beyond this many dirty paths the set is dropped and settle walks the
/// whole tree instead: memory stays bounded under an event storm.
const MAX_DIRTY_PATHS: usize = 200_000;

/// Called (on the watcher's thread, so it must not block) with each path
/// under the root that turned dirty, or with `None` when a rescan became
/// due (anything may have changed).
pub type ChangeHook = Arc<dyn Fn(Option<&Path>) + Send + Sync>;

#[derive(Default)]
struct Shared {
    dirty: HashSet<PathBuf>,
    /// Set when events may have been lost: settle must walk everything.
    rescan: Option<String>,
    cookie_seen: u64,
    on_change: Option<ChangeHook>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("dirty", &self.dirty.len())
            .field("rescan", &self.rescan)
            .field("cookie_seen", &self.cookie_seen)
            .finish_non_exhaustive()
    }
}

/// What settle has to look at.
#[derive(Debug)]
pub(crate) enum Pending {
    /// These absolute paths (and, for directories, their subtrees).
    Paths(HashSet<PathBuf>),
    /// Everything, for this reason.
    Rescan(String),
}

/// Why a directory could not be watched.
#[derive(Debug)]
pub(crate) enum WatchFailure {
    /// The directory vanished meanwhile: not an error.
    Gone,
    /// The watcher cannot go on (watch limit, inotify failure); fall back to
    /// walking.
    Fatal(String),
}

#[derive(Debug)]
pub(crate) struct LocalWatcher {
    watcher: RecommendedWatcher,
    shared: Arc<(Mutex<Shared>, Condvar)>,
    cookie_dir: PathBuf,
    next_cookie: u64,
    barrier_timeout: Duration,
    /// Test hook: how many more directories may be watched before the
    /// watch limit is "reached".
    #[cfg(test)]
    watch_budget: Option<usize>,
}

impl LocalWatcher {
    /// Starts a watcher whose events under `root` (but not under `exclude`,
    /// the state directory) mark paths dirty. No directory is watched yet:
    /// the first (full) settle adds them.
    pub fn start(
        root: &Path,
        exclude: &Path,
        cookie_dir: &Path,
        barrier_timeout: Duration,
    ) -> Result<LocalWatcher, String> {
        let shared: Arc<(Mutex<Shared>, Condvar)> = Arc::default();
        let handler_shared = shared.clone();
        let root = root.to_owned();
        let exclude = exclude.to_owned();
        let cookies = cookie_dir.to_owned();
        let handler = move |res: notify::Result<Event>| {
            let (lock, cvar) = &*handler_shared;
            let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
            match res {
                Err(e) => {
                    let reason = match e.kind {
                        notify::ErrorKind::MaxFilesWatch => {
                            "inotify watch limit reached (fs.inotify.max_user_watches)".to_owned()
                        }
                        _ => format!("watcher error: {e}"),
                    };
                    s.rescan.get_or_insert(reason);
                }
                Ok(ev) => {
                    let rescan_before = s.rescan.is_some();
                    if ev.need_rescan() {
                        s.rescan
                            .get_or_insert_with(|| "inotify event queue overflowed".into());
                    }
                    // Reads (open, close-nowrite) are noise; every write also
                    // raises a modify event.
                    if matches!(ev.kind, EventKind::Access(_)) {
                        return;
                    }
                    for p in ev.paths {
                        if let Ok(rest) = p.strip_prefix(&cookies) {
                            if let Some(n) = rest.to_str().and_then(|n| n.parse::<u64>().ok()) {
                                s.cookie_seen = s.cookie_seen.max(n);
                                cvar.notify_all();
                            }
                        } else if p.starts_with(&exclude) || !p.starts_with(&root) {
                            continue;
                        } else if s.dirty.len() < MAX_DIRTY_PATHS {
                            // Cookies and the state directory never get
                            // here: settle writes those, and a hook that
                            // settles would loop.
                            if let Some(hook) = &s.on_change
                                && !s.dirty.contains(&p)
                            {
                                hook(Some(&p));
                            }
                            s.dirty.insert(p);
                        } else if s.rescan.is_none() {
                            s.dirty.clear();
                            s.rescan = Some(format!("more than {MAX_DIRTY_PATHS} dirty paths"));
                        }
                    }
                    if !rescan_before
                        && s.rescan.is_some()
                        && let Some(hook) = &s.on_change
                    {
                        hook(None);
                    }
                }
            }
        };
        let mut watcher = notify::recommended_watcher(handler)
            .map_err(|e| format!("cannot start the watcher: {e}"))?;
        std::fs::create_dir_all(cookie_dir)
            .map_err(|e| format!("cannot create {}: {e}", cookie_dir.display()))?;
        // Stale cookies from a previous run would be mistaken for new ones.
        if let Ok(rd) = std::fs::read_dir(cookie_dir) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        watcher
            .watch(cookie_dir, RecursiveMode::NonRecursive)
            .map_err(|e| format!("cannot watch {}: {e}", cookie_dir.display()))?;
        Ok(LocalWatcher {
            watcher,
            shared,
            cookie_dir: cookie_dir.to_owned(),
            next_cookie: 0,
            barrier_timeout,
            #[cfg(test)]
            watch_budget: None,
        })
    }

    /// Calls `hook` whenever a change under the root is noticed, so an idle
    /// owner can settle without polling.
    pub fn set_change_hook(&self, hook: ChangeHook) {
        let (lock, _) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).on_change = Some(hook);
    }

    /// Watches one directory (its direct children). Adding an existing
    /// watch again is harmless.
    pub fn watch_dir(&mut self, dir: &Path) -> Result<(), WatchFailure> {
        #[cfg(test)]
        if let Some(left) = self.watch_budget.as_mut() {
            if *left == 0 {
                return Err(WatchFailure::Fatal(format!(
                    "inotify watch limit reached (fs.inotify.max_user_watches) at {} (simulated)",
                    dir.display()
                )));
            }
            *left -= 1;
        }
        match self.watcher.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => Ok(()),
            Err(e) => match &e.kind {
                notify::ErrorKind::PathNotFound => Err(WatchFailure::Gone),
                notify::ErrorKind::Io(io)
                    if matches!(
                        io.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    ) =>
                {
                    Err(WatchFailure::Gone)
                }
                notify::ErrorKind::MaxFilesWatch => Err(WatchFailure::Fatal(format!(
                    "inotify watch limit reached (fs.inotify.max_user_watches) at {}",
                    dir.display()
                ))),
                _ => Err(WatchFailure::Fatal(format!(
                    "cannot watch {}: {e}",
                    dir.display()
                ))),
            },
        }
    }

    /// True when events arrived since the last [`LocalWatcher::take_pending`]
    /// (without a barrier: writes still in flight may not show yet).
    pub fn has_pending(&self) -> bool {
        let (lock, _) = &*self.shared;
        let s = lock.lock().unwrap_or_else(|p| p.into_inner());
        !s.dirty.is_empty() || s.rescan.is_some()
    }

    /// Waits until every event of writes finished before this call has been
    /// handled, then takes what settle must look at.
    pub fn take_pending(&mut self) -> Pending {
        self.next_cookie += 1;
        let n = self.next_cookie;
        let cookie = self.cookie_dir.join(n.to_string());
        let barrier = match std::fs::File::create(&cookie) {
            Err(e) => Err(format!(
                "cannot create the barrier cookie {}: {e}",
                cookie.display()
            )),
            Ok(_) => {
                let (lock, cvar) = &*self.shared;
                let deadline = Instant::now() + self.barrier_timeout;
                let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if s.cookie_seen >= n {
                        break Ok(s);
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Err(format!(
                            "the watcher did not deliver its barrier within {:?}",
                            self.barrier_timeout
                        ));
                    }
                    s = cvar
                        .wait_timeout(s, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        };
        let _ = std::fs::remove_file(&cookie);
        match barrier {
            Ok(mut s) => {
                let dirty = std::mem::take(&mut s.dirty);
                match s.rescan.take() {
                    Some(reason) => Pending::Rescan(reason),
                    None => Pending::Paths(dirty),
                }
            }
            Err(reason) => {
                let (lock, _) = &*self.shared;
                let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
                s.dirty.clear();
                s.rescan = None;
                Pending::Rescan(reason)
            }
        }
    }

    /// Drops the pending events and flags a rescan, as an inotify queue
    /// overflow does.
    #[cfg(test)]
    pub fn simulate_overflow(&self) {
        let (lock, _) = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        s.dirty.clear();
        s.rescan = Some("inotify event queue overflowed".into());
    }

    /// Makes the watch limit "reached" after `n` more directories.
    #[cfg(test)]
    pub fn simulate_watch_limit(&mut self, n: usize) {
        self.watch_budget = Some(n);
    }
}
