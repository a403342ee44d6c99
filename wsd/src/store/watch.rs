//! The inotify watcher (via the `inotify` crate) that narrows settle to the
//! paths that changed, and the cookie barrier that makes "everything
//! written before settle started is in the dirty set" hold without
//! sleeping.
//!
//! One thread reads the instance's events; watches are added by the
//! settling thread itself (`inotify_add_watch`, a few microseconds). With
//! `notify` each added watch was a synchronous round trip to its event
//! thread: 0.22 ms per directory, 186 ms of a 2 s cold push of 30k files
//! in 860 new directories, on the daemon's critical path
//! (bench/RESULTS.md, `cargo bench -p wsd-bench --bench watch`).
//!
//! Every directory gets its own non-recursive watch, added by the settle
//! that first sees the directory and *before* that settle lists it: a file
//! created in a new directory is either listed by that walk or reported by
//! the watch, never neither. (notify's recursive mode adds the watch for a
//! new directory only after delivering its event, which leaves that gap
//! open, and cannot leave out the state directory.)
//!
//! Barrier: inotify queues events of one instance in the order the
//! modifying syscalls happened. Settle makes `cookies/<n>` appear in the
//! state directory (watched by the same instance; the first barrier creates
//! it, each later one renames the previous cookie to its own number) and
//! waits until the handler has seen it; by then every event of a write that
//! returned before the cookie appeared has been handled. This is watchman's
//! cookie technique.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use inotify::{EventMask, Events, Inotify, WatchDescriptor, WatchMask, Watches};

/// What a watch reports: every change to an entry's content, metadata or
/// name. Not opens, reads or closes without a write (noise for settle), and
/// never through a symlink.
const WATCH_MASK: WatchMask = WatchMask::ATTRIB
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MODIFY)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::DONT_FOLLOW);

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
    /// The descriptor and directory of each watch, by descriptor id.
    dirs: HashMap<i32, (WatchDescriptor, PathBuf)>,
    /// The same, by directory.
    watched: HashMap<PathBuf, i32>,
    /// Why the reading thread stopped, if it did: no event arrives any more.
    dead: Option<String>,
    /// Events apply's own syscalls are about to raise, by absolute path.
    expected: HashMap<PathBuf, OwnEvents>,
}

/// How many events of each kind apply's own syscalls raise on one path
/// (each counted from the watch of the path's directory). Only kinds whose
/// events inotify cannot merge with another of ours: a `rename` carries a
/// cookie of its own, a `mkdir` is one `CREATE`; at most one `ATTRIB` and
/// one `MODIFY` are expected, so two of ours merged or not both consume it
/// or leave the second as an ordinary (dirty) event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnEvents {
    pub moved_to: u8,
    pub close_write: u8,
    pub create: u8,
    pub attrib: u8,
    pub modify: u8,
}

impl OwnEvents {
    /// A new version renamed onto its target, then its descriptor closed.
    pub const REPLACE: OwnEvents = OwnEvents {
        moved_to: 1,
        close_write: 1,
        create: 0,
        attrib: 0,
        modify: 0,
    };
    /// A new version renamed onto its target, its descriptor closed before
    /// under its temp name (the io_uring writer, `uring.rs`).
    pub const RENAME_ONTO: OwnEvents = OwnEvents {
        moved_to: 1,
        close_write: 0,
        create: 0,
        attrib: 0,
        modify: 0,
    };
    /// A directory made with `mkdir`.
    pub const MKDIR: OwnEvents = OwnEvents {
        moved_to: 0,
        close_write: 0,
        create: 1,
        attrib: 0,
        modify: 0,
    };
    /// A `chmod`.
    pub const ATTRIB: OwnEvents = OwnEvents {
        moved_to: 0,
        close_write: 0,
        create: 0,
        attrib: 1,
        modify: 0,
    };
    /// Setting the mtime alone (`utimensat` with the atime omitted raises
    /// `MODIFY`, not `ATTRIB`).
    pub const SET_MTIME: OwnEvents = OwnEvents {
        moved_to: 0,
        close_write: 0,
        create: 0,
        attrib: 0,
        modify: 1,
    };

    fn is_empty(&self) -> bool {
        *self == OwnEvents::default()
    }

    /// Consumes one expected event of `mask`'s kind; false when none of
    /// that kind is expected (the event is someone else's).
    fn consume(&mut self, mask: EventMask) -> bool {
        let slot = if mask.contains(EventMask::MOVED_TO) {
            &mut self.moved_to
        } else if mask.contains(EventMask::CLOSE_WRITE) {
            &mut self.close_write
        } else if mask.contains(EventMask::CREATE) {
            &mut self.create
        } else if mask.contains(EventMask::ATTRIB) {
            // At most one: see the type's comment.
            &mut self.attrib
        } else if mask.contains(EventMask::MODIFY) {
            &mut self.modify
        } else {
            return false;
        };
        if *slot == 0 {
            return false;
        }
        *slot -= 1;
        true
    }
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

pub(crate) struct LocalWatcher {
    watches: Watches,
    /// Written to (then closed) to stop the reading thread.
    stop: Option<OwnedFd>,
    reader: Option<std::thread::JoinHandle<()>>,
    shared: Arc<(Mutex<Shared>, Condvar)>,
    cookie_dir: PathBuf,
    next_cookie: u64,
    /// The cookie file the last barrier left, renamed by the next one.
    cookie: Option<PathBuf>,
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
        let inotify =
            Inotify::init().map_err(|e| format!("cannot start the watcher (inotify_init): {e}"))?;
        let watches = inotify.watches();
        // Close-on-exec: a command the daemon runs must not hold the stop
        // pipe (a copy of its write end would keep the reader from seeing
        // it close; the byte Drop writes wakes it regardless).
        let (stop_rx, stop_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| format!("cannot start the watcher (pipe): {e}"))?;
        let shared: Arc<(Mutex<Shared>, Condvar)> = Arc::default();
        let filter = Filter {
            root: root.to_owned(),
            exclude: exclude.to_owned(),
            cookies: cookie_dir.to_owned(),
        };
        let reader_shared = shared.clone();
        let reader = std::thread::Builder::new()
            .name("wsd-watch".into())
            .spawn(move || read_events(inotify, stop_rx, &reader_shared, &filter))
            .map_err(|e| format!("cannot start the watcher thread: {e}"))?;
        let mut w = LocalWatcher {
            watches,
            stop: Some(stop_tx),
            reader: Some(reader),
            shared,
            cookie_dir: cookie_dir.to_owned(),
            next_cookie: 0,
            cookie: None,
            barrier_timeout,
            #[cfg(test)]
            watch_budget: None,
        };
        std::fs::create_dir_all(cookie_dir)
            .map_err(|e| format!("cannot create {}: {e}", cookie_dir.display()))?;
        // Stale cookies from a previous run would be mistaken for new ones.
        if let Ok(rd) = std::fs::read_dir(cookie_dir) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        w.add(cookie_dir)
            .map_err(|e| format!("cannot watch {}: {e}", cookie_dir.display()))?;
        Ok(w)
    }

    /// Adds a watch on `dir` and records its descriptor's directory (a
    /// directory watched again, e.g. after a rename, keeps its descriptor
    /// under its new name). Under the lock the reader files events with, so
    /// no event of the new watch is read before its directory is known.
    fn add(&mut self, dir: &Path) -> std::io::Result<()> {
        let (lock, _) = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        let wd = self.watches.add(dir, WATCH_MASK)?;
        let id = wd.get_watch_descriptor_id();
        if let Some((_, old)) = s.dirs.insert(id, (wd, dir.to_owned())) {
            s.watched.remove(&old);
        }
        s.watched.insert(dir.to_owned(), id);
        Ok(())
    }

    /// Removes the watches of `dir` and of every directory below it, when
    /// settle found `dir` gone: moved out of the tree, they would go on
    /// reporting the old paths and count against the watch limit. A
    /// directory moved elsewhere inside the tree was watched again under
    /// its new name by the settle that walked it, so it is not below `dir`
    /// in the map any more.
    pub fn unwatch_below(&mut self, dir: &Path) {
        let (lock, _) = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        // Most paths settle finds gone were files: one lookup.
        if !s.watched.contains_key(dir) {
            return;
        }
        let gone: Vec<i32> = s
            .dirs
            .iter()
            .filter(|(_, (_, p))| p.starts_with(dir))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some((wd, p)) = s.dirs.remove(&id) {
                s.watched.remove(&p);
                // Already gone with its directory: nothing to undo.
                let _ = self.watches.remove(wd);
            }
        }
    }

    /// Calls `hook` whenever a change under the root is noticed, so an idle
    /// owner can settle without polling.
    pub fn set_change_hook(&self, hook: ChangeHook) {
        let (lock, _) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).on_change = Some(hook);
    }

    /// Files the events apply's next syscalls on `path` (absolute) will
    /// raise, so the reader takes them for apply's and not as changes.
    /// Called before the syscalls.
    pub fn expect(&self, path: &Path, events: OwnEvents) {
        let (lock, _) = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded like the dirty set: past it, apply's events count as
        // anyone's (settled, not lost).
        if s.dead.is_some() || s.expected.len() >= MAX_DIRTY_PATHS {
            return;
        }
        let e = s.expected.entry(path.to_owned()).or_default();
        e.moved_to += events.moved_to;
        e.close_write += events.close_write;
        e.create += events.create;
        e.attrib = e.attrib.max(events.attrib);
        e.modify = e.modify.max(events.modify);
    }

    /// Apply's syscalls on `path` failed after [`Self::expect`]: drops what
    /// is left of its expectation and marks the path dirty, since whatever
    /// did happen there is now unknown.
    pub fn unexpect(&self, path: &Path) {
        let (lock, _) = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        s.expected.remove(path);
        mark_path_dirty(&mut s, path.to_owned());
    }

    /// Marks `path` (absolute) dirty as an event would: the next settle
    /// looks at it (walks it, for a directory).
    pub fn mark_dirty(&self, path: &Path) {
        let (lock, _) = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        mark_path_dirty(&mut s, path.to_owned());
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
        if let Some(reason) = self.dead() {
            return Err(WatchFailure::Fatal(reason));
        }
        match self.add(dir) {
            Ok(()) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(ENOENT | ENOTDIR) => Err(WatchFailure::Gone),
                Some(ENOSPC) => Err(WatchFailure::Fatal(format!(
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

    /// Why the reading thread stopped, if it did.
    fn dead(&self) -> Option<String> {
        let (lock, _) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).dead.clone()
    }

    /// Why the next settle must walk the whole tree (events were lost, or
    /// the reading thread stopped), as far as the events handled so far
    /// tell; `None` when it can look at the dirty paths only.
    pub fn rescan_due(&self) -> Option<String> {
        let (lock, _) = &*self.shared;
        let s = lock.lock().unwrap_or_else(|p| p.into_inner());
        s.rescan
            .clone()
            .or_else(|| s.dead.as_ref().map(|r| format!("the watcher stopped: {r}")))
    }

    /// True when events arrived since the last [`LocalWatcher::take_pending`]
    /// (without a barrier: writes still in flight may not show yet).
    pub fn has_pending(&self) -> bool {
        let (lock, _) = &*self.shared;
        let s = lock.lock().unwrap_or_else(|p| p.into_inner());
        !s.dirty.is_empty() || s.rescan.is_some() || s.dead.is_some()
    }

    /// Waits until every event of writes finished before this call has been
    /// handled, then takes what settle must look at.
    pub fn take_pending(&mut self) -> Pending {
        if let Some(reason) = self.dead() {
            return Pending::Rescan(format!("the watcher stopped: {reason}"));
        }
        self.next_cookie += 1;
        let n = self.next_cookie;
        let cookie = self.cookie_dir.join(n.to_string());
        // One cookie file, renamed to the next number by each barrier: its
        // MOVED_TO names the barrier as a new file's CREATE did, without an
        // inode allocated and freed per settle (a profile of short
        // commands found that allocation at 7.7 % of the daemon's samples).
        let made = match self.cookie.take() {
            Some(prev) => std::fs::rename(&prev, &cookie)
                .or_else(|_| std::fs::File::create(&cookie).map(drop)),
            None => std::fs::File::create(&cookie).map(drop),
        };
        if made.is_ok() {
            self.cookie = Some(cookie.clone());
        }
        let barrier = match made {
            Err(e) => Err(format!(
                "cannot create the barrier cookie {}: {e}",
                cookie.display()
            )),
            Ok(_) => {
                let (lock, cvar) = &*self.shared;
                let deadline = Instant::now() + self.barrier_timeout;
                let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    // After an overflow (the cookie itself may be lost) the
                    // settle walks everything anyway.
                    if s.cookie_seen >= n || s.rescan.is_some() {
                        break Ok(s);
                    }
                    if let Some(reason) = &s.dead {
                        break Err(format!("the watcher stopped: {reason}"));
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
        match barrier {
            Ok(mut s) => {
                // Every event of apply's writes, all finished before the
                // cookie, was filed: what was not consumed is stale.
                let stale: Vec<PathBuf> = s.expected.drain().map(|(p, _)| p).collect();
                s.dirty.extend(stale);
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
                s.expected.clear();
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

    /// Stops event delivery as a failing reader does (its thread keeps
    /// running until drop, reading nothing that matters).
    #[cfg(test)]
    pub fn simulate_reader_failure(&self) {
        mark_dead(&self.shared, "reading inotify events: simulated".to_owned());
    }

    /// Makes the watch limit "reached" after `n` more directories.
    #[cfg(test)]
    pub fn simulate_watch_limit(&mut self, n: usize) {
        self.watch_budget = Some(n);
    }
}

impl Drop for LocalWatcher {
    fn drop(&mut self) {
        // A byte on the stop pipe (and its write end closing) wakes the
        // reader, which then exits and closes the inotify instance.
        if let Some(stop) = self.stop.take() {
            let _ = rustix::io::write(&stop, &[1]);
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl std::fmt::Debug for LocalWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWatcher")
            .field("shared", &self.shared.0)
            .field("cookie_dir", &self.cookie_dir)
            .field("next_cookie", &self.next_cookie)
            .finish_non_exhaustive()
    }
}

/// Which event paths count, and which are barrier cookies.
struct Filter {
    root: PathBuf,
    exclude: PathBuf,
    cookies: PathBuf,
}

/// The reading thread: waits for events (or for `stop` to close), reads
/// every batch the kernel has and files it. A read error other than "no
/// more for now" stops it and marks the watcher dead, so settles walk.
fn read_events(inotify: Inotify, stop: OwnedFd, shared: &(Mutex<Shared>, Condvar), f: &Filter) {
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_loop(inotify, stop, shared, f)
    }));
    let reason = match read {
        Ok(None) => return,
        Ok(Some(reason)) => reason,
        Err(_) => "the watcher thread panicked".to_owned(),
    };
    mark_dead(shared, reason);
}

/// No event arrives any more: settles walk (and give the watcher up), and
/// an owner waiting on the hook or the barrier is told now.
fn mark_dead(shared: &(Mutex<Shared>, Condvar), reason: String) {
    let (lock, cvar) = shared;
    let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
    tracing::warn!(%reason, "the watcher stopped; settles walk the whole tree");
    s.dead = Some(reason);
    if let Some(hook) = &s.on_change {
        hook(None);
    }
    cvar.notify_all();
}

/// [`read_events`]' loop: `None` when stopped, else why it failed.
fn read_loop(
    mut inotify: Inotify,
    stop: OwnedFd,
    shared: &(Mutex<Shared>, Condvar),
    f: &Filter,
) -> Option<String> {
    use rustix::event::{PollFd, PollFlags};
    // Room for many events per read (each is 16 bytes plus its name).
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut fds = [
            PollFd::new(&inotify, PollFlags::IN),
            PollFd::new(&stop, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Some(format!("poll on the inotify instance: {e}")),
        }
        if !fds[1].revents().is_empty() {
            return None;
        }
        loop {
            match inotify.read_events(&mut buf) {
                Ok(events) => file_events(events, shared, f),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Some(format!("reading inotify events: {e}")),
            }
        }
        // Under a stream of events (an apply, a build) woken for every few
        // of them, this thread cost more than filing them: a cold push of
        // 10k files woke it 27k times (a `ppoll` and two `read`s each). A
        // pause after each batch lets the next one gather; a barrier waits
        // at most this much longer, an idle watcher not at all.
        let mut stop_only = [PollFd::new(&stop, PollFlags::IN)];
        match rustix::event::poll(&mut stop_only, Some(&BATCH_PAUSE)) {
            Ok(n) if n > 0 => return None,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Some(format!("poll on the stop pipe: {e}")),
        }
    }
}

/// How long the reader waits after filing a batch before it looks again.
const BATCH_PAUSE: rustix::event::Timespec = rustix::event::Timespec {
    tv_sec: 0,
    tv_nsec: 1_000_000,
};

/// Files one batch of events under one lock: cookies advance the barrier,
/// paths under the root (not the state directory) turn dirty.
fn file_events(events: Events<'_>, shared: &(Mutex<Shared>, Condvar), f: &Filter) {
    let (lock, cvar) = shared;
    let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
    let rescan_before = s.rescan.is_some();
    for ev in events {
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            s.rescan
                .get_or_insert_with(|| "inotify event queue overflowed".into());
            continue;
        }
        let wd = ev.wd.get_watch_descriptor_id();
        if ev.mask.contains(EventMask::IGNORED) {
            // The watch is gone (its directory removed or unmounted); the
            // parent's watch reported that.
            if let Some((_, p)) = s.dirs.remove(&wd)
                && s.watched.get(&p) == Some(&wd)
            {
                s.watched.remove(&p);
            }
            continue;
        }
        let Some((_, dir)) = s.dirs.get(&wd) else {
            continue;
        };
        let p = match ev.name {
            // Apply's temp files are never workspace paths (settle skips
            // them): not dirty, and no reason to wake an idle owner.
            Some(name) if name.to_str().is_some_and(super::fsutil::is_apply_temp) => continue,
            Some(name) => dir.join(name),
            None => dir.clone(),
        };
        if !s.expected.is_empty()
            && let Some(own) = s.expected.get_mut(&p)
            && own.consume(ev.mask)
        {
            if own.is_empty() {
                s.expected.remove(&p);
            }
            continue;
        }
        file_path(&mut s, cvar, f, p);
    }
    if !rescan_before
        && s.rescan.is_some()
        && let Some(hook) = &s.on_change
    {
        hook(None);
    }
}

fn file_path(s: &mut Shared, cvar: &Condvar, f: &Filter, p: PathBuf) {
    if let Ok(rest) = p.strip_prefix(&f.cookies) {
        if let Some(n) = rest.to_str().and_then(|n| n.parse::<u64>().ok()) {
            s.cookie_seen = s.cookie_seen.max(n);
            cvar.notify_all();
        }
    } else if p.starts_with(&f.exclude) || !p.starts_with(&f.root) {
        // The state directory, or outside the root: not the workspace.
    } else {
        // Cookies and the state directory never get here: settle writes
        // those, and a hook that settles would loop.
        mark_path_dirty(s, p);
    }
}

/// Adds `p` to the dirty set (calling the change hook for a new one), or
/// turns an overfull set into a rescan.
fn mark_path_dirty(s: &mut Shared, p: PathBuf) {
    if s.dirty.len() < MAX_DIRTY_PATHS {
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

/// The errno values `watch_dir` tells apart.
const ENOENT: i32 = rustix::io::Errno::NOENT.raw_os_error();
const ENOTDIR: i32 = rustix::io::Errno::NOTDIR.raw_os_error();
const ENOSPC: i32 = rustix::io::Errno::NOSPC.raw_os_error();
