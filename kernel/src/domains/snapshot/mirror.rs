//! Snapshots off the box: with `gsv serve --chunk-store s3://...`, every
//! snapshot's chunks are copied into the object store when it is taken
//! (only those the store lacks: a second snapshot of an unchanged tree
//! uploads nothing), and garbage collection sweeps the store of chunks no
//! snapshot of any workspace holds, outside the grace window. Each
//! workspace's dofs stays the hot copy the tree is served from.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use wsd_dofs::{ChunkStore, Credentials, Dofs, DofsError, ObjectChunks, SweepOutcome};
use wsd_sync::Hash;

use crate::error::KernelError;

/// Where snapshot chunks go besides the workspaces' own stores.
#[derive(Clone, Debug)]
pub struct ChunkStoreConfig {
    /// `s3://BUCKET[/PREFIX]?endpoint=URL[&region=R][&deadline=30s]`.
    pub url: String,
    /// `None`: the usual AWS environment variables.
    pub credentials: Option<Credentials>,
}

/// The object store snapshots are copied to.
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

fn lock(d: &Mutex<Dofs>) -> std::sync::MutexGuard<'_, Dofs> {
    d.lock().unwrap_or_else(|p| p.into_inner())
}

fn upstream(e: DofsError) -> KernelError {
    KernelError::Upstream(e.to_string())
}

impl SnapshotMirror {
    /// Connects and checks the store answers: an unreachable or refusing
    /// store fails the kernel's start, naming it (never a silent fallback
    /// to local-only snapshots).
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
            "snapshot chunks are mirrored to the object store"
        );
        Ok(SnapshotMirror {
            store: Arc::new(store),
            gate: tokio::sync::RwLock::new(()),
        })
    }

    pub fn label(&self) -> &str {
        self.store.label()
    }

    /// Copies the chunks of snapshot `id` of `dofs` that the store lacks.
    pub async fn upload(&self, dofs: &Arc<Mutex<Dofs>>, id: &str) -> Result<Uploaded, KernelError> {
        let _shared = self.gate.read().await;
        let (store, dofs, id) = (self.store.clone(), dofs.clone(), id.to_owned());
        tokio::task::spawn_blocking(move || -> Result<Uploaded, DofsError> {
            let chunks = lock(&dofs).snapshot_chunks(&id)?;
            let held: HashSet<Hash> = store.has(&chunks)?.into_iter().collect();
            let mut out = Uploaded::default();
            for hash in chunks.iter().filter(|h| !held.contains(h)) {
                // The workspace is locked per chunk, not for the upload.
                let bytes = lock(&dofs).read_chunk(hash)?;
                if store.put_if_absent(hash, &bytes)? {
                    out.chunks += 1;
                    out.bytes += bytes.len() as u64;
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| KernelError::internal("uploading a snapshot", e))?
        .map_err(upstream)
    }

    /// Deletes the store's chunks that none of `stores`' snapshots holds
    /// and that were stored before `stored_before`.
    pub async fn sweep(
        &self,
        stores: Vec<Arc<Mutex<Dofs>>>,
        stored_before: SystemTime,
    ) -> Result<SweepOutcome, KernelError> {
        let _exclusive = self.gate.write().await;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || -> Result<SweepOutcome, DofsError> {
            let mut keep = HashSet::new();
            for dofs in &stores {
                keep.extend(lock(dofs).all_snapshot_chunks()?);
            }
            store.sweep(&keep, stored_before)
        })
        .await
        .map_err(|e| KernelError::internal("sweeping the chunk store", e))?
        .map_err(upstream)
    }
}
