//! `gsv serve --chunk-store s3://...`: snapshots mirrored to a real S3
//! server (SeaweedFS, started here on loopback; skipped without `weed`
//! unless `GSV_REQUIRE_S3` is set) and swept by `sys.gc`.

use std::time::Duration;

use gsv_kernel::client::GsvClient;
use gsv_kernel::{ChunkStoreConfig, Kernel, KernelConfig};
use serde_json::{Value, json};
use wsd_dofs::seaweedfs::{self, SeaweedFs};
use wsd_dofs::{ChunkStore, ObjectChunks};
use wsd_sync::Hash;

use crate::harness::{TestKernel, new_workspace};

async fn write(c: &mut GsvClient, ws: &str, path: &str, content: &str) {
    let r = c
        .call(
            "fs.write",
            json!({"path": format!("/workspaces/{ws}/{path}"), "content": content}),
        )
        .await
        .unwrap();
    assert_ne!(r["ok"], false, "{r}");
}

async fn snapshot(c: &mut GsvClient, ws: &str) -> Value {
    c.call("workspace.snapshot.create", json!({"workspaceId": ws}))
        .await
        .unwrap()
}

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

async fn start_seaweedfs() -> Option<SeaweedFs> {
    tokio::task::spawn_blocking(SeaweedFs::start).await.unwrap()
}

#[tokio::test]
async fn snapshots_are_copied_to_the_bucket_once_and_swept_when_no_snapshot_holds_them() {
    let Some(server) = start_seaweedfs().await else {
        return;
    };
    let url = server.url("kernel");
    let store = url.clone();
    let k = TestKernel::with_users_tuned(move |c| {
        c.chunk_store = Some(ChunkStoreConfig {
            url: store,
            credentials: Some(seaweedfs::credentials()),
        });
        c.gc_grace = Duration::ZERO;
    })
    .await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "f.txt", "first content").await;
    write(&mut a, &ws, "same.txt", "kept by every snapshot").await;
    let (first, same) = (
        Hash::of(b"first content"),
        Hash::of(b"kept by every snapshot"),
    );
    assert!(in_bucket(&url, &[first, same]).await.is_empty());

    let s1 = snapshot(&mut a, &ws).await;
    assert_eq!(s1["files"], 2, "{s1}");
    assert_eq!(in_bucket(&url, &[first, same]).await, vec![first, same]);

    write(&mut a, &ws, "f.txt", "second content").await;
    let second = Hash::of(b"second content");
    let s2 = snapshot(&mut a, &ws).await;
    assert_eq!(s2["newBytes"], "second content".len(), "{s2}");
    assert_eq!(in_bucket(&url, &[second]).await, vec![second]);

    let mut root = k.login("root", "root-password").await;
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["storeChunks"], 0, "both snapshots hold theirs: {gc}");
    a.call(
        "workspace.snapshot.delete",
        json!({"snapshotId": s1["snapshotId"]}),
    )
    .await
    .unwrap();
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["storeChunks"], 1, "{gc}");
    assert_eq!(gc["storeBytes"], "first content".len(), "{gc}");
    assert_eq!(
        in_bucket(&url, &[first, second, same]).await,
        vec![second, same],
        "only the deleted snapshot held `first content`"
    );
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
