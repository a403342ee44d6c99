//! A small in-memory [`Store`] that passes the contract suite, for tests of
//! what sits on top of a store (the RPC server, the driver). It is shared
//! (`Arc<Mutex<..>>`) so a test can look at the server's copy while the
//! server's store thread owns the other handle. It never prunes
//! tombstones, so it never owes a peer a baseline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{LocalOp, StoreUnderTest, apply_local};
use crate::{
    ApplyBatch, ApplyOutcome, Baseline, ChangeCursor, ChangeEntry, ChangesQuery, ChangesWindow,
    EntryState, Hash, Object, Store, SyncError, SyncPath, Watermarks, chunk,
};

#[derive(Clone, Debug)]
struct Node {
    rev: u64,
    state: EntryState,
    /// The remote this state was applied from, until a local change.
    from: Option<String>,
}

#[derive(Default, Debug)]
struct Inner {
    rev: u64,
    nodes: BTreeMap<SyncPath, Node>,
    objects: HashMap<Hash, Vec<u8>>,
    push: HashMap<String, ChangeCursor>,
    fetch: HashMap<String, ChangeCursor>,
    marks: HashSet<SyncPath>,
    /// The last entry an ongoing baseline marked, per remote.
    progress: HashMap<String, ChangeCursor>,
    /// Every `apply` sleeps this long first (to hold a call in flight).
    apply_delay: Duration,
}

#[derive(Clone, Default, Debug)]
pub struct MemStore(Arc<Mutex<Inner>>);

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }

    pub fn set_apply_delay(&self, d: Duration) {
        self.0.lock().unwrap().apply_delay = d;
    }

    /// A local write of a file (chunked like the real stores).
    pub fn write_file(&self, path: &str, bytes: &[u8], mode: u32) {
        let chunks: Vec<_> = chunk::chunk_slice(bytes)
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        let mut objects = Vec::new();
        for (off, c) in chunk::chunk_slice(bytes) {
            objects.push(Object {
                hash: c.hash,
                bytes: bytes[off..off + c.size as usize].to_vec(),
            });
        }
        let mut s = self.clone();
        s.stage_objects(&objects).unwrap();
        let state = EntryState::File {
            mode,
            mtime: 1,
            size: bytes.len() as u64,
            chunks,
        };
        s.local_write(path, state);
    }

    pub fn delete(&self, path: &str) {
        self.clone().local_write(path, EntryState::Delete);
    }

    fn local_write(&mut self, path: &str, state: EntryState) {
        let e = ChangeEntry {
            rev: 0,
            path: SyncPath::new(path).unwrap(),
            state,
        };
        self.apply(ApplyBatch {
            remote: "local",
            sender: None,
            entries: &[e],
            baseline: Baseline::Off,
            ignore: &crate::IgnoreRules::none(),
        })
        .unwrap();
    }

    /// Live paths and their content-relevant state (kind, mode, chunks,
    /// target), for convergence checks.
    pub fn live(&self) -> BTreeMap<String, EntryState> {
        let inner = self.0.lock().unwrap();
        inner
            .nodes
            .iter()
            .filter(|(_, n)| n.state != EntryState::Delete)
            .map(|(p, n)| {
                let state = match &n.state {
                    EntryState::File {
                        mode, size, chunks, ..
                    } => EntryState::File {
                        mode: *mode,
                        mtime: 0,
                        size: *size,
                        chunks: chunks.clone(),
                    },
                    EntryState::Dir { mode, .. } => EntryState::Dir {
                        mode: *mode,
                        mtime: 0,
                    },
                    EntryState::Symlink { target, mode, .. } => EntryState::Symlink {
                        target: target.clone(),
                        mode: *mode,
                        mtime: 0,
                    },
                    EntryState::Delete => EntryState::Delete,
                };
                (p.as_str().to_owned(), state)
            })
            .collect()
    }

    pub fn object_count(&self) -> usize {
        self.0.lock().unwrap().objects.len()
    }
}

impl Inner {
    /// The remote lost state: nothing here is its echo any more.
    fn forget_applied(&mut self, remote: &str) {
        for n in self.nodes.values_mut() {
            if n.from.as_deref() == Some(remote) {
                n.from = None;
            }
        }
    }

    fn set(&mut self, path: SyncPath, state: EntryState, rev: u64, from: Option<&str>) {
        let was_dir = matches!(
            self.nodes.get(&path).map(|n| &n.state),
            Some(EntryState::Dir { .. })
        );
        let is_dir = matches!(state, EntryState::Dir { .. });
        if was_dir && !is_dir {
            // A kind change replaces the whole subtree.
            let below: Vec<SyncPath> = self
                .nodes
                .range(path.clone()..)
                .take_while(|(p, _)| p.as_str().starts_with(path.as_str()))
                .filter(|(p, n)| {
                    p.starts_with(&path) && **p != path && n.state != EntryState::Delete
                })
                .map(|(p, _)| p.clone())
                .collect();
            for p in below {
                self.nodes.insert(
                    p,
                    Node {
                        rev,
                        state: EntryState::Delete,
                        from: from.map(str::to_owned),
                    },
                );
            }
        }
        if state != EntryState::Delete {
            for a in path.ancestors() {
                let is_dir = matches!(
                    self.nodes.get(&a).map(|n| &n.state),
                    Some(EntryState::Dir { .. })
                );
                if !is_dir {
                    self.nodes.insert(
                        a,
                        Node {
                            rev,
                            state: EntryState::Dir {
                                mode: 0o755,
                                mtime: 0,
                            },
                            from: None,
                        },
                    );
                }
            }
        }
        self.nodes.insert(
            path,
            Node {
                rev,
                state,
                from: from.map(str::to_owned),
            },
        );
    }
}

impl Store for MemStore {
    fn current_rev(&mut self) -> Result<u64, SyncError> {
        Ok(self.0.lock().unwrap().rev)
    }

    fn watermarks(&mut self, remote: &str) -> Result<Watermarks, SyncError> {
        let s = self.0.lock().unwrap();
        Ok(Watermarks {
            current_rev: s.rev,
            push_cursor: s.push.get(remote).cloned().unwrap_or_default(),
            fetch_cursor: s.fetch.get(remote).cloned().unwrap_or_default(),
        })
    }

    fn open_changes(&mut self, _after: &ChangeCursor) -> Result<ChangesWindow, SyncError> {
        // Tombstones are never pruned here, so no baseline is ever forced.
        Ok(ChangesWindow {
            through: ChangeCursor::at(self.0.lock().unwrap().rev),
            baseline: false,
        })
    }

    fn changes(&mut self, q: ChangesQuery<'_>) -> Result<Vec<ChangeEntry>, SyncError> {
        let s = self.0.lock().unwrap();
        let mut out: Vec<ChangeEntry> = s
            .nodes
            .iter()
            .filter(|(p, n)| q.after.is_before(n.rev, p) && !q.through.is_before(n.rev, p))
            .filter(|(p, n)| match n.state {
                EntryState::Delete => !q.ignore.is_ignored_any_kind(p),
                EntryState::Dir { .. } => !q.ignore.is_ignored(p, true),
                _ => !q.ignore.is_ignored(p, false),
            })
            .filter(|(_, n)| {
                q.exclude_applied_from.is_none() || n.from.as_deref() != q.exclude_applied_from
            })
            .map(|(p, n)| ChangeEntry {
                rev: n.rev,
                path: p.clone(),
                state: n.state.clone(),
            })
            .collect();
        out.sort_by(|a, b| (a.rev, &a.path).cmp(&(b.rev, &b.path)));
        out.truncate(q.limit);
        Ok(out)
    }

    fn read_entry(&mut self, path: &SyncPath) -> Result<Option<ChangeEntry>, SyncError> {
        let s = self.0.lock().unwrap();
        Ok(s.nodes.get(path).map(|n| ChangeEntry {
            rev: n.rev,
            path: path.clone(),
            state: n.state.clone(),
        }))
    }

    fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        let s = self.0.lock().unwrap();
        Ok(hashes
            .iter()
            .filter(|h| s.objects.contains_key(h))
            .copied()
            .collect())
    }

    fn read_object(&mut self, hash: &Hash) -> Result<Vec<u8>, SyncError> {
        let s = self.0.lock().unwrap();
        s.objects.get(hash).cloned().ok_or(SyncError::UnknownHash {
            hash: *hash,
            path: None,
        })
    }

    fn stage_objects(&mut self, objects: &[Object]) -> Result<(), SyncError> {
        for o in objects {
            o.hash.verify(&o.bytes)?;
        }
        let mut s = self.0.lock().unwrap();
        for o in objects {
            s.objects.insert(o.hash, o.bytes.clone());
        }
        Ok(())
    }

    fn apply(&mut self, batch: ApplyBatch<'_>) -> Result<ApplyOutcome, SyncError> {
        let delay = self.0.lock().unwrap().apply_delay;
        std::thread::sleep(delay);
        let mut s = self.0.lock().unwrap();
        for e in batch.entries {
            for c in e.chunks() {
                if !s.objects.contains_key(&c.hash) {
                    return Err(SyncError::UnknownHash {
                        hash: c.hash,
                        path: Some(e.path.to_string()),
                    });
                }
            }
        }
        let rev = s.rev + 1;
        let from = batch.sender.as_ref().map(|_| batch.remote);
        if batch.baseline != Baseline::Off
            && let Some(first) = batch.entries.first()
            && let Some(last) = s.progress.get(batch.remote)
            && !last.is_before(first.rev, &first.path)
        {
            // A baseline that starts again: the old marks would spare
            // paths the sender no longer has.
            s.marks.clear();
            s.progress.remove(batch.remote);
        }
        let (mut applied, mut skipped) = (0, 0);
        for e in batch.entries {
            let current = s
                .nodes
                .get(&e.path)
                .filter(|n| n.state != EntryState::Delete);
            let same = current.is_some_and(|n| n.state.same_content(&e.state));
            let gone = e.state == EntryState::Delete && current.is_none();
            let is_dir = current.is_some_and(|n| matches!(n.state, EntryState::Dir { .. }));
            let sparing = if e.state == EntryState::Delete && is_dir {
                let below: Vec<(SyncPath, bool)> = s
                    .nodes
                    .iter()
                    .filter(|(p, n)| p.starts_with(&e.path) && n.state != EntryState::Delete)
                    .map(|(p, n)| (p.clone(), matches!(n.state, EntryState::Dir { .. })))
                    .filter(|(p, _)| *p != e.path)
                    .collect();
                batch.ignore.delete_sparing(&e.path, &below)
            } else {
                None
            };
            if gone || (batch.sender.is_some() && same) {
                skipped += 1;
            } else if let Some(tops) = sparing {
                for t in tops {
                    s.set(t, EntryState::Delete, rev, from);
                }
                applied += 1;
            } else {
                s.set(e.path.clone(), e.state.clone(), rev, from);
                applied += 1;
            }
            if batch.baseline != Baseline::Off {
                s.marks.insert(e.path.clone());
                if e.state != EntryState::Delete {
                    // Its ancestors exist on the sender even if their own
                    // entries were deferred out of the stream.
                    let ancestors: Vec<SyncPath> = e.path.ancestors().collect();
                    s.marks.extend(ancestors);
                }
                s.progress.insert(
                    batch.remote.to_owned(),
                    ChangeCursor::within(e.rev, e.path.clone()),
                );
            }
        }
        if batch.baseline == Baseline::Sweep {
            let mut marks = std::mem::take(&mut s.marks);
            if !batch.ignore.is_empty() {
                for (p, n) in &s.nodes {
                    let is_dir = matches!(n.state, EntryState::Dir { .. });
                    if n.state != EntryState::Delete && batch.ignore.is_ignored(p, is_dir) {
                        marks.insert(p.clone());
                        marks.extend(p.ancestors());
                    }
                }
            }
            s.progress.remove(batch.remote);
            let stale: Vec<SyncPath> = s
                .nodes
                .iter()
                .filter(|(p, n)| n.state != EntryState::Delete && !marks.contains(*p))
                .map(|(p, _)| p.clone())
                .collect();
            for p in stale {
                if s.nodes
                    .get(&p)
                    .is_some_and(|n| n.state != EntryState::Delete)
                {
                    s.set(p, EntryState::Delete, rev, from);
                    applied += 1;
                }
            }
        }
        if applied > 0 {
            s.rev = rev;
        }
        if let Some(sender) = &batch.sender {
            let cur = s.fetch.entry(batch.remote.to_owned()).or_default();
            if *sender > *cur {
                *cur = sender.clone();
            }
        }
        let fetch_cursor = s.fetch.get(batch.remote).cloned().unwrap_or_default();
        Ok(ApplyOutcome {
            rev: s.rev,
            fetch_cursor,
            applied,
            skipped,
            overwrote_local: 0,
        })
    }

    fn set_push_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        let mut s = self.0.lock().unwrap();
        if cursor.rev > s.rev {
            return Err(SyncError::Invalid(format!(
                "push cursor {cursor} for remote {remote:?} is beyond the current rev {}",
                s.rev
            )));
        }
        let old = s.push.insert(remote.to_owned(), cursor.clone());
        if old.is_some_and(|old| *cursor < old) || *cursor == ChangeCursor::ZERO {
            s.forget_applied(remote);
        }
        Ok(())
    }

    fn set_fetch_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        let mut s = self.0.lock().unwrap();
        let old = s.fetch.insert(remote.to_owned(), cursor.clone());
        if old.is_some_and(|old| *cursor < old) || *cursor == ChangeCursor::ZERO {
            s.forget_applied(remote);
        }
        Ok(())
    }
}

impl StoreUnderTest for MemStore {
    fn local(&mut self, op: &LocalOp) -> Result<(), SyncError> {
        apply_local(self, op)
    }
}
