//! The executable [`Store`] contract (feature `testkit`, for tests only):
//! one conformance suite and one reference-model property test that every
//! store implementation runs (`wsd_dofs::Dofs`, wsd's `WorkspaceStore`,
//! [`MemStore`]).
//!
//! A store joins by implementing [`StoreUnderTest`] (local writes as its
//! users make them) and invoking [`store_conformance_tests!`] with a
//! factory. The suite checks the rules of `sync-protocol.md` one by one
//! ([`suite`]); the model test ([`model`]) drives two stores of the kind
//! through random operation sequences (local edits on both sides, pushes,
//! pulls, a side losing its state, cursor rewinds, pruning that forces
//! baselines) and compares both trees with a reference model after every
//! step.

mod mem_store;
pub mod model;
pub mod suite;

use std::collections::BTreeMap;

pub use mem_store::MemStore;

use crate::{
    ApplyBatch, Baseline, ChangeCursor, ChangeEntry, ChangesQuery, EntryState, Hash, IgnoreRules,
    Object, Store, SyncError, SyncPath, chunk,
};

/// One local operation, as a user (or a command) makes it in a store's
/// tree. The suite issues only operations that fit the tree (see
/// [`model::Tree::check`]); missing parents are created with mode 0755.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalOp {
    /// Creates or overwrites a regular file.
    Write {
        path: String,
        bytes: Vec<u8>,
        mode: u32,
    },
    /// Creates a directory (the path is absent).
    Mkdir { path: String, mode: u32 },
    /// Creates a symlink (the path is absent).
    Symlink { path: String, target: String },
    /// Removes a path and everything below it.
    Remove { path: String },
    /// Moves a path (and its subtree) to an absent path outside it.
    Rename { from: String, to: String },
    /// Changes the mode of a file or directory.
    Chmod { path: String, mode: u32 },
}

/// A store the contract suite can drive.
pub trait StoreUnderTest: Store {
    /// Carries out one local operation (one that fits the tree) the way
    /// the store's users do, so that it shows up as a local change.
    fn local(&mut self, op: &LocalOp) -> Result<(), SyncError>;

    /// Drops the tombstones every remote acknowledged, as the store's owner
    /// does from time to time; `false` when this store never prunes.
    fn prune(&mut self) -> Result<bool, SyncError> {
        Ok(false)
    }
}

/// What the suite compares of one live path: kind, mode (not for
/// symlinks), content, target. Never mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File { mode: u32, chunks: Vec<Hash> },
    Dir { mode: u32 },
    Symlink { target: String },
}

impl Node {
    pub fn of(state: &EntryState) -> Option<Node> {
        match state {
            EntryState::File { mode, chunks, .. } => Some(Node::File {
                mode: *mode,
                chunks: chunks.iter().map(|c| c.hash).collect(),
            }),
            EntryState::Dir { mode, .. } => Some(Node::Dir { mode: *mode }),
            EntryState::Symlink { target, .. } => Some(Node::Symlink {
                target: target.clone(),
            }),
            EntryState::Delete => None,
        }
    }

    pub fn file(bytes: &[u8], mode: u32) -> Node {
        Node::File {
            mode,
            chunks: chunk::chunk_slice(bytes)
                .into_iter()
                .map(|(_, c)| c.hash)
                .collect(),
        }
    }

    pub fn is_dir(&self) -> bool {
        matches!(self, Node::Dir { .. })
    }
}

/// Every row of `store` (live and tombstones), through its own change feed.
pub fn rows<S: Store + ?Sized>(store: &mut S) -> Result<Vec<ChangeEntry>, SyncError> {
    let through = store.open_changes(&ChangeCursor::ZERO)?.through;
    let ignore = IgnoreRules::none();
    let mut after = ChangeCursor::ZERO;
    let mut out = Vec::new();
    loop {
        let page = store.changes(ChangesQuery {
            after: &after,
            through: &through,
            ignore: &ignore,
            exclude_applied_from: None,
            limit: 500,
        })?;
        let done = page.len() < 500;
        if let Some(e) = page.last() {
            after = ChangeCursor::within(e.rev, e.path.clone());
        }
        out.extend(page);
        if done {
            return Ok(out);
        }
    }
}

/// The live tree of `store`, as its change feed reports it.
pub fn live_tree<S: Store + ?Sized>(store: &mut S) -> Result<BTreeMap<String, Node>, SyncError> {
    Ok(rows(store)?
        .into_iter()
        .filter_map(|e| Node::of(&e.state).map(|n| (e.path.into_string(), n)))
        .collect())
}

/// Stages the chunks of `bytes` in `store` and returns the file's state.
pub fn stage_file<S: Store + ?Sized>(
    store: &mut S,
    bytes: &[u8],
    mode: u32,
) -> Result<EntryState, SyncError> {
    let cut = chunk::chunk_slice(bytes);
    let objects: Vec<Object> = cut
        .iter()
        .map(|(off, c)| Object {
            hash: c.hash,
            bytes: bytes[*off..*off + c.size as usize].to_vec(),
        })
        .collect();
    store.stage_objects(&objects)?;
    Ok(EntryState::File {
        mode,
        mtime: 1,
        size: bytes.len() as u64,
        chunks: cut.into_iter().map(|(_, c)| c).collect(),
    })
}

fn sp(s: &str) -> Result<SyncPath, SyncError> {
    SyncPath::new(s)
}

/// [`StoreUnderTest::local`] for a store whose only writer is
/// [`Store::apply`] without a sender (an external writer, rule 5): each op
/// becomes one batch of entries.
pub fn apply_local<S: Store + ?Sized>(store: &mut S, op: &LocalOp) -> Result<(), SyncError> {
    let dir = |mode| EntryState::Dir { mode, mtime: 1 };
    let mut entries = Vec::new();
    let parents = |store: &mut S, path: &SyncPath, entries: &mut Vec<ChangeEntry>| {
        for a in path.ancestors() {
            let live = store
                .read_entry(&a)?
                .is_some_and(|e| e.state.kind().is_some());
            if !live {
                entries.push(ChangeEntry {
                    rev: 0,
                    path: a,
                    state: dir(0o755),
                });
            }
        }
        Ok::<(), SyncError>(())
    };
    match op {
        LocalOp::Write { path, bytes, mode } => {
            let path = sp(path)?;
            parents(store, &path, &mut entries)?;
            let state = stage_file(store, bytes, *mode)?;
            entries.push(ChangeEntry {
                rev: 0,
                path,
                state,
            });
        }
        LocalOp::Mkdir { path, mode } => {
            let path = sp(path)?;
            parents(store, &path, &mut entries)?;
            entries.push(ChangeEntry {
                rev: 0,
                path,
                state: dir(*mode),
            });
        }
        LocalOp::Symlink { path, target } => {
            let path = sp(path)?;
            parents(store, &path, &mut entries)?;
            entries.push(ChangeEntry {
                rev: 0,
                path,
                state: EntryState::Symlink {
                    target: target.clone(),
                    mode: 0o777,
                    mtime: 1,
                },
            });
        }
        LocalOp::Remove { path } => entries.push(ChangeEntry {
            rev: 0,
            path: sp(path)?,
            state: EntryState::Delete,
        }),
        LocalOp::Chmod { path, mode } => {
            let path = sp(path)?;
            let mut e = store
                .read_entry(&path)?
                .ok_or_else(|| SyncError::NotFound {
                    path: path.to_string(),
                })?;
            match &mut e.state {
                EntryState::File { mode: m, .. } | EntryState::Dir { mode: m, .. } => *m = *mode,
                _ => {
                    return Err(SyncError::Invalid(format!(
                        "{path}: not a file or directory"
                    )));
                }
            }
            entries.push(e);
        }
        LocalOp::Rename { from, to } => {
            let (from, to) = (sp(from)?, sp(to)?);
            parents(store, &to, &mut entries)?;
            let prefix = format!("{from}/");
            for e in rows(store)? {
                if e.state.kind().is_none()
                    || !(e.path == from || e.path.as_str().starts_with(&prefix))
                {
                    continue;
                }
                let rest = &e.path.as_str()[from.as_str().len()..];
                entries.push(ChangeEntry {
                    rev: 0,
                    path: sp(&format!("{to}{rest}"))?,
                    state: e.state,
                });
            }
            entries.push(ChangeEntry {
                rev: 0,
                path: from,
                state: EntryState::Delete,
            });
        }
    }
    store.apply(ApplyBatch {
        remote: "local",
        sender: None,
        entries: &entries,
        baseline: Baseline::Off,
        ignore: &crate::IgnoreRules::none(),
    })?;
    Ok(())
}

/// Runs a future of the in-process driver to completion (the
/// [`crate::driver::StoreRemote`] never waits on anything outside).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

/// Generates the conformance suite and the model property test for one
/// store: `store_conformance_tests!(factory_expression, model_cases)`,
/// where the factory is an expression of type `impl FnMut() -> S` (called
/// for every fresh store) and `model_cases` caps the property test's cases
/// (the smaller of it and `PROPTEST_CASES`).
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:expr, $cases:expr) => {
        $crate::__conformance_case!($factory, first_write_stamps_rev_one_and_reads_back);
        $crate::__conformance_case!($factory, changes_are_coalesced_and_ordered_by_rev_then_path);
        $crate::__conformance_case!(
            $factory,
            a_path_rewritten_after_the_window_opened_is_deferred
        );
        $crate::__conformance_case!($factory, a_batch_with_a_missing_chunk_changes_nothing);
        $crate::__conformance_case!($factory, a_bad_object_is_refused_and_not_stored);
        $crate::__conformance_case!($factory, an_identical_entry_from_a_peer_is_skipped);
        $crate::__conformance_case!($factory, the_fetch_cursor_never_moves_backwards_by_apply);
        $crate::__conformance_case!($factory, a_push_cursor_beyond_the_current_rev_is_einval);
        $crate::__conformance_case!($factory, applied_paths_are_not_echoed_to_their_remote);
        $crate::__conformance_case!($factory, a_push_cursor_rewind_clears_the_echo_markers);
        $crate::__conformance_case!($factory, a_fetch_cursor_rewind_clears_the_echo_markers);
        $crate::__conformance_case!(
            $factory,
            a_sweep_deletes_unlisted_paths_and_keeps_listed_ones
        );
        $crate::__conformance_case!(
            $factory,
            a_sweep_keeps_a_listed_file_whose_parent_was_not_listed
        );
        $crate::__conformance_case!($factory, a_sweep_spares_paths_the_senders_exclusions_match);
        $crate::__conformance_case!(
            $factory,
            a_delete_of_a_directory_spares_what_the_senders_exclusions_match
        );
        $crate::__conformance_case!($factory, a_rewound_baseline_restarts_its_marks);
        $crate::__conformance_case!($factory, a_remote_due_a_baseline_gets_everything_back);
        $crate::__conformance_case!($factory, read_entry_gives_live_then_tombstone_then_nothing);

        #[test]
        fn random_operation_sequences_match_the_reference_model() {
            let cases = std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or($cases)
                .min($cases);
            $crate::testkit::model::check(cases, $factory);
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_case {
    ($factory:expr, $name:ident) => {
        #[test]
        fn $name() {
            $crate::testkit::suite::$name($factory);
        }
    };
}
