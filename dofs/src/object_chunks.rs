//! The S3 chunk store: chunks in immutable objects in a bucket, through
//! the `object_store` crate (any S3-compatible server; an in-memory store
//! for tests).
//!
//! - A chunk stored alone is the object `PREFIX/chunks/<first 2 hex>/<hash>`;
//!   the chunks of one upload batch ([`ChunkStore::put_many`] of several)
//!   go into packs, `PREFIX/packs/<pack id>`, of up to [`PACK_BYTES`]
//!   each (format in `src/pack.rs`): the server's cost is per object, so
//!   this is what makes a sync fast (`bench/RESULTS.md`, issue 29). The
//!   caller records where `put_many` put each chunk ([`PackSlot`]) and
//!   reads with [`ChunkStore::get_placed`] (the pack read whole and kept
//!   a while for its other chunks); a
//!   pack lists its chunks itself, so a process with no record finds them
//!   ([`ChunkStore::locate`] reads the indexes of packs it has not seen).
//! - Writes are put-if-absent (`If-None-Match: *`): "already there" is not
//!   an error, so two writers of one chunk agree. A batch's packs may be
//!   sent while the caller goes on ([`ChunkStore::begin_put_many`]: a
//!   sync receives its next batch meanwhile); their chunks become known
//!   present, and may be named by a record, once the caller saw the
//!   uploads succeed ([`PendingPut::finish`]).
//! - A known-present set (the hashes this process stored or saw lately,
//!   with their pack ranges, bounded in count) answers `has` and skips uploads without a request
//!   per chunk; a hot cache of recently read chunks (bounded in bytes)
//!   answers repeated reads. Both assume one writer per bucket prefix:
//!   this process's own sweeps keep them true, a deletion by another
//!   process would not. (A [`crate::Dofs`] keeping its chunks here has a
//!   durable index of its own besides: its `chunks` table.)
//! - Besides chunks, small documents (snapshot manifests) live under
//!   `PREFIX/<name>` ([`ObjectChunks::put_document`] and friends).
//! - Every request runs under a deadline ([`DEFAULT_DEADLINE`], or
//!   `?deadline=` in the URL): a server that does not answer is an error
//!   naming the store, never a hang.
//! - Every byte read back is hash-verified, as for every [`ChunkStore`].
//!
//! The store runs its requests on a small runtime of its own, so its
//! (synchronous) [`ChunkStore`] methods can be called from any thread,
//! whatever runtime it belongs to: from a thread driving async code (the
//! sync driver calls its store from its connection's runtime) the caller
//! waits on a short-lived thread of its own instead, blocking as any
//! synchronous store call does.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt, stream};
use hashlink::LruCache;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutPayload, RetryConfig,
};
use wsd_sync::{ErrorCode, Hash, SyncError};

use crate::DofsError;
use crate::chunk_store::{BegunPut, ChunkStore, PackSlot, PendingPut, verified};
use crate::pack::{self, PackIndex};

mod collect;

pub use collect::{EachStore, REPACK_DEAD_SHARE};

/// How long one request may take before it is an error.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// Bytes of recently read chunks kept in memory.
const HOT_CACHE_BYTES: usize = 64 << 20;

/// Hashes the known-present set remembers (about 100 bytes each).
const PRESENT_HASHES: usize = 1 << 18;

/// Bytes of chunks in one pack at most: an upload batch larger than that
/// goes out as several packs (concurrently). Small on purpose: SeaweedFS
/// reads a whole stored object (up to its chunk size) to serve any range
/// of it, so a cold read of one small chunk costs about 1 ms more per MiB
/// of pack; at 1 MiB a sync of small files still makes ~100× fewer
/// objects than one per chunk (`bench/RESULTS.md`, issue 29).
pub const PACK_BYTES: usize = 1 << 20;

/// Whole packs kept after a read (at most [`PACK_BYTES`] and an index
/// each), so the next reads of their other chunks ask nothing.
const READ_AHEAD_PACKS: usize = 16;

/// Requests in flight at once for a batch (`has`, `sweep`): S3 has no
/// batch HEAD or batch delete that every server speaks.
const CONCURRENCY: usize = 16;

/// An object a sweep may delete, unmarked when listed and older than the
/// grace window ([`ObjectChunks::stale_objects`]): one chunk's own object,
/// or a pack with the chunks its index lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleObject {
    key: ObjectPath,
    /// The pack's id, for a pack.
    pub pack: Option<Hash>,
    /// The object's size in bytes.
    pub size: u64,
    /// The chunks it holds.
    pub chunks: Vec<Hash>,
    /// For a pack, where each of `chunks` is in it (same order).
    pub slots: Vec<PackSlot>,
}

impl StaleObject {
    /// Whether any chunk it holds is in `keep` (then it stays).
    pub fn holds_any(&self, keep: &HashSet<Hash>) -> bool {
        self.chunks.iter().any(|h| keep.contains(h))
    }
}

/// The objects of a collection in progress: packs by id, own objects by
/// their chunk's hash.
#[derive(Default)]
struct Doomed {
    packs: HashSet<Hash>,
    own: HashSet<Hash>,
}

/// What a sweep ([`ObjectChunks::sweep`], [`ObjectChunks::collect`])
/// freed: the chunk copies whose bytes left the bucket (whole objects
/// deleted, and the dead chunks of packs rewritten), the bytes the bucket
/// shrank by, and how many packs were rewritten without their dead chunks.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct SweepOutcome {
    pub chunks: u64,
    pub bytes: u64,
    pub repacked: u64,
}

impl std::ops::AddAssign for SweepOutcome {
    fn add_assign(&mut self, other: SweepOutcome) {
        self.chunks += other.chunks;
        self.bytes += other.bytes;
        self.repacked += other.repacked;
    }
}

/// Static credentials, for callers that do not take them from the
/// environment (tests that start their own server).
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Where the store is, parsed from `s3://BUCKET[/PREFIX]?endpoint=URL
/// [&region=R][&deadline=30s]`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct S3Location {
    bucket: String,
    prefix: String,
    endpoint: Option<String>,
    region: String,
    deadline: Duration,
}

impl S3Location {
    fn parse(url: &str) -> Result<S3Location, DofsError> {
        let bad = |reason: String| DofsError::ChunkStoreUrl {
            url: url.to_owned(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        if parsed.scheme() != "s3" {
            return Err(bad(format!(
                "scheme {:?} is not s3 (s3://BUCKET?endpoint=URL)",
                parsed.scheme()
            )));
        }
        let bucket = parsed
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| bad("no bucket (s3://BUCKET?endpoint=URL)".into()))?
            .to_owned();
        let prefix = parsed.path().trim_matches('/').to_owned();
        let mut location = S3Location {
            bucket,
            prefix,
            endpoint: None,
            region: "us-east-1".to_owned(),
            deadline: DEFAULT_DEADLINE,
        };
        for (key, value) in parsed.query_pairs() {
            match &*key {
                "endpoint" => {
                    let endpoint = url::Url::parse(&value)
                        .map_err(|e| bad(format!("endpoint {value:?}: {e}")))?;
                    if !matches!(endpoint.scheme(), "http" | "https") {
                        return Err(bad(format!("endpoint {value:?} is not http(s)")));
                    }
                    location.endpoint = Some(value.trim_end_matches('/').to_owned());
                }
                "region" => location.region = value.into_owned(),
                "deadline" => {
                    location.deadline = humantime::parse_duration(&value)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| {
                            bad(format!("deadline {value:?} is not a duration such as 30s"))
                        })?;
                }
                other => {
                    return Err(bad(format!(
                        "unknown option {other:?} (endpoint, region, deadline)"
                    )));
                }
            }
        }
        Ok(location)
    }

    /// How the store names itself in errors and logs: the URL without
    /// options, and the endpoint.
    fn label(&self) -> String {
        let mut label = format!("s3://{}", self.bucket);
        if !self.prefix.is_empty() {
            label = format!("{label}/{}", self.prefix);
        }
        match &self.endpoint {
            Some(endpoint) => format!("{label} at {endpoint}"),
            None => label,
        }
    }
}

/// Why one request failed.
enum CallError {
    Store(object_store::Error),
    Deadline,
}

async fn bounded<T>(
    deadline: Duration,
    fut: impl Future<Output = object_store::Result<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Store(e)),
        Err(_) => Err(CallError::Deadline),
    }
}

/// A runtime that is shut down without waiting (dropping a runtime blocks,
/// which a caller on an async thread must not do).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("runtime lives until drop").handle()
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Hot chunks, least recently read evicted first, bounded in bytes.
struct HotCache {
    chunks: LruCache<Hash, Arc<[u8]>>,
    bytes: usize,
}

/// A [`ChunkStore`] over an object store (S3 or any `object_store`
/// backend). Every method takes `&self`; a clone is the same store (its
/// state is shared), which is how uploads still running after a call
/// ([`ChunkStore::begin_put_many`]) reach it when they end.
#[derive(Clone)]
pub struct ObjectChunks {
    shared: Arc<Shared>,
}

/// The state of an [`ObjectChunks`] and of its clones.
struct Shared {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    label: String,
    deadline: Duration,
    /// Known present: each hash with its pack range (`None`: its own object).
    present: Mutex<LruCache<Hash, Option<PackSlot>>>,
    /// Packs whose indexes are in `present` (written or read here).
    packs_read: Mutex<HashSet<Hash>>,
    /// The objects a collection in progress may delete or rewrite
    /// ([`ObjectChunks::collect_each`]): writes do not reuse them.
    doomed: Mutex<Doomed>,
    hot: Mutex<HotCache>,
    /// Packs read whole lately (unverified bytes: each chunk is verified
    /// when taken from them).
    ahead: Mutex<LruCache<Hash, Arc<[u8]>>>,
    runtime: OwnRuntime,
}

impl std::fmt::Debug for ObjectChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectChunks")
            .field("label", &self.shared.label)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ObjectChunks {
    /// Connects to `url` (`s3://BUCKET[/PREFIX]?endpoint=URL[&region=R]
    /// [&deadline=30s]`) with credentials from the usual AWS environment
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
    /// ...), and checks that the bucket answers: a store that is
    /// unreachable or refuses us is an error naming it, here and now.
    pub fn connect(url: &str) -> Result<ObjectChunks, DofsError> {
        ObjectChunks::connect_with(url, None)
    }

    /// [`ObjectChunks::connect`] with static `credentials` instead of the
    /// environment's, when given.
    pub fn connect_with(
        url: &str,
        credentials: Option<Credentials>,
    ) -> Result<ObjectChunks, DofsError> {
        let location = S3Location::parse(url)?;
        let label = location.label();
        // TLS for https endpoints: ring, the process-wide provider the
        // rest of the workspace uses (an earlier install wins, harmlessly).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&location.bucket)
            .with_region(&location.region)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(location.deadline)
                    .with_connect_timeout(location.deadline.min(Duration::from_secs(10)))
                    .with_allow_http(
                        location
                            .endpoint
                            .as_deref()
                            .is_some_and(|e| e.starts_with("http:")),
                    ),
            )
            // Retries stay inside the deadline the caller waits for.
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: location.deadline,
                ..RetryConfig::default()
            });
        if let Some(endpoint) = &location.endpoint {
            // Path-style addressing: S3-compatible servers rarely have a
            // DNS name per bucket.
            builder = builder
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false);
        }
        if let Some(c) = credentials {
            builder = builder
                .with_access_key_id(c.access_key_id)
                .with_secret_access_key(c.secret_access_key);
        }
        let store = builder.build().map_err(|e| DofsError::ChunkStoreUrl {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
        let chunks =
            ObjectChunks::over(Arc::new(store), &location.prefix, label, location.deadline)?;
        chunks.check_reachable()?;
        Ok(chunks)
    }

    /// A store over any `object_store` backend (e.g. `InMemory` in tests),
    /// keys under `prefix`, named `label` in errors.
    pub fn over(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        label: String,
        deadline: Duration,
    ) -> Result<ObjectChunks, DofsError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dofs-chunk-store")
            .enable_all()
            .build()
            .map_err(|e| SyncError::io("starting the chunk store's runtime", e))?;
        let shared = Shared {
            store,
            prefix: ObjectPath::from(prefix),
            label,
            deadline,
            present: Mutex::new(LruCache::new(PRESENT_HASHES)),
            packs_read: Mutex::new(HashSet::new()),
            doomed: Mutex::new(Doomed::default()),
            ahead: Mutex::new(LruCache::new(READ_AHEAD_PACKS)),
            hot: Mutex::new(HotCache {
                chunks: LruCache::new_unbounded(),
                bytes: 0,
            }),
            runtime: OwnRuntime(Some(runtime)),
        };
        Ok(ObjectChunks {
            shared: Arc::new(shared),
        })
    }

    /// How many packs' indexes this process holds (written or read).
    #[cfg(test)]
    pub(crate) fn packs_read(&self) -> usize {
        lock(&self.shared.packs_read).len()
    }

    /// How this store names itself (`s3://BUCKET/PREFIX at ENDPOINT`).
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    fn chunks_dir(&self) -> ObjectPath {
        self.shared.prefix.clone().join("chunks")
    }

    fn key(&self, hash: &Hash) -> ObjectPath {
        let hex = hash.to_string();
        self.chunks_dir().join(&hex[..2]).join(hex)
    }

    fn packs_dir(&self) -> ObjectPath {
        self.shared.prefix.clone().join("packs")
    }

    fn pack_key(&self, id: &Hash) -> ObjectPath {
        self.packs_dir().join(id.to_string())
    }

    fn failed(&self, op: String, e: CallError) -> DofsError {
        match e {
            CallError::Store(source) => DofsError::ChunkStore {
                store: self.shared.label.clone(),
                op,
                source: Box::new(source),
            },
            CallError::Deadline => DofsError::ChunkStoreDeadline {
                store: self.shared.label.clone(),
                op,
                after: self.shared.deadline,
            },
        }
    }

    /// Runs `fut` to completion on this store's runtime and waits for it.
    fn block_on<T: Send>(&self, fut: impl Future<Output = T> + Send) -> T {
        let handle = self.shared.runtime.handle();
        if tokio::runtime::Handle::try_current().is_err() {
            return handle.block_on(fut);
        }
        // A runtime's thread may not enter another runtime: wait from a
        // thread that is in none.
        std::thread::scope(|s| {
            s.spawn(|| handle.block_on(fut))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// One listing request: the bucket exists and we may read it.
    fn check_reachable(&self) -> Result<(), DofsError> {
        let (store, dir, deadline) = (
            self.shared.store.clone(),
            self.chunks_dir(),
            self.shared.deadline,
        );
        self.block_on(bounded(deadline, async move {
            store.list_with_delimiter(Some(&dir)).await
        }))
        .map(drop)
        .map_err(|e| self.failed("listing the bucket".into(), e))
    }

    fn remember(&self, hash: Hash, slot: Option<PackSlot>) {
        lock(&self.shared.present).insert(hash, slot);
    }

    /// Where `hash` is, if this process knows it present somewhere a
    /// collection in progress will not delete: the place a write may
    /// name.
    fn known_lasting(&self, hash: &Hash) -> Option<Option<PackSlot>> {
        self.known(hash).filter(|slot| self.lasting(hash, *slot))
    }

    /// Whether `hash` at `slot` (`None`: its own object) is outside every
    /// collection in progress.
    fn lasting(&self, hash: &Hash, slot: Option<PackSlot>) -> bool {
        let doomed = lock(&self.shared.doomed);
        match slot {
            Some(slot) => !doomed.packs.contains(&slot.pack),
            None => !doomed.own.contains(hash),
        }
    }

    /// Where `hash` is, if this process knows it present.
    fn known(&self, hash: &Hash) -> Option<Option<PackSlot>> {
        lock(&self.shared.present).get(hash).copied()
    }

    fn cache(&self, hash: Hash, bytes: Arc<[u8]>) {
        if bytes.len() > HOT_CACHE_BYTES / 4 {
            return;
        }
        let mut hot = lock(&self.shared.hot);
        hot.bytes += bytes.len();
        if let Some(old) = hot.chunks.insert(hash, bytes) {
            hot.bytes -= old.len();
        }
        while hot.bytes > HOT_CACHE_BYTES {
            match hot.chunks.remove_lru() {
                Some((_, evicted)) => hot.bytes -= evicted.len(),
                None => break,
            }
        }
    }

    /// Frees what `keep` does not name among the objects stored before
    /// `stored_before` (the grace window: a chunk uploaded for a reference
    /// not yet recorded is young, and stays; so is a pack written for it):
    /// [`ObjectChunks::collect`] with no workspace store, for a caller
    /// whose marks are hashes alone.
    pub fn sweep(
        &self,
        keep: &HashSet<Hash>,
        stored_before: SystemTime,
    ) -> Result<SweepOutcome, DofsError> {
        self.collect(self.stale_objects(stored_before)?, &mut [], keep)
    }

    /// Every object listed under `dir`, page by page (each page one
    /// request under the deadline).
    fn listing(&self, dir: &ObjectPath, what: &str) -> Result<Vec<ObjectMeta>, DofsError> {
        let deadline = self.shared.deadline;
        let mut listing = self.shared.store.list(Some(dir));
        let mut out = Vec::new();
        loop {
            let next = self
                .block_on(async {
                    tokio::time::timeout(deadline, listing.next())
                        .await
                        .map_err(|_| CallError::Deadline)
                })
                .map_err(|e| self.failed(format!("listing {what}"), e))?;
            let Some(meta) = next else { break };
            out.push(
                meta.map_err(|e| self.failed(format!("listing {what}"), CallError::Store(e)))?,
            );
        }
        Ok(out)
    }

    /// The packs listed in the bucket, each with its size (objects under
    /// `packs/` not named by a pack id are another tool's, and left).
    fn listed_packs(&self) -> Result<Vec<(Hash, ObjectMeta)>, DofsError> {
        Ok(self
            .listing(&self.packs_dir(), "packs")?
            .into_iter()
            .filter_map(|meta| {
                let id = meta
                    .location
                    .filename()
                    .and_then(|n| Hash::from_hex(n).ok())?;
                Some((id, meta))
            })
            .collect())
    }

    /// The indexes of `packs` (id, size), read concurrently, in input
    /// order; a pack gone meanwhile is `None`.
    fn read_pack_indexes(
        &self,
        packs: &[(Hash, u64)],
    ) -> Result<Vec<Option<PackIndex>>, DofsError> {
        let (store, deadline) = (self.shared.store.clone(), self.shared.deadline);
        let reads: Vec<(Hash, ObjectPath, u64)> = packs
            .iter()
            .map(|(id, size)| (*id, self.pack_key(id), *size))
            .collect();
        let read: Vec<(Hash, Result<Option<PackIndex>, IndexError>)> = self.block_on(
            stream::iter(reads)
                .map(|(id, key, size)| {
                    let store = store.clone();
                    async move {
                        (
                            id,
                            read_pack_index(&*store, &key, &id, size, deadline).await,
                        )
                    }
                })
                .buffered(CONCURRENCY)
                .collect(),
        );
        read.into_iter()
            .map(|(id, got)| match got {
                Ok(index) => Ok(index),
                Err(IndexError::Pack(e)) => Err(e),
                Err(IndexError::Call(e)) => {
                    Err(self.failed(format!("reading the index of pack {id}"), e))
                }
            })
            .collect()
    }

    /// Reads the index of every pack in the bucket this process has not
    /// read (or written) yet into the known-present set: how a store with
    /// no local state (a recovery, a second client) finds packed chunks.
    /// Answers what it read (whole, even where the bounded set evicted).
    fn read_new_packs(&self) -> Result<HashMap<Hash, PackSlot>, DofsError> {
        let new: Vec<(Hash, u64)> = {
            let listed = self.listed_packs()?;
            let read = lock(&self.shared.packs_read);
            listed
                .into_iter()
                .filter(|(id, _)| !read.contains(id))
                .map(|(id, meta)| (id, meta.size))
                .collect()
        };
        let indexes = self.read_pack_indexes(&new)?;
        let mut read = HashMap::new();
        for ((id, _), index) in new.iter().zip(indexes) {
            let Some(index) = index else { continue };
            for (hash, slot) in index {
                self.remember(hash, Some(slot));
                read.insert(hash, slot);
            }
            lock(&self.shared.packs_read).insert(*id);
        }
        Ok(read)
    }

    /// Every object stored before `stored_before`: chunks' own objects and
    /// packs (each with the chunks its index lists). A caller marks what
    /// it must keep among their chunks, then
    /// [`ObjectChunks::delete_objects`] the rest, with nothing able to
    /// reference them in between.
    pub fn stale_objects(&self, stored_before: SystemTime) -> Result<Vec<StaleObject>, DofsError> {
        let before_ms = stored_before
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let stale = |meta: &ObjectMeta| meta.last_modified.timestamp_millis() < before_ms;
        let mut out: Vec<StaleObject> = self
            .listing(&self.chunks_dir(), "chunks")?
            .into_iter()
            .filter(|meta| stale(meta))
            .filter_map(|meta| {
                // Objects that are not chunks (another tool's files) are left.
                let hash = meta
                    .location
                    .filename()
                    .and_then(|n| Hash::from_hex(n).ok())?;
                Some(StaleObject {
                    key: meta.location,
                    pack: None,
                    size: meta.size,
                    chunks: vec![hash],
                    slots: Vec::new(),
                })
            })
            .collect();
        let packs: Vec<(Hash, ObjectMeta)> = self
            .listed_packs()?
            .into_iter()
            .filter(|(_, meta)| stale(meta))
            .collect();
        let sizes: Vec<(Hash, u64)> = packs.iter().map(|(id, m)| (*id, m.size)).collect();
        for ((id, meta), index) in packs.into_iter().zip(self.read_pack_indexes(&sizes)?) {
            // Gone since the listing: nothing to delete.
            let Some(index) = index else { continue };
            let (chunks, slots) = index.into_iter().unzip();
            out.push(StaleObject {
                key: meta.location,
                pack: Some(id),
                size: meta.size,
                chunks,
                slots,
            });
        }
        Ok(out)
    }

    /// Deletes `objects` (a few at a time) and forgets their chunks.
    pub fn delete_objects(&self, objects: Vec<StaleObject>) -> Result<SweepOutcome, DofsError> {
        let deleted = self.delete_keys(objects)?;
        self.forget(&deleted);
        let mut out = SweepOutcome::default();
        for object in &deleted {
            out.chunks += object.chunks.len() as u64;
            out.bytes += object.size;
        }
        Ok(out)
    }

    /// Deletes `objects` from the bucket (gone already is fine), answering
    /// them.
    fn delete_keys(&self, objects: Vec<StaleObject>) -> Result<Vec<StaleObject>, DofsError> {
        let (store, deadline) = (self.shared.store.clone(), self.shared.deadline);
        self.block_on(
            stream::iter(objects)
                .map(|o| {
                    let store = store.clone();
                    async move {
                        match bounded(deadline, store.delete(&o.key)).await {
                            Ok(())
                            | Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(o),
                            Err(e) => Err((o.key, e)),
                        }
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .collect::<Vec<_>>(),
        )
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|(key, e)| self.failed(format!("deleting {key}"), e))
    }

    /// Forgets the chunks of deleted `objects` (known present, hot, read
    /// ahead), so a later write stores them again instead of pointing at
    /// a deleted object.
    fn forget(&self, objects: &[StaleObject]) {
        let mut present = lock(&self.shared.present);
        let mut hot = lock(&self.shared.hot);
        let mut packs_read = lock(&self.shared.packs_read);
        let mut ahead = lock(&self.shared.ahead);
        for object in objects {
            if let Some(id) = object.pack {
                packs_read.remove(&id);
                ahead.remove(&id);
            }
            for hash in &object.chunks {
                present.remove(hash);
                if let Some(bytes) = hot.chunks.remove(hash) {
                    hot.bytes -= bytes.len();
                }
            }
        }
    }

    fn document_key(&self, name: &str) -> ObjectPath {
        name.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.shared.prefix.clone(), |key, part| key.join(part))
    }

    /// Stores (replacing) the document `name` (`a/b.json`) under the prefix.
    pub fn put_document(&self, name: &str, bytes: Vec<u8>) -> Result<(), DofsError> {
        let (store, key) = (self.shared.store.clone(), self.document_key(name));
        self.block_on(bounded(self.shared.deadline, async move {
            store.put(&key, PutPayload::from(bytes)).await
        }))
        .map(drop)
        .map_err(|e| self.failed(format!("storing {name}"), e))
    }

    /// The document `name`, or `None` when there is none.
    pub fn get_document(&self, name: &str) -> Result<Option<Vec<u8>>, DofsError> {
        let (store, key) = (self.shared.store.clone(), self.document_key(name));
        match self.block_on(bounded(self.shared.deadline, async move {
            store.get(&key).await?.bytes().await
        })) {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(None),
            Err(e) => Err(self.failed(format!("reading {name}"), e)),
        }
    }

    /// Deletes the document `name` (gone already is fine).
    pub fn delete_document(&self, name: &str) -> Result<(), DofsError> {
        let (store, key) = (self.shared.store.clone(), self.document_key(name));
        match self.block_on(bounded(self.shared.deadline, async move {
            store.delete(&key).await
        })) {
            Ok(()) | Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(()),
            Err(e) => Err(self.failed(format!("deleting {name}"), e)),
        }
    }

    /// The names (relative to the prefix) of the documents under `dir`.
    pub fn list_documents(&self, dir: &str) -> Result<Vec<String>, DofsError> {
        let prefix_parts = self.shared.prefix.parts().count();
        let mut names: Vec<String> = self
            .listing(&self.document_key(dir), dir)?
            .into_iter()
            .map(|meta| {
                let parts: Vec<String> = meta
                    .location
                    .parts()
                    .skip(prefix_parts)
                    .map(|p| p.as_ref().to_owned())
                    .collect();
                parts.join("/")
            })
            .collect();
        names.sort();
        Ok(names)
    }
}

/// Why reading a pack's index failed: the request, or the pack itself.
enum IndexError {
    Call(CallError),
    Pack(DofsError),
}

/// The index of pack `id` at `key` (`size` bytes): two ranged reads, the
/// header then the index. `None` when the pack is gone.
async fn read_pack_index(
    store: &dyn ObjectStore,
    key: &ObjectPath,
    id: &Hash,
    size: u64,
    deadline: Duration,
) -> Result<Option<PackIndex>, IndexError> {
    let range = |r: std::ops::Range<u64>| async move {
        match bounded(deadline, store.get_range(key, r)).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(None),
            Err(e) => Err(IndexError::Call(e)),
        }
    };
    if size < pack::HEADER_LEN {
        return Err(IndexError::Pack(DofsError::CorruptPack {
            pack: *id,
            reason: format!("{size} bytes, shorter than a pack header"),
        }));
    }
    let Some(header) = range(0..pack::HEADER_LEN).await? else {
        return Ok(None);
    };
    let len = pack::index_len(id, &header).map_err(IndexError::Pack)?;
    let end = pack::HEADER_LEN + len;
    if end > size {
        return Err(IndexError::Pack(DofsError::CorruptPack {
            pack: *id,
            reason: format!("an index of {len} bytes in a pack of {size}"),
        }));
    }
    let index = match len {
        0 => Default::default(),
        _ => match range(pack::HEADER_LEN..end).await? {
            Some(index) => index,
            None => return Ok(None),
        },
    };
    pack::decode_index(id, &index, size)
        .map(Some)
        .map_err(IndexError::Pack)
}

/// The bytes `slot` names in `pack` (empty when the pack is shorter: the
/// chunk's verification then fails, naming it).
fn slice(pack: &[u8], slot: &PackSlot) -> Vec<u8> {
    let start = usize::try_from(slot.offset).unwrap_or(usize::MAX);
    start
        .checked_add(slot.len as usize)
        .and_then(|end| pack.get(start..end))
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

/// One request of a [`ObjectChunks::get_placed`]: a chunk's own object, or
/// one pack, whole, for the chunks wanted from it.
enum Fetch {
    Alone {
        at: usize,
        hash: Hash,
        key: ObjectPath,
    },
    Packed {
        key: ObjectPath,
        members: Vec<(usize, Hash, PackSlot)>,
    },
}

impl ObjectChunks {
    /// Stores `chunks` (distinct, not known present) as packs of at most
    /// [`PACK_BYTES`], sent concurrently; answers where each one is.
    fn put_packs(&self, chunks: &[(Hash, &[u8])]) -> Result<Vec<(Hash, PackSlot)>, DofsError> {
        let (placed, pending) = self.begin_packs(chunks);
        pending.finish()?;
        Ok(placed)
    }

    /// [`ObjectChunks::put_packs`] that answers once the packs are built,
    /// their uploads running on this store's runtime (so the caller can
    /// go on, e.g. receive the next batch, meanwhile). The chunks become
    /// known present only when [`PendingPut::finish`] saw every upload
    /// succeed: no other writer names a place before it exists.
    fn begin_packs(&self, chunks: &[(Hash, &[u8])]) -> (Vec<(Hash, PackSlot)>, PendingPut) {
        let mut groups: Vec<&[(Hash, &[u8])]> = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, (_, b)) in chunks.iter().enumerate() {
            if bytes > 0 && bytes + b.len() > PACK_BYTES {
                groups.push(&chunks[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += b.len();
        }
        groups.push(&chunks[start..]);
        let (store, deadline) = (self.shared.store.clone(), self.shared.deadline);
        let mut uploads: Vec<(Hash, ObjectPath, PutPayload)> = Vec::with_capacity(groups.len());
        let mut placed: Vec<(Hash, PackIndex)> = Vec::with_capacity(groups.len());
        for group in groups {
            // Never the id of a pack a collection may delete (the same
            // chunks in the same order would make it): a gap makes another.
            let mut packed = pack::encode(group);
            let mut gap = 0;
            while lock(&self.shared.doomed).packs.contains(&packed.id) {
                gap += 1;
                packed = pack::encode_with_gap(group, gap);
            }
            // The bytes move into the request; the slots stay for the answer.
            let pack::Pack { id, bytes, slots } = packed;
            uploads.push((id, self.pack_key(&id), PutPayload::from(bytes)));
            placed.push((id, slots));
        }
        let sending = self.shared.runtime.handle().spawn(
            stream::iter(uploads)
                .map(move |(id, key, payload)| {
                    let store = store.clone();
                    async move {
                        // Same id, same bytes: "already there" is success.
                        match bounded(
                            deadline,
                            store.put_opts(&key, payload, PutMode::Create.into()),
                        )
                        .await
                        {
                            Ok(_)
                            | Err(CallError::Store(
                                object_store::Error::AlreadyExists { .. }
                                | object_store::Error::Precondition { .. },
                            )) => Ok(()),
                            Err(e) => Err((id, e)),
                        }
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .try_collect::<Vec<()>>(),
        );
        let answer: Vec<(Hash, PackSlot)> = placed
            .iter()
            .flat_map(|(_, slots)| slots.iter().copied())
            .collect();
        let this = self.clone();
        let pending = PendingPut::new(move || {
            match this.block_on(sending) {
                Ok(Ok(_)) => {}
                Ok(Err((id, e))) => {
                    return Err(this.failed(format!("storing pack {}", this.pack_key(&id)), e));
                }
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(join) => {
                    return Err(DofsError::ChunkStore {
                        store: this.shared.label.clone(),
                        op: "storing packs".into(),
                        source: Box::new(join),
                    });
                }
            }
            for (id, slots) in placed {
                for (hash, slot) in &slots {
                    this.remember(*hash, Some(*slot));
                }
                lock(&this.shared.packs_read).insert(id);
            }
            Ok(())
        });
        (answer, pending)
    }
}

impl ChunkStore for ObjectChunks {
    /// A chunk whose own object a collection in progress may delete goes
    /// into a pack of one instead ("already there" would answer for the
    /// doomed object).
    fn put_if_absent(&self, hash: &Hash, bytes: &[u8]) -> Result<bool, DofsError> {
        if self.known_lasting(hash).is_some() {
            return Ok(false);
        }
        if !self.lasting(hash, None) {
            self.put_packs(&[(*hash, bytes)])?;
            return Ok(true);
        }
        let (store, key) = (self.shared.store.clone(), self.key(hash));
        let payload = PutPayload::from(bytes.to_vec());
        let stored = match self.block_on(bounded(self.shared.deadline, async move {
            store.put_opts(&key, payload, PutMode::Create.into()).await
        })) {
            Ok(_) => true,
            Err(CallError::Store(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            )) => false,
            Err(e) => return Err(self.failed(format!("storing chunk {hash}"), e)),
        };
        self.remember(*hash, None);
        Ok(stored)
    }

    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        Ok(self
            .get_many(std::slice::from_ref(hash))?
            .pop()
            .expect("one chunk asked, one answered"))
    }

    fn has(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        Ok(self.locate(hashes)?.into_iter().map(|(h, _)| h).collect())
    }

    /// The chunks not known present go out together: one alone as its
    /// own object, several in packs (one object per [`PACK_BYTES`]).
    fn put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<Vec<Option<PackSlot>>, DofsError> {
        let begun = self.begin_put_many(chunks)?;
        if let Some(pending) = begun.pending {
            pending.finish()?;
        }
        Ok(begun.places)
    }

    /// [`ChunkStore::put_many`] whose packs are still being sent when it
    /// answers (a chunk alone is sent before: its "already there" answers
    /// for an object that may be a collection's to delete, so it is not
    /// left to run past the caller's checks).
    fn begin_put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<BegunPut, DofsError> {
        let mut placed: HashMap<Hash, Option<PackSlot>> = HashMap::new();
        let mut new: Vec<(Hash, &[u8])> = Vec::new();
        let mut seen = HashSet::new();
        for (hash, bytes) in chunks {
            match self.known_lasting(hash) {
                Some(slot) => {
                    placed.insert(*hash, slot);
                }
                None if seen.insert(*hash) => new.push((*hash, bytes)),
                None => {}
            }
        }
        let mut pending = None;
        if let [(hash, bytes)] = new[..]
            && self.lasting(&hash, None)
        {
            self.put_if_absent(&hash, bytes)?;
            placed.insert(hash, None);
        } else if !new.is_empty() {
            let (packed, sending) = self.begin_packs(&new);
            placed.extend(packed.into_iter().map(|(h, s)| (h, Some(s))));
            pending = Some(sending);
        }
        Ok(BegunPut {
            places: chunks.iter().map(|(h, _)| placed[h]).collect(),
            pending,
        })
    }

    /// [`ChunkStore::get_placed`] at the places this process knows; a
    /// chunk it cannot find sends it to read the indexes of packs it has
    /// not seen (once), then to try again.
    fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Vec<u8>>, DofsError> {
        let placed = |this: &ObjectChunks| -> Vec<(Hash, Option<PackSlot>)> {
            hashes
                .iter()
                .map(|h| (*h, this.known(h).flatten()))
                .collect()
        };
        let first = placed(self);
        match self.get_placed(&first) {
            Err(e)
                if e.code() == ErrorCode::UnknownHash
                    && first.iter().any(|(_, s)| s.is_none())
                    && !self.read_new_packs()?.is_empty() =>
            {
                self.get_placed(&placed(self))
            }
            got => got,
        }
    }

    /// Hot chunks from the cache, packed ones from a pack read whole
    /// lately; the rest fetched [`CONCURRENCY`] requests at a time: a
    /// chunk's own object, or its whole pack (kept for the next reads,
    /// [`READ_AHEAD_PACKS`] of them). Each chunk is verified.
    fn get_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Vec<u8>>, DofsError> {
        let mut out: Vec<Option<Vec<u8>>> = {
            let mut hot = lock(&self.shared.hot);
            chunks
                .iter()
                .map(|(h, _)| hot.chunks.get(h).map(|b| b.to_vec()))
                .collect()
        };
        let mut fetches: Vec<Fetch> = Vec::new();
        let mut pack_fetch: HashMap<Hash, usize> = HashMap::new();
        // Chunks sliced out of packs read whole: verified like the rest.
        let mut sliced: Vec<(usize, Hash, Option<PackSlot>, Vec<u8>)> = Vec::new();
        for (at, (hash, slot)) in chunks.iter().enumerate() {
            if out[at].is_some() {
                continue;
            }
            let slot = slot.or_else(|| self.known(hash).flatten());
            if let Some(slot) = slot
                && let Some(pack) = lock(&self.shared.ahead).get(&slot.pack).cloned()
            {
                sliced.push((at, *hash, Some(slot), slice(&pack, &slot)));
                continue;
            }
            match slot {
                None => fetches.push(Fetch::Alone {
                    at,
                    hash: *hash,
                    key: self.key(hash),
                }),
                Some(slot) => {
                    let i = *pack_fetch.entry(slot.pack).or_insert_with(|| {
                        fetches.push(Fetch::Packed {
                            key: self.pack_key(&slot.pack),
                            members: Vec::new(),
                        });
                        fetches.len() - 1
                    });
                    if let Fetch::Packed { members, .. } = &mut fetches[i] {
                        members.push((at, *hash, slot));
                    }
                }
            }
        }
        let (store, deadline) = (self.shared.store.clone(), self.shared.deadline);
        type Fetched = Result<
            (
                Option<(Hash, Arc<[u8]>)>,
                Vec<(usize, Hash, Option<PackSlot>, Vec<u8>)>,
            ),
            (Hash, CallError),
        >;
        let fetched: Vec<Fetched> = self.block_on(
            stream::iter(fetches)
                .map(|fetch| {
                    let store = store.clone();
                    async move {
                        match fetch {
                            Fetch::Alone { at, hash, key } => bounded(deadline, async move {
                                Ok(store.get(&key).await?.bytes().await?.to_vec())
                            })
                            .await
                            .map(|bytes| (None, vec![(at, hash, None, bytes)]))
                            .map_err(|e| (hash, e)),
                            // The whole pack: SeaweedFS reads all of it to
                            // serve any range anyway, and the next reads
                            // (neighbouring files) find it in memory.
                            Fetch::Packed { key, members } => {
                                match bounded(deadline, async move {
                                    store.get(&key).await?.bytes().await
                                })
                                .await
                                {
                                    Ok(whole) => {
                                        let id = members[0].2.pack;
                                        let pack: Arc<[u8]> = Arc::from(&whole[..]);
                                        let got: Vec<_> = members
                                            .into_iter()
                                            .map(|(at, hash, s)| {
                                                (at, hash, Some(s), slice(&pack, &s))
                                            })
                                            .collect();
                                        Ok((Some((id, pack)), got))
                                    }
                                    Err(e) => Err((members[0].1, e)),
                                }
                            }
                        }
                    }
                })
                .buffered(CONCURRENCY)
                .collect(),
        );
        let mut taken = vec![sliced];
        for got in fetched {
            let (pack, got) = match got {
                Ok(got) => got,
                Err((hash, CallError::Store(object_store::Error::NotFound { .. }))) => {
                    return Err(SyncError::UnknownHash { hash, path: None }.into());
                }
                Err((hash, e)) => return Err(self.failed(format!("reading chunk {hash}"), e)),
            };
            if let Some((id, bytes)) = pack {
                lock(&self.shared.ahead).insert(id, bytes);
            }
            taken.push(got);
        }
        for got in taken {
            for (at, hash, slot, bytes) in got {
                let bytes = verified(&hash, bytes)?;
                self.remember(hash, slot);
                self.cache(hash, Arc::from(bytes.as_slice()));
                out[at] = Some(bytes);
            }
        }
        Ok(out
            .into_iter()
            .map(|b| b.expect("every chunk cached or fetched"))
            .collect())
    }

    /// Known chunks answer from the known-present set; the rest are looked
    /// up in the indexes of packs this process has not read yet (one
    /// listing of `packs/`, each new index read once), and what is still
    /// unknown is asked for as objects of their own
    /// ([`ObjectChunks::own_objects`]): never a request per packed chunk.
    fn locate(&self, hashes: &[Hash]) -> Result<Vec<(Hash, Option<PackSlot>)>, DofsError> {
        let unknown = |this: &ObjectChunks, read: &HashMap<Hash, PackSlot>| -> Vec<Hash> {
            let mut seen = HashSet::new();
            hashes
                .iter()
                .filter(|h| {
                    this.known_lasting(h).is_none() && !read.contains_key(*h) && seen.insert(**h)
                })
                .copied()
                .collect()
        };
        let mut read = HashMap::new();
        if !unknown(self, &read).is_empty() {
            read = self.read_new_packs()?;
            // A place a collection in progress may delete is not answered.
            read.retain(|hash, slot| self.lasting(hash, Some(*slot)));
        }
        for hash in self.own_objects(&unknown(self, &read))? {
            if self.lasting(&hash, None) {
                self.remember(hash, None);
            }
        }
        Ok(hashes
            .iter()
            .filter_map(|h| {
                let slot = self
                    .known_lasting(h)
                    .or_else(|| read.get(h).map(|s| Some(*s)))?;
                Some((*h, slot))
            })
            .collect())
    }

    fn lasting_place(&self, hash: &Hash, slot: Option<PackSlot>) -> bool {
        self.lasting(hash, slot)
    }

    /// Which of `chunks` are not where the record says: a pack range its
    /// pack does not list (or a pack that is gone), or an object of its own
    /// the bucket lacks. One listing of `packs/` and one index read per
    /// pack named, whatever the number of chunks.
    fn missing_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Hash>, DofsError> {
        let named: HashSet<Hash> = chunks
            .iter()
            .filter_map(|(_, s)| s.map(|s| s.pack))
            .collect();
        let mut listed: HashSet<(Hash, PackSlot)> = HashSet::new();
        if !named.is_empty() {
            let packs: Vec<(Hash, u64)> = self
                .listed_packs()?
                .into_iter()
                .filter(|(id, _)| named.contains(id))
                .map(|(id, meta)| (id, meta.size))
                .collect();
            for ((id, _), index) in packs.iter().zip(self.read_pack_indexes(&packs)?) {
                let Some(index) = index else { continue };
                for (hash, slot) in index {
                    self.remember(hash, Some(slot));
                    listed.insert((hash, slot));
                }
                lock(&self.shared.packs_read).insert(*id);
            }
        }
        let alone: Vec<Hash> = chunks
            .iter()
            .filter(|(h, s)| s.is_none() && self.known(h) != Some(None))
            .map(|(h, _)| *h)
            .collect::<HashSet<Hash>>()
            .into_iter()
            .collect();
        let found: HashSet<Hash> = self.own_objects(&alone)?.into_iter().collect();
        Ok(chunks
            .iter()
            .filter(|(hash, slot)| match slot {
                Some(slot) => !listed.contains(&(*hash, *slot)),
                None => self.known(hash) != Some(None) && !found.contains(hash),
            })
            .map(|(h, _)| *h)
            .collect())
    }
}

/// Above this many chunks to look for as objects of their own, one
/// listing of `chunks/` (a request per 1,000 objects) answers them instead
/// of a HEAD each.
const LIST_OVER_HEAD: usize = 64;

impl ObjectChunks {
    /// Which of `hashes` (distinct) the bucket holds as objects of their
    /// own: a HEAD each, or for many, one listing of `chunks/`.
    fn own_objects(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        if hashes.len() > LIST_OVER_HEAD {
            let listed: HashSet<Hash> = self
                .listing(&self.chunks_dir(), "chunks")?
                .into_iter()
                .filter_map(|meta| {
                    meta.location
                        .filename()
                        .and_then(|n| Hash::from_hex(n).ok())
                })
                .collect();
            return Ok(hashes
                .iter()
                .filter(|h| listed.contains(*h))
                .copied()
                .collect());
        }
        let (store, deadline) = (self.shared.store.clone(), self.shared.deadline);
        let keys: Vec<(Hash, ObjectPath)> = hashes.iter().map(|h| (*h, self.key(h))).collect();
        self.block_on(
            stream::iter(keys)
                .map(|(hash, key)| {
                    let store = store.clone();
                    async move {
                        match bounded(deadline, store.head(&key)).await {
                            Ok(_) => Ok(Some(hash)),
                            Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(None),
                            Err(e) => Err((hash, e)),
                        }
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .try_filter_map(|found| async move { Ok(found) })
                .try_collect(),
        )
        .map_err(|(hash, e)| self.failed(format!("probing chunk {hash}"), e))
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;
    use crate::chunk_store::contract;

    fn in_memory() -> (Arc<InMemory>, ObjectChunks) {
        let backend = Arc::new(InMemory::new());
        let chunks = ObjectChunks::over(
            backend.clone(),
            "ws",
            "memory://test".into(),
            DEFAULT_DEADLINE,
        )
        .unwrap();
        (backend, chunks)
    }

    /// The grace window: a sweep deletes only unreferenced chunks stored
    /// before its bound, and forgets what it deleted.
    fn sweeps_within_the_grace_window(chunks: &ObjectChunks) {
        let (kept, garbage) = (b"kept".to_vec(), b"garbage".to_vec());
        let (hk, hg) = (Hash::of(&kept), Hash::of(&garbage));
        chunks.put_if_absent(&hk, &kept).unwrap();
        chunks.put_if_absent(&hg, &garbage).unwrap();
        assert_eq!(chunks.get(&hg).unwrap(), garbage, "cached now");
        let keep = HashSet::from([hk]);
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        assert_eq!(
            chunks.sweep(&keep, hour_ago).unwrap(),
            SweepOutcome::default(),
            "young chunks stay"
        );
        let later = SystemTime::now() + Duration::from_secs(60);
        let swept = chunks.sweep(&keep, later).unwrap();
        assert_eq!(
            swept,
            SweepOutcome {
                chunks: 1,
                bytes: garbage.len() as u64,
                repacked: 0,
            }
        );
        assert_eq!(chunks.has(&[hk, hg]).unwrap(), vec![hk]);
        let err = chunks.get(&hg).unwrap_err();
        assert_eq!(err.code(), wsd_sync::ErrorCode::UnknownHash, "{err}");
        assert_eq!(chunks.get(&hk).unwrap(), kept);
        assert!(chunks.put_if_absent(&hg, &garbage).unwrap(), "stored again");
    }

    /// Packs: one holding no kept chunk goes whole; one mostly dead is
    /// rewritten with its kept chunks alone (the dead ones unreadable
    /// after, the kept ones read from the new pack, also by a client with
    /// no state); one a little dead stays as it is.
    fn sweeps_dead_packs_and_repacks_mostly_dead_ones(chunks: &ObjectChunks) {
        let bytes: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 3000]).collect();
        let h: Vec<Hash> = bytes.iter().map(|b| Hash::of(b)).collect();
        let (mostly_dead, dead) = (
            [(h[0], &bytes[0][..]), (h[1], &bytes[1][..])],
            [(h[2], &bytes[2][..]), (h[3], &bytes[3][..])],
        );
        // 9,000 bytes kept, 1,000 dead: under a quarter.
        let (big, small) = (vec![7u8; 9000], vec![8u8; 1000]);
        let (hb, hs) = (Hash::of(&big), Hash::of(&small));
        chunks.put_many(&mostly_dead).unwrap();
        chunks.put_many(&dead).unwrap();
        chunks
            .put_many(&[(hb, &big[..]), (hs, &small[..])])
            .unwrap();
        let later = SystemTime::now() + Duration::from_secs(60);
        let stale = chunks.stale_objects(later).unwrap();
        assert_eq!(stale.len(), 3, "three packs: {stale:?}");
        let size_of = |hash: Hash| {
            stale
                .iter()
                .find(|o| o.chunks.contains(&hash))
                .unwrap()
                .size
        };
        let dead_pack = stale.iter().find(|o| o.chunks.contains(&h[2])).unwrap();
        assert_eq!(dead_pack.chunks, vec![h[2], h[3]], "its index, in order");
        let keep = HashSet::from([h[0], hb]);
        let swept = chunks.sweep(&keep, later).unwrap();
        // The rewritten pack: a header, one index entry, the kept chunk.
        let rewritten = pack::HEADER_LEN + 44 + 3000;
        assert_eq!(
            swept,
            SweepOutcome {
                chunks: 3,
                bytes: size_of(h[2]) + size_of(h[0]) - rewritten,
                repacked: 1,
            }
        );
        assert_eq!(chunks.has(&h).unwrap(), vec![h[0]]);
        assert_eq!(chunks.get(&h[0]).unwrap(), bytes[0], "from its new pack");
        for gone in [h[1], h[3]] {
            let err = chunks.get(&gone).unwrap_err();
            assert_eq!(err.code(), wsd_sync::ErrorCode::UnknownHash, "{err}");
        }
        let left = chunks.stale_objects(later).unwrap();
        let packs: Vec<(Vec<Hash>, u64)> =
            left.iter().map(|o| (o.chunks.clone(), o.size)).collect();
        assert_eq!(packs.len(), 2, "{packs:?}");
        assert!(packs.contains(&(vec![h[0]], rewritten)), "{packs:?}");
        assert!(
            packs.contains(&(vec![hb, hs], size_of(hb))),
            "kept whole: {packs:?}"
        );
        let fresh = another_client(chunks);
        assert_eq!(fresh.get(&h[0]).unwrap(), bytes[0]);
        assert_eq!(fresh.get(&hs).unwrap(), small, "a little dead: still there");
        // Swept again: nothing more to do.
        assert_eq!(chunks.sweep(&keep, later).unwrap(), SweepOutcome::default());
    }

    /// A client of the same bucket and prefix with no state of its own.
    fn another_client(chunks: &ObjectChunks) -> ObjectChunks {
        ObjectChunks::over(
            chunks.shared.store.clone(),
            chunks.shared.prefix.as_ref(),
            chunks.shared.label.clone(),
            DEFAULT_DEADLINE,
        )
        .unwrap()
    }

    /// Requests that reach an in-memory bucket, by kind.
    #[derive(Debug, Default)]
    struct Requests {
        gets: std::sync::atomic::AtomicUsize,
        heads: std::sync::atomic::AtomicUsize,
        lists: std::sync::atomic::AtomicUsize,
        puts: std::sync::atomic::AtomicUsize,
    }

    impl Requests {
        fn take(&self) -> [usize; 4] {
            use std::sync::atomic::Ordering::SeqCst;
            [
                self.gets.swap(0, SeqCst),
                self.heads.swap(0, SeqCst),
                self.lists.swap(0, SeqCst),
                self.puts.swap(0, SeqCst),
            ]
        }
    }

    /// An in-memory bucket counting the requests made of it (the trait's
    /// `async_trait` methods written out as boxed futures). With a `gate`,
    /// every PUT first takes one of its permits (the test hands them out);
    /// with `refuse_packs`, every PUT of a pack fails.
    #[derive(Debug)]
    struct Counted {
        inner: Arc<InMemory>,
        requests: Arc<Requests>,
        gate: Option<Arc<tokio::sync::Semaphore>>,
        refuse_packs: bool,
    }

    impl std::fmt::Display for Counted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "counted({})", self.inner)
        }
    }

    type Boxed<'a, T> = futures::future::BoxFuture<'a, object_store::Result<T>>;

    impl ObjectStore for Counted {
        fn put_opts<'s, 'l, 'f>(
            &'s self,
            location: &'l ObjectPath,
            payload: PutPayload,
            opts: object_store::PutOptions,
        ) -> Boxed<'f, object_store::PutResult>
        where
            's: 'f,
            'l: 'f,
            Self: 'f,
        {
            self.requests
                .puts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (inner, location) = (self.inner.clone(), location.clone());
            let gate = self.gate.clone();
            let refused = self.refuse_packs && location.as_ref().contains("/packs/");
            Box::pin(async move {
                if let Some(gate) = gate {
                    gate.acquire().await.expect("the gate stays open").forget();
                }
                if refused {
                    return Err(object_store::Error::Generic {
                        store: "counted",
                        source: "refused by the test".into(),
                    });
                }
                inner.put_opts(&location, payload, opts).await
            })
        }

        fn put_multipart_opts<'s, 'l, 'f>(
            &'s self,
            location: &'l ObjectPath,
            opts: object_store::PutMultipartOptions,
        ) -> Boxed<'f, Box<dyn object_store::MultipartUpload>>
        where
            's: 'f,
            'l: 'f,
            Self: 'f,
        {
            self.inner.put_multipart_opts(location, opts)
        }

        fn get_opts<'s, 'l, 'f>(
            &'s self,
            location: &'l ObjectPath,
            options: object_store::GetOptions,
        ) -> Boxed<'f, object_store::GetResult>
        where
            's: 'f,
            'l: 'f,
            Self: 'f,
        {
            let counter = match options.head {
                true => &self.requests.heads,
                false => &self.requests.gets,
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.get_opts(location, options)
        }

        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<'static, object_store::Result<ObjectPath>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<ObjectPath>> {
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&ObjectPath>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.requests
                .lists
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.list(prefix)
        }

        fn list_with_delimiter<'s, 'l, 'f>(
            &'s self,
            prefix: Option<&'l ObjectPath>,
        ) -> Boxed<'f, object_store::ListResult>
        where
            's: 'f,
            'l: 'f,
            Self: 'f,
        {
            self.requests
                .lists
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.list_with_delimiter(prefix)
        }

        fn copy_opts<'s, 'l, 'm, 'f>(
            &'s self,
            from: &'l ObjectPath,
            to: &'m ObjectPath,
            options: object_store::CopyOptions,
        ) -> Boxed<'f, ()>
        where
            's: 'f,
            'l: 'f,
            'm: 'f,
            Self: 'f,
        {
            self.inner.copy_opts(from, to, options)
        }
    }

    /// A client of a counted bucket with no state of its own (a fresh
    /// process), and the counter.
    fn counted_client(backend: &Arc<InMemory>) -> (ObjectChunks, Arc<Requests>) {
        let requests = Arc::new(Requests::default());
        let counted = Counted {
            inner: backend.clone(),
            requests: requests.clone(),
            gate: None,
            refuse_packs: false,
        };
        let chunks = ObjectChunks::over(
            Arc::new(counted),
            "ws",
            "memory://counted".into(),
            DEFAULT_DEADLINE,
        )
        .unwrap();
        (chunks, requests)
    }

    /// A client of `backend` whose PUTs wait for permits of `gate`, or
    /// whose pack PUTs fail (`refuse_packs`). A short deadline: a caller
    /// that waited for a held PUT fails within it instead of hanging.
    fn gated_client(
        backend: &Arc<InMemory>,
        gate: Option<Arc<tokio::sync::Semaphore>>,
        refuse_packs: bool,
    ) -> ObjectChunks {
        let counted = Counted {
            inner: backend.clone(),
            requests: Arc::default(),
            gate,
            refuse_packs,
        };
        ObjectChunks::over(
            Arc::new(counted),
            "ws",
            "memory://gated".into(),
            Duration::from_secs(5),
        )
        .unwrap()
    }

    /// 40 chunks of 10,000 bytes as a sync receives them (one pack).
    fn received_objects() -> Vec<wsd_sync::Object> {
        (0..40u64)
            .map(|i| {
                let bytes = crate::test_util::noise(10_000, 100 + i);
                wsd_sync::Object {
                    hash: Hash::of(&bytes),
                    bytes,
                }
            })
            .collect()
    }

    fn index_rows(d: &crate::Dofs) -> u64 {
        d.conn
            .query_row("SELECT count(*) FROM chunks", [], |r| r.get(0))
            .unwrap()
    }

    /// A sync's `stage_objects` answers while its pack is still being
    /// sent (so the driver receives the next batch meanwhile), and no
    /// index row names the pack before it is stored: a crash then (the
    /// store closed with the upload held) leaves no row at all. The next
    /// sync call waits for the upload and commits the rows.
    #[test]
    fn staging_answers_before_its_upload_ends_and_its_rows_wait_for_it() {
        use wsd_sync::Store;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dofs.sqlite3");
        let backend = Arc::new(InMemory::new());
        let objects = received_objects();
        let hashes: Vec<Hash> = objects.iter().map(|o| o.hash).collect();

        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let mut d = crate::Dofs::open(&path).unwrap();
        d.keep_chunks_in(Arc::new(gated_client(&backend, Some(gate.clone()), false)));
        d.stage_objects(&objects).unwrap();
        assert_eq!(backend_packs(&backend), 0, "the upload is held");
        assert_eq!(index_rows(&d), 0, "no row names a pack not yet stored");
        drop(d);
        gate.add_permits(1);
        let mut d = crate::Dofs::open(&path).unwrap();
        assert_eq!(index_rows(&d), 0, "the crash left no row");

        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        d.keep_chunks_in(Arc::new(gated_client(&backend, Some(gate.clone()), false)));
        d.stage_objects(&objects).unwrap();
        assert_eq!(index_rows(&d), 0);
        gate.add_permits(1);
        assert_eq!(d.has_objects(&hashes).unwrap(), hashes, "settled");
        assert_eq!(index_rows(&d), 40);
        assert_eq!(backend_packs(&backend), 1, "the same pack, stored once");
        let read = d.read_objects(&hashes).unwrap();
        assert!(read.iter().zip(&objects).all(|(r, o)| r.bytes == o.bytes));
        d.check_integrity().unwrap();
    }

    /// A staged pack whose upload fails fails the apply naming the pack's
    /// key and the store, and the apply commits nothing: no entry, no row.
    #[test]
    fn a_failed_staged_upload_fails_the_apply_naming_the_pack_and_commits_nothing() {
        use wsd_sync::{ApplyBatch, Baseline, ChangeEntry, ChunkRef, EntryState, IgnoreRules};
        use wsd_sync::{ErrorCode, Store};
        let backend = Arc::new(InMemory::new());
        let mut d = crate::Dofs::open_in_memory().unwrap();
        d.keep_chunks_in(Arc::new(gated_client(&backend, None, true)));
        let objects = received_objects();
        d.stage_objects(&objects).unwrap();
        let chunks: Vec<ChunkRef> = objects
            .iter()
            .map(|o| ChunkRef {
                hash: o.hash,
                size: o.bytes.len() as u32,
            })
            .collect();
        let entry = ChangeEntry {
            rev: 1,
            path: crate::test_util::p("f"),
            state: EntryState::File {
                mode: 0o644,
                mtime: 1,
                size: 400_000,
                chunks,
            },
        };
        let err = d
            .apply(ApplyBatch {
                remote: "peer",
                sender: None,
                entries: &[entry],
                baseline: Baseline::Off,
                ignore: &IgnoreRules::none(),
            })
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Io);
        let text = err.to_string();
        assert!(
            text.contains("memory://gated") && text.contains("ws/packs/"),
            "{text}"
        );
        assert_eq!(crate::Dofs::current_rev(&d).unwrap(), 0, "nothing applied");
        assert_eq!(index_rows(&d), 0);
        assert_eq!(backend_packs(&backend), 0);
    }

    /// A fresh process checking an index of many packed chunks, or asking
    /// which of them the bucket holds (a snapshot's upload), lists `packs/`
    /// once and reads each pack's index once (two ranged GETs): no request
    /// per chunk. Only the chunk stored as an object of its own is HEADed.
    #[test]
    fn a_fresh_process_checks_packed_chunks_per_pack_not_per_chunk() {
        use crate::test_util::{noise, p};
        let backend = Arc::new(InMemory::new());
        let (writer, _) = counted_client(&backend);
        let mut d = crate::Dofs::open_in_memory().unwrap();
        d.keep_chunks_in(Arc::new(writer));
        let names: Vec<_> = (0..300).map(|i| p(&format!("src/f{i}.rs"))).collect();
        let contents: Vec<Vec<u8>> = (0..300).map(|i| noise(3000, i)).collect();
        let opts = crate::WriteOptions {
            create_parents: true,
            ..crate::WriteOptions::default()
        };
        d.write_files(
            names
                .iter()
                .zip(&contents)
                .map(|(n, c)| (n, c.as_slice(), opts)),
        )
        .unwrap();
        d.write_file_with(&p("alone"), &b"a lone chunk"[..], opts)
            .unwrap();
        let packs = backend_packs(&backend);
        assert!(packs > 0, "the batch went out in packs");
        let stubs: u64 = d
            .conn
            .query_row("SELECT count(*) FROM chunks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stubs, 301);

        let (fresh, requests) = counted_client(&backend);
        d.keep_chunks_in(Arc::new(fresh));
        d.check_integrity().unwrap();
        let [gets, heads, lists, puts] = requests.take();
        assert_eq!(
            (gets, heads, lists, puts),
            (2 * packs, 1, 1, 0),
            "an index read per pack ({packs}), a HEAD for the lone chunk, one listing"
        );

        let (fresh, requests) = counted_client(&backend);
        let hashes: Vec<Hash> = contents.iter().map(|c| Hash::of(c)).collect();
        assert_eq!(fresh.has(&hashes).unwrap(), hashes);
        let [gets, heads, lists, _] = requests.take();
        assert_eq!((gets, heads, lists), (2 * packs, 0, 1));

        // A pack gone behind the store's back is named by the check.
        let gone = stale_in(&backend)
            .into_iter()
            .find(|o| o.pack.is_some())
            .unwrap();
        let (fresh, _) = counted_client(&backend);
        fresh.block_on(backend.delete(&gone.key)).unwrap();
        d.keep_chunks_in(Arc::new(fresh));
        let err = d.check_integrity().unwrap_err().to_string();
        let pack = gone.pack.unwrap().to_string();
        assert!(
            err.contains(&pack) && err.contains(&gone.chunks[0].to_string()),
            "{err}"
        );
    }

    fn stale_in(backend: &Arc<InMemory>) -> Vec<StaleObject> {
        let (client, _) = counted_client(backend);
        client
            .stale_objects(SystemTime::now() + Duration::from_secs(60))
            .unwrap()
    }

    fn backend_packs(backend: &Arc<InMemory>) -> usize {
        stale_in(backend)
            .iter()
            .filter(|o| o.pack.is_some())
            .count()
    }

    #[test]
    fn the_in_memory_object_store_keeps_the_contract() {
        contract::holds_for(&in_memory().1, 1);
        sweeps_within_the_grace_window(&in_memory().1);
        sweeps_dead_packs_and_repacks_mostly_dead_ones(&in_memory().1);
    }

    #[test]
    fn a_batch_is_one_pack_object_that_a_second_client_reads_without_local_state() {
        let (backend, chunks) = in_memory();
        let placed = contract::batches_hold_for(&chunks, 3);
        let later = SystemTime::now() + Duration::from_secs(60);
        let objects = chunks.stale_objects(later).unwrap();
        let packed: Vec<&StaleObject> = objects.iter().filter(|o| o.pack.is_some()).collect();
        assert_eq!(
            (objects.len(), packed.len()),
            (2, 1),
            "the held chunk alone, the 20 others in one pack: {objects:?}"
        );
        assert_eq!(packed[0].chunks.len(), 20);
        let second =
            ObjectChunks::over(backend, "ws", "memory://test".into(), DEFAULT_DEADLINE).unwrap();
        contract::a_second_client_finds(&second, &placed);
        // By hash alone, with nothing known: found through the packs' own
        // indexes.
        let third = in_memory_again(&chunks);
        let hashes: Vec<Hash> = placed.iter().map(|(h, _)| *h).collect();
        assert_eq!(third.get_many(&hashes).unwrap().len(), hashes.len());
    }

    /// A second store over the same backend and prefix as `chunks`.
    fn in_memory_again(chunks: &ObjectChunks) -> ObjectChunks {
        ObjectChunks::over(
            chunks.shared.store.clone(),
            "ws",
            "memory://test".into(),
            DEFAULT_DEADLINE,
        )
        .unwrap()
    }

    #[test]
    fn a_pack_read_once_serves_its_other_chunks_from_memory() {
        let (backend, chunks) = in_memory();
        let bytes: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 2000]).collect();
        let batch: Vec<(Hash, &[u8])> = bytes.iter().map(|b| (Hash::of(b), &b[..])).collect();
        let slots = chunks.put_many(&batch).unwrap();
        let placed: Vec<_> = batch.iter().map(|(h, _)| *h).zip(slots).collect();
        let fresh = in_memory_again(&chunks);
        assert_eq!(
            fresh.get_placed(&placed[..1]).unwrap(),
            vec![bytes[0].clone()]
        );
        // Gone from the bucket now: the others still read (the pack was
        // read whole), and are verified.
        let key = chunks.pack_key(&placed[0].1.unwrap().pack);
        chunks.block_on(backend.delete(&key)).unwrap();
        assert_eq!(fresh.get_placed(&placed[1..]).unwrap(), bytes[1..].to_vec());
        let other = in_memory_again(&chunks);
        let err = other.get_placed(&placed[1..2]).unwrap_err();
        assert_eq!(err.code(), wsd_sync::ErrorCode::UnknownHash, "{err}");
        assert!(err.to_string().contains(&placed[1].0.to_string()), "{err}");
    }

    #[test]
    fn a_batch_larger_than_a_pack_goes_out_as_several() {
        let (_, chunks) = in_memory();
        // Three chunks of 7/16 of a pack: two fit in one, the third not.
        let size = PACK_BYTES / 16 * 7;
        let bytes: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; size]).collect();
        let batch: Vec<(Hash, &[u8])> = bytes.iter().map(|b| (Hash::of(b), &b[..])).collect();
        let slots = chunks.put_many(&batch).unwrap();
        let packs: Vec<Hash> = slots.iter().map(|s| s.unwrap().pack).collect();
        assert_eq!(packs[0], packs[1], "{slots:?}");
        assert_ne!(packs[1], packs[2], "{slots:?}");
        let placed: Vec<_> = batch.iter().map(|(h, _)| *h).zip(slots).collect();
        let fresh = in_memory_again(&chunks);
        assert_eq!(fresh.get_placed(&placed).unwrap(), bytes);
    }

    /// A mostly dead pack whose kept chunk is damaged is not repacked (its
    /// bytes could not be copied verified): it stays as it is, the read of
    /// that chunk still names it, and the collection repacks the healthy
    /// pack beside it.
    #[test]
    fn a_damaged_pack_is_left_alone_while_a_healthy_one_is_repacked() {
        let (backend, chunks) = in_memory();
        let bytes: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 3000]).collect();
        let h: Vec<Hash> = bytes.iter().map(|b| Hash::of(b)).collect();
        let healthy = chunks
            .put_many(&[(h[0], &bytes[0][..]), (h[1], &bytes[1][..])])
            .unwrap();
        let damaged = chunks
            .put_many(&[(h[2], &bytes[2][..]), (h[3], &bytes[3][..])])
            .unwrap();
        let slot = damaged[0].unwrap();
        let key = chunks.pack_key(&slot.pack);
        let mut raw = chunks
            .block_on(async { backend.get(&key).await?.bytes().await })
            .unwrap()
            .to_vec();
        raw[slot.offset as usize] ^= 1;
        chunks
            .block_on(backend.put(&key, PutPayload::from(raw)))
            .unwrap();
        let later = SystemTime::now() + Duration::from_secs(60);
        let keep = HashSet::from([h[0], h[2]]);
        let swept = chunks.sweep(&keep, later).unwrap();
        assert_eq!(swept.repacked, 1, "only the healthy pack: {swept:?}");
        let left = chunks.stale_objects(later).unwrap();
        assert!(
            left.iter().any(|o| o.pack == Some(slot.pack)),
            "the damaged pack stays: {left:?}"
        );
        assert!(
            !left
                .iter()
                .any(|o| o.pack == Some(healthy[0].unwrap().pack)),
            "the healthy one was rewritten: {left:?}"
        );
        let fresh = in_memory_again(&chunks);
        assert_eq!(fresh.get(&h[0]).unwrap(), bytes[0]);
        let err = fresh.get_placed(&[(h[2], Some(slot))]).unwrap_err();
        assert!(err.to_string().contains(&h[2].to_string()), "{err}");
    }

    #[test]
    fn a_damaged_pack_is_an_error_naming_the_chunk_or_the_pack() {
        let (backend, chunks) = in_memory();
        let (a, b) = (b"chunk a".to_vec(), b"chunk b".to_vec());
        let batch = [(Hash::of(&a), &a[..]), (Hash::of(&b), &b[..])];
        let slots = chunks.put_many(&batch).unwrap();
        let slot = slots[1].unwrap();
        let key = chunks.pack_key(&slot.pack);
        let mut bytes = chunks
            .block_on(async { backend.get(&key).await?.bytes().await })
            .unwrap()
            .to_vec();
        // Same length, one byte of `b` changed: only its hash can tell.
        bytes[slot.offset as usize] ^= 1;
        chunks
            .block_on(backend.put(&key, PutPayload::from(bytes.clone())))
            .unwrap();
        let fresh = in_memory_again(&chunks);
        let err = fresh.get_placed(&[(batch[1].0, Some(slot))]).unwrap_err();
        assert!(matches!(err, DofsError::CorruptChunk { .. }), "{err}");
        assert!(err.to_string().contains(&batch[1].0.to_string()), "{err}");
        assert_eq!(
            fresh.get_placed(&[(batch[0].0, slots[0])]).unwrap(),
            vec![a.clone()]
        );

        // Not a pack at all: a reader with no record names the pack.
        bytes[0] = b'X';
        chunks
            .block_on(backend.put(&key, PutPayload::from(bytes)))
            .unwrap();
        let err = in_memory_again(&chunks).locate(&[batch[0].0]).unwrap_err();
        assert!(matches!(err, DofsError::CorruptPack { .. }), "{err}");
        assert!(err.to_string().contains(&slot.pack.to_string()), "{err}");
    }

    /// The sync driver calls its store from a current-thread runtime.
    #[tokio::test(flavor = "current_thread")]
    async fn the_store_answers_from_inside_a_runtime_thread() {
        let (_, chunks) = in_memory();
        contract::holds_for(&chunks, 2);
        let hash = Hash::of(&[2, 1, 2, 3]);
        assert_eq!(chunks.get_many(&[hash]).unwrap(), vec![vec![2, 1, 2, 3]]);
    }

    #[test]
    fn seaweedfs_keeps_the_contract() {
        let Some(server) = crate::seaweedfs::SeaweedFs::start() else {
            return;
        };
        contract::holds_for(&server.chunks("contract"), 1);
        let placed = contract::batches_hold_for(&server.chunks("batches"), 2);
        contract::a_second_client_finds(&server.chunks("batches"), &placed);
        sweeps_dead_packs_and_repacks_mostly_dead_ones(&server.chunks("packs"));
        sweeps_within_the_grace_window(&server.chunks("sweep"));
        // A second client knows nothing yet: its answers come from the
        // server, not from the first one's index.
        let fresh = server.chunks("sweep");
        let kept = Hash::of(b"kept");
        assert_eq!(fresh.has(&[kept]).unwrap(), vec![kept]);
        assert_eq!(fresh.get(&kept).unwrap(), b"kept");
        assert!(
            !fresh.put_if_absent(&kept, b"kept").unwrap(),
            "412: already there"
        );
        let other_prefix = server.chunks("elsewhere");
        assert!(
            other_prefix.has(&[kept]).unwrap().is_empty(),
            "prefixes are apart"
        );
    }

    #[test]
    fn seaweedfs_refuses_wrong_credentials_with_an_error_naming_the_store() {
        let Some(server) = crate::seaweedfs::SeaweedFs::start() else {
            return;
        };
        let wrong = Credentials {
            access_key_id: "nobody".into(),
            secret_access_key: "wrong".into(),
        };
        let err = ObjectChunks::connect_with(&server.url("p"), Some(wrong)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&server.endpoint), "{text}");
        assert!(text.contains("s3://gsv-test/p"), "{text}");
    }

    #[test]
    fn urls_parse_with_their_options_and_bad_ones_name_what_is_wrong() {
        let l = S3Location::parse(
            "s3://bucket/some/prefix?endpoint=http://127.0.0.1:8333/&region=eu-west-1&deadline=5s",
        )
        .unwrap();
        assert_eq!(
            l,
            S3Location {
                bucket: "bucket".into(),
                prefix: "some/prefix".into(),
                endpoint: Some("http://127.0.0.1:8333".into()),
                region: "eu-west-1".into(),
                deadline: Duration::from_secs(5),
            }
        );
        assert_eq!(
            l.label(),
            "s3://bucket/some/prefix at http://127.0.0.1:8333"
        );
        for (url, names) in [
            ("http://bucket", "not s3"),
            ("s3:///nobucket", "no bucket"),
            ("s3://b?endpoint=ftp://x", "not http"),
            ("s3://b?deadline=soon", "deadline"),
            ("s3://b?colour=blue", "colour"),
        ] {
            let err = S3Location::parse(url).unwrap_err();
            assert_eq!(err.posix_name(), "EINVAL", "{url}");
            let text = err.to_string();
            assert!(text.contains(url) && text.contains(names), "{url}: {text}");
        }
    }

    #[test]
    fn a_corrupted_object_is_an_error_naming_its_hash_and_is_not_cached() {
        let (backend, chunks) = in_memory();
        let bytes = b"the real bytes".to_vec();
        let hash = Hash::of(&bytes);
        assert!(chunks.put_if_absent(&hash, &bytes).unwrap());
        let key = chunks.key(&hash);
        chunks
            .block_on(backend.put(&key, PutPayload::from(b"other bytes".to_vec())))
            .unwrap();
        for _ in 0..2 {
            let err = chunks.get(&hash).unwrap_err();
            assert!(matches!(err, DofsError::CorruptChunk { .. }), "{err}");
            assert!(err.to_string().contains(&hash.to_string()), "{err}");
        }
    }

    #[test]
    fn a_store_that_does_not_answer_is_an_error_naming_it_within_the_deadline() {
        // A listener that accepts and never answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "s3://bucket?endpoint=http://{}&deadline=300ms",
            silent.local_addr().unwrap()
        );
        let creds = Credentials {
            access_key_id: "id".into(),
            secret_access_key: "secret".into(),
        };
        let err = ObjectChunks::connect_with(&url, Some(creds)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("s3://bucket at http://127.0.0.1"), "{text}");
        assert_eq!(err.posix_name(), "EIO", "{text}");
    }
}
