//! A `Dofs` keeping its chunk bytes in an object store
//! ([`Dofs::keep_chunks_in`]): the index in its own table, uploads before
//! commits, verified reads, restarts, collection, forks and recovery.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use wsd_sync::{ErrorCode, Hash, Store, chunk};

use crate::test_util::{noise, p, put};
use crate::{ChunkStore, Dofs, DofsError, ObjectChunks, PackSlot, SharedChunkStore};

/// Requests that reached the object store, by kind.
#[derive(Debug, Default)]
struct Calls {
    put: AtomicUsize,
    get: AtomicUsize,
    has: AtomicUsize,
    /// `put_many` calls (upload batches).
    batches: AtomicUsize,
}

impl Calls {
    fn total(&self) -> usize {
        self.put.load(Ordering::SeqCst)
            + self.get.load(Ordering::SeqCst)
            + self.has.load(Ordering::SeqCst)
    }
}

/// An in-memory object store that counts what is asked of it.
struct Counting {
    inner: ObjectChunks,
    calls: Arc<Calls>,
    backend: Arc<object_store::memory::InMemory>,
}

impl Counting {
    /// A second client of the same bucket, knowing nothing yet (another
    /// process: a restarted or recovering kernel).
    fn fresh(&self) -> Arc<Counting> {
        bucket_over(self.backend.clone()).0
    }
}

impl ChunkStore for Counting {
    fn put_if_absent(&self, hash: &Hash, bytes: &[u8]) -> Result<bool, DofsError> {
        self.calls.put.fetch_add(1, Ordering::SeqCst);
        self.inner.put_if_absent(hash, bytes)
    }
    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        self.calls.get.fetch_add(1, Ordering::SeqCst);
        self.inner.get(hash)
    }
    fn has(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        self.calls.has.fetch_add(hashes.len(), Ordering::SeqCst);
        self.inner.has(hashes)
    }
    fn put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<Vec<Option<PackSlot>>, DofsError> {
        self.calls.put.fetch_add(chunks.len(), Ordering::SeqCst);
        self.calls.batches.fetch_add(1, Ordering::SeqCst);
        self.inner.put_many(chunks)
    }
    fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Vec<u8>>, DofsError> {
        self.calls.get.fetch_add(hashes.len(), Ordering::SeqCst);
        self.inner.get_many(hashes)
    }
    fn get_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Vec<u8>>, DofsError> {
        self.calls.get.fetch_add(chunks.len(), Ordering::SeqCst);
        self.inner.get_placed(chunks)
    }
    fn locate(&self, hashes: &[Hash]) -> Result<Vec<(Hash, Option<PackSlot>)>, DofsError> {
        self.calls.has.fetch_add(hashes.len(), Ordering::SeqCst);
        self.inner.locate(hashes)
    }
    fn lasting_place(&self, hash: &Hash, slot: Option<PackSlot>) -> bool {
        self.inner.lasting_place(hash, slot)
    }
    fn missing_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Hash>, DofsError> {
        self.calls.has.fetch_add(chunks.len(), Ordering::SeqCst);
        self.inner.missing_placed(chunks)
    }
}

/// A bucket of our own and the counter of what reaches it.
fn bucket() -> (Arc<Counting>, Arc<Calls>) {
    bucket_over(Arc::new(object_store::memory::InMemory::new()))
}

fn bucket_over(backend: Arc<object_store::memory::InMemory>) -> (Arc<Counting>, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    let inner = ObjectChunks::over(
        backend.clone(),
        "ws",
        "memory://test".into(),
        crate::DEFAULT_DEADLINE,
    )
    .unwrap();
    let store = Arc::new(Counting {
        inner,
        calls: calls.clone(),
        backend,
    });
    (store, calls)
}

const PACKED: &str = "SELECT count(*) FROM chunks WHERE pack IS NOT NULL";

fn keeping(store: &Arc<Counting>) -> Dofs {
    let mut d = Dofs::open_in_memory().unwrap();
    d.keep_chunks_in(store.clone());
    d
}

fn count(d: &Dofs, sql: &str) -> u64 {
    d.conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Deletes the object holding `hash` (its own, or its pack with every
/// chunk in it) behind the store's back (as another tool would).
fn delete_object(store: &Counting, hash: Hash) {
    let stale = store
        .inner
        .stale_objects(SystemTime::now() + Duration::from_secs(60))
        .unwrap();
    let doomed: Vec<_> = stale
        .into_iter()
        .filter(|o| o.chunks.contains(&hash))
        .collect();
    assert_eq!(doomed.len(), 1, "one object holds {hash}");
    assert!(store.inner.delete_objects(doomed).unwrap().chunks >= 1);
}

#[test]
fn chunks_go_to_the_object_store_and_the_table_indexes_them() {
    let (store, calls) = bucket();
    let mut d = keeping(&store);
    let big = noise(900 * 1024, 1);
    put(&mut d, "small", b"small bytes\nsecond line\n");
    put(&mut d, "big", &big);
    let big_chunks = chunk::chunk_slice(&big).len() as u64;
    assert!(big_chunks > 2);
    assert_eq!(count(&d, PACKED), big_chunks, "one batch, one pack");
    d.append_file(&p("small"), &b"appended\n"[..]).unwrap();
    assert_eq!(
        count(&d, "SELECT count(*) FROM chunks WHERE length(data) > 0"),
        0,
        "no chunk bytes in the database"
    );
    assert!(count(&d, "SELECT count(*) FROM chunks") > 2);
    assert!(d.keeps_chunks_elsewhere().unwrap());
    assert_eq!(
        d.read_file(&p("small")).unwrap(),
        b"small bytes\nsecond line\nappended\n"
    );
    assert_eq!(d.read_file(&p("big")).unwrap(), big);
    let lines = d.read_lines(&p("small"), 1, Some(1), 1 << 20).unwrap();
    assert_eq!(lines.lines, vec![b"second line".to_vec()]);
    assert_eq!(d.search(b"appended", None, 10).unwrap().len(), 1);
    d.check_integrity().unwrap();

    // A sync probe is answered by the index: nothing asked per chunk.
    let chunks: Vec<Hash> = chunk::chunk_slice(&big).iter().map(|c| c.1.hash).collect();
    let (before, probes) = (calls.total(), calls.has.load(Ordering::SeqCst));
    assert_eq!(d.has_objects(&chunks).unwrap(), chunks);
    let objects = d.read_objects(&chunks).unwrap();
    assert_eq!(
        objects
            .iter()
            .flat_map(|o| o.bytes.clone())
            .collect::<Vec<u8>>(),
        big
    );
    assert_eq!(
        calls.has.load(Ordering::SeqCst),
        probes,
        "probes never reach the store"
    );
    assert!(calls.total() > before, "the bytes did (hot cache or not)");
}

#[test]
fn staged_objects_are_uploaded_before_their_rows_and_found_by_the_index() {
    let (store, calls) = bucket();
    let mut d = keeping(&store);
    let objects: Vec<wsd_sync::Object> = (0..40u32)
        .map(|i| {
            let bytes = noise(10_000, u64::from(i));
            wsd_sync::Object {
                hash: Hash::of(&bytes),
                bytes,
            }
        })
        .collect();
    d.stage_objects(&objects).unwrap();
    assert_eq!(calls.put.load(Ordering::SeqCst), 40);
    let hashes: Vec<Hash> = objects.iter().map(|o| o.hash).collect();
    assert_eq!(store.inner.has(&hashes).unwrap(), hashes, "in the bucket");
    d.stage_objects(&objects).unwrap();
    assert_eq!(
        calls.put.load(Ordering::SeqCst),
        40,
        "indexed ones are not sent again"
    );
    assert_eq!(d.has_objects(&hashes).unwrap(), hashes);
}

/// A store that answers nothing.
struct Unreachable;

impl ChunkStore for Unreachable {
    fn put_if_absent(&self, _: &Hash, _: &[u8]) -> Result<bool, DofsError> {
        Err(DofsError::ChunkStoreDeadline {
            store: "s3://nowhere".into(),
            op: "storing".into(),
            after: Duration::from_secs(1),
        })
    }
    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        Err(DofsError::ChunkStoreDeadline {
            store: "s3://nowhere".into(),
            op: format!("reading chunk {hash}"),
            after: Duration::from_secs(1),
        })
    }
    fn has(&self, _: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        Ok(Vec::new())
    }
}

#[test]
fn a_failed_upload_commits_nothing_and_a_missing_object_names_its_hash() {
    let mut d = Dofs::open_in_memory().unwrap();
    let unreachable: SharedChunkStore = Arc::new(Unreachable);
    d.keep_chunks_in(unreachable);
    let err = d.write_file(&p("f"), &b"never stored"[..]).unwrap_err();
    assert!(err.to_string().contains("s3://nowhere"), "{err}");
    assert_eq!(d.current_rev().unwrap(), 0, "nothing committed");
    assert_eq!(count(&d, "SELECT count(*) FROM chunks"), 0);
    assert!(d.stat(&p("f")).is_err());

    let (store, _) = bucket();
    let mut d = keeping(&store);
    let big = noise(600 * 1024, 2);
    put(&mut d, "big", &big);
    put(&mut d, "small", b"small");
    let chunks = chunk::chunk_slice(&big);
    let (first, second) = (chunks[0].1.hash, chunks[1].1.hash);
    let small = Hash::of(b"small");
    // `big`'s chunks went out in one pack: deleting it loses them all, and
    // a read names the first it needs; `small` went alone.
    delete_object(&store, second);
    delete_object(&store, small);
    for (path, hash) in [("big", first), ("small", small)] {
        let err = d.read_file(&p(path)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::UnknownHash, "{err}");
        assert!(err.to_string().contains(&hash.to_string()), "{err}");
    }
    let err = d.read_object(&second).unwrap_err();
    assert!(err.to_string().contains(&second.to_string()), "{err}");
    let err = d.check_integrity().unwrap_err();
    assert!(err.to_string().contains(&small.to_string()), "{err}");
}

#[test]
fn the_index_survives_a_restart_and_a_store_without_its_bucket_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ws.dofs");
    let (store, calls) = bucket();
    let content = noise(300 * 1024, 3);
    {
        let mut d = Dofs::open(&path).unwrap();
        d.keep_chunks_in(store.clone());
        put(&mut d, "f", &content);
    }
    let hashes: Vec<Hash> = chunk::chunk_slice(&content)
        .iter()
        .map(|c| c.1.hash)
        .collect();
    // A new process reads packed chunks at the ranges its index records,
    // without looking anything up in the bucket.
    let fresh = store.fresh();
    let mut d = Dofs::open(&path).unwrap();
    d.keep_chunks_in(fresh.clone());
    assert_eq!(d.read_file(&p("f")).unwrap(), content);
    assert_eq!(fresh.inner.packs_read(), 0, "no pack index read");
    assert_eq!(fresh.calls.has.load(Ordering::SeqCst), 0, "no probe");
    drop(d);
    let mut d = Dofs::open(&path).unwrap();
    d.keep_chunks_in(store.clone());
    let asked = calls.has.load(Ordering::SeqCst);
    assert_eq!(d.has_objects(&hashes).unwrap(), hashes);
    assert_eq!(calls.has.load(Ordering::SeqCst), asked, "from the index");
    assert_eq!(d.read_file(&p("f")).unwrap(), content);
    drop(d);

    let d = Dofs::open(&path).unwrap();
    assert!(d.keeps_chunks_elsewhere().unwrap());
    let err = d.read_file(&p("f")).unwrap_err();
    assert!(matches!(err, DofsError::ChunkElsewhere { .. }), "{err}");
    assert!(err.to_string().contains("--chunk-store"), "{err}");
}

#[test]
fn collection_frees_index_rows_and_snapshots_keep_theirs() {
    let (store, _) = bucket();
    let mut d = keeping(&store);
    put(&mut d, "f", b"old content");
    d.create_snapshot("s").unwrap();
    put(&mut d, "f", b"new content");
    put(&mut d, "g", b"dropped");
    put(&mut d, "g", b"replaced");
    let out = d.collect_garbage().unwrap();
    assert_eq!(out.chunks, 1, "only `dropped` lost its last reference");
    let (old, dropped) = (Hash::of(b"old content"), Hash::of(b"dropped"));
    assert_eq!(d.indexed_chunks(&[old, dropped]).unwrap(), vec![old]);
    d.check_integrity().unwrap();
}

#[test]
fn a_fork_over_the_same_bucket_moves_no_bytes() {
    let (store, calls) = bucket();
    let mut source = keeping(&store);
    let big = noise(500 * 1024, 4);
    put(&mut source, "a/big", &big);
    put(&mut source, "b", b"small");
    source.create_snapshot("s").unwrap();
    let mut fork = keeping(&store);
    let before = calls.total();
    fork.fork_from(&source, "s").unwrap();
    assert_eq!(calls.total(), before, "indexed, not copied");
    assert!(count(&fork, PACKED) > 0);
    assert_eq!(
        count(&fork, PACKED),
        count(&source, PACKED),
        "pack ranges too"
    );
    assert_eq!(fork.read_file(&p("a/big")).unwrap(), big);
    fork.check_integrity().unwrap();
}

#[test]
fn a_snapshot_tree_imported_elsewhere_restores_the_same_files() {
    let (store, _) = bucket();
    let mut lost = keeping(&store);
    let big = noise(700 * 1024, 5);
    put(&mut lost, "dir/big", &big);
    put(&mut lost, "small", b"small");
    lost.symlink("small", &p("link")).unwrap();
    lost.create_snapshot("s1").unwrap();
    let tree = lost.snapshot_tree("s1").unwrap();
    assert_eq!(tree.len(), 4, "{tree:?}");
    drop(lost);

    // A new process: nothing known but the bucket, whose packs list
    // their chunks.
    let mut rebuilt = keeping(&store.fresh());
    rebuilt.import_snapshot("s1", 42, &tree).unwrap();
    assert_eq!(
        count(&rebuilt, PACKED),
        chunk::chunk_slice(&big).len() as u64,
        "pack ranges found in the packs' indexes"
    );
    let out = rebuilt.restore_snapshot("s1").unwrap();
    assert_eq!(out.changed, 4);
    assert_eq!(rebuilt.read_file(&p("dir/big")).unwrap(), big);
    assert_eq!(rebuilt.read_file(&p("small")).unwrap(), b"small");
    assert_eq!(
        rebuilt.stat(&p("link")).unwrap().target.as_deref(),
        Some("small")
    );
    rebuilt.check_integrity().unwrap();
    let err = rebuilt.import_snapshot("s1", 42, &tree).unwrap_err();
    assert_eq!(err.posix_name(), "EEXIST", "{err}");

    // Chunks gone from the bucket (`dir/big`'s pack): one named with its
    // path, nothing recorded.
    let big_chunks: Vec<Hash> = chunk::chunk_slice(&big).iter().map(|c| c.1.hash).collect();
    delete_object(&store, big_chunks[0]);
    let mut short = keeping(&store);
    let err = short.import_snapshot("s1", 42, &tree).unwrap_err();
    assert_eq!(err.code(), ErrorCode::UnknownHash, "{err}");
    let text = err.to_string();
    assert!(
        big_chunks.iter().any(|h| text.contains(&h.to_string())) && text.contains("dir/big"),
        "{text}"
    );
    assert!(short.snapshot_ids().unwrap().is_empty());
    assert_eq!(count(&short, "SELECT count(*) FROM chunks"), 0);
}

#[test]
fn many_small_files_written_together_go_out_in_one_batch() {
    let (store, calls) = bucket();
    let mut d = keeping(&store);
    let paths: Vec<_> = (0..200).map(|i| p(&format!("src/f{i}.rs"))).collect();
    let content = |i: usize| format!("fn f{i}() {{}}\n").into_bytes();
    let opts = crate::WriteOptions {
        create_parents: true,
        ..crate::WriteOptions::default()
    };
    let files: Vec<_> = paths
        .iter()
        .enumerate()
        .map(|(i, path)| (path, std::io::Cursor::new(content(i)), opts))
        .collect();
    d.write_files(files).unwrap();
    assert_eq!(calls.batches.load(Ordering::SeqCst), 1, "{calls:?}");
    assert_eq!(calls.put.load(Ordering::SeqCst), 200);
    // A multi-chunk file among them: its list is recorded over stored
    // chunks, the small ones still go out together at the end.
    let big = noise(600 * 1024, 9);
    let (a, b) = (p("src/a.rs"), p("src/b.rs"));
    let with_big = vec![
        (&a, std::io::Cursor::new(b"a".to_vec()), opts),
        (&paths[0], std::io::Cursor::new(big.clone()), opts),
        (&b, std::io::Cursor::new(b"b".to_vec()), opts),
    ];
    d.write_files(with_big).unwrap();
    assert_eq!(calls.batches.load(Ordering::SeqCst), 3, "{calls:?}");
    for (i, path) in paths.iter().enumerate().skip(1) {
        assert_eq!(d.read_file(path).unwrap(), content(i));
    }
    assert_eq!(d.read_file(&paths[0]).unwrap(), big);
    assert_eq!(d.read_file(&b).unwrap(), b"b");
    d.check_integrity().unwrap();
}

/// A collection frees a chunk's row and a sweep its object: the same
/// content written again is uploaded again (neither the index nor the
/// known-present set still claims it), on a real S3 server.
#[test]
fn content_written_again_after_its_object_was_swept_is_uploaded_again() {
    let Some(server) = crate::seaweedfs::SeaweedFs::start() else {
        return;
    };
    let store = Arc::new(server.chunks("rewrite"));
    let mut d = Dofs::open_in_memory().unwrap();
    d.keep_chunks_in(store.clone());
    let bytes = b"content that comes back".to_vec();
    let hash = Hash::of(&bytes);
    put(&mut d, "f", &bytes);
    d.rm(&p("f"), false).unwrap();
    assert_eq!(d.collect_garbage().unwrap().chunks, 1);
    assert!(d.indexed_chunks(&[hash]).unwrap().is_empty());
    let keep = d.indexed_chunks(&[hash]).unwrap().into_iter().collect();
    let later = SystemTime::now() + Duration::from_secs(60);
    assert_eq!(store.sweep(&keep, later).unwrap().chunks, 1);
    let fresh = || server.chunks("rewrite");
    assert!(fresh().has(&[hash]).unwrap().is_empty(), "swept");

    put(&mut d, "g", &bytes);
    assert_eq!(fresh().has(&[hash]).unwrap(), vec![hash], "uploaded again");
    assert_eq!(fresh().get(&hash).unwrap(), bytes);
    d.keep_chunks_in(Arc::new(fresh()));
    assert_eq!(d.read_file(&p("g")).unwrap(), bytes);
    d.check_integrity().unwrap();
}

/// The packs in the bucket that hold `hash`.
fn packs_holding(store: &Counting, hash: Hash) -> Vec<Hash> {
    store
        .inner
        .stale_objects(SystemTime::now() + Duration::from_secs(60))
        .unwrap()
        .into_iter()
        .filter(|o| o.chunks.contains(&hash))
        .filter_map(|o| o.pack)
        .collect()
}

/// A store and a fork of it share a pack whose head both dropped. A
/// repack interrupted after moving the first store's rows (the second
/// store's database is busy) leaves both reading, each at the pack its
/// rows name, and a fresh process's next collection finishes the work:
/// the same live chunks make the same new pack, the old one goes.
#[test]
fn an_interrupted_repack_leaves_every_chunk_readable_and_the_next_collection_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = bucket();
    let mut a = Dofs::open(dir.path().join("a.dofs")).unwrap();
    a.keep_chunks_in(store.clone());
    let big = noise(600 * 1024, 9);
    put(&mut a, "big", &big);
    let old: Vec<Hash> = chunk::chunk_slice(&big).iter().map(|c| c.1.hash).collect();
    let old_pack = packs_holding(&store, old[0]);
    assert_eq!(old_pack.len(), 1, "one write, one pack");
    a.create_snapshot("s").unwrap();
    let b_path = dir.path().join("b.dofs");
    let mut b = Dofs::open(&b_path).unwrap();
    b.keep_chunks_in(store.clone());
    b.fork_from(&a, "s").unwrap();
    // Both keep only the tail: the head chunks die in both.
    let tail = big[400 * 1024..].to_vec();
    put(&mut a, "big", &tail);
    put(&mut b, "big", &tail);
    a.delete_snapshot("s").unwrap();
    a.collect_garbage().unwrap();
    b.collect_garbage().unwrap();
    let live: Vec<Hash> = chunk::chunk_slice(&tail).iter().map(|c| c.1.hash).collect();
    let shared: Vec<Hash> = old.iter().filter(|h| live.contains(h)).copied().collect();
    assert!(
        !shared.is_empty() && shared.len() * 2 < old.len(),
        "{shared:?}"
    );

    // `b` busy: the collection moves `a`'s rows, then fails on `b`'s.
    let blocker = rusqlite::Connection::open(&b_path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    b.conn.busy_timeout(Duration::from_millis(50)).unwrap();
    let later = SystemTime::now() + Duration::from_secs(60);
    let stale = store.inner.stale_objects(later).unwrap();
    let mut stores = [&mut a, &mut b];
    let err = store.inner.collect(stale, &mut stores, &Default::default());
    assert!(err.is_err(), "{err:?}");
    assert_eq!(
        packs_holding(&store, shared[0]).len(),
        2,
        "the new pack is written and the old one still there"
    );
    for d in [&mut a, &mut b] {
        d.keep_chunks_in(store.fresh());
        assert_eq!(d.read_file(&p("big")).unwrap(), tail);
        d.check_integrity().unwrap();
    }
    drop(blocker);

    let fresh = store.fresh();
    let stale = fresh.inner.stale_objects(later).unwrap();
    let out = fresh
        .inner
        .collect(stale, &mut [&mut a, &mut b], &Default::default())
        .unwrap();
    assert_eq!(out.repacked, 1, "{out:?}");
    let now_in = packs_holding(&fresh, shared[0]);
    assert_eq!(now_in.len(), 1, "one copy left: {now_in:?}");
    assert_ne!(now_in, old_pack);
    for d in [&mut a, &mut b] {
        d.keep_chunks_in(store.fresh());
        assert_eq!(d.read_file(&p("big")).unwrap(), tail);
        d.check_integrity().unwrap();
    }
    for dead in old.iter().filter(|h| !live.contains(h)) {
        assert!(packs_holding(&fresh, *dead).is_empty(), "{dead} freed");
    }
}

/// A collection reaching one store at a time: a write to a store already
/// marked, of content whose chunks are known present only in a pack the
/// collection is about to delete, stores those chunks again (in a new
/// pack, whose id differs from the doomed one although it holds the same
/// chunks in the same order) instead of naming the doomed pack; after the
/// collection the file reads back with a client that knows nothing.
#[test]
fn a_write_during_a_collection_stores_a_doomed_objects_chunks_again() {
    let (store, _) = bucket();
    let mut a = keeping(&store);
    let mut b = keeping(&store);
    let content = noise(300 * 1024, 11);
    let hashes: Vec<Hash> = chunk::chunk_slice(&content)
        .iter()
        .map(|c| c.1.hash)
        .collect();
    put(&mut a, "x", &content);
    let doomed = packs_holding(&store, hashes[0]);
    assert_eq!(doomed.len(), 1);
    // Nothing names them now; the process still knows them present.
    a.rm(&p("x"), false).unwrap();
    a.collect_garbage().unwrap();

    let later = SystemTime::now() + Duration::from_secs(60);
    let stale = store.inner.stale_objects(later).unwrap();
    let mut turns = 0;
    let mut each = |f: &mut dyn FnMut(&mut Dofs) -> Result<(), DofsError>| {
        f(&mut a)?;
        if turns == 0 {
            // After `a`'s mark, before `b`'s.
            put(&mut a, "y", &content);
        }
        turns += 1;
        f(&mut b)
    };
    let out = store
        .inner
        .collect_each(stale, &mut each, &Default::default())
        .unwrap();
    assert_eq!(out.chunks, hashes.len() as u64, "{out:?}");
    let now_in = packs_holding(&store, hashes[0]);
    assert_eq!(now_in.len(), 1, "{now_in:?}");
    assert_ne!(now_in, doomed, "the doomed pack is gone");
    a.keep_chunks_in(store.fresh());
    a.check_integrity().unwrap();
    assert_eq!(a.read_file(&p("y")).unwrap(), content);
}

/// A collection reaching one store at a time: a fork written after its
/// own (then empty) store was marked, from a snapshot whose chunks only a
/// pack the collection is about to delete holds (the source drops the
/// snapshot and collects its rows before its own mark), copies those
/// chunks' bytes instead of naming the doomed pack; after the collection
/// deleted that pack the fork reads back with a client that knows
/// nothing.
#[test]
fn a_fork_during_a_collection_copies_the_chunks_of_a_doomed_pack() {
    let (store, _) = bucket();
    let mut source = keeping(&store);
    let mut fork = keeping(&store);
    let content = noise(300 * 1024, 12);
    let hashes: Vec<Hash> = chunk::chunk_slice(&content)
        .iter()
        .map(|c| c.1.hash)
        .collect();
    put(&mut source, "x", &content);
    let doomed = packs_holding(&store, hashes[0]);
    assert_eq!(doomed.len(), 1);
    source.create_snapshot("s").unwrap();
    source.rm(&p("x"), false).unwrap();

    let later = SystemTime::now() + Duration::from_secs(60);
    let stale = store.inner.stale_objects(later).unwrap();
    let mut turns = 0;
    let mut each = |f: &mut dyn FnMut(&mut Dofs) -> Result<(), DofsError>| {
        f(&mut fork)?;
        if turns == 0 {
            // After the fork's mark, before the source's.
            fork.fork_from(&source, "s").unwrap();
            source.delete_snapshot("s").unwrap();
            source.collect_garbage().unwrap();
        }
        turns += 1;
        f(&mut source)
    };
    let out = store
        .inner
        .collect_each(stale, &mut each, &Default::default())
        .unwrap();
    assert_eq!(out.chunks, hashes.len() as u64, "{out:?}");
    assert!(
        packs_holding(&store, hashes[0]).is_empty(),
        "the doomed pack is gone"
    );
    fork.keep_chunks_in(store.fresh());
    fork.check_integrity().unwrap();
    assert_eq!(fork.read_file(&p("x")).unwrap(), content);
}
