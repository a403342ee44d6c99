//! `gsv serve --chunk-store s3://...`: workspace chunks and snapshot
//! manifests kept in a real S3 server (SeaweedFS, started here on
//! loopback; skipped without `weed` unless `GSV_REQUIRE_S3` is set), used
//! by fs.* and shell.exec, swept by `sys.gc`, and a workspace recovered
//! from it by a kernel that lost its data directory.

use std::time::Duration;

use gsv_kernel::{ChunkStoreConfig, Kernel, KernelConfig};
use serde_json::{Value, json};
use wsd_dofs::seaweedfs::{self, SeaweedFs};
use wsd_dofs::{ChunkStore, ObjectChunks};
use wsd_sync::Hash;

use crate::harness::{TestKernel, err_of, new_workspace};
use crate::workspace_calls::{read, run, snapshot, write};

/// Which of `hashes` the bucket holds, asked by a client of our own (no
/// index shared with the kernel's).
async fn in_bucket(url: &str, hashes: &[Hash]) -> Vec<Hash> {
    let (url, hashes) = (url.to_owned(), hashes.to_vec());
    tokio::task::spawn_blocking(move || {
        ObjectChunks::connect_with(&url, Some(seaweedfs::credentials()))
            .unwrap()
            .has(&hashes)
            .unwrap()
    })
    .await
    .unwrap()
}

/// A kernel keeping its chunks at `url`, collecting with `grace`.
fn in_bucket_with_grace(
    url: &str,
    grace: Duration,
) -> impl FnOnce(&mut gsv_kernel::KernelConfig) + use<> {
    let url = url.to_owned();
    move |c| {
        c.chunk_store = Some(ChunkStoreConfig {
            url,
            credentials: Some(seaweedfs::credentials()),
        });
        c.gc_grace = grace;
    }
}

/// Deletes the object holding `hash` (its own, or its pack) with a client
/// of our own (as another tool would).
async fn delete_from_bucket(url: &str, hash: Hash) {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let store = ObjectChunks::connect_with(&url, Some(seaweedfs::credentials())).unwrap();
        let stale = store
            .stale_objects(std::time::SystemTime::now() + Duration::from_secs(3600))
            .unwrap();
        let doomed: Vec<_> = stale
            .into_iter()
            .filter(|o| o.chunks.contains(&hash))
            .collect();
        assert_eq!(doomed.len(), 1, "one object holds {hash}");
        assert!(store.delete_objects(doomed).unwrap().chunks >= 1);
    })
    .await
    .unwrap();
}

async fn start_seaweedfs() -> Option<SeaweedFs> {
    tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap()
}

#[tokio::test]
async fn workspace_chunks_live_in_the_bucket_and_gc_sweeps_what_nothing_holds() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("kernel");
    let k = TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::ZERO)).await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "f.txt", "first content").await;
    write(&mut a, &ws, "same.txt", "kept by every snapshot").await;
    let (first, same) = (
        Hash::of(b"first content"),
        Hash::of(b"kept by every snapshot"),
    );
    assert_eq!(
        in_bucket(&url, &[first, same]).await,
        vec![first, same],
        "stored in the bucket by the write itself"
    );

    let s1 = snapshot(&mut a, &ws).await;
    assert_eq!(s1["files"], 2, "{s1}");
    write(&mut a, &ws, "f.txt", "second content").await;
    let second = Hash::of(b"second content");
    let s2 = snapshot(&mut a, &ws).await;
    assert_eq!(s2["newBytes"], "second content".len(), "{s2}");
    assert_eq!(in_bucket(&url, &[second]).await, vec![second]);

    let mut root = k.login("root", "root-password").await;
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["storeChunks"], 0, "everything is referenced: {gc}");
    a.call(
        "workspace.snapshot.delete",
        json!({"snapshotId": s1["snapshotId"]}),
    )
    .await
    .unwrap();
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["chunks"], 1, "{gc}");
    assert_eq!(gc["storeChunks"], 1, "{gc}");
    assert_eq!(gc["storeBytes"], "first content".len(), "{gc}");
    assert_eq!(
        in_bucket(&url, &[first, second, same]).await,
        vec![second, same],
        "only the deleted snapshot held `first content`"
    );
    let r = read(&mut a, &ws, "f.txt").await;
    assert_eq!(r["content"], "1\tsecond content", "{r}");
}

/// The chunks `content` is cut into, in order, distinct.
fn chunks_of(content: &str) -> Vec<Hash> {
    let mut out: Vec<Hash> = wsd_sync::chunk::chunk_slice(content.as_bytes())
        .iter()
        .map(|(_, c)| c.hash)
        .collect();
    out.dedup();
    out
}

#[tokio::test]
async fn a_pack_a_little_dead_stays_whole_and_goes_whole_after() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("packs");
    let k = TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::ZERO)).await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    // One write, one pack of its chunks (under `PACK_BYTES`).
    let old: String = (0..40_000)
        .map(|i| format!("line {i} of a big file\n"))
        .collect();
    assert!(old.len() < wsd_dofs::PACK_BYTES);
    write(&mut a, &ws, "big.txt", &old).await;
    let old_chunks = chunks_of(&old);
    assert!(old_chunks.len() > 2, "{}", old_chunks.len());
    assert_eq!(in_bucket(&url, &old_chunks).await, old_chunks);
    // The same file with a new tail: its first chunks stay referenced and
    // the dead one is under a quarter of the pack's bytes, so the first
    // pack stays as it is, its dead tail with it (the new chunks are a
    // pack or an object of their own).
    let new = format!("{}a new tail\n", &old[..old.len() - 1000]);
    write(&mut a, &ws, "big.txt", &new).await;
    let new_chunks = chunks_of(&new);
    let shared = old_chunks.iter().filter(|h| new_chunks.contains(h)).count();
    assert!(shared > 0 && shared < old_chunks.len(), "{shared}");
    let dead_bytes: usize = wsd_sync::chunk::chunk_slice(old.as_bytes())
        .iter()
        .filter(|(_, c)| !new_chunks.contains(&c.hash))
        .map(|(_, c)| c.size as usize)
        .sum();
    assert!(dead_bytes * 4 < old.len(), "{dead_bytes} of {}", old.len());
    let mut root = k.login("root", "root-password").await;
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert!(gc["chunks"].as_u64().unwrap() > 0, "index rows freed: {gc}");
    assert_eq!(
        (gc["storeChunks"].as_u64(), gc["storeRepacked"].as_u64()),
        (Some(0), Some(0)),
        "every object holds a live chunk, and little dead: {gc}"
    );
    assert_eq!(
        run(&mut a, &ws, "sha256sum big.txt").await,
        format!("{}  big.txt\n", Hash::of(new.as_bytes())),
        "read back across both packs"
    );

    // Nothing of either left: both go, counted by their chunks.
    write(&mut a, &ws, "big.txt", "small now").await;
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    let packed = old_chunks.len() + new_chunks.len() - shared;
    assert_eq!(gc["storeChunks"], packed as u64, "{gc}");
    assert!(
        gc["storeBytes"].as_u64().unwrap() > old.len() as u64,
        "{gc}"
    );
    let all: Vec<Hash> = old_chunks.iter().chain(&new_chunks).copied().collect();
    assert!(in_bucket(&url, &all).await.is_empty());
    let f = read(&mut a, &ws, "big.txt").await;
    assert_eq!(f["content"], "1\tsmall now", "{f}");
}

/// The bytes of every chunk object (own or pack) under a kernel's prefix,
/// by a client of our own.
async fn bucket_bytes(url: &str) -> u64 {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        ObjectChunks::connect_with(&url, Some(seaweedfs::credentials()))
            .unwrap()
            .stale_objects(std::time::SystemTime::now() + Duration::from_secs(3600))
            .unwrap()
            .iter()
            .map(|o| o.size)
            .sum()
    })
    .await
    .unwrap()
}

/// Every workspace store under a stopped kernel's data directory passes
/// the integrity check with a client of the bucket that knows nothing
/// (every stub where its row says, in a pack or an object of its own).
fn stores_check_out(data: &std::path::Path, url: &str) -> usize {
    let mut checked = 0;
    for entry in std::fs::read_dir(data.join("workspaces")).unwrap() {
        let file = entry.unwrap().path().join("dofs.sqlite3");
        if !file.exists() {
            continue;
        }
        let mut d = wsd_dofs::Dofs::open(&file).unwrap();
        let fresh = ObjectChunks::connect_with(url, Some(seaweedfs::credentials())).unwrap();
        d.keep_chunks_in(std::sync::Arc::new(fresh));
        d.check_integrity()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        checked += 1;
    }
    checked
}

#[tokio::test]
async fn a_deleted_snapshot_s_chunks_leave_the_bucket_though_live_ones_share_their_pack() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("repack");
    let k = TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::ZERO)).await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    // Two versions of one file sharing its tail: the first written at
    // once (one pack), kept by a snapshot only, then deleted.
    let lines = |what: &str, n: usize| -> String {
        (0..n)
            .map(|i| format!("{what} line {i} of a big file\n"))
            .collect()
    };
    let tail = lines("the same tail", 6_000);
    let old = format!("{}{tail}", lines("first", 12_000));
    let new = format!("{}{tail}", lines("second", 12_000));
    write(&mut a, &ws, "big.txt", &old).await;
    let (old_chunks, new_chunks) = (chunks_of(&old), chunks_of(&new));
    let dead: Vec<Hash> = old_chunks
        .iter()
        .filter(|h| !new_chunks.contains(h))
        .copied()
        .collect();
    assert!(
        dead.len() < old_chunks.len() && dead.len() * 4 >= old_chunks.len(),
        "{} of {} chunks die",
        dead.len(),
        old_chunks.len()
    );
    let dead_bytes: u64 = wsd_sync::chunk::chunk_slice(old.as_bytes())
        .iter()
        .filter(|(_, c)| dead.contains(&c.hash))
        .map(|(_, c)| u64::from(c.size))
        .sum();
    let first = snapshot(&mut a, &ws).await;
    write(&mut a, &ws, "big.txt", &new).await;
    let second = snapshot(&mut a, &ws).await;
    a.call(
        "workspace.snapshot.delete",
        json!({"snapshotId": first["snapshotId"]}),
    )
    .await
    .unwrap();

    let before = bucket_bytes(&url).await;
    let mut root = k.login("root", "root-password").await;
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["chunks"], dead.len(), "index rows: {gc}");
    assert_eq!(gc["storeRepacked"], 1, "the first version's pack: {gc}");
    assert_eq!(gc["storeChunks"], dead.len(), "{gc}");
    // The rewritten pack lacks the dead chunks and their index entries
    // (44 bytes each).
    let freed = dead_bytes + 44 * dead.len() as u64;
    assert_eq!(gc["storeBytes"], freed, "{gc}");
    assert_eq!(before - bucket_bytes(&url).await, freed, "object sizes");
    assert!(in_bucket(&url, &dead).await.is_empty(), "dead chunks gone");
    assert_eq!(
        in_bucket(&url, &new_chunks).await,
        new_chunks,
        "shared ones stay"
    );
    let f = read(&mut a, &ws, "big.txt").await;
    assert!(
        f["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("1\tsecond line 0 of a big file")),
        "{f}"
    );
    assert_eq!(
        run(&mut a, &ws, "sha256sum big.txt").await,
        format!("{}  big.txt\n", Hash::of(new.as_bytes())),
        "read back from the old pack's successor and the new pack"
    );
    let again = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(
        (
            again["storeChunks"].as_u64(),
            again["storeRepacked"].as_u64()
        ),
        (Some(0), Some(0)),
        "nothing left to free: {again}"
    );

    // A fresh process: the store's rows all name objects that exist, and
    // a kernel that lost its data directory recovers the snapshot.
    a.close().await;
    root.close().await;
    let stopped = k.stop().await;
    let data = stopped.data();
    let url_for_check = url.clone();
    let checked = tokio::task::spawn_blocking(move || stores_check_out(&data, &url_for_check))
        .await
        .unwrap();
    assert_eq!(checked, 1);
    drop(stopped);
    let k = TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::ZERO)).await;
    let mut a = k.alice().await;
    let r = a
        .call("workspace.recover", json!({"workspaceId": ws}))
        .await
        .unwrap();
    assert_eq!(r["restoredFrom"], second["snapshotId"], "{r}");
    assert_eq!(
        run(&mut a, &ws, "sha256sum big.txt").await,
        format!("{}  big.txt\n", Hash::of(new.as_bytes())),
        "recovered from the rewritten pack"
    );
}

#[tokio::test]
async fn fs_and_exec_round_trip_with_chunks_in_the_bucket() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("live");
    let k =
        TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::from_secs(3600))).await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let big: String = (0..40_000).map(|i| format!("line {i}\n")).collect();
    write(&mut a, &ws, "big.txt", &big).await;
    write(&mut a, &ws, "f.txt", "from fs.write").await;
    let r = read(&mut a, &ws, "big.txt").await;
    assert_eq!(r["size"].as_u64(), Some(big.len() as u64), "{}", r["path"]);
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .starts_with("1\tline 0\n2\tline 1\n")
    );
    assert_eq!(
        run(
            &mut a,
            &ws,
            "cat f.txt; wc -l < big.txt; printf 'made by a command' > g.txt"
        )
        .await,
        "from fs.write40000\n"
    );
    let r = read(&mut a, &ws, "g.txt").await;
    assert_eq!(r["content"], "1\tmade by a command", "{r}");
    let made = Hash::of(b"made by a command");
    assert_eq!(
        in_bucket(&url, &[made]).await,
        vec![made],
        "a pulled chunk goes to the bucket too"
    );
}

#[tokio::test]
async fn a_deleted_object_is_an_error_naming_its_hash_and_nothing_is_half_written() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("missing");
    let k =
        TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::from_secs(3600))).await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "good.txt", "still here").await;
    write(&mut a, &ws, "lost.txt", "deleted behind our back").await;
    let lost = Hash::of(b"deleted behind our back");
    delete_from_bucket(&url, lost).await;

    let f = a
        .request(
            "fs.read",
            json!({"path": format!("/workspaces/{ws}/lost.txt")}),
        )
        .await
        .unwrap();
    assert!(f.to_string().contains(&lost.to_string()), "{f}");
    let r = read(&mut a, &ws, "good.txt").await;
    assert_eq!(r["content"], "1\tstill here", "{r}");

    // The push before a command cannot send the file: the command does not
    // run, the error names the chunk, and the workspace's wsd got nothing.
    let f = a
        .request(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{ws}"), "input": "ls", "yieldMs": 10000}),
        )
        .await
        .unwrap();
    assert!(f.to_string().contains(&lost.to_string()), "{f}");
    // Written again (new content, a new object), it all goes through.
    write(&mut a, &ws, "lost.txt", "written again").await;
    assert_eq!(
        run(&mut a, &ws, "cat good.txt lost.txt").await,
        "still herewritten again"
    );
}

#[tokio::test]
async fn a_workspace_comes_back_from_the_bucket_after_its_kernel_lost_its_data() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("recover");
    let k = TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::ZERO)).await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "f.txt", "snapshot content").await;
    write(&mut a, &ws, "dir/g.txt", "nested").await;
    let first = snapshot(&mut a, &ws).await;
    write(&mut a, &ws, "f.txt", "second snapshot").await;
    // Many chunks written at once: they go to the bucket in a pack, which
    // the recovering kernel finds through the pack's own index.
    let big: String = (0..12_000)
        .map(|i| format!("line {i} of a big file\n"))
        .collect();
    write(&mut a, &ws, "big.txt", &big).await;
    let second = snapshot(&mut a, &ws).await;
    write(&mut a, &ws, "f.txt", "never snapshotted").await;
    a.close().await;
    // The data directory goes with the stopped kernel.
    drop(k.stop().await);

    let k = TestKernel::with_users_tuned(in_bucket_with_grace(&url, Duration::ZERO)).await;
    let mut root = k.login("root", "root-password").await;
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(
        (gc["storeChunks"].as_u64(), gc["storeBytes"].as_u64()),
        (Some(1), Some("never snapshotted".len() as u64)),
        "manifests of a workspace not yet recovered keep its snapshots' chunks: {gc}"
    );
    let mut b = k.bob().await;
    let f = b
        .request("workspace.recover", json!({"workspaceId": ws}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403, "not bob's: {f}");
    let mut a = k.alice().await;
    let f = a
        .request(
            "workspace.recover",
            json!({"workspaceId": "ws_0123456789ab"}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403, "unknown looks foreign: {f}");
    let f = a
        .request("workspace.recover", json!({"workspaceId": "../etc"}))
        .await
        .unwrap();
    assert!(err_of(&f).1.contains("ws_<hex>"), "{f}");

    let r = a
        .call("workspace.recover", json!({"workspaceId": ws}))
        .await
        .unwrap();
    assert_eq!(r["snapshots"], 2, "{r}");
    assert_eq!(r["restoredFrom"], second["snapshotId"], "{r}");
    assert_eq!(r["workspace"]["workspaceId"], ws.as_str(), "{r}");
    let f = read(&mut a, &ws, "f.txt").await;
    assert_eq!(f["content"], "1\tsecond snapshot", "{f}");
    assert_eq!(run(&mut a, &ws, "cat dir/g.txt").await, "nested");
    assert_eq!(
        run(&mut a, &ws, "sha256sum big.txt").await,
        format!("{}  big.txt\n", Hash::of(big.as_bytes())),
        "the packed file, read back from the bucket"
    );
    let list = a
        .call("workspace.snapshot.list", json!({"workspaceId": ws}))
        .await
        .unwrap();
    let ids: Vec<&Value> = list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["snapshotId"])
        .collect();
    assert_eq!(ids, vec![&first["snapshotId"], &second["snapshotId"]]);
    let restored = a
        .call(
            "workspace.snapshot.restore",
            json!({"snapshotId": first["snapshotId"]}),
        )
        .await
        .unwrap();
    assert_eq!(restored["changed"], 1, "{restored}");
    let f = read(&mut a, &ws, "f.txt").await;
    assert_eq!(f["content"], "1\tsnapshot content", "{f}");

    let again = a
        .call("workspace.recover", json!({"workspaceId": ws}))
        .await
        .unwrap();
    assert_eq!(again["code"], "EEXIST", "{again}");
}

#[tokio::test]
async fn a_grace_window_keeps_fresh_chunks_in_the_bucket() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("grace");
    let store = url.clone();
    let k = TestKernel::with_users_tuned(move |c| {
        c.chunk_store = Some(ChunkStoreConfig {
            url: store,
            credentials: Some(seaweedfs::credentials()),
        });
        c.gc_grace = Duration::from_secs(3600);
    })
    .await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "f.txt", "young").await;
    let s = snapshot(&mut a, &ws).await;
    a.call(
        "workspace.snapshot.delete",
        json!({"snapshotId": s["snapshotId"]}),
    )
    .await
    .unwrap();
    let mut root = k.login("root", "root-password").await;
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["storeChunks"], 0, "stored within the grace window: {gc}");
    let young = Hash::of(b"young");
    assert_eq!(in_bucket(&url, &[young]).await, vec![young]);
}

#[tokio::test]
async fn an_unreachable_chunk_store_stops_the_kernel_at_start_naming_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let mut config = KernelConfig::new(dir.path().join("data"));
    config.chunk_store = Some(ChunkStoreConfig {
        url: format!("s3://snapshots?endpoint={endpoint}&deadline=2s"),
        credentials: Some(seaweedfs::credentials()),
    });
    let err = Kernel::open(config).await.unwrap_err().to_string();
    assert!(
        err.contains("s3://snapshots") && err.contains(&endpoint),
        "{err}"
    );
}
