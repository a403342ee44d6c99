//! The SQLite index: schema, migrations and row helpers. See `DESIGN.md`.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use wsd_sqlite::{
    CleanClose, JournalMode, LegacyBookkeeping, Migration, MigrationSet, OnDamage, Opened, Pragmas,
    Setup, Synchronous,
};
use wsd_sync::chunk::KnownChunk;
use wsd_sync::{ChangeCursor, ChangeEntry, ChunkRef, EntryState, Hash, SyncError, SyncPath};

use super::error::{IndexContext, StoreError};

/// The index's migrations (owner `index`). Never edit a shipped entry:
/// append a new one. Indexes written before `wsd-sqlite` counted them in
/// `PRAGMA user_version`.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial schema",
        sql: r#"
    CREATE TABLE meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL) STRICT;
    INSERT INTO meta (k, v) VALUES ('rev', 0), ('prune_horizon', 0);
    CREATE TABLE nodes (
        path TEXT PRIMARY KEY,
        parent TEXT NOT NULL,
        kind INTEGER NOT NULL,
        mode INTEGER NOT NULL,
        size INTEGER NOT NULL,
        mtime_ms INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        dev INTEGER NOT NULL,
        ino INTEGER NOT NULL,
        ctime_ns INTEGER NOT NULL,
        target TEXT,
        manifest BLOB,
        verified_ns INTEGER NOT NULL,
        rev INTEGER NOT NULL,
        applied_from TEXT
    ) STRICT;
    CREATE INDEX nodes_by_rev ON nodes (rev, path);
    CREATE INDEX nodes_by_parent ON nodes (parent, path);
    CREATE TABLE chunks (
        path TEXT NOT NULL,
        idx INTEGER NOT NULL,
        hash BLOB NOT NULL,
        offset INTEGER NOT NULL,
        size INTEGER NOT NULL,
        PRIMARY KEY (path, idx)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX chunks_by_hash ON chunks (hash);
    CREATE TABLE remotes (
        name TEXT PRIMARY KEY,
        push_rev INTEGER NOT NULL DEFAULT 0,
        push_path TEXT,
        fetch_rev INTEGER NOT NULL DEFAULT 0,
        fetch_path TEXT
    ) STRICT;
    CREATE TABLE baseline_marks (
        remote TEXT NOT NULL,
        path TEXT NOT NULL,
        PRIMARY KEY (remote, path)
    ) STRICT, WITHOUT ROWID;
    "#,
    },
    // Where an ongoing baseline got to, so a restarted one (its first
    // entry not after the last one marked) drops the stale marks.
    Migration {
        version: 2,
        name: "baseline progress",
        sql: r#"
    CREATE TABLE baseline_progress (
        remote TEXT PRIMARY KEY,
        rev INTEGER NOT NULL,
        path TEXT NOT NULL
    ) STRICT;
    "#,
    },
    // A cheap fingerprint (BLAKE3) of each chunk of a large file a settle
    // hashed, so re-hashing it after an edit checks unchanged stretches by
    // fingerprint instead of cutting and SHA-256-ing them again
    // (`wsd_sync::chunk::rechunk_reader_with`). NULL where unknown (rows
    // apply wrote, small files, rows from before).
    Migration {
        version: 3,
        name: "chunk fingerprints",
        sql: r#"
    ALTER TABLE chunks ADD COLUMN fingerprint BLOB;
    "#,
    },
];

/// A chunk's fingerprint: the BLAKE3 of its bytes (see migration 3).
pub(crate) type Fingerprint = [u8; 32];

/// How the index is opened. WAL: readers never block the single writer;
/// NORMAL: a crash may lose the last commits but never corrupts, and the
/// directory stays the truth that the next settle reconciles against. A
/// damaged index is set aside: it is derived from the tree, so the store's
/// startup walk rebuilds it, and with no cursors left every peer
/// re-baselines.
const SETUP: Setup<'static> = Setup {
    what: "the index",
    pragmas: Pragmas {
        journal_mode: JournalMode::Wal,
        synchronous: Synchronous::Normal,
        busy_timeout: std::time::Duration::from_secs(5),
        foreign_keys: false,
        // Checkpoint every 64 MiB of WAL, not every 4 MiB: each checkpoint
        // copies pages back and fsyncs (30 fsyncs in one cold push of 10k
        // files at the default).
        wal_autocheckpoint: Some(16384),
        cache_kib: None,
        // Without it, a parameter such as a chunk hash or a LIMIT re-prepared
        // the cached statement on every rebind: 7% of a cold push's
        // receiving CPU went to re-parsing one query.
        stable_query_plans: true,
        // Room for every statement the store prepares, so none is re-parsed.
        statement_cache: Some(64),
    },
    application_id: None,
    migrations: &[MigrationSet {
        owner: "index",
        migrations: MIGRATIONS,
        legacy: LegacyBookkeeping::UserVersion,
    }],
    on_damage: OnDamage::SetAside,
};

/// The index of a store opened with `StoreOptions::durable_index` off (the
/// CLI's): no `fsync` ever, checkpoints included. A process crash loses
/// nothing (the kernel holds every write); an OS crash may lose or tear
/// writes since the kernel last flushed, which [`check_after_os_crash`]
/// finds at the next boot.
const SETUP_NOT_DURABLE: Setup<'static> = Setup {
    pragmas: Pragmas {
        synchronous: Synchronous::Off,
        ..SETUP.pragmas
    },
    ..SETUP
};

/// Beside a non-durable index: the boot id (`/proc/sys/kernel/random/boot_id`)
/// of the last session that wrote it. Another boot's id, or none, means
/// the OS may have stopped before flushing the index's writes.
pub const BOOT_FILE: &str = "index.sqlite3.boot";

/// Opens (creating if needed) the index at `path` through `wsd-sqlite`:
/// pragmas, migrations, and `PRAGMA quick_check` unless the last close
/// stamped the file clean (the check reads every page: 14 ms of a CLI push
/// on a 20k-file index). A damaged index is set aside with a warning and a
/// fresh one created. Returns whether that happened: the index is new and
/// knows nothing of what was synced before.
///
/// `durable` off: commits never wait for the disk, and a non-durable index
/// first written under another boot gets the full check of
/// [`check_after_os_crash`].
pub(crate) fn open(
    path: &Path,
    durable: bool,
) -> Result<(Connection, CleanClose, bool), StoreError> {
    let boot = path.with_file_name(BOOT_FILE);
    let booted = current_boot_id();
    let recorded = read_boot_id(&boot);
    let mut rebuilt = false;
    if !durable
        && path.exists()
        && (recorded.is_none() || recorded != booted)
        && let Some(reason) = check_after_os_crash(path)
    {
        let moved_to = wsd_sqlite::set_aside(path).map_err(|source| StoreError::Io {
            context: format!("setting aside the damaged index {}", path.display()),
            source,
        })?;
        tracing::warn!(
            index = %path.display(),
            moved_to = %moved_to.display(),
            %reason,
            "the index lost writes in an OS crash: rebuilding it from the tree (peers re-baseline)"
        );
        rebuilt = true;
    }
    let setup = if durable { &SETUP } else { &SETUP_NOT_DURABLE };
    let opened = wsd_sqlite::open(path, setup).map_err(|e| StoreError::Database(Box::new(e)))?;
    let Opened {
        conn: db,
        clean_close,
        set_aside,
    } = opened;
    if let Some(aside) = &set_aside {
        tracing::warn!(
            index = %path.display(),
            moved_to = %aside.moved_to.display(),
            reason = %aside.reason,
            "rebuilding the damaged index from the tree (peers re-baseline)"
        );
    }
    if rebuilt || set_aside.is_some() {
        // The rebuilt index knows nothing of what was deleted or pushed
        // before: a horizon at the first rev makes every reader whose cursor
        // predates the rebuild (a push cursor reset to zero, too) take a
        // baseline, whose sweep removes on the peer what no longer exists
        // here.
        db.execute("UPDATE meta SET v = 1 WHERE k = 'prune_horizon'", [])
            .map_err(|source| StoreError::Index {
                context: format!("marking the rebuilt index ({})", path.display()),
                source,
            })?;
        rebuilt = true;
    }
    if !durable
        && let Some(id) = booted
        && recorded.as_ref() != Some(&id)
    {
        // Not synced either: lost with the index's own writes, it makes
        // the next boot check.
        std::fs::write(&boot, id).map_err(|source| StoreError::Io {
            context: format!("writing {}", boot.display()),
            source,
        })?;
    }
    Ok((db, clean_close, rebuilt))
}

/// This boot's id; `None` where the kernel does not tell (then every open
/// of a non-durable index checks it fully).
fn current_boot_id() -> Option<String> {
    read_boot_id(Path::new("/proc/sys/kernel/random/boot_id"))
}

fn read_boot_id(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Why a non-durable index may not be trusted after an OS crash, or `None`
/// when it may. A lost tail is harmless (the tree is the truth, and a
/// cursor that went back only resends, as apply is idempotent); a torn
/// file is not, so this runs the full `PRAGMA integrity_check` (B-trees
/// and every index against its table, which `quick_check` skips) and
/// checks that no row and no cursor is ahead of the rev counter (pages
/// from two different moments). Once per boot, O(size of the index).
pub(crate) fn check_after_os_crash(path: &Path) -> Option<String> {
    let check = || -> Result<Option<String>, rusqlite::Error> {
        let conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        let mut stmt = conn.prepare("PRAGMA integrity_check")?;
        let rows: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<_, _>>()?;
        if rows.len() != 1 || rows[0] != "ok" {
            return Ok(Some(rows.join("; ")));
        }
        let ahead: Option<String> = conn
            .query_row(
                "WITH r AS (SELECT v FROM meta WHERE k = 'rev')
                 SELECT CASE
                   WHEN (SELECT max(rev) FROM nodes) > (SELECT v FROM r)
                     THEN 'a row is ahead of the rev counter'
                   WHEN (SELECT max(push_rev) FROM remotes) > (SELECT v FROM r)
                     THEN 'a push cursor is ahead of the rev counter'
                 END",
                [],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        Ok(ahead)
    };
    match check() {
        Ok(found) => found,
        // A table the check reads is missing (an index from an older
        // build before its migration ran) is not damage; the open's own
        // checks and migrations handle it.
        Err(e) if wsd_sqlite::is_corruption(&e) => Some(e.to_string()),
        Err(_) => None,
    }
}

/// What a row says is at its path.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum NodeKind {
    File = 0,
    Dir = 1,
    Symlink = 2,
    Tombstone = 3,
}

impl NodeKind {
    fn from_i64(v: i64) -> Result<NodeKind, SyncError> {
        Ok(match v {
            0 => NodeKind::File,
            1 => NodeKind::Dir,
            2 => NodeKind::Symlink,
            3 => NodeKind::Tombstone,
            _ => return Err(SyncError::Storage(format!("index: unknown node kind {v}"))),
        })
    }
}

/// What the filesystem said about a path when it was indexed. Two stats
/// with equal fields are taken to mean unchanged content (modulo the
/// racy-clean rule, see [`Stat::is_racy`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct Stat {
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub dev: u64,
    pub ino: u64,
    pub ctime_ns: i64,
}

/// How close to its hashing time a file's ctime must be to count as
/// racily clean. This compares the filesystem's clock with ours, so it
/// covers coarse clocks (jiffies, 1-2 s granularity on FAT/SMB) and a
/// network filesystem's server clock being off by up to about as much; the
/// cost is one more hash of recently written files.
pub(crate) const RACY_MARGIN_NS: i64 = 2_000_000_000;

/// How close a file's mtime must be to its own ctime for a later write to
/// reproduce it, when the ctime's nanoseconds show sub-10 ms stamps (ext4,
/// xfs, btrfs, tmpfs, overlayfs, NFS): both come from the filesystem's one
/// clock, whose tick is at most 10 ms, so ten ticks cover it.
pub(crate) const FINE_RACY_MARGIN_NS: i64 = 100_000_000;

/// `statfs` types of local filesystems (`linux/magic.h`): their timestamps
/// come from this kernel's clock, the one `verified_ns` is read from.
pub(crate) const LOCAL_FS_TYPES: [u64; 8] = [
    0xEF53,      // ext2/3/4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0x794C_7630, // overlayfs (its upper layer is local)
    0x2FC1_2FC1, // zfs
    0xF2F5_2010, // f2fs
    0xCA45_1A4E, // bcachefs
];

/// Devices (`st_dev`) known to hold a local filesystem, registered by each
/// store for its root ([`note_clock_of`]). Anything else (NFS, SMB, FUSE, a
/// mount inside the root) is treated as a clock that may be off by a
/// second or two.
static LOCAL_CLOCK_DEVS: std::sync::RwLock<Vec<u64>> = std::sync::RwLock::new(Vec::new());

/// Records whether the filesystem holding `root` keeps time with this
/// kernel's clock (for [`Stat::is_racy`]). Best effort: a failing `statfs`
/// leaves the generous margin.
pub(crate) fn note_clock_of(root: &Path) {
    use std::os::unix::fs::MetadataExt;
    let local = rustix::fs::statfs(root).is_ok_and(|s| LOCAL_FS_TYPES.contains(&(s.f_type as u64)));
    let Ok(dev) = std::fs::metadata(root).map(|m| m.dev()) else {
        return;
    };
    if local
        && let Ok(mut devs) = LOCAL_CLOCK_DEVS.write()
        && !devs.contains(&dev)
    {
        devs.push(dev);
    }
}

fn has_local_clock(dev: u64) -> bool {
    LOCAL_CLOCK_DEVS.read().is_ok_and(|d| d.contains(&dev))
}

impl Stat {
    /// The racy-clean rule (git's, sharpened by ctime), the one place it is
    /// written. A write after the content was hashed stamps the file's
    /// mtime *and* ctime with the filesystem clock's "now"; the stat still
    /// equals this one only if that "now" falls in the tick of both
    /// recorded stamps. So a stat equal to this one does not prove the
    /// content when
    /// - its ctime is within a tick of `verified_ns` (when it was last
    ///   hashed, or written by apply), and
    /// - its mtime is within a tick of its ctime (or after it): a file whose
    ///   mtime was set to an earlier time (apply stamps the sender's mtime;
    ///   `touch -d`, `cp -p`, `tar`) cannot be rewritten to that mtime by an
    ///   ordinary write.
    ///
    /// The tick is [`FINE_RACY_MARGIN_NS`] when the ctime's nanoseconds
    /// prove sub-10 ms stamps, else [`RACY_MARGIN_NS`]. The second test
    /// compares two stamps of the filesystem's own clock; the first compares
    /// that clock with ours, so it uses the fine tick only on a local
    /// filesystem ([`note_clock_of`]) and [`RACY_MARGIN_NS`] elsewhere (a
    /// server's clock may be off).
    pub(crate) fn is_racy(&self, verified_ns: i64) -> bool {
        let fine = self.ctime_ns.rem_euclid(10_000_000) != 0;
        let tick = if fine {
            FINE_RACY_MARGIN_NS
        } else {
            RACY_MARGIN_NS
        };
        if self.mtime_ns.saturating_add(tick) < self.ctime_ns
            || self.ctime_ns.saturating_add(RACY_MARGIN_NS) < verified_ns
        {
            return false;
        }
        // Changed within 2 s of the hashing: on our own clock only a tick
        // counts (looked up only here, off the walk's common path).
        !(fine && has_local_clock(self.dev))
            || self.ctime_ns.saturating_add(FINE_RACY_MARGIN_NS) >= verified_ns
    }

    /// True when `disk` (a `stat` of the file now) proves the bytes hashed
    /// at `verified_ns` under this stat are still there: equal, and not
    /// racily clean.
    pub(crate) fn proves_unchanged(&self, disk: &std::fs::Metadata, verified_ns: i64) -> bool {
        Stat::of(disk) == *self && !self.is_racy(verified_ns)
    }

    /// The stat apply records for what it wrote with `mode`: the disk's,
    /// but the mode asked for. A `chmod` by someone else after ours (or a
    /// bit the kernel refused) then differs from the row, and the next
    /// settle ships it as a local change instead of it passing for the
    /// sender's state.
    pub(crate) fn applied(m: &std::fs::Metadata, mode: u32) -> Stat {
        Stat {
            mode: mode & wsd_sync::MODE_MASK,
            ..Stat::of(m)
        }
    }

    /// The same fields [`Stat::of`] gives for the `Metadata` std builds
    /// from this `statx` (its `dev` is `makedev(major, minor)` too).
    pub fn of_statx(x: &rustix::fs::Statx) -> Stat {
        let ns = |t: &rustix::fs::StatxTimestamp| {
            t.tv_sec
                .saturating_mul(1_000_000_000)
                .saturating_add(i64::from(t.tv_nsec))
        };
        Stat {
            mode: u32::from(x.stx_mode) & wsd_sync::MODE_MASK,
            size: x.stx_size,
            mtime_ns: ns(&x.stx_mtime),
            dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
            ino: x.stx_ino,
            ctime_ns: ns(&x.stx_ctime),
        }
    }

    pub fn of(m: &std::fs::Metadata) -> Stat {
        use std::os::unix::fs::MetadataExt;
        Stat {
            mode: m.mode() & wsd_sync::MODE_MASK,
            size: m.size(),
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            dev: m.dev(),
            ino: m.ino(),
            ctime_ns: m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec()),
        }
    }

    /// The wire mtime: milliseconds since the epoch, rounded down.
    pub fn mtime_ms(&self) -> i64 {
        self.mtime_ns.div_euclid(1_000_000)
    }
}

/// One row of `nodes`: a live path or a tombstone.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Node {
    pub path: SyncPath,
    pub kind: NodeKind,
    pub stat: Stat,
    pub target: Option<String>,
    pub manifest: Option<Hash>,
    /// When the content was last hashed or written by apply (ns since the
    /// epoch): the racy-clean reference point.
    pub verified_ns: i64,
    pub rev: u64,
    /// The remote whose apply produced this state; `None` once changed locally.
    pub applied_from: Option<String>,
}

impl Node {
    pub fn is_live(&self) -> bool {
        self.kind != NodeKind::Tombstone
    }
}

const NODE_COLS: &str = "path, kind, mode, size, mtime_ns, dev, ino, ctime_ns, target, manifest, verified_ns, rev, applied_from";

fn node_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, i64, Node0)> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        Node0 {
            stat: Stat {
                mode: r.get::<_, i64>(2)? as u32,
                size: r.get::<_, i64>(3)? as u64,
                mtime_ns: r.get(4)?,
                dev: r.get::<_, i64>(5)? as u64,
                ino: r.get::<_, i64>(6)? as u64,
                ctime_ns: r.get(7)?,
            },
            target: r.get(8)?,
            manifest: r.get(9)?,
            verified_ns: r.get(10)?,
            rev: r.get::<_, i64>(11)? as u64,
            applied_from: r.get(12)?,
        },
    ))
}

/// A row before its path and kind are validated.
struct Node0 {
    stat: Stat,
    target: Option<String>,
    manifest: Option<Vec<u8>>,
    verified_ns: i64,
    rev: u64,
    applied_from: Option<String>,
}

fn finish(path: String, kind: i64, n: Node0) -> Result<Node, SyncError> {
    let path = SyncPath::new(path)
        .map_err(|e| SyncError::Storage(format!("index holds a bad path: {e}")))?;
    Ok(Node {
        path,
        kind: NodeKind::from_i64(kind)?,
        stat: n.stat,
        target: n.target,
        manifest: n.manifest.map(|b| Hash::from_slice(&b)).transpose()?,
        verified_ns: n.verified_ns,
        rev: n.rev,
        applied_from: n.applied_from,
    })
}

/// The row for `path` (live or tombstone).
pub(crate) fn get_node(db: &Connection, path: &SyncPath) -> Result<Option<Node>, SyncError> {
    let row = db
        .prepare_cached(&format!("SELECT {NODE_COLS} FROM nodes WHERE path = ?1"))
        .and_then(|mut s| s.query_row([path.as_str()], node_from_row).optional())
        .ctx("reading a node")?;
    row.map(|(p, k, n)| finish(p, k, n)).transpose()
}

/// What a walk compares a directory entry against: the kind, stat and
/// verification time of a live row, without building its [`Node`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChildRow {
    pub kind: NodeKind,
    pub stat: Stat,
    pub verified_ns: i64,
}

/// The live rows of one directory's children, for a walk to take out by
/// name: the names share one buffer and the rows sit sorted in one `Vec`,
/// so a directory costs a few allocations instead of one per row, and its
/// lookups stay within a few cache lines.
#[derive(Debug, Default)]
pub(crate) struct DirRows {
    names: String,
    /// `(start, end)` of the name in `names`, the row, and whether the walk
    /// took it; sorted by name once [`DirRows::sort`] ran.
    rows: Vec<(u32, u32, ChildRow, bool)>,
}

impl DirRows {
    fn push(&mut self, name: &str, row: ChildRow) {
        let start = self.names.len() as u32;
        self.names.push_str(name);
        self.rows.push((start, self.names.len() as u32, row, false));
    }

    fn name(&self, i: usize) -> &str {
        let (a, b, ..) = self.rows[i];
        &self.names[a as usize..b as usize]
    }

    fn sort(&mut self) {
        let names = &self.names;
        self.rows.sort_unstable_by(|x, y| {
            names[x.0 as usize..x.1 as usize].cmp(&names[y.0 as usize..y.1 as usize])
        });
    }

    /// The row of `name`, once: a second take of the same name is `None`.
    pub fn take(&mut self, name: &str) -> Option<ChildRow> {
        let names = &self.names;
        let i = self
            .rows
            .binary_search_by(|x| names[x.0 as usize..x.1 as usize].cmp(name))
            .ok()?;
        let r = &mut self.rows[i];
        if std::mem::replace(&mut r.3, true) {
            return None;
        }
        Some(r.2)
    }

    /// The names no [`DirRows::take`] asked for, in order.
    pub fn untaken(&self) -> impl Iterator<Item = &str> {
        (0..self.rows.len())
            .filter(|&i| !self.rows[i].3)
            .map(|i| self.name(i))
    }
}

/// The live children of `parent` (`""` = root), in one query (the
/// `(parent, path)` index).
pub(crate) fn live_children(db: &Connection, parent: &str) -> Result<DirRows, SyncError> {
    let mut stmt = db
        .prepare_cached(
            "SELECT path, kind, mode, size, mtime_ns, dev, ino, ctime_ns, verified_ns
             FROM nodes WHERE parent = ?1 AND kind != 3",
        )
        .ctx("listing children")?;
    let mut rows = stmt.query([parent]).ctx("listing children")?;
    let mut out = DirRows::default();
    while let Some(r) = rows.next().ctx("listing children")? {
        let (name, row) = child_row(r).ctx("listing children")?;
        out.push(name, row);
    }
    out.sort();
    Ok(out)
}

/// Every live row, grouped by parent key (`""` = root): what a whole-tree
/// walk compares with, read in one pass over the table instead of one
/// indexed query per directory. `None` when the index holds more than
/// `max_rows` live rows (the caller then reads per directory, bounding the
/// memory a walk of a huge tree takes).
pub(crate) fn live_rows_by_parent(
    db: &Connection,
    max_rows: usize,
) -> Result<Option<rustc_hash::FxHashMap<String, DirRows>>, SyncError> {
    let mut stmt = db
        .prepare_cached(
            "SELECT path, kind, mode, size, mtime_ns, dev, ino, ctime_ns, verified_ns, parent
             FROM nodes WHERE kind != 3",
        )
        .ctx("reading the index")?;
    let mut rows = stmt.query([]).ctx("reading the index")?;
    // Fx hashing: keys are the user's own directory names.
    let mut out = rustc_hash::FxHashMap::<String, DirRows>::default();
    let mut n = 0usize;
    while let Some(r) = rows.next().ctx("reading the index")? {
        n += 1;
        if n > max_rows {
            return Ok(None);
        }
        let (name, row) = child_row(r).ctx("reading the index")?;
        let parent = r
            .get_ref(9)
            .and_then(|v| Ok(v.as_str()?))
            .ctx("reading the index")?;
        // One key per directory, not per row.
        match out.get_mut(parent) {
            Some(dir) => dir.push(name, row),
            None => out.entry(parent.to_owned()).or_default().push(name, row),
        }
    }
    out.values_mut().for_each(DirRows::sort);
    Ok(Some(out))
}

/// Decodes `path, kind, mode, size, mtime_ns, dev, ino, ctime_ns,
/// verified_ns` into the row's name (last segment) and [`ChildRow`].
fn child_row<'r>(r: &'r rusqlite::Row<'_>) -> rusqlite::Result<(&'r str, ChildRow)> {
    let path = r.get_ref(0)?.as_str()?;
    let name = path.rsplit('/').next().unwrap_or(path);
    let row = ChildRow {
        kind: NodeKind::from_i64(r.get(1)?).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(
                1,
                rusqlite::types::Type::Integer,
                Box::new(e),
            )
        })?,
        stat: Stat {
            mode: r.get::<_, i64>(2)? as u32,
            size: r.get::<_, i64>(3)? as u64,
            mtime_ns: r.get(4)?,
            dev: r.get::<_, i64>(5)? as u64,
            ino: r.get::<_, i64>(6)? as u64,
            ctime_ns: r.get(7)?,
        },
        verified_ns: r.get(8)?,
    };
    Ok((name, row))
}

/// The key of a path's parent in the `parent` column.
fn parent_key(path: &SyncPath) -> String {
    path.parent().map(SyncPath::into_string).unwrap_or_default()
}

/// Bounds of the key range holding exactly the strict descendants of `p`
/// (`p/` ≤ key < `p0`, as `0` is the byte after `/`).
pub(crate) fn descendant_range(p: &SyncPath) -> (String, String) {
    (format!("{p}/"), format!("{p}0"))
}

/// Inserts or replaces the row of a live path; for files, replaces its chunk
/// locations too (offsets follow from the sizes).
pub(crate) fn put_node(db: &Connection, node: &Node, chunks: &[ChunkRef]) -> Result<(), SyncError> {
    put_node_with(db, node, chunks, true)
}

/// [`put_node`]; `clear_chunks = false` when the path is known to have no
/// chunk rows (no row before, or a row that was not a live file).
pub(crate) fn put_node_with(
    db: &Connection,
    node: &Node,
    chunks: &[ChunkRef],
    clear_chunks: bool,
) -> Result<(), SyncError> {
    put_file_node(db, node, chunks, None, clear_chunks)
}

/// [`put_node_with`], with each chunk's fingerprint when they are known
/// (as many as `chunks`).
pub(crate) fn put_file_node(
    db: &Connection,
    node: &Node,
    chunks: &[ChunkRef],
    fingerprints: Option<&[Fingerprint]>,
    clear_chunks: bool,
) -> Result<(), SyncError> {
    debug_assert!(fingerprints.is_none_or(|f| f.len() == chunks.len()));
    let s = &node.stat;
    db.prepare_cached(
        "INSERT OR REPLACE INTO nodes (path, parent, kind, mode, size, mtime_ms, mtime_ns, dev, ino,
            ctime_ns, target, manifest, verified_ns, rev, applied_from)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )
    .and_then(|mut st| {
        st.execute(params![
            node.path.as_str(),
            parent_key(&node.path),
            node.kind as i64,
            i64::from(s.mode),
            s.size as i64,
            s.mtime_ms(),
            s.mtime_ns,
            s.dev as i64,
            s.ino as i64,
            s.ctime_ns,
            node.target,
            node.manifest.map(|h| h.0.to_vec()),
            node.verified_ns,
            node.rev as i64,
            node.applied_from,
        ])
    })
    .ctx("writing a node")?;
    if clear_chunks {
        db.prepare_cached("DELETE FROM chunks WHERE path = ?1")
            .and_then(|mut st| st.execute([node.path.as_str()]))
            .ctx("clearing chunk locations")?;
    }
    let mut ins = db
        .prepare_cached(
            "INSERT INTO chunks (path, idx, hash, offset, size, fingerprint)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .ctx("writing chunk locations")?;
    let mut offset = 0u64;
    for (i, c) in chunks.iter().enumerate() {
        let print = fingerprints.and_then(|f| f.get(i)).map(|f| &f[..]);
        ins.execute(params![
            node.path.as_str(),
            i as i64,
            &c.hash.0[..],
            offset as i64,
            i64::from(c.size),
            print,
        ])
        .ctx("writing chunk locations")?;
        offset += u64::from(c.size);
    }
    Ok(())
}

/// A file's chunks with their fingerprints, in order, when every one of
/// them has one (`None`: no chunks, or some were written without).
pub(crate) fn known_chunks(
    db: &Connection,
    path: &SyncPath,
) -> Result<Option<Vec<KnownChunk<Fingerprint>>>, SyncError> {
    let mut stmt = db
        .prepare_cached("SELECT hash, size, fingerprint FROM chunks WHERE path = ?1 ORDER BY idx")
        .ctx("reading chunk fingerprints")?;
    let rows = stmt
        .query_map([path.as_str()], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Option<Vec<u8>>>(2)?,
            ))
        })
        .ctx("reading chunk fingerprints")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading chunk fingerprints")?;
    let mut out = Vec::with_capacity(rows.len());
    for (hash, size, print) in rows {
        let Some(fingerprint) = print.and_then(|p| Fingerprint::try_from(p.as_slice()).ok()) else {
            return Ok(None);
        };
        out.push(KnownChunk {
            chunk: ChunkRef {
                hash: Hash::from_slice(&hash)?,
                size: size as u32,
            },
            fingerprint,
        });
    }
    Ok((!out.is_empty()).then_some(out))
}

/// Records a new stat for a row whose content was re-verified unchanged.
/// No rev: nothing a peer could observe changed except the mtime.
pub(crate) fn refresh_stat(
    db: &Connection,
    path: &SyncPath,
    stat: &Stat,
    verified_ns: i64,
) -> Result<(), SyncError> {
    db.prepare_cached(
        "UPDATE nodes SET mode = ?2, size = ?3, mtime_ms = ?4, mtime_ns = ?5, dev = ?6, ino = ?7,
            ctime_ns = ?8, verified_ns = ?9 WHERE path = ?1",
    )
    .and_then(|mut st| {
        st.execute(params![
            path.as_str(),
            i64::from(stat.mode),
            stat.size as i64,
            stat.mtime_ms(),
            stat.mtime_ns,
            stat.dev as i64,
            stat.ino as i64,
            stat.ctime_ns,
            verified_ns
        ])
    })
    .ctx("refreshing a stat")?;
    Ok(())
}

/// Turns every live row at or below `path` into a tombstone at `rev` and
/// drops their chunk locations. Returns how many rows changed.
pub(crate) fn tombstone_subtree(
    db: &Connection,
    path: &SyncPath,
    rev: u64,
    applied_from: Option<&str>,
) -> Result<usize, SyncError> {
    let (lo, hi) = descendant_range(path);
    db.prepare_cached("DELETE FROM chunks WHERE path = ?1 OR (path >= ?2 AND path < ?3)")
        .and_then(|mut st| st.execute(params![path.as_str(), lo, hi]))
        .ctx("dropping chunk locations")?;
    db.prepare_cached(
        "UPDATE nodes SET kind = 3, mode = 0, size = 0, mtime_ms = 0, mtime_ns = 0, dev = 0, ino = 0,
            ctime_ns = 0, target = NULL, manifest = NULL, verified_ns = 0, rev = ?4, applied_from = ?5
         WHERE (path = ?1 OR (path >= ?2 AND path < ?3)) AND kind != 3",
    )
    .and_then(|mut st| st.execute(params![path.as_str(), lo, hi, rev as i64, applied_from]))
    .ctx("writing tombstones")
}

/// Tombstones only the strict descendants of `path` (a directory replaced by
/// another kind).
pub(crate) fn tombstone_descendants(
    db: &Connection,
    path: &SyncPath,
    rev: u64,
    applied_from: Option<&str>,
) -> Result<usize, SyncError> {
    let (lo, hi) = descendant_range(path);
    db.prepare_cached("DELETE FROM chunks WHERE path >= ?1 AND path < ?2")
        .and_then(|mut st| st.execute(params![lo, hi]))
        .ctx("dropping chunk locations")?;
    db.prepare_cached(
        "UPDATE nodes SET kind = 3, mode = 0, size = 0, mtime_ms = 0, mtime_ns = 0, dev = 0, ino = 0,
            ctime_ns = 0, target = NULL, manifest = NULL, verified_ns = 0, rev = ?3, applied_from = ?4
         WHERE path >= ?1 AND path < ?2 AND kind != 3",
    )
    .and_then(|mut st| st.execute(params![lo, hi, rev as i64, applied_from]))
    .ctx("writing tombstones")
}

/// The chunk list of a file row, in file order.
pub(crate) fn chunks_of(db: &Connection, path: &SyncPath) -> Result<Vec<ChunkRef>, SyncError> {
    let mut stmt = db
        .prepare_cached("SELECT hash, size FROM chunks WHERE path = ?1 ORDER BY idx")
        .ctx("reading chunks")?;
    let rows = stmt
        .query_map([path.as_str()], |r| {
            Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?))
        })
        .ctx("reading chunks")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading chunks")?;
    rows.into_iter()
        .map(|(h, size)| {
            Ok(ChunkRef {
                hash: Hash::from_slice(&h)?,
                size: size as u32,
            })
        })
        .collect()
}

/// Where a chunk's bytes can be read in the directory.
#[derive(Clone, Debug)]
pub(crate) struct ChunkLocation {
    pub path: SyncPath,
    pub offset: u64,
    pub size: u32,
    /// The file row's stat and verification time: a file whose stat still
    /// equals it (and is not racily clean) holds the bytes that were
    /// hashed, as settle assumes.
    pub stat: Stat,
    pub verified_ns: i64,
}

impl ChunkLocation {
    /// True when `disk` (the open file's `fstat`) proves the indexed bytes
    /// unchanged, so they need not be hashed again.
    pub fn unchanged(&self, disk: &std::fs::Metadata) -> bool {
        self.stat.proves_unchanged(disk, self.verified_ns)
    }
}

/// Up to `limit` live files holding chunk `hash`.
pub(crate) fn chunk_locations(
    db: &Connection,
    hash: &Hash,
    limit: usize,
) -> Result<Vec<ChunkLocation>, SyncError> {
    let mut stmt = db
        .prepare_cached(
            "SELECT c.path, c.offset, c.size, n.mode, n.size, n.mtime_ns, n.dev, n.ino,
                    n.ctime_ns, n.verified_ns
             FROM chunks c JOIN nodes n ON n.path = c.path
             WHERE c.hash = ?1 AND n.kind = 0 LIMIT ?2",
        )
        .ctx("locating a chunk")?;
    let rows = stmt
        .query_map(params![&hash.0[..], limit as i64], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                Stat {
                    mode: r.get::<_, i64>(3)? as u32,
                    size: r.get::<_, i64>(4)? as u64,
                    mtime_ns: r.get(5)?,
                    dev: r.get::<_, i64>(6)? as u64,
                    ino: r.get::<_, i64>(7)? as u64,
                    ctime_ns: r.get(8)?,
                },
                r.get::<_, i64>(9)?,
            ))
        })
        .ctx("locating a chunk")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("locating a chunk")?;
    rows.into_iter()
        .map(|(p, offset, size, stat, verified_ns)| {
            Ok(ChunkLocation {
                path: SyncPath::new(p)
                    .map_err(|e| SyncError::Storage(format!("index holds a bad path: {e}")))?,
                offset: offset as u64,
                size: size as u32,
                stat,
                verified_ns,
            })
        })
        .collect()
}

/// True when some live file in the index holds chunk `hash`.
pub(crate) fn chunk_indexed(db: &Connection, hash: &Hash) -> Result<bool, SyncError> {
    db.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM chunks c JOIN nodes n ON n.path = c.path
                        WHERE c.hash = ?1 AND n.kind = 0)",
    )
    .and_then(|mut s| s.query_row([&hash.0[..]], |r| r.get(0)))
    .ctx("probing a chunk")
}

/// The wire entry for a row.
pub(crate) fn entry_of(db: &Connection, node: &Node) -> Result<ChangeEntry, SyncError> {
    let chunks = match node.kind {
        NodeKind::File => chunks_of(db, &node.path)?,
        _ => Vec::new(),
    };
    Ok(entry_with(node, chunks))
}

/// The wire entry for a row whose chunk list (for a file) is known.
pub(crate) fn entry_with(node: &Node, chunks: Vec<ChunkRef>) -> ChangeEntry {
    let s = &node.stat;
    let state = match node.kind {
        NodeKind::File => EntryState::File {
            mode: s.mode,
            mtime: s.mtime_ms(),
            size: s.size,
            chunks,
        },
        NodeKind::Dir => EntryState::Dir {
            mode: s.mode,
            mtime: s.mtime_ms(),
        },
        NodeKind::Symlink => EntryState::Symlink {
            target: node.target.clone().unwrap_or_default(),
            mode: s.mode,
            mtime: s.mtime_ms(),
        },
        NodeKind::Tombstone => EntryState::Delete,
    };
    ChangeEntry {
        rev: node.rev,
        path: node.path.clone(),
        state,
    }
}

/// One page of rows with `after < (rev, path) <= {through_rev, None}`,
/// ordered by `(rev, path)`, leaving out rows applied from `exclude`, each
/// with its chunk list (empty but for files), read in one joined query.
pub(crate) fn rows_after(
    db: &Connection,
    after: &ChangeCursor,
    through_rev: u64,
    exclude: Option<&str>,
    limit: usize,
) -> Result<Vec<(Node, Vec<ChunkRef>)>, SyncError> {
    // Row-value comparison lets SQLite seek the (rev, path) index directly;
    // each row's chunks follow it from the chunks primary key. No LIMIT:
    // rows are read lazily and the page ends after `limit` nodes.
    let sql = format!(
        "SELECT n.path, n.kind, n.mode, n.size, n.mtime_ns, n.dev, n.ino, n.ctime_ns, n.target,
                n.manifest, n.verified_ns, n.rev, n.applied_from, c.idx, c.hash, c.size
         FROM nodes n LEFT JOIN chunks c ON c.path = n.path
         WHERE {} AND n.rev <= ?3
           AND (?4 IS NULL OR n.applied_from IS NULL OR n.applied_from != ?4)
         ORDER BY n.rev, n.path",
        if after.path.is_some() {
            "(n.rev, n.path) > (?1, ?2)"
        } else {
            "n.rev > ?1 AND ?2 IS NULL"
        }
    );
    let mut stmt = db.prepare_cached(&sql).ctx("paging changes")?;
    let mut rows = stmt
        .query(params![
            after.rev as i64,
            after.path.as_ref().map(SyncPath::as_str),
            through_rev as i64,
            exclude,
        ])
        .ctx("paging changes")?;
    let mut out: Vec<(Node, Vec<(i64, ChunkRef)>)> = Vec::new();
    while let Some(r) = rows.next().ctx("paging changes")? {
        let same = out.last().is_some_and(|(n, _)| {
            r.get_ref(0).ok().and_then(|v| v.as_str().ok()) == Some(n.path.as_str())
        });
        if !same {
            if out.len() == limit {
                break;
            }
            let (p, k, n) = node_from_row(r).ctx("paging changes")?;
            out.push((finish(p, k, n)?, Vec::new()));
        }
        let idx: Option<i64> = r.get(13).ctx("paging changes")?;
        if let Some(idx) = idx {
            let hash: Vec<u8> = r.get(14).ctx("paging changes")?;
            let size: i64 = r.get(15).ctx("paging changes")?;
            let chunks = &mut out.last_mut().expect("a row was pushed").1;
            chunks.push((
                idx,
                ChunkRef {
                    hash: Hash::from_slice(&hash)?,
                    size: size as u32,
                },
            ));
        }
    }
    Ok(out
        .into_iter()
        .map(|(n, mut chunks)| {
            // The primary key yields them in order; do not rely on it.
            if !chunks.is_sorted_by_key(|(i, _)| *i) {
                chunks.sort_by_key(|(i, _)| *i);
            }
            (n, chunks.into_iter().map(|(_, c)| c).collect())
        })
        .collect())
}

/// Reads an integer from `meta`.
pub(crate) fn meta_get(db: &Connection, key: &str) -> Result<u64, SyncError> {
    let v: i64 = db
        .prepare_cached("SELECT v FROM meta WHERE k = ?1")
        .and_then(|mut s| s.query_row([key], |r| r.get(0)))
        .ctx("reading meta")?;
    Ok(v as u64)
}

pub(crate) fn meta_set(db: &Connection, key: &str, v: u64) -> Result<(), SyncError> {
    db.prepare_cached("INSERT OR REPLACE INTO meta (k, v) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![key, v as i64]))
        .ctx("writing meta")?;
    Ok(())
}

/// Allocates the next rev (inside the caller's transaction).
pub(crate) fn next_rev(db: &Connection) -> Result<u64, SyncError> {
    let rev = meta_get(db, "rev")? + 1;
    meta_set(db, "rev", rev)?;
    Ok(rev)
}

/// A remote's stored cursors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RemoteCursors {
    pub push: ChangeCursor,
    pub fetch: ChangeCursor,
}

fn cursor_of(rev: i64, path: Option<String>) -> Result<ChangeCursor, SyncError> {
    let path = path
        .map(SyncPath::new)
        .transpose()
        .map_err(|e| SyncError::Storage(format!("index holds a bad cursor path: {e}")))?;
    Ok(ChangeCursor {
        rev: rev as u64,
        path,
    })
}

pub(crate) fn remote_cursors(db: &Connection, remote: &str) -> Result<RemoteCursors, SyncError> {
    let row = db
        .prepare_cached(
            "SELECT push_rev, push_path, fetch_rev, fetch_path FROM remotes WHERE name = ?1",
        )
        .and_then(|mut s| {
            s.query_row([remote], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<String>>(3)?,
                ))
            })
            .optional()
        })
        .ctx("reading remote cursors")?;
    match row {
        None => Ok(RemoteCursors::default()),
        Some((pr, pp, fr, fp)) => Ok(RemoteCursors {
            push: cursor_of(pr, pp)?,
            fetch: cursor_of(fr, fp)?,
        }),
    }
}

/// Sets `remote`'s push cursor. A cursor beyond our current rev is
/// `EINVAL` (nothing of ours can have been acknowledged there). Moving it
/// back, or to zero, means the remote lost state: its echo markers are
/// cleared, so that what we applied from it is pushed back to it too.
pub(crate) fn set_push_cursor(
    db: &Connection,
    remote: &str,
    c: &ChangeCursor,
) -> Result<(), SyncError> {
    let current = meta_get(db, "rev")?;
    if c.rev > current {
        return Err(SyncError::Invalid(format!(
            "push cursor {c} for remote {remote:?} is beyond this store's current rev {current}"
        )));
    }
    let old = remote_cursors(db, remote)?.push;
    db.prepare_cached(
        "INSERT INTO remotes (name, push_rev, push_path) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET push_rev = ?2, push_path = ?3",
    )
    .and_then(|mut s| {
        s.execute(params![
            remote,
            c.rev as i64,
            c.path.as_ref().map(SyncPath::as_str)
        ])
    })
    .ctx("writing a push cursor")?;
    // Zero is a reset even when the cursor was already there (we had only
    // pulled from the remote).
    if *c < old || *c == ChangeCursor::ZERO {
        let cleared = forget_applied_markers(db, remote)?;
        if cleared > 0 {
            tracing::warn!(remote, from = %old, to = %c, cleared,
                "push cursor moved back: the remote lost state; its echo markers are cleared");
        }
    }
    Ok(())
}

/// Forgets which paths hold `remote`'s state, so echo exclusion no longer
/// keeps them from it. Returns how many rows were marked.
pub(crate) fn forget_applied_markers(db: &Connection, remote: &str) -> Result<usize, SyncError> {
    db.prepare_cached("UPDATE nodes SET applied_from = NULL WHERE applied_from = ?1")
        .and_then(|mut s| s.execute([remote]))
        .ctx("clearing echo markers")
}

/// Sets `remote`'s fetch cursor exactly; moving it back (or to zero) means
/// the remote lost state, and its echo markers are cleared as for the push
/// cursor.
pub(crate) fn set_fetch_cursor(
    db: &Connection,
    remote: &str,
    c: &ChangeCursor,
) -> Result<(), SyncError> {
    let old = remote_cursors(db, remote)?.fetch;
    write_fetch_cursor(db, remote, c)?;
    if *c < old || *c == ChangeCursor::ZERO {
        let cleared = forget_applied_markers(db, remote)?;
        tracing::warn!(remote, from = %old, to = %c, cleared,
            "fetch cursor moved back: the remote lost state; its echo markers are cleared");
    }
    Ok(())
}

/// Writes `remote`'s fetch cursor (registering the remote), nothing else.
pub(crate) fn write_fetch_cursor(
    db: &Connection,
    remote: &str,
    c: &ChangeCursor,
) -> Result<(), SyncError> {
    db.prepare_cached(
        "INSERT INTO remotes (name, fetch_rev, fetch_path) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET fetch_rev = ?2, fetch_path = ?3",
    )
    .and_then(|mut s| {
        s.execute(params![
            remote,
            c.rev as i64,
            c.path.as_ref().map(SyncPath::as_str)
        ])
    })
    .ctx("writing a fetch cursor")?;
    Ok(())
}

/// The smallest complete push rev over every registered remote, or `None`
/// when no remote is registered.
pub(crate) fn min_push_rev(db: &Connection) -> Result<Option<u64>, SyncError> {
    let mut stmt = db
        .prepare_cached("SELECT push_rev, push_path FROM remotes")
        .ctx("reading remotes")?;
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Option<String>>(1)?))
        })
        .ctx("reading remotes")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading remotes")?;
    let mut min: Option<u64> = None;
    for (rev, path) in rows {
        let complete = cursor_of(rev, path)?.complete_rev();
        min = Some(min.map_or(complete, |m| m.min(complete)));
    }
    Ok(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_s_rows_are_taken_once_by_name_and_the_rest_listed_in_name_order() {
        let row = |size| ChildRow {
            kind: NodeKind::File,
            stat: Stat {
                mode: 0o644,
                size,
                mtime_ns: 1,
                dev: 1,
                ino: size,
                ctime_ns: 1,
            },
            verified_ns: 2,
        };
        let mut d = DirRows::default();
        for (i, name) in ["m", "b", "zz", "a", "ä", "b.txt"].iter().enumerate() {
            d.push(name, row(i as u64));
        }
        d.sort();
        assert_eq!(d.take("zz").map(|r| r.stat.size), Some(2));
        assert_eq!(d.take("zz").map(|r| r.stat.size), None, "taken once");
        assert_eq!(d.take("b").map(|r| r.stat.size), Some(1));
        assert_eq!(d.take("nope").map(|r| r.stat.size), None);
        assert_eq!(d.take("ä").map(|r| r.stat.size), Some(4));
        assert_eq!(d.untaken().collect::<Vec<_>>(), ["a", "b.txt", "m"]);
    }

    #[test]
    fn an_index_written_before_wsd_sqlite_opens_with_its_rows() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("index.sqlite3");
        {
            // As the code before `wsd-sqlite` left it: its two migrations
            // run, their count in `user_version`.
            let db = Connection::open(&path).unwrap();
            db.pragma_update(None, "journal_mode", "WAL").unwrap();
            for m in &MIGRATIONS[..2] {
                db.execute_batch(m.sql).unwrap();
            }
            db.pragma_update(None, "user_version", 2).unwrap();
            db.execute("UPDATE meta SET v = 41 WHERE k = 'rev'", [])
                .unwrap();
        }
        let (db, clean_close, _) = open(&path, true).unwrap();
        let rev: i64 = db
            .query_row("SELECT v FROM meta WHERE k = 'rev'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rev, 41, "the old index is kept, not rebuilt");
        let recorded: i64 = db
            .query_row(
                "SELECT count(*) FROM schema_migrations WHERE owner = 'index'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(recorded, MIGRATIONS.len() as i64, "the later ones ran");
        clean_close.close(db);
        let (db, _clean_close, _) = open(&path, true).unwrap();
        let rev: i64 = db
            .query_row("SELECT v FROM meta WHERE k = 'rev'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rev, 41);
    }

    #[test]
    fn an_index_damaged_after_a_clean_close_is_still_set_aside() {
        use std::io::{Seek, SeekFrom, Write};
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("index.sqlite3");
        let (db, clean_close, _) = open(&path, true).unwrap();
        for i in 0..200 {
            db.execute(
                "INSERT INTO meta (k, v) VALUES (?1, ?2)",
                params![format!("padding-{i:0>200}"), i],
            )
            .unwrap();
        }
        clean_close.close(db);
        assert!(tmp.path().join("index.sqlite3.clean").exists());
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(4096)).unwrap();
        f.write_all(&[0xA5; 8192]).unwrap();
        drop(f);

        let (db, _clean_close, _) = open(&path, true).unwrap();
        let rev: i64 = db
            .query_row("SELECT v FROM meta WHERE k = 'prune_horizon'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(rev, 1, "the rebuilt index marks its horizon");
        let aside = std::fs::read_dir(tmp.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                let name = name.to_string_lossy();
                // Its -wal and -shm go with it.
                name.starts_with("index.sqlite3.corrupt-")
                    && !name.ends_with("-wal")
                    && !name.ends_with("-shm")
            })
            .count();
        assert_eq!(aside, 1, "the damaged file is set aside");
    }
}
