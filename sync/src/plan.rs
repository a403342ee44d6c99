//! The per-entry decision of an apply, as a plan (sync rules 3–6 and 11,
//! numbered in sync/DESIGN.md).
//!
//! [`entry`] decides what one entry of a push or pull does to one path, and
//! [`implied_dir`] what a parent directory apply creates for it is, from
//! what the receiver's index holds there ([`IndexRow`]), what is on disk
//! ([`Disk`]), the entry and the batch's [`Options`]. Both stores (the
//! workspace store and dofs) execute the plan; neither restates a rule.
//! Facts about the subtree below a path cost a query or a walk, so the
//! plan asks for them ([`Below`]) only where a rule needs them.
//!
//! The reference model (`testkit::MemStore`) does not use this module: it
//! stays an independent statement of the contract.

use crate::{ChangeCursor, ChangeEntry, EntryState, IgnoreRules, Kind, SyncError, SyncPath};

/// The mode of a parent directory created before its own entry arrives,
/// when nothing better is known (rule 3).
pub const IMPLIED_DIR_MODE: u32 = 0o755;

/// What the receiver's index holds at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexRow {
    /// The kind of a live row; `None` for a tombstone.
    pub kind: Option<Kind>,
    /// A live row's mode.
    pub mode: u32,
    /// The rev that stamped the row.
    pub rev: u64,
    /// Whether the row's state was applied from the batch's remote (and
    /// not changed locally since).
    pub from_sender: bool,
    /// Whether the live row equals the entry (rule 4: kind, mode, content,
    /// target; never mtime). The stores hold content differently, so they
    /// compare; unused for an implied directory.
    pub matches_entry: bool,
}

/// What is on disk at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDisk {
    Absent,
    File,
    Dir,
    Symlink,
    /// Something sync does not carry (a fifo, a socket, a device).
    Other,
}

/// The disk at a path, next to its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disk {
    pub on_disk: OnDisk,
    /// The disk differs from the live row (or there is something where
    /// there is none, or nothing where there is one): a local write settle
    /// has not stamped yet, local state all the same.
    pub differs_from_row: bool,
}

impl Disk {
    /// A store with no disk apart from its rows (dofs): the disk is the row.
    pub fn as_indexed(row: Option<&IndexRow>) -> Disk {
        let on_disk = match row.and_then(|r| r.kind) {
            None => OnDisk::Absent,
            Some(Kind::File) => OnDisk::File,
            Some(Kind::Dir) => OnDisk::Dir,
            Some(Kind::Symlink) => OnDisk::Symlink,
        };
        Disk {
            on_disk,
            differs_from_row: false,
        }
    }
}

/// Whose state a directory apply creates as a parent is (rule 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImpliedDirs {
    /// Always a local write at [`IMPLIED_DIR_MODE`], so the guess flows
    /// back to the sender (dofs).
    Local,
    /// The mode the index still holds for a directory deleted here and not
    /// settled yet, else [`IMPLIED_DIR_MODE`]; recorded as the sender's
    /// state (its own entry follows) unless it overwrites a local change not
    /// yet pushed or stands where we deleted the directory ourselves (the
    /// workspace store).
    Inferred,
}

/// What holds for a whole batch.
#[derive(Clone, Copy, Debug)]
pub struct Options<'a> {
    /// The entries come from a peer: an entry equal to local state is
    /// skipped (rule 4). An external writer's entries always apply.
    pub peer: bool,
    /// Our push cursor for the batch's remote: a row after it, not applied
    /// from that remote, is a local change the remote has not seen. `None`:
    /// no remote to have seen anything (an external writer), nothing is.
    pub push_cursor: Option<&'a ChangeCursor>,
    /// A local version an entry overwrites or deletes while it holds
    /// changes not yet pushed is kept beside it as a conflict copy.
    pub conflict_copies: bool,
    /// The sender's exclusions: no apply deletes what they match (rule 11).
    pub ignore: &'a IgnoreRules,
    pub implied_dirs: ImpliedDirs,
    /// A file or symlink replacing a directory that holds a path `ignore`
    /// matches is refused (with no conflict copies to keep it). Off in
    /// dofs, which replaces the whole subtree.
    pub refuse_replacing_excluded: bool,
}

/// Facts about the subtree strictly below the entry's path, asked for only
/// when a rule needs them.
pub trait Below {
    type Error: From<SyncError>;
    /// The live rows below, in path order, with whether each is a directory.
    fn live(&mut self) -> Result<Vec<(SyncPath, bool)>, Self::Error>;
    /// Whether a row below is a local change the remote has not seen.
    fn unpushed(&mut self) -> Result<bool, Self::Error>;
    /// Whether the disk below holds anything its rows do not (a local write
    /// not settled yet). Asked only with conflict copies on.
    fn unsettled(&mut self) -> Result<bool, Self::Error>;
}

/// What one entry does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing: the entry equals local state, or deletes what is absent.
    Skip,
    /// A delete of a directory holding paths the sender excludes: delete
    /// these subtrees below it instead (each planned on its own), keep the
    /// directory and what is excluded.
    DeleteSparing(Vec<SyncPath>),
    /// Write the entry's state (or remove the path, for a delete).
    Write(Write),
}

/// How an entry that applies is carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The entry overwrites or deletes local state the remote has not seen:
    /// counted (`ApplyOutcome::overwrote_local`).
    pub overwrites_local: bool,
    /// Keep the file or symlink on disk as a conflict copy first.
    pub copy_aside: bool,
    /// The directory on disk that the entry (not a directory) replaces or
    /// deletes, with the rows below it.
    pub replaced_dir: Option<ReplacedDir>,
    /// The index holds a live directory here that a local write replaced on
    /// disk (not settled yet): its rows below go as they would with the
    /// directory. Left live, they would sit below a file, where no walk
    /// looks.
    pub tombstone_rows_below: bool,
}

/// What becomes of a directory an entry replaces or deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplacedDir {
    Remove,
    /// Moved aside whole as a conflict copy: it holds local changes not
    /// yet pushed, or paths the sender excludes. A replaced (not deleted)
    /// directory moves only once its replacement is ready: moved earlier, a
    /// failed write would leave its rows live while it is gone.
    MoveAside,
}

/// Whose state a row apply writes is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The sender's: not sent back to it (echo exclusion, rule 14).
    Sender,
    /// A local write: ships back to the sender.
    Local,
}

/// What a parent directory apply creates is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImpliedDir {
    pub mode: u32,
    pub origin: Origin,
    /// It replaces local state the remote has not seen (counted).
    pub overwrites_local: bool,
    /// Keep what is on disk there as a conflict copy first.
    pub copy_aside: bool,
}

fn unpushed(row: Option<&IndexRow>, path: &SyncPath, opts: &Options<'_>) -> bool {
    match (row, opts.push_cursor) {
        (Some(r), Some(pushed)) => !r.from_sender && pushed.is_before(r.rev, path),
        _ => false,
    }
}

/// The plan for entry `e`, given the row at its path (live or tombstone),
/// the disk there, and the facts below it. A refusal is an error.
pub fn entry<B: Below>(
    e: &ChangeEntry,
    row: Option<&IndexRow>,
    disk: Disk,
    opts: &Options<'_>,
    below: &mut B,
) -> Result<Plan, B::Error> {
    let live = row.filter(|r| r.kind.is_some());
    let is_delete = matches!(e.state, EntryState::Delete);
    let disk_dir = disk.on_disk == OnDisk::Dir;
    if is_delete && live.is_none() && disk.on_disk == OnDisk::Absent {
        return Ok(Plan::Skip);
    }
    if is_delete
        && disk_dir
        && live.is_some_and(|r| r.kind == Some(Kind::Dir))
        && !opts.ignore.is_empty()
        && let Some(tops) = opts.ignore.delete_sparing(&e.path, &below.live()?)
    {
        return Ok(Plan::DeleteSparing(tops));
    }
    if opts.peer && !disk.differs_from_row && live.is_some_and(|r| r.matches_entry) {
        return Ok(Plan::Skip);
    }
    // A delete of a directory replaces it too.
    let replaces_dir = disk_dir && !matches!(e.state, EntryState::Dir { .. });
    // With conflict copies on, the disk below is looked at too: a file
    // written there since the last settle is kept, not lost.
    let local_below =
        replaces_dir && (below.unpushed()? || (opts.conflict_copies && below.unsettled()?));
    // Looked for only where it changes the plan.
    let refuses_or_keeps = opts.refuse_replacing_excluded || opts.conflict_copies;
    let excluded = match replaces_dir && !is_delete && !opts.ignore.is_empty() && refuses_or_keeps {
        true => below
            .live()?
            .into_iter()
            .find(|(p, is_dir)| opts.ignore.is_ignored(p, *is_dir))
            .map(|(p, _)| p),
        false => None,
    };
    if let Some(x) = &excluded
        && opts.refuse_replacing_excluded
        && !opts.conflict_copies
    {
        return Err(SyncError::Invalid(format!(
            "{} replaces directory {} which holds {x}, excluded by the sender: \
             remove or rename {} on one side",
            kind_word(&e.state),
            e.path,
            e.path
        ))
        .into());
    }
    let overwrites_local = disk.differs_from_row || unpushed(row, &e.path, opts) || local_below;
    let replaced_dir = replaces_dir.then(|| {
        if opts.conflict_copies && (local_below || excluded.is_some()) {
            ReplacedDir::MoveAside
        } else {
            ReplacedDir::Remove
        }
    });
    Ok(Plan::Write(Write {
        overwrites_local,
        copy_aside: overwrites_local
            && opts.conflict_copies
            && matches!(disk.on_disk, OnDisk::File | OnDisk::Symlink),
        replaced_dir,
        tombstone_rows_below: !replaces_dir
            && !matches!(e.state, EntryState::Dir { .. } | EntryState::Delete)
            && live.is_some_and(|r| r.kind == Some(Kind::Dir)),
    }))
}

/// The directory apply creates at `path`, an ancestor of an entry, where
/// the disk holds no directory: `row` is the index's row there (live or
/// tombstone), `disk` what is there instead.
pub fn implied_dir(
    path: &SyncPath,
    row: Option<&IndexRow>,
    disk: Disk,
    opts: &Options<'_>,
) -> ImpliedDir {
    let live = row.filter(|r| r.kind.is_some());
    match opts.implied_dirs {
        ImpliedDirs::Local => ImpliedDir {
            mode: IMPLIED_DIR_MODE,
            origin: Origin::Local,
            overwrites_local: unpushed(live, path, opts),
            copy_aside: false,
        },
        ImpliedDirs::Inferred => {
            // A live directory row with no directory on disk is a local
            // delete (or replacement) settle has not stamped yet: the row's
            // mode is what both sides last agreed on (a guess recorded as
            // the sender's would keep the two sides' modes apart for good).
            let row_dir = live.filter(|r| r.kind == Some(Kind::Dir));
            // Otherwise the mode is a guess standing in for the sender's,
            // whose own entry follows (a directory streams after what it
            // holds only when its mode changed later): the sender's state.
            // Except where it overwrites a local change not yet pushed, or
            // stands on our own delete of the directory (pushed or not: the
            // sender kept it, sparing paths it excludes, rule 11, and sends
            // no entry for it): then it is a local write and ships back, so
            // both sides agree on one mode.
            let own_delete = row.is_some_and(|r| r.kind.is_none() && !r.from_sender);
            let unpushed = unpushed(row, path, opts);
            // What is there (a file, a symlink, or nothing where the index
            // holds a directory) and not as indexed is lost all the same:
            // counted, and kept as a conflict copy where those are on.
            let overwrites_local = unpushed || disk.differs_from_row;
            ImpliedDir {
                mode: row_dir.map_or(IMPLIED_DIR_MODE, |r| r.mode),
                origin: if unpushed || own_delete {
                    Origin::Local
                } else {
                    Origin::Sender
                },
                overwrites_local,
                copy_aside: overwrites_local
                    && opts.conflict_copies
                    && disk.on_disk != OnDisk::Absent,
            }
        }
    }
}

/// How an error names the kind of entry at fault.
fn kind_word(state: &EntryState) -> &'static str {
    match state {
        EntryState::File { .. } => "a file",
        EntryState::Dir { .. } => "a directory",
        EntryState::Symlink { .. } => "a symlink",
        EntryState::Delete => "a delete",
    }
}

#[cfg(test)]
mod tests;
