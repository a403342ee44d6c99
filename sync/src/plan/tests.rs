//! The plan, table-style: one case per rule (the sync rules numbered in
//! sync/DESIGN.md, and the fixes `git log -- wsd/src/store/apply.rs`
//! records), each named by its rule, so that reverting a rule fails its case.

use super::*;
use crate::{ChunkRef, ErrorCode, Hash};

/// Our push cursor in every case: rows stamped after rev 5 are local
/// changes the remote has not seen.
const PUSHED: u64 = 5;
const UNPUSHED_REV: u64 = 9;
const PUSHED_REV: u64 = 3;

fn row(kind: Kind, rev: u64) -> IndexRow {
    IndexRow {
        kind: Some(kind),
        mode: 0o644,
        rev,
        from_sender: false,
        matches_entry: false,
    }
}

fn tomb(rev: u64) -> IndexRow {
    IndexRow {
        kind: None,
        mode: 0,
        rev,
        from_sender: false,
        matches_entry: false,
    }
}

impl IndexRow {
    fn matching(self) -> Self {
        IndexRow {
            matches_entry: true,
            ..self
        }
    }
    fn sent_by_the_sender(self) -> Self {
        IndexRow {
            from_sender: true,
            ..self
        }
    }
    fn mode(self, mode: u32) -> Self {
        IndexRow { mode, ..self }
    }
}

/// What is on disk, as its row says.
fn disk(on_disk: OnDisk) -> Disk {
    Disk {
        on_disk,
        differs_from_row: false,
    }
}

/// What is on disk, unlike its row (a local write not settled).
fn unsettled(on_disk: OnDisk) -> Disk {
    Disk {
        on_disk,
        differs_from_row: true,
    }
}

fn file() -> EntryState {
    EntryState::File {
        mode: 0o644,
        mtime: 1,
        size: 1,
        chunks: vec![ChunkRef {
            hash: Hash::of(b"x"),
            size: 1,
        }],
    }
}

fn dir() -> EntryState {
    EntryState::Dir {
        mode: 0o700,
        mtime: 1,
    }
}

fn link() -> EntryState {
    EntryState::Symlink {
        target: "t".into(),
        mode: 0o777,
        mtime: 1,
    }
}

/// The batch, as a case varies it from the workspace store's defaults (a
/// peer, no conflict copies, no exclusions).
#[derive(Clone, Copy)]
struct Batch {
    peer: bool,
    external_writer: bool,
    conflicts: bool,
    excludes_logs: bool,
    implied_dirs: ImpliedDirs,
    refuse: bool,
}

const WSD: Batch = Batch {
    peer: true,
    external_writer: false,
    conflicts: false,
    excludes_logs: false,
    implied_dirs: ImpliedDirs::Inferred,
    refuse: true,
};
const CLI: Batch = Batch {
    conflicts: true,
    ..WSD
};
const DOFS: Batch = Batch {
    implied_dirs: ImpliedDirs::Local,
    refuse: false,
    ..WSD
};

impl Batch {
    fn excluding_logs(self) -> Batch {
        Batch {
            excludes_logs: true,
            ..self
        }
    }

    fn run<T>(self, f: impl FnOnce(&Options<'_>) -> T) -> T {
        let pushed = ChangeCursor::at(PUSHED);
        let ignore = match self.excludes_logs {
            true => IgnoreRules::new(&["*.log"]).unwrap(),
            false => IgnoreRules::none(),
        };
        f(&Options {
            peer: self.peer,
            push_cursor: (!self.external_writer).then_some(&pushed),
            conflict_copies: self.conflicts,
            ignore: &ignore,
            implied_dirs: self.implied_dirs,
            refuse_replacing_excluded: self.refuse,
        })
    }
}

/// The subtree below the entry's path.
#[derive(Clone, Default)]
struct Facts {
    live: Vec<(&'static str, bool)>,
    unpushed: bool,
    unsettled: bool,
}

impl Below for Facts {
    type Error = SyncError;
    fn live(&mut self) -> Result<Vec<(SyncPath, bool)>, SyncError> {
        Ok(self
            .live
            .iter()
            .map(|(p, d)| (SyncPath::new(*p).unwrap(), *d))
            .collect())
    }
    fn unpushed(&mut self) -> Result<bool, SyncError> {
        Ok(self.unpushed)
    }
    fn unsettled(&mut self) -> Result<bool, SyncError> {
        Ok(self.unsettled)
    }
}

fn nothing_below() -> Facts {
    Facts::default()
}

fn unpushed_below() -> Facts {
    Facts {
        unpushed: true,
        ..Facts::default()
    }
}

fn unsettled_below() -> Facts {
    Facts {
        unsettled: true,
        ..Facts::default()
    }
}

/// `d/a` and the excluded `d/x.log` below.
fn excluded_below() -> Facts {
    Facts {
        live: vec![("d/a", false), ("d/x.log", false)],
        ..Facts::default()
    }
}

fn write(overwrites_local: bool) -> Plan {
    Plan::Write(Write {
        overwrites_local,
        copy_aside: false,
        replaced_dir: None,
        tombstone_rows_below: false,
    })
}

fn copied_aside(plan: Plan) -> Plan {
    match plan {
        Plan::Write(w) => Plan::Write(Write {
            copy_aside: true,
            ..w
        }),
        other => other,
    }
}

fn replacing_dir(plan: Plan, fate: ReplacedDir) -> Plan {
    match plan {
        Plan::Write(w) => Plan::Write(Write {
            replaced_dir: Some(fate),
            ..w
        }),
        other => other,
    }
}

fn tombstoning_rows_below(plan: Plan) -> Plan {
    match plan {
        Plan::Write(w) => Plan::Write(Write {
            tombstone_rows_below: true,
            ..w
        }),
        other => other,
    }
}

struct Case {
    rule: &'static str,
    batch: Batch,
    entry: EntryState,
    row: Option<IndexRow>,
    disk: Disk,
    below: Facts,
    want: Result<Plan, ErrorCode>,
}

fn entry_cases() -> Vec<Case> {
    use OnDisk::*;
    use ReplacedDir::*;
    let c = |rule, batch, entry, row, disk, below, want| Case {
        rule,
        batch,
        entry,
        row,
        disk,
        below,
        want: Ok(want),
    };
    vec![
        c(
            "4: a delete of an absent path is skipped",
            WSD,
            EntryState::Delete,
            None,
            disk(Absent),
            nothing_below(),
            Plan::Skip,
        ),
        c(
            "4: a delete where the index holds only a tombstone and the disk nothing is skipped",
            WSD,
            EntryState::Delete,
            Some(tomb(UNPUSHED_REV)),
            disk(Absent),
            nothing_below(),
            Plan::Skip,
        ),
        c(
            "6: a delete of a file not settled yet removes it, a local change lost",
            WSD,
            EntryState::Delete,
            None,
            unsettled(File),
            nothing_below(),
            write(true),
        ),
        c(
            "4: a peer's entry equal to the row, with the disk as indexed, is skipped",
            WSD,
            file(),
            Some(row(Kind::File, UNPUSHED_REV).matching()),
            disk(File),
            nothing_below(),
            Plan::Skip,
        ),
        c(
            "4: equal to the row but not to the disk (an edit not settled) applies and counts",
            WSD,
            file(),
            Some(row(Kind::File, PUSHED_REV).matching()),
            unsettled(File),
            nothing_below(),
            write(true),
        ),
        c(
            "5: an external writer's entry equal to local state still applies",
            Batch { peer: false, ..WSD },
            file(),
            Some(row(Kind::File, PUSHED_REV).matching()),
            disk(File),
            nothing_below(),
            write(false),
        ),
        c(
            "11: a delete of a directory holding excluded paths deletes the rest below, keeps it",
            WSD.excluding_logs(),
            EntryState::Delete,
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            excluded_below(),
            Plan::DeleteSparing(vec![SyncPath::new("d/a").unwrap()]),
        ),
        c(
            "11: a delete of a directory with nothing excluded below removes it whole",
            WSD.excluding_logs(),
            EntryState::Delete,
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            Facts {
                live: vec![("d/a", false)],
                ..Facts::default()
            },
            replacing_dir(write(false), Remove),
        ),
        c(
            "11: with conflict copies, a directory holding an excluded path is moved aside",
            CLI.excluding_logs(),
            file(),
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            excluded_below(),
            replacing_dir(write(false), MoveAside),
        ),
        c(
            "11: dofs replaces a subtree holding an excluded path",
            DOFS.excluding_logs(),
            link(),
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            excluded_below(),
            replacing_dir(write(false), Remove),
        ),
        c(
            "6: a file replacing a directory with an unpushed change below overwrites local state",
            WSD,
            file(),
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            unpushed_below(),
            replacing_dir(write(true), Remove),
        ),
        c(
            "6: with conflict copies, a replaced directory holding unpushed changes moves aside",
            CLI,
            link(),
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            unpushed_below(),
            replacing_dir(write(true), MoveAside),
        ),
        c(
            "6: with conflict copies, a deleted directory holding an unsettled write moves aside",
            CLI,
            EntryState::Delete,
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            unsettled_below(),
            replacing_dir(write(true), MoveAside),
        ),
        c(
            "6: without conflict copies, the disk below a deleted directory is not looked at",
            WSD,
            EntryState::Delete,
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            unsettled_below(),
            replacing_dir(write(false), Remove),
        ),
        c(
            "6: a directory entry over a directory replaces nothing and asks nothing below",
            WSD,
            dir(),
            Some(row(Kind::Dir, PUSHED_REV)),
            disk(Dir),
            unpushed_below(),
            write(false),
        ),
        c(
            "6: overwriting an unpushed local row counts",
            WSD,
            file(),
            Some(row(Kind::File, UNPUSHED_REV)),
            disk(File),
            nothing_below(),
            write(true),
        ),
        c(
            "6: overwriting the sender's own state does not count",
            WSD,
            file(),
            Some(row(Kind::File, UNPUSHED_REV).sent_by_the_sender()),
            disk(File),
            nothing_below(),
            write(false),
        ),
        c(
            "6: overwriting a local change the remote acknowledged does not count",
            WSD,
            file(),
            Some(row(Kind::File, PUSHED_REV)),
            disk(File),
            nothing_below(),
            write(false),
        ),
        c(
            "6: writing where we deleted and have not pushed counts",
            WSD,
            file(),
            Some(tomb(UNPUSHED_REV)),
            disk(Absent),
            nothing_below(),
            write(true),
        ),
        c(
            "5: an external writer overwrites nothing a remote has not seen",
            Batch {
                external_writer: true,
                peer: false,
                ..WSD
            },
            file(),
            Some(row(Kind::File, UNPUSHED_REV)),
            disk(File),
            nothing_below(),
            write(false),
        ),
        c(
            "6: with conflict copies, an overwritten unpushed file is kept beside it",
            CLI,
            file(),
            Some(row(Kind::File, UNPUSHED_REV)),
            disk(File),
            nothing_below(),
            copied_aside(write(true)),
        ),
        c(
            "6: with conflict copies, an unsettled symlink deleted is kept beside it",
            CLI,
            EntryState::Delete,
            Some(row(Kind::Symlink, PUSHED_REV)),
            unsettled(Symlink),
            nothing_below(),
            copied_aside(write(true)),
        ),
        c(
            "6: with conflict copies, nothing on disk is nothing to keep",
            CLI,
            file(),
            Some(row(Kind::File, PUSHED_REV)),
            unsettled(Absent),
            nothing_below(),
            write(true),
        ),
        c(
            "6: with conflict copies, a node sync does not carry is not kept",
            CLI,
            file(),
            None,
            unsettled(Other),
            nothing_below(),
            write(true),
        ),
        c(
            "6: with conflict copies, acknowledged local state is not kept",
            CLI,
            file(),
            Some(row(Kind::File, PUSHED_REV)),
            disk(File),
            nothing_below(),
            write(false),
        ),
        c(
            "6: a file over a directory row a local write replaced on disk takes the rows below",
            WSD,
            file(),
            Some(row(Kind::Dir, PUSHED_REV)),
            unsettled(File),
            nothing_below(),
            tombstoning_rows_below(write(true)),
        ),
        c(
            "6: a directory entry over that keeps the rows below",
            WSD,
            dir(),
            Some(row(Kind::Dir, PUSHED_REV)),
            unsettled(Symlink),
            nothing_below(),
            write(true),
        ),
        Case {
            rule: "11: a file replacing a directory holding an excluded path is refused",
            batch: WSD.excluding_logs(),
            entry: file(),
            row: Some(row(Kind::Dir, PUSHED_REV)),
            disk: disk(Dir),
            below: excluded_below(),
            want: Err(ErrorCode::Invalid),
        },
    ]
}

#[test]
fn every_entry_rule_plans_its_case() {
    let path = SyncPath::new("d").unwrap();
    let mut failed = Vec::new();
    for mut case in entry_cases() {
        let e = ChangeEntry {
            rev: 1,
            path: path.clone(),
            state: case.entry.clone(),
        };
        let got = case.batch.run(|opts| {
            entry(&e, case.row.as_ref(), case.disk, opts, &mut case.below).map_err(|e| e.code())
        });
        if got != case.want {
            failed.push(format!(
                "{}:\n  want {:?}\n  got  {:?}",
                case.rule, case.want, got
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

struct ParentCase {
    rule: &'static str,
    batch: Batch,
    row: Option<IndexRow>,
    disk: Disk,
    want: ImpliedDir,
}

fn parent_cases() -> Vec<ParentCase> {
    use OnDisk::*;
    use Origin::*;
    let want = |mode, origin, overwrites_local, copy_aside| ImpliedDir {
        mode,
        origin,
        overwrites_local,
        copy_aside,
    };
    let c = |rule, batch, row, disk, want| ParentCase {
        rule,
        batch,
        row,
        disk,
        want,
    };
    vec![
        c(
            "3: a missing parent is 0755, the sender's (its own entry follows)",
            WSD,
            None,
            disk(Absent),
            want(0o755, Sender, false, false),
        ),
        c(
            "3: a directory deleted here, not settled, comes back with its row's mode",
            WSD,
            Some(row(Kind::Dir, PUSHED_REV).mode(0o700)),
            unsettled(Absent),
            want(0o700, Sender, true, false),
        ),
        c(
            "3: that directory with its row unpushed is a local write",
            WSD,
            Some(row(Kind::Dir, UNPUSHED_REV).mode(0o711)),
            unsettled(Absent),
            want(0o711, Local, true, false),
        ),
        c(
            "3: with conflict copies, a directory deleted here leaves nothing to keep",
            CLI,
            Some(row(Kind::Dir, UNPUSHED_REV).mode(0o711)),
            unsettled(Absent),
            want(0o711, Local, true, false),
        ),
        c(
            "3: a parent where we deleted the directory ourselves (pushed) is a local write",
            WSD,
            Some(tomb(PUSHED_REV)),
            disk(Absent),
            want(0o755, Local, false, false),
        ),
        c(
            "3: a parent the sender deleted is the sender's",
            WSD,
            Some(tomb(PUSHED_REV).sent_by_the_sender()),
            disk(Absent),
            want(0o755, Sender, false, false),
        ),
        c(
            "3: a parent over our unpushed file is a local write, the file kept",
            CLI,
            Some(row(Kind::File, UNPUSHED_REV)),
            disk(File),
            want(0o755, Local, true, true),
        ),
        c(
            "3: a parent over an acknowledged, settled file is the sender's",
            CLI,
            Some(row(Kind::File, PUSHED_REV)),
            disk(Symlink),
            want(0o755, Sender, false, false),
        ),
        c(
            "3: a parent over a file not settled yet counts and keeps it",
            CLI,
            None,
            unsettled(File),
            want(0o755, Sender, true, true),
        ),
        c(
            "3: without conflict copies, nothing is kept",
            WSD,
            None,
            unsettled(File),
            want(0o755, Sender, true, false),
        ),
        c(
            "3: dofs records parents as local writes at 0755",
            DOFS,
            Some(tomb(PUSHED_REV).sent_by_the_sender()),
            disk(Absent),
            want(0o755, Local, false, false),
        ),
        c(
            "3: dofs counts a parent over an unpushed live row",
            DOFS,
            Some(row(Kind::Symlink, UNPUSHED_REV)),
            disk(Symlink),
            want(0o755, Local, true, false),
        ),
        c(
            "3: dofs does not count a parent over an unpushed tombstone",
            DOFS,
            Some(tomb(UNPUSHED_REV)),
            disk(Absent),
            want(0o755, Local, false, false),
        ),
    ]
}

#[test]
fn every_implied_directory_rule_plans_its_case() {
    let path = SyncPath::new("d").unwrap();
    let mut failed = Vec::new();
    for case in parent_cases() {
        let got = case
            .batch
            .run(|opts| implied_dir(&path, case.row.as_ref(), case.disk, opts));
        if got != case.want {
            failed.push(format!(
                "{}:\n  want {:?}\n  got  {:?}",
                case.rule, case.want, got
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn the_disk_of_a_store_without_one_is_its_row() {
    assert_eq!(Disk::as_indexed(None), disk(OnDisk::Absent));
    assert_eq!(Disk::as_indexed(Some(&tomb(1))), disk(OnDisk::Absent));
    assert_eq!(
        Disk::as_indexed(Some(&row(Kind::Symlink, 1))),
        disk(OnDisk::Symlink)
    );
}
