//! The S3 chunk store: chunks as immutable objects
//! `PREFIX/chunks/<first 2 hex>/<hash>` in a bucket, through the
//! `object_store` crate (any S3-compatible server; an in-memory store for
//! tests).
//!
//! - Writes are put-if-absent (`If-None-Match: *`): "already there" is not
//!   an error, so two writers of one chunk agree.
//! - A known-present set (the hashes this process stored or saw lately,
//!   bounded in count) answers `has` and skips uploads without a request
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

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt, stream};
use hashlink::LruCache;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutPayload, RetryConfig};
use wsd_sync::{Hash, SyncError};

use crate::DofsError;
use crate::chunk_store::{ChunkStore, verified};

/// How long one request may take before it is an error.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// Bytes of recently read chunks kept in memory.
const HOT_CACHE_BYTES: usize = 64 << 20;

/// Hashes the known-present set remembers (about 100 bytes each).
const PRESENT_HASHES: usize = 1 << 18;

/// Requests in flight at once for a batch (`has`, `sweep`): S3 has no
/// batch HEAD or batch delete that every server speaks.
const CONCURRENCY: usize = 16;

/// A chunk object a sweep may delete: unmarked when listed, and older than
/// the grace window ([`ObjectChunks::stale_chunks`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleChunk {
    pub hash: Hash,
    key: ObjectPath,
    pub size: u64,
}

/// What [`ObjectChunks::sweep`] deleted.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct SweepOutcome {
    pub chunks: u64,
    pub bytes: u64,
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
/// backend). Cheap to share behind an `Arc`; every method takes `&self`.
pub struct ObjectChunks {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    label: String,
    deadline: Duration,
    present: Mutex<LruCache<Hash, ()>>,
    hot: Mutex<HotCache>,
    runtime: OwnRuntime,
}

impl std::fmt::Debug for ObjectChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectChunks")
            .field("label", &self.label)
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
        Ok(ObjectChunks {
            store,
            prefix: ObjectPath::from(prefix),
            label,
            deadline,
            present: Mutex::new(LruCache::new(PRESENT_HASHES)),
            hot: Mutex::new(HotCache {
                chunks: LruCache::new_unbounded(),
                bytes: 0,
            }),
            runtime: OwnRuntime(Some(runtime)),
        })
    }

    /// How this store names itself (`s3://BUCKET/PREFIX at ENDPOINT`).
    pub fn label(&self) -> &str {
        &self.label
    }

    fn chunks_dir(&self) -> ObjectPath {
        self.prefix.clone().join("chunks")
    }

    fn key(&self, hash: &Hash) -> ObjectPath {
        let hex = hash.to_string();
        self.chunks_dir().join(&hex[..2]).join(hex)
    }

    fn failed(&self, op: String, e: CallError) -> DofsError {
        match e {
            CallError::Store(source) => DofsError::ChunkStore {
                store: self.label.clone(),
                op,
                source: Box::new(source),
            },
            CallError::Deadline => DofsError::ChunkStoreDeadline {
                store: self.label.clone(),
                op,
                after: self.deadline,
            },
        }
    }

    /// Runs `fut` to completion on this store's runtime and waits for it.
    fn block_on<T: Send>(&self, fut: impl Future<Output = T> + Send) -> T {
        let handle = self.runtime.handle();
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
        let (store, dir, deadline) = (self.store.clone(), self.chunks_dir(), self.deadline);
        self.block_on(bounded(deadline, async move {
            store.list_with_delimiter(Some(&dir)).await
        }))
        .map(drop)
        .map_err(|e| self.failed("listing the bucket".into(), e))
    }

    fn remember(&self, hash: Hash) {
        lock(&self.present).insert(hash, ());
    }

    fn known(&self, hash: &Hash) -> bool {
        lock(&self.present).get(hash).is_some()
    }

    fn cache(&self, hash: Hash, bytes: Arc<[u8]>) {
        if bytes.len() > HOT_CACHE_BYTES / 4 {
            return;
        }
        let mut hot = lock(&self.hot);
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

    /// Deletes every chunk object that `keep` does not name and that was
    /// stored before `stored_before` (the grace window: a chunk uploaded
    /// for a reference not yet recorded is young, and stays).
    pub fn sweep(
        &self,
        keep: &HashSet<Hash>,
        stored_before: SystemTime,
    ) -> Result<SweepOutcome, DofsError> {
        let stale: Vec<StaleChunk> = self
            .stale_chunks(stored_before)?
            .into_iter()
            .filter(|c| !keep.contains(&c.hash))
            .collect();
        self.delete_chunks(stale)
    }

    /// Every chunk object stored before `stored_before`, listed page by
    /// page (each page one request under the deadline). A caller marks
    /// what it must keep among them, then [`ObjectChunks::delete_chunks`]
    /// the rest, with nothing able to reference them in between.
    pub fn stale_chunks(&self, stored_before: SystemTime) -> Result<Vec<StaleChunk>, DofsError> {
        let before_ms = stored_before
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let deadline = self.deadline;
        let mut listing = self.store.list(Some(&self.chunks_dir()));
        let mut stale = Vec::new();
        loop {
            let next = self
                .block_on(async {
                    tokio::time::timeout(deadline, listing.next())
                        .await
                        .map_err(|_| CallError::Deadline)
                })
                .map_err(|e| self.failed("listing chunks".into(), e))?;
            let Some(meta) = next else { break };
            let meta =
                meta.map_err(|e| self.failed("listing chunks".into(), CallError::Store(e)))?;
            // Objects that are not chunks (another tool's files) are left.
            let Some(hash) = meta
                .location
                .filename()
                .and_then(|n| Hash::from_hex(n).ok())
            else {
                continue;
            };
            if meta.last_modified.timestamp_millis() < before_ms {
                stale.push(StaleChunk {
                    hash,
                    key: meta.location,
                    size: meta.size,
                });
            }
        }
        Ok(stale)
    }

    /// Deletes `chunks` (a few at a time) and forgets them.
    pub fn delete_chunks(&self, chunks: Vec<StaleChunk>) -> Result<SweepOutcome, DofsError> {
        let (store, deadline) = (self.store.clone(), self.deadline);
        let deleted: Vec<(Hash, u64)> = self
            .block_on(
                stream::iter(chunks)
                    .map(|c| {
                        let store = store.clone();
                        async move {
                            match bounded(deadline, store.delete(&c.key)).await {
                                Ok(())
                                | Err(CallError::Store(object_store::Error::NotFound { .. })) => {
                                    Ok((c.hash, c.size))
                                }
                                Err(e) => Err((c.hash, e)),
                            }
                        }
                    })
                    .buffer_unordered(CONCURRENCY)
                    .collect::<Vec<_>>(),
            )
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|(hash, e)| self.failed(format!("deleting chunk {hash}"), e))?;
        let mut present = lock(&self.present);
        let mut hot = lock(&self.hot);
        let mut out = SweepOutcome::default();
        for (hash, size) in deleted {
            present.remove(&hash);
            if let Some(bytes) = hot.chunks.remove(&hash) {
                hot.bytes -= bytes.len();
            }
            out.chunks += 1;
            out.bytes += size;
        }
        Ok(out)
    }

    fn document_key(&self, name: &str) -> ObjectPath {
        name.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |key, part| key.join(part))
    }

    /// Stores (replacing) the document `name` (`a/b.json`) under the prefix.
    pub fn put_document(&self, name: &str, bytes: Vec<u8>) -> Result<(), DofsError> {
        let (store, key) = (self.store.clone(), self.document_key(name));
        self.block_on(bounded(self.deadline, async move {
            store.put(&key, PutPayload::from(bytes)).await
        }))
        .map(drop)
        .map_err(|e| self.failed(format!("storing {name}"), e))
    }

    /// The document `name`, or `None` when there is none.
    pub fn get_document(&self, name: &str) -> Result<Option<Vec<u8>>, DofsError> {
        let (store, key) = (self.store.clone(), self.document_key(name));
        match self.block_on(bounded(self.deadline, async move {
            store.get(&key).await?.bytes().await
        })) {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(None),
            Err(e) => Err(self.failed(format!("reading {name}"), e)),
        }
    }

    /// Deletes the document `name` (gone already is fine).
    pub fn delete_document(&self, name: &str) -> Result<(), DofsError> {
        let (store, key) = (self.store.clone(), self.document_key(name));
        match self.block_on(bounded(
            self.deadline,
            async move { store.delete(&key).await },
        )) {
            Ok(()) | Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(()),
            Err(e) => Err(self.failed(format!("deleting {name}"), e)),
        }
    }

    /// The names (relative to the prefix) of the documents under `dir`.
    pub fn list_documents(&self, dir: &str) -> Result<Vec<String>, DofsError> {
        let deadline = self.deadline;
        let mut listing = self.store.list(Some(&self.document_key(dir)));
        let prefix_parts = self.prefix.parts().count();
        let mut names = Vec::new();
        loop {
            let next = self
                .block_on(async {
                    tokio::time::timeout(deadline, listing.next())
                        .await
                        .map_err(|_| CallError::Deadline)
                })
                .map_err(|e| self.failed(format!("listing {dir}"), e))?;
            let Some(meta) = next else { break };
            let meta =
                meta.map_err(|e| self.failed(format!("listing {dir}"), CallError::Store(e)))?;
            let parts: Vec<String> = meta
                .location
                .parts()
                .skip(prefix_parts)
                .map(|p| p.as_ref().to_owned())
                .collect();
            names.push(parts.join("/"));
        }
        names.sort();
        Ok(names)
    }
}

impl ChunkStore for ObjectChunks {
    fn put_if_absent(&self, hash: &Hash, bytes: &[u8]) -> Result<bool, DofsError> {
        if self.known(hash) {
            return Ok(false);
        }
        let (store, key) = (self.store.clone(), self.key(hash));
        let payload = PutPayload::from(bytes.to_vec());
        let stored = match self.block_on(bounded(self.deadline, async move {
            store.put_opts(&key, payload, PutMode::Create.into()).await
        })) {
            Ok(_) => true,
            Err(CallError::Store(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            )) => false,
            Err(e) => return Err(self.failed(format!("storing chunk {hash}"), e)),
        };
        self.remember(*hash);
        Ok(stored)
    }

    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        if let Some(bytes) = lock(&self.hot).chunks.get(hash) {
            return Ok(bytes.to_vec());
        }
        let (store, key) = (self.store.clone(), self.key(hash));
        let fetched = self.block_on(bounded(self.deadline, async move {
            store.get(&key).await?.bytes().await
        }));
        let bytes = match fetched {
            Ok(bytes) => verified(hash, bytes.to_vec())?,
            Err(CallError::Store(object_store::Error::NotFound { .. })) => {
                return Err(SyncError::UnknownHash {
                    hash: *hash,
                    path: None,
                }
                .into());
            }
            Err(e) => return Err(self.failed(format!("reading chunk {hash}"), e)),
        };
        self.remember(*hash);
        self.cache(*hash, Arc::from(bytes.as_slice()));
        Ok(bytes)
    }

    fn has(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        let unknown: Vec<Hash> = {
            let mut seen = HashSet::new();
            hashes
                .iter()
                .filter(|h| !self.known(h) && seen.insert(**h))
                .copied()
                .collect()
        };
        let (store, deadline) = (self.store.clone(), self.deadline);
        let keys: Vec<(Hash, ObjectPath)> = unknown.iter().map(|h| (*h, self.key(h))).collect();
        let found: HashSet<Hash> = self
            .block_on(
                stream::iter(keys)
                    .map(|(hash, key)| {
                        let store = store.clone();
                        async move {
                            match bounded(deadline, store.head(&key)).await {
                                Ok(_) => Ok(Some(hash)),
                                Err(CallError::Store(object_store::Error::NotFound { .. })) => {
                                    Ok(None)
                                }
                                Err(e) => Err((hash, e)),
                            }
                        }
                    })
                    .buffer_unordered(CONCURRENCY)
                    .try_filter_map(|found| async move { Ok(found) })
                    .try_collect(),
            )
            .map_err(|(hash, e)| self.failed(format!("probing chunk {hash}"), e))?;
        for hash in &found {
            self.remember(*hash);
        }
        let unknown: HashSet<Hash> = unknown.into_iter().collect();
        Ok(hashes
            .iter()
            .filter(|h| !unknown.contains(h) || found.contains(h))
            .copied()
            .collect())
    }

    /// The chunks not known present go out [`CONCURRENCY`] at a time.
    fn put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<(), DofsError> {
        let mut seen = HashSet::new();
        let (store, deadline) = (self.store.clone(), self.deadline);
        let uploads: Vec<(Hash, ObjectPath, PutPayload)> = chunks
            .iter()
            .filter(|(h, _)| !self.known(h) && seen.insert(*h))
            .map(|(h, b)| (*h, self.key(h), PutPayload::from(b.to_vec())))
            .collect();
        let stored: Vec<Hash> = self
            .block_on(
                stream::iter(uploads)
                    .map(|(hash, key, payload)| {
                        let store = store.clone();
                        async move {
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
                                )) => Ok(hash),
                                Err(e) => Err((hash, e)),
                            }
                        }
                    })
                    .buffer_unordered(CONCURRENCY)
                    .try_collect(),
            )
            .map_err(|(hash, e)| self.failed(format!("storing chunk {hash}"), e))?;
        for hash in stored {
            self.remember(hash);
        }
        Ok(())
    }

    /// Hot chunks from the cache, the rest fetched [`CONCURRENCY`] at a
    /// time, each verified.
    fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Vec<u8>>, DofsError> {
        let cached: Vec<Option<Arc<[u8]>>> = {
            let mut hot = lock(&self.hot);
            hashes.iter().map(|h| hot.chunks.get(h).cloned()).collect()
        };
        let (store, deadline) = (self.store.clone(), self.deadline);
        let fetches: Vec<(usize, Hash, ObjectPath)> = hashes
            .iter()
            .enumerate()
            .filter(|(i, _)| cached[*i].is_none())
            .map(|(i, h)| (i, *h, self.key(h)))
            .collect();
        let fetched: Vec<(usize, Hash, Result<Vec<u8>, CallError>)> = self.block_on(
            stream::iter(fetches)
                .map(|(i, hash, key)| {
                    let store = store.clone();
                    async move {
                        let got = bounded(deadline, async move {
                            Ok(store.get(&key).await?.bytes().await?.to_vec())
                        })
                        .await;
                        (i, hash, got)
                    }
                })
                .buffered(CONCURRENCY)
                .collect(),
        );
        let mut out: Vec<Option<Vec<u8>>> =
            cached.into_iter().map(|c| c.map(|b| b.to_vec())).collect();
        for (i, hash, got) in fetched {
            let bytes = match got {
                Ok(bytes) => verified(&hash, bytes)?,
                Err(CallError::Store(object_store::Error::NotFound { .. })) => {
                    return Err(SyncError::UnknownHash { hash, path: None }.into());
                }
                Err(e) => return Err(self.failed(format!("reading chunk {hash}"), e)),
            };
            self.remember(hash);
            self.cache(hash, Arc::from(bytes.as_slice()));
            out[i] = Some(bytes);
        }
        Ok(out
            .into_iter()
            .map(|b| b.expect("every chunk cached or fetched"))
            .collect())
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
                bytes: garbage.len() as u64
            }
        );
        assert_eq!(chunks.has(&[hk, hg]).unwrap(), vec![hk]);
        let err = chunks.get(&hg).unwrap_err();
        assert_eq!(err.code(), wsd_sync::ErrorCode::UnknownHash, "{err}");
        assert_eq!(chunks.get(&hk).unwrap(), kept);
        assert!(chunks.put_if_absent(&hg, &garbage).unwrap(), "stored again");
    }

    #[test]
    fn the_in_memory_object_store_keeps_the_contract() {
        contract::holds_for(&in_memory().1, 1);
        sweeps_within_the_grace_window(&in_memory().1);
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
