//! The inotify watcher (via the `inotify` crate) that narrows settle to the
//! paths that changed, and the barrier that makes "everything written
//! before settle started is in the dirty set" hold without sleeping.
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
//! Barrier: inotify queues an event before the syscall that raised it
//! returns (`fsnotify` runs inside the syscall). So settle reads the
//! instance's queue empty itself, holding the queue the reading thread
//! reads and files under: every event of a write that returned before
//! settle started is then filed, by that thread or by settle. (Until
//! 2026-11-28 settle made a cookie file appear, watchman's technique, and
//! waited for the reading thread to see it: a rename and two thread
//! wake-ups per settle, plus up to the reader's batch pause.)

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// Called (on the watcher's thread, or the settling one during its
/// barrier, with the watcher's state locked: it must not block) with each
/// path under the root that turned dirty, or with `None` when a rescan
/// became due (anything may have changed).
pub type ChangeHook = Arc<dyn Fn(Option<&Path>) + Send + Sync>;

#[derive(Default)]
struct Shared {
    dirty: HashSet<PathBuf>,
    /// Set when events may have been lost: settle must walk everything.
    rescan: Option<String>,
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
    shared: Arc<Mutex<Shared>>,
    /// The instance's event queue, read by the reading thread and by the
    /// barrier ([`LocalWatcher::take_pending`]).
    queue: Arc<Mutex<EventQueue>>,
    filter: Arc<Filter>,
    /// Test hook: how many more directories may be watched before the
    /// watch limit is "reached".
    #[cfg(test)]
    watch_budget: Option<usize>,
}

impl LocalWatcher {
    /// Starts a watcher whose events under `root` (but not under `exclude`,
    /// the state directory) mark paths dirty. No directory is watched yet:
    /// the first (full) settle adds them.
    pub fn start(root: &Path, exclude: &Path) -> Result<LocalWatcher, String> {
        let inotify =
            Inotify::init().map_err(|e| format!("cannot start the watcher (inotify_init): {e}"))?;
        let watches = inotify.watches();
        // Close-on-exec: a command the daemon runs must not hold the stop
        // pipe (a copy of its write end would keep the reader from seeing
        // it close; the byte Drop writes wakes it regardless).
        let (stop_rx, stop_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| format!("cannot start the watcher (pipe): {e}"))?;
        // The reading thread polls a duplicate of the descriptor (the same
        // queue) while the instance itself sits in `queue`, unlocked.
        // Close-on-exec like the instance: commands must not hold it.
        let readable = rustix::io::fcntl_dupfd_cloexec(&inotify, 0)
            .map_err(|e| format!("cannot start the watcher (dup): {e}"))?;
        let shared: Arc<Mutex<Shared>> = Arc::default();
        let queue = Arc::new(Mutex::new(EventQueue {
            inotify,
            buf: vec![0u8; EVENT_BUFFER_BYTES],
        }));
        let filter = Arc::new(Filter {
            root: root.to_owned(),
            exclude: exclude.to_owned(),
        });
        let reader = {
            let (shared, queue, filter) = (shared.clone(), queue.clone(), filter.clone());
            std::thread::Builder::new()
                .name("wsd-watch".into())
                .spawn(move || read_events(&queue, readable, stop_rx, &shared, &filter))
                .map_err(|e| format!("cannot start the watcher thread: {e}"))?
        };
        Ok(LocalWatcher {
            watches,
            stop: Some(stop_tx),
            reader: Some(reader),
            shared,
            queue,
            filter,
            #[cfg(test)]
            watch_budget: None,
        })
    }

    /// Adds a watch on `dir` and records its descriptor's directory (a
    /// directory watched again, e.g. after a rename, keeps its descriptor
    /// under its new name). Under the lock the reader files events with, so
    /// no event of the new watch is read before its directory is known.
    fn add(&mut self, dir: &Path) -> std::io::Result<()> {
        let lock = &*self.shared;
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
        let lock = &*self.shared;
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
        let lock = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).on_change = Some(hook);
    }

    /// Files the events apply's next syscalls on `path` (absolute) will
    /// raise, so the reader takes them for apply's and not as changes.
    /// Called before the syscalls.
    pub fn expect(&self, path: &Path, events: OwnEvents) {
        let lock = &*self.shared;
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
        let lock = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        s.expected.remove(path);
        mark_path_dirty(&mut s, path.to_owned());
    }

    /// Marks `path` (absolute) dirty as an event would: the next settle
    /// looks at it (walks it, for a directory).
    pub fn mark_dirty(&self, path: &Path) {
        let lock = &*self.shared;
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
        let lock = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).dead.clone()
    }

    /// Why the next settle must walk the whole tree (events were lost, or
    /// the reading thread stopped), as far as the events handled so far
    /// tell; `None` when it can look at the dirty paths only.
    pub fn rescan_due(&self) -> Option<String> {
        let lock = &*self.shared;
        let s = lock.lock().unwrap_or_else(|p| p.into_inner());
        s.rescan
            .clone()
            .or_else(|| s.dead.as_ref().map(|r| format!("the watcher stopped: {r}")))
    }

    /// True when events arrived since the last [`LocalWatcher::take_pending`]
    /// (without a barrier: writes still in flight may not show yet).
    pub fn has_pending(&self) -> bool {
        let lock = &*self.shared;
        let s = lock.lock().unwrap_or_else(|p| p.into_inner());
        !s.dirty.is_empty() || s.rescan.is_some() || s.dead.is_some()
    }

    /// Files every event of writes finished before this call (the barrier:
    /// see the module docs), then takes what settle must look at. Never
    /// waits for the reading thread, only for a batch it is filing.
    pub fn take_pending(&mut self) -> Pending {
        if let Some(reason) = self.dead() {
            return Pending::Rescan(format!("the watcher stopped: {reason}"));
        }
        if let Err(reason) = drain(&self.queue, &self.shared, &self.filter) {
            // Events may be lost from here on: settles walk, as after a
            // failure of the reading thread.
            mark_dead(&self.shared, reason.clone());
            let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            s.dirty.clear();
            s.expected.clear();
            s.rescan = None;
            return Pending::Rescan(format!("the watcher stopped: {reason}"));
        }
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        // Every event of apply's writes, all finished before this call, was
        // filed: what was not consumed is stale.
        let stale: Vec<PathBuf> = s.expected.drain().map(|(p, _)| p).collect();
        s.dirty.extend(stale);
        let dirty = std::mem::take(&mut s.dirty);
        match s.rescan.take() {
            Some(reason) => Pending::Rescan(reason),
            None => Pending::Paths(dirty),
        }
    }

    /// Drops the pending events and flags a rescan, as an inotify queue
    /// overflow does.
    #[cfg(test)]
    pub fn simulate_overflow(&self) {
        let lock = &*self.shared;
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

    /// Stops the reading thread without marking the watcher dead: from
    /// here on only the barrier reads events.
    #[cfg(test)]
    pub fn stop_reader(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = rustix::io::write(&stop, &[1]);
        }
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the reading thread ends");
        }
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
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

/// Which event paths count.
struct Filter {
    root: PathBuf,
    exclude: PathBuf,
}

/// The inotify instance and the buffer its events are read into. Whoever
/// holds it reads a batch and files it before letting go, so an event read
/// from the instance is in the watcher's state before anyone else reads.
struct EventQueue {
    inotify: Inotify,
    buf: Vec<u8>,
}

/// Room for many events per read (each is 16 bytes plus its name).
const EVENT_BUFFER_BYTES: usize = 64 * 1024;

/// Reads and files every event the instance holds, until it has none;
/// `Err` says why reading failed.
fn drain(queue: &Mutex<EventQueue>, shared: &Mutex<Shared>, f: &Filter) -> Result<(), String> {
    let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
    let EventQueue { inotify, buf } = &mut *q;
    loop {
        match inotify.read_events(buf) {
            Ok(events) => file_events(events, shared, f),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading inotify events: {e}")),
        }
    }
}

/// The reading thread: waits for events on `readable` (the instance's
/// descriptor, duplicated) or for `stop` to close, and drains the queue. A
/// read error other than "no more for now" stops it and marks the watcher
/// dead, so settles walk.
fn read_events(
    queue: &Mutex<EventQueue>,
    readable: OwnedFd,
    stop: OwnedFd,
    shared: &Mutex<Shared>,
    f: &Filter,
) {
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_loop(queue, readable, stop, shared, f)
    }));
    let reason = match read {
        Ok(None) => return,
        Ok(Some(reason)) => reason,
        Err(_) => "the watcher thread panicked".to_owned(),
    };
    mark_dead(shared, reason);
}

/// No event arrives any more: settles walk (and give the watcher up), and
/// an owner waiting on the hook is told now.
fn mark_dead(shared: &Mutex<Shared>, reason: String) {
    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
    tracing::warn!(%reason, "the watcher stopped; settles walk the whole tree");
    s.dead = Some(reason);
    if let Some(hook) = &s.on_change {
        hook(None);
    }
}

/// [`read_events`]' loop: `None` when stopped, else why it failed.
fn read_loop(
    queue: &Mutex<EventQueue>,
    readable: OwnedFd,
    stop: OwnedFd,
    shared: &Mutex<Shared>,
    f: &Filter,
) -> Option<String> {
    use rustix::event::{PollFd, PollFlags};
    loop {
        let mut fds = [
            PollFd::new(&readable, PollFlags::IN),
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
        // A settle may have drained the queue since the poll: then this
        // reads nothing.
        if let Err(reason) = drain(queue, shared, f) {
            return Some(reason);
        }
        // Under a stream of events (an apply, a build) woken for every few
        // of them, this thread cost more than filing them: a cold push of
        // 10k files woke it 27k times (a `ppoll` and two `read`s each). A
        // pause after each batch lets the next one gather (a settle's
        // barrier reads the queue itself, so it never waits for this).
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

/// Files one batch of events under one lock: paths under the root (not
/// the state directory) turn dirty.
fn file_events(events: Events<'_>, shared: &Mutex<Shared>, f: &Filter) {
    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
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
        file_path(&mut s, f, p);
    }
    if !rescan_before
        && s.rescan.is_some()
        && let Some(hook) = &s.on_change
    {
        hook(None);
    }
}

fn file_path(s: &mut Shared, f: &Filter, p: PathBuf) {
    if p.starts_with(&f.exclude) || !p.starts_with(&f.root) {
        // The state directory, or outside the root: not the workspace.
    } else {
        // The state directory never gets here: settle writes there, and a
        // hook that settles would loop.
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
