//! Workspaces off the box: with `gsv serve --chunk-store s3://...`, every
//! workspace's dofs keeps its chunk bytes in the object store (its
//! `chunks` table becomes the durable index of what the store holds for
//! it; `wsd_dofs::Dofs::keep_chunks_in`), each snapshot's manifest is
//! copied there as a document (`snapshots/<workspace>/<snapshot>.json`,
//! with what a recovery needs of the workspace), so a kernel that lost its
//! data directory can rebuild the workspace from the bucket
//! ([`SnapshotMirror::manifests`]), and garbage collection sweeps the
//! store of chunks no workspace indexes and no mirrored manifest names,
//! outside the grace window.
//!
//! One kernel per bucket prefix: the sweep marks with this kernel's
//! workspaces (and the manifests of workspaces it does not have).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use gsv_protocol::snapshot::SnapshotInfo;
use serde::{Deserialize, Serialize};
use wsd_dofs::{
    ChunkStore, Credentials, Dofs, DofsError, ObjectChunks, SharedChunkStore, SweepOutcome,
};
use wsd_sync::{ChangeEntry, ChunkRef, EntryState, Hash, SyncPath};

use crate::error::KernelError;

/// The object store workspaces keep their chunks and snapshot manifests in.
#[derive(Clone, Debug)]
pub struct ChunkStoreConfig {
    /// `s3://BUCKET[/PREFIX]?endpoint=URL[&region=R][&deadline=30s]`.
    pub url: String,
    /// `None`: the usual AWS environment variables.
    pub credentials: Option<Credentials>,
}

/// The object store, as the kernel uses it.
#[derive(Debug)]
pub struct SnapshotMirror {
    store: Arc<ObjectChunks>,
    /// Uploads hold it shared, a sweep exclusively (its mark and its
    /// deletes): a sweep never runs between an upload's "already there"
    /// and the snapshot that now needs that chunk being recorded.
    gate: tokio::sync::RwLock<()>,
}

/// What one snapshot's upload sent.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Uploaded {
    pub chunks: u64,
    pub bytes: u64,
}

/// The format tag of a mirrored manifest; another is refused by name.
const MANIFEST_FORMAT: &str = "gsv-snapshot/1";

/// Chunks a snapshot's upload reads and sends together (at most 256 KiB
/// each: 8 MiB, a few packs).
const UPLOAD_BATCH_CHUNKS: usize = 32;

/// What a recovery needs of the workspace a snapshot was taken of.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MirroredWorkspace {
    /// The owner's username (uids are per kernel).
    pub owner: String,
    pub label: Option<String>,
    pub kind: String,
}

/// One path of a mirrored snapshot.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MirroredEntry {
    File {
        path: String,
        mode: u32,
        mtime: i64,
        size: u64,
        /// `[hex SHA-256, bytes]` per chunk, in order.
        chunks: Vec<(String, u32)>,
    },
    Dir {
        path: String,
        mode: u32,
        mtime: i64,
    },
    Symlink {
        path: String,
        mode: u32,
        mtime: i64,
        target: String,
    },
}

/// A snapshot manifest as mirrored to the object store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MirroredSnapshot {
    pub format: String,
    pub snapshot: SnapshotInfo,
    pub workspace: MirroredWorkspace,
    pub entries: Vec<MirroredEntry>,
}

/// A mirrored manifest that cannot be used, naming it.
fn bad_manifest(name: &str, why: impl std::fmt::Display) -> KernelError {
    KernelError::Upstream(format!(
        "snapshot manifest {name} in the chunk store: {why}"
    ))
}

impl MirroredSnapshot {
    pub fn new(
        snapshot: SnapshotInfo,
        workspace: MirroredWorkspace,
        tree: Vec<ChangeEntry>,
    ) -> MirroredSnapshot {
        let entries = tree
            .into_iter()
            .filter_map(|e| {
                let path = e.path.into_string();
                Some(match e.state {
                    EntryState::File {
                        mode,
                        mtime,
                        size,
                        chunks,
                    } => MirroredEntry::File {
                        path,
                        mode,
                        mtime,
                        size,
                        chunks: chunks
                            .iter()
                            .map(|c| (c.hash.to_string(), c.size))
                            .collect(),
                    },
                    EntryState::Dir { mode, mtime } => MirroredEntry::Dir { path, mode, mtime },
                    EntryState::Symlink {
                        target,
                        mode,
                        mtime,
                    } => MirroredEntry::Symlink {
                        path,
                        mode,
                        mtime,
                        target,
                    },
                    EntryState::Delete => return None,
                })
            })
            .collect();
        MirroredSnapshot {
            format: MANIFEST_FORMAT.to_owned(),
            snapshot,
            workspace,
            entries,
        }
    }

    /// The tree as dofs records it; a malformed entry names the manifest.
    pub fn tree(&self, name: &str) -> Result<Vec<ChangeEntry>, KernelError> {
        let rev = self.snapshot.rev;
        let path = |p: &str| SyncPath::new(p).map_err(|e| bad_manifest(name, e));
        self.entries
            .iter()
            .map(|e| {
                Ok(match e {
                    MirroredEntry::File {
                        path: p,
                        mode,
                        mtime,
                        size,
                        chunks,
                    } => ChangeEntry {
                        rev,
                        path: path(p)?,
                        state: EntryState::File {
                            mode: *mode,
                            mtime: *mtime,
                            size: *size,
                            chunks: chunks
                                .iter()
                                .map(|(hex, size)| {
                                    Ok(ChunkRef {
                                        hash: Hash::from_hex(hex)
                                            .map_err(|e| bad_manifest(name, e))?,
                                        size: *size,
                                    })
                                })
                                .collect::<Result<_, KernelError>>()?,
                        },
                    },
                    MirroredEntry::Dir {
                        path: p,
                        mode,
                        mtime,
                    } => ChangeEntry {
                        rev,
                        path: path(p)?,
                        state: EntryState::Dir {
                            mode: *mode,
                            mtime: *mtime,
                        },
                    },
                    MirroredEntry::Symlink {
                        path: p,
                        mode,
                        mtime,
                        target,
                    } => ChangeEntry {
                        rev,
                        path: path(p)?,
                        state: EntryState::Symlink {
                            target: target.clone(),
                            mode: *mode,
                            mtime: *mtime,
                        },
                    },
                })
            })
            .collect()
    }

    /// Every chunk the manifest names.
    fn chunk_hashes(&self) -> impl Iterator<Item = Hash> + '_ {
        self.entries.iter().flat_map(|e| match e {
            MirroredEntry::File { chunks, .. } => chunks
                .iter()
                .filter_map(|(hex, _)| Hash::from_hex(hex).ok())
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
    }
}

fn manifest_name(workspace_id: &str, snapshot_id: &str) -> String {
    format!("snapshots/{workspace_id}/{snapshot_id}.json")
}

fn lock(d: &Mutex<Dofs>) -> MutexGuard<'_, Dofs> {
    d.lock().unwrap_or_else(|p| p.into_inner())
}

fn upstream(e: DofsError) -> KernelError {
    KernelError::Upstream(e.to_string())
}

impl SnapshotMirror {
    /// Connects and checks the store answers: an unreachable or refusing
    /// store fails the kernel's start, naming it (never a silent fallback
    /// to local-only chunks).
    pub async fn connect(config: &ChunkStoreConfig) -> Result<SnapshotMirror, KernelError> {
        let config = config.clone();
        let store = tokio::task::spawn_blocking(move || {
            ObjectChunks::connect_with(&config.url, config.credentials)
        })
        .await
        .map_err(|e| KernelError::internal("connecting to the chunk store", e))?
        .map_err(|e| KernelError::Unavailable(e.to_string()))?;
        tracing::info!(
            store = store.label(),
            "workspace chunks and snapshot manifests are kept in the object store"
        );
        Ok(SnapshotMirror {
            store: Arc::new(store),
            gate: tokio::sync::RwLock::new(()),
        })
    }

    pub fn label(&self) -> &str {
        self.store.label()
    }

    /// The store, for workspace stores to keep their chunks in.
    pub fn chunks(&self) -> SharedChunkStore {
        self.store.clone()
    }

    /// Copies the chunks of snapshot `id` of `dofs` that are still held in
    /// the dofs database itself (written before the kernel kept chunks in
    /// the object store) and the store lacks.
    pub async fn upload(&self, dofs: &Arc<Mutex<Dofs>>, id: &str) -> Result<Uploaded, KernelError> {
        let _shared = self.gate.read().await;
        let (store, dofs, id) = (self.store.clone(), dofs.clone(), id.to_owned());
        tokio::task::spawn_blocking(move || -> Result<Uploaded, DofsError> {
            let here = {
                let d = lock(&dofs);
                d.chunks_held_here(&d.snapshot_chunks(&id)?)?
            };
            // One listing of the bucket's packs and their indexes (and of
            // own objects, for many), not a request per chunk.
            let held: HashSet<Hash> = store.has(&here)?.into_iter().collect();
            let missing: Vec<Hash> = here.into_iter().filter(|h| !held.contains(h)).collect();
            let mut out = Uploaded::default();
            for batch in missing.chunks(UPLOAD_BATCH_CHUNKS) {
                // The workspace is locked per batch, not for the upload.
                let chunks: Vec<(Hash, Vec<u8>)> = {
                    let d = lock(&dofs);
                    batch
                        .iter()
                        .map(|h| Ok((*h, d.read_chunk(h)?)))
                        .collect::<Result<_, DofsError>>()?
                };
                let refs: Vec<(Hash, &[u8])> =
                    chunks.iter().map(|(h, b)| (*h, b.as_slice())).collect();
                // In packs (one object per `PACK_BYTES`).
                store.put_many(&refs)?;
                out.chunks += chunks.len() as u64;
                out.bytes += chunks.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
            }
            Ok(out)
        })
        .await
        .map_err(|e| KernelError::internal("uploading a snapshot", e))?
        .map_err(upstream)
    }

    /// Writes the manifest of snapshot `info` (its tree read from `dofs`)
    /// to the store.
    pub async fn publish(
        &self,
        dofs: &Arc<Mutex<Dofs>>,
        info: SnapshotInfo,
        workspace: MirroredWorkspace,
    ) -> Result<(), KernelError> {
        let (store, dofs) = (self.store.clone(), dofs.clone());
        tokio::task::spawn_blocking(move || -> Result<(), KernelError> {
            let tree = lock(&dofs)
                .snapshot_tree(&info.snapshot_id)
                .map_err(upstream)?;
            let name = manifest_name(&info.workspace_id, &info.snapshot_id);
            let manifest = MirroredSnapshot::new(info, workspace, tree);
            let bytes = serde_json::to_vec(&manifest)
                .map_err(|e| KernelError::internal("encoding a snapshot manifest", e))?;
            store.put_document(&name, bytes).map_err(upstream)
        })
        .await
        .map_err(|e| KernelError::internal("mirroring a snapshot manifest", e))?
    }

    /// Deletes the mirrored manifest of a snapshot.
    pub async fn forget(&self, workspace_id: &str, snapshot_id: &str) -> Result<(), KernelError> {
        let (store, name) = (self.store.clone(), manifest_name(workspace_id, snapshot_id));
        tokio::task::spawn_blocking(move || store.delete_document(&name))
            .await
            .map_err(|e| KernelError::internal("deleting a snapshot manifest", e))?
            .map_err(upstream)
    }

    /// Every mirrored manifest of workspace `workspace_id`, oldest first.
    pub async fn manifests(
        &self,
        workspace_id: &str,
    ) -> Result<Vec<(String, MirroredSnapshot)>, KernelError> {
        let (store, dir) = (self.store.clone(), format!("snapshots/{workspace_id}"));
        let mut out = tokio::task::spawn_blocking(move || read_manifests(&store, &dir, |_| true))
            .await
            .map_err(|e| KernelError::internal("reading snapshot manifests", e))??;
        out.sort_by(|a, b| {
            (a.1.snapshot.created_at, &a.1.snapshot.snapshot_id)
                .cmp(&(b.1.snapshot.created_at, &b.1.snapshot.snapshot_id))
        });
        Ok(out)
    }

    /// Collects the store's objects stored before `stored_before`
    /// ([`ObjectChunks::collect_each`]): deletes those no workspace store in
    /// `stores` reads from and no mirrored manifest of a workspace outside
    /// `known` names, and rewrites packs mostly dead into new ones. Each
    /// workspace store is locked for its own turn only (its mark, its
    /// moves); the collection's objects are doomed before the first mark,
    /// so no write reuses one of them meanwhile.
    pub async fn sweep(
        &self,
        stores: Vec<Arc<Mutex<Dofs>>>,
        known: HashSet<String>,
        stored_before: SystemTime,
    ) -> Result<SweepOutcome, KernelError> {
        let _exclusive = self.gate.write().await;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || -> Result<SweepOutcome, KernelError> {
            let stale = store.stale_objects(stored_before).map_err(upstream)?;
            if stale.is_empty() {
                return Ok(SweepOutcome::default());
            }
            // Workspaces only the bucket knows (a kernel that lost its data
            // directory, before `recover`) keep their snapshots' chunks.
            let mut keep: HashSet<Hash> = HashSet::new();
            let others = read_manifests(&store, "snapshots", |name| {
                name.split('/').nth(1).is_some_and(|ws| !known.contains(ws))
            })?;
            for (_, manifest) in &others {
                keep.extend(manifest.chunk_hashes());
            }
            // One store locked at a time (each for its own mark, then for
            // each round of moves): the collection dooms its objects
            // first, so no write reuses them meanwhile.
            let mut each = |f: &mut dyn FnMut(&mut Dofs) -> Result<(), DofsError>| {
                stores.iter().try_for_each(|d| f(&mut lock(d)))
            };
            store
                .collect_each(stale, &mut each, &keep)
                .map_err(upstream)
        })
        .await
        .map_err(|e| KernelError::internal("sweeping the chunk store", e))?
    }
}

/// The manifests under `dir` whose names `wanted` accepts, each with its
/// name.
fn read_manifests(
    store: &ObjectChunks,
    dir: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<(String, MirroredSnapshot)>, KernelError> {
    let mut out = Vec::new();
    for name in store.list_documents(dir).map_err(upstream)? {
        if !name.ends_with(".json") || !wanted(&name) {
            continue;
        }
        let Some(bytes) = store.get_document(&name).map_err(upstream)? else {
            // Deleted between the listing and the read.
            continue;
        };
        let manifest: MirroredSnapshot =
            serde_json::from_slice(&bytes).map_err(|e| bad_manifest(&name, e))?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(bad_manifest(
                &name,
                format!("format {:?}, not {MANIFEST_FORMAT:?}", manifest.format),
            ));
        }
        out.push((name, manifest));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_its_tree() {
        let tree = vec![
            ChangeEntry {
                rev: 7,
                path: SyncPath::new("d").unwrap(),
                state: EntryState::Dir {
                    mode: 0o755,
                    mtime: 1,
                },
            },
            ChangeEntry {
                rev: 7,
                path: SyncPath::new("d/f").unwrap(),
                state: EntryState::File {
                    mode: 0o644,
                    mtime: 2,
                    size: 5,
                    chunks: vec![ChunkRef {
                        hash: Hash::of(b"hello"),
                        size: 5,
                    }],
                },
            },
            ChangeEntry {
                rev: 7,
                path: SyncPath::new("l").unwrap(),
                state: EntryState::Symlink {
                    target: "d/f".into(),
                    mode: 0o777,
                    mtime: 3,
                },
            },
        ];
        let info = SnapshotInfo {
            snapshot_id: "snap_1".into(),
            workspace_id: "ws_1".into(),
            rev: 7,
            label: None,
            files: 1,
            bytes: 5,
            new_bytes: 5,
            created_at: 9,
        };
        let workspace = MirroredWorkspace {
            owner: "alice".into(),
            label: Some("l".into()),
            kind: "thread".into(),
        };
        let m = MirroredSnapshot::new(info, workspace, tree.clone());
        let json = serde_json::to_vec(&m).unwrap();
        let back: MirroredSnapshot = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.tree("x").unwrap(), tree);
        assert_eq!(
            back.chunk_hashes().collect::<Vec<_>>(),
            [Hash::of(b"hello")]
        );

        let mut broken = back;
        broken.entries[1] = MirroredEntry::File {
            path: "d/f".into(),
            mode: 0o644,
            mtime: 2,
            size: 5,
            chunks: vec![("not hex".into(), 5)],
        };
        let err = broken.tree("snapshots/ws_1/snap_1.json").unwrap_err();
        assert!(
            err.to_string().contains("snapshots/ws_1/snap_1.json"),
            "{err}"
        );
    }
}
