//! End-to-end tests of the wire: a real server on `127.0.0.1:0` or a unix
//! socket in a temp dir, the real client, in-memory stores on both ends.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use capnp_rpc::{RpcSystem, rpc_twoparty_capnp};
use tokio::sync::{oneshot, watch};
use wsd_schema::workspace_capnp as wire;
use wsd_sync::driver::{self, SyncOptions};
use wsd_sync::limits::{MAX_HASHES_PER_CALL, MAX_PUSH_ENTRIES};
use wsd_sync::{
    Baseline, ChangeCursor, ChangeEntry, EntryState, ErrorCode, Hash, IgnoreRules, Object, Store,
    SyncError, SyncPath, chunk,
};

use super::transport::network;
use super::*;
use wsd_client::client::{self, Client, ReconnectingClient};
use wsd_sync::testkit::MemStore;

/// Runs a test body on a current-thread runtime inside a `LocalSet`, as
/// `wsd serve` runs the server.
fn run<F: Future<Output = ()>>(body: F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async {
        tokio::time::timeout(Duration::from_secs(60), body)
            .await
            .expect("test timed out");
    });
}

struct TestServer {
    addr: String,
    store: MemStore,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<MemStore, ServeError>>,
}

impl TestServer {
    async fn stop(mut self) -> Result<MemStore, ServeError> {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap()
    }
}

async fn start_on(
    bind: &str,
    store: MemStore,
    config: ServerConfig,
    exec: Option<FakeExec>,
) -> TestServer {
    let listener = Listener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut backend = Backend::new(store.clone()).unwrap();
    if let Some(exec) = exec {
        backend = backend.with_exec(exec);
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::task::spawn_local(serve(vec![listener], backend, config, async {
        let _ = stopped.await;
    }));
    TestServer {
        addr,
        store,
        stop: Some(stop),
        task,
    }
}

async fn start() -> TestServer {
    start_on(
        "127.0.0.1:0",
        MemStore::new(),
        ServerConfig::default(),
        None,
    )
    .await
}

fn opts<'a>(remote: &'a str, ignore: &'a IgnoreRules) -> SyncOptions<'a> {
    SyncOptions {
        remote_name: remote,
        ignore,
    }
}

/// Deterministic pseudo-random bytes (xorshift), so large files cut into
/// several content-defined chunks.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn dir_entry(path: &str) -> ChangeEntry {
    ChangeEntry {
        rev: 1,
        path: SyncPath::new(path).unwrap(),
        state: EntryState::Dir {
            mode: 0o755,
            mtime: 0,
        },
    }
}

#[test]
fn push_and_pull_through_the_wire_converge_over_tcp() {
    run(async {
        let server = start().await;
        push_pull_scenario(&server).await;
        server.stop().await.unwrap();
    });
}

#[test]
fn push_and_pull_through_the_wire_converge_over_a_unix_socket() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let bind = format!("unix:{}", dir.path().join("wsd.sock").display());
        let server = start_on(&bind, MemStore::new(), ServerConfig::default(), None).await;
        assert!(server.addr.starts_with("unix:"));
        push_pull_scenario(&server).await;
        server.stop().await.unwrap();
        assert!(
            !dir.path().join("wsd.sock").exists(),
            "the socket file is removed on shutdown"
        );
    });
}

async fn push_pull_scenario(server: &TestServer) {
    // `server.store` shares state with the server's store thread; the test
    // only reads it (and writes once, as a local change on the server side).
    let none = IgnoreRules::none();
    let mut a = MemStore::new();
    a.write_file("dir/a.txt", b"hello", 0o644);
    a.write_file("dir/sub/run.sh", b"#!/bin/sh\necho hi\n", 0o755);
    a.write_file("big.bin", &data(1, 700 * 1024), 0o600);
    a.write_file("empty", b"", 0o644);
    let mut ca = client::connect(&server.addr, None, "a").await.unwrap();
    driver::reconcile(&mut a, &mut ca, "server").await.unwrap();
    let report = driver::push(&mut a, &mut ca, &opts("server", &none), |_| {})
        .await
        .unwrap();
    assert!(
        report.objects >= 4,
        "several chunks of big.bin moved: {report:?}"
    );
    assert_eq!(
        server.store.live(),
        a.live(),
        "the server holds exactly what a pushed"
    );
    let wm = ca.watermarks().await.unwrap();
    assert_eq!(
        wm.fetch_cursor, report.cursor,
        "the server's fetch cursor for a is a's push cursor"
    );

    // A second peer pulls everything.
    let mut b = MemStore::new();
    let mut cb = client::connect(&server.addr, None, "b").await.unwrap();
    let pulled = driver::pull(&mut b, &mut cb, &opts("server", &none), |_| {})
        .await
        .unwrap();
    assert_eq!(b.live(), a.live());
    assert_eq!(pulled.entries as usize, a.live().len());

    // Incremental: a delete and an in-place edit move only what changed.
    a.delete("dir/a.txt");
    let mut big = data(1, 700 * 1024);
    big[350 * 1024] ^= 0xff;
    a.write_file("big.bin", &big, 0o600);
    let report = driver::push(&mut a, &mut ca, &opts("server", &none), |_| {})
        .await
        .unwrap();
    assert!(
        report.deduplicated_bytes > 0,
        "unchanged chunks are not re-sent: {report:?}"
    );
    driver::pull(&mut b, &mut cb, &opts("server", &none), |_| {})
        .await
        .unwrap();
    assert_eq!(b.live(), a.live());
    assert_eq!(
        cb.read_entry(&SyncPath::new("dir/a.txt").unwrap())
            .await
            .unwrap()
            .unwrap()
            .state,
        EntryState::Delete,
        "readEntry returns the tombstone"
    );
    assert_eq!(
        cb.read_entry(&SyncPath::new("nope").unwrap())
            .await
            .unwrap(),
        None
    );

    // A change made on the server side reaches a; a's own pushes are not
    // echoed back to it.
    server.store.write_file("from-server", b"s", 0o644);
    let pulled = driver::pull(&mut a, &mut ca, &opts("server", &none), |_| {})
        .await
        .unwrap();
    assert_eq!(
        pulled.entries, 1,
        "only the server's own change comes back: {pulled:?}"
    );
    assert_eq!(a.live(), server.store.live());
}

#[test]
fn a_pipelined_push_of_many_batches_and_large_files_converges() {
    // Batches of small files interleaved with files larger than a batch's
    // object budget: uploads overlap applies, large files go alone, and
    // every push must find its objects staged (uploads travel on another
    // capability than the pushes).
    run(async {
        let server = start().await;
        let none = IgnoreRules::none();
        let mut a = MemStore::new();
        for i in 0..700 {
            a.write_file(
                &format!("d{}/f{i:03}", i % 7),
                &data(i, 100 + (i as usize % 5) * 3000),
                0o644,
            );
            if i % 250 == 0 {
                a.write_file(
                    &format!("d{}/big{i}", i % 7),
                    &data(10_000 + i, 5 << 20),
                    0o644,
                );
            }
        }
        let mut ca = client::connect(&server.addr, None, "a").await.unwrap();
        driver::reconcile(&mut a, &mut ca, "server").await.unwrap();
        let report = driver::push(&mut a, &mut ca, &opts("server", &none), |_| {})
            .await
            .unwrap();
        assert!(report.batches >= 5, "{report:?}");
        assert_eq!(server.store.live(), a.live());
        assert_eq!(
            driver::push(&mut a, &mut ca, &opts("server", &none), |_| {})
                .await
                .unwrap()
                .entries,
            0
        );
        server.stop().await.unwrap();
    });
}

#[test]
fn a_wrong_token_is_eauth_and_the_right_one_connects() {
    run(async {
        let config = ServerConfig {
            token: Some(Token::new(b"s3cret".to_vec()).unwrap()),
            ..Default::default()
        };
        let server = start_on("127.0.0.1:0", MemStore::new(), config, None).await;
        let err = client::connect(&server.addr, Some(b"wrong".to_vec()), "p")
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Auth, "{err}");
        let err = client::connect(&server.addr, None, "p").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Auth, "{err}");
        let c = client::connect(&server.addr, Some(b"s3cret".to_vec()), "p")
            .await
            .unwrap();
        c.watermarks().await.unwrap();
        server.stop().await.unwrap();
    });
}

/// Dials and calls `Bootstrap.connect` with arbitrary arguments.
async fn raw_connect(addr: &str, version: u32, peer: &str) -> Result<(), WireError> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut rpc = RpcSystem::new(network(stream, rpc_twoparty_capnp::Side::Client), None);
    let bootstrap: wire::bootstrap::Client = rpc.bootstrap(rpc_twoparty_capnp::Side::Server);
    tokio::task::spawn_local(rpc);
    let mut req = bootstrap.connect_request();
    req.get().set_protocol_version(version);
    req.get().set_peer(peer);
    req.send().promise.await?;
    Ok(())
}

/// Dials and returns the generated `Sync` capability itself, for sending
/// requests the real client never builds.
async fn raw_sync(addr: &str) -> wire::sync::Client {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut rpc = RpcSystem::new(network(stream, rpc_twoparty_capnp::Side::Client), None);
    let bootstrap: wire::bootstrap::Client = rpc.bootstrap(rpc_twoparty_capnp::Side::Server);
    tokio::task::spawn_local(rpc);
    let mut req = bootstrap.connect_request();
    req.get().set_protocol_version(PROTOCOL_VERSION);
    req.get().set_peer("raw");
    let response = req.send().promise.await.unwrap();
    let workspace = response.get().unwrap().get_workspace().unwrap();
    workspace.sync_request().send().pipeline.get_sync()
}

#[test]
fn an_unsupported_protocol_version_is_eprotocol() {
    run(async {
        let server = start().await;
        let err = raw_connect(&server.addr, PROTOCOL_VERSION + 1, "p")
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Protocol, "{err}");
        raw_connect(&server.addr, PROTOCOL_VERSION, "p")
            .await
            .unwrap();
        let err = raw_connect(&server.addr, PROTOCOL_VERSION, "")
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Invalid, "an empty peer name: {err}");
        server.stop().await.unwrap();
    });
}

#[test]
fn a_hostile_path_in_a_push_is_einval_and_nothing_is_applied() {
    run(async {
        let server = start().await;
        let raw = raw_sync(&server.addr).await;
        // The peer name `raw_sync` connects as: its watermarks must not move.
        let c = client::connect(&server.addr, None, "raw").await.unwrap();
        for bad in ["../escape", "/etc/passwd", "a/../../b", "a//b", "a\0b", ""] {
            let mut req = raw.push_request();
            {
                let mut p = req.get();
                let mut sender = p.reborrow().init_sender();
                sender.set_rev(5);
                sender.set_complete(());
                let mut list = p.init_entries(2);
                let mut ok = list.reborrow().get(0);
                ok.set_rev(5);
                ok.set_path("fine");
                ok.init_dir().set_mode(0o755);
                let mut evil = list.get(1);
                evil.set_rev(5);
                evil.set_path(bad);
                evil.init_dir().set_mode(0o755);
            }
            let err = WireError::from(req.send().promise.await.err().expect("push must fail"));
            assert_eq!(err.code, ErrorCode::Invalid, "{bad:?}: {err}");
        }
        assert!(
            server.store.live().is_empty(),
            "nothing of a rejected batch is applied"
        );
        assert_eq!(server.store.clone().current_rev().unwrap(), 0);
        assert_eq!(
            c.watermarks().await.unwrap().fetch_cursor,
            ChangeCursor::ZERO
        );
        server.stop().await.unwrap();
    });
}

#[test]
fn over_a_limit_is_elimit_and_the_connection_stays_usable() {
    run(async {
        let server = start().await;
        let c = client::connect(&server.addr, None, "p").await.unwrap();
        let many: Vec<ChangeEntry> = (0..=MAX_PUSH_ENTRIES)
            .map(|i| dir_entry(&format!("d{i}")))
            .collect();
        let err = c
            .push(Some(&ChangeCursor::at(1)), &many, Baseline::Off, &[])
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit);
        assert!(err.message.contains("entries per push"), "{err}");

        let hashes = vec![Hash::of(b"x"); MAX_HASHES_PER_CALL + 1];
        let err = c.has_objects(&hashes).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit);
        assert!(err.message.contains("hashes per call"), "{err}");
        let err = c.fetch_objects(&hashes).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit, "{err}");

        let huge = vec![7u8; chunk::MAX_CHUNK + 1];
        let err = c
            .push_objects(&[Object {
                hash: Hash::of(&huge),
                bytes: huge,
            }])
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit);
        assert!(err.message.contains("object size"), "{err}");

        let patterns: Vec<String> = (0..=wsd_sync::limits::MAX_IGNORE_PATTERNS)
            .map(|i| format!("p{i}"))
            .collect();
        let err = c
            .fetch_changes(&ChangeCursor::ZERO, &patterns)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit, "{err}");
        // The same bound, and the same check of each pattern, for a push's
        // exclusions: a refused push applies nothing.
        let err = c
            .push(
                Some(&ChangeCursor::at(1)),
                &[dir_entry("refused")],
                Baseline::Sweep,
                &patterns,
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit, "{err}");
        let err = c
            .push(
                Some(&ChangeCursor::at(1)),
                &[dir_entry("refused")],
                Baseline::Sweep,
                &["a{b".to_owned()],
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Invalid, "{err}");
        assert!(err.message.contains("a{b"), "{err}");
        assert_eq!(c.watermarks().await.unwrap().current_rev, 0);

        let long = "x/".repeat(wsd_sync::limits::MAX_PATH_DEPTH) + "y";
        let mut req = raw_sync(&server.addr).await.read_entry_request();
        req.get().set_path(long.as_str());
        let err = WireError::from(req.send().promise.await.err().unwrap());
        assert_eq!(err.code, ErrorCode::Limit, "{err}");

        // Still usable afterwards.
        assert!(c.is_connected());
        c.push(
            Some(&ChangeCursor::at(1)),
            &[dir_entry("ok")],
            Baseline::Off,
            &[],
        )
        .await
        .unwrap();
        assert_eq!(c.watermarks().await.unwrap().current_rev, 1);
        server.stop().await.unwrap();
    });
}

#[test]
fn calls_beyond_the_in_flight_limit_are_elimit() {
    run(async {
        let store = MemStore::new();
        store.set_apply_delay(Duration::from_millis(1000));
        let config = ServerConfig {
            max_in_flight_calls: 1,
            ..Default::default()
        };
        let server = start_on("127.0.0.1:0", store, config, None).await;
        let c = client::connect(&server.addr, None, "p").await.unwrap();
        let slow = {
            let c = c.clone();
            tokio::task::spawn_local(async move {
                c.push(
                    Some(&ChangeCursor::at(1)),
                    &[dir_entry("d")],
                    Baseline::Off,
                    &[],
                )
                .await
            })
        };
        // Leave the push ample time to reach the (slow) store.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let err = c.watermarks().await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit);
        assert!(err.message.contains("in-flight calls"), "{err}");
        slow.await.unwrap().unwrap();
        c.watermarks().await.unwrap();
        server.stop().await.unwrap();
    });
}

#[test]
fn a_corrupted_object_is_eprotocol_and_is_not_stored() {
    run(async {
        let server = start().await;
        let c = client::connect(&server.addr, None, "p").await.unwrap();
        let good = Object {
            hash: Hash::of(b"good"),
            bytes: b"good".to_vec(),
        };
        let bad = Object {
            hash: Hash::of(b"claimed"),
            bytes: b"actual".to_vec(),
        };
        let err = c
            .push_objects(&[good.clone(), bad.clone()])
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Protocol, "{err}");
        assert_eq!(
            c.has_objects(&[bad.hash]).await.unwrap(),
            Vec::<Hash>::new()
        );
        assert_eq!(
            server.store.object_count(),
            0,
            "nothing of the failed write was kept"
        );
        // A correct upload on the same connection works.
        c.push_objects(std::slice::from_ref(&good)).await.unwrap();
        assert_eq!(
            c.has_objects(&[good.hash, bad.hash]).await.unwrap(),
            vec![good.hash]
        );
        server.stop().await.unwrap();
    });
}

#[test]
fn unknown_hashes_are_eunknown_hash() {
    run(async {
        let server = start().await;
        let c = client::connect(&server.addr, None, "p").await.unwrap();
        let held = Object {
            hash: Hash::of(b"held"),
            bytes: b"held".to_vec(),
        };
        c.push_objects(std::slice::from_ref(&held)).await.unwrap();
        let missing = Hash::of(b"missing");
        let err = c.fetch_objects(&[held.hash, missing]).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::UnknownHash);
        assert!(
            err.message.contains(&missing.to_string()),
            "the message names the hash: {err}"
        );
        assert_eq!(
            c.fetch_objects(&[held.hash]).await.unwrap(),
            vec![held.clone()]
        );

        // A push referencing a chunk that was never sent changes nothing.
        let file = ChangeEntry {
            rev: 1,
            path: SyncPath::new("f").unwrap(),
            state: EntryState::File {
                mode: 0o644,
                mtime: 0,
                size: 7,
                chunks: vec![wsd_sync::ChunkRef {
                    hash: missing,
                    size: 7,
                }],
            },
        };
        let err = c
            .push(
                Some(&ChangeCursor::at(1)),
                &[dir_entry("d"), file],
                Baseline::Off,
                &[],
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::UnknownHash, "{err}");
        assert!(server.store.live().is_empty());
        server.stop().await.unwrap();
    });
}

/// A cut-able TCP proxy: every connection open when `cut` is bumped is
/// dropped; later connections go through.
async fn proxy(target: String) -> (String, watch::Sender<u64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (cut, cuts) = watch::channel(0u64);
    tokio::task::spawn_local(async move {
        loop {
            let (mut inbound, _) = listener.accept().await.unwrap();
            let mut outbound = tokio::net::TcpStream::connect(&target).await.unwrap();
            let mut cuts = cuts.clone();
            cuts.mark_unchanged();
            tokio::task::spawn_local(async move {
                tokio::select! {
                    biased;
                    _ = cuts.changed() => {}
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                }
            });
        }
    });
    (addr, cut)
}

#[test]
fn a_connection_cut_mid_pull_resumes_and_converges() {
    run(async {
        let server = start().await;
        for i in 0..600 {
            server.store.write_file(
                &format!("f{i:03}"),
                format!("content {i}").as_bytes(),
                0o644,
            );
        }
        let (addr, cut) = proxy(server.addr.clone()).await;
        let none = IgnoreRules::none();
        let mut b = MemStore::new();
        let mut remote = ReconnectingClient::new(addr, None, "b");
        let mut batches = 0;
        let err = driver::pull(&mut b, &mut remote, &opts("server", &none), |_| {
            batches += 1;
            if batches == 1 {
                cut.send_modify(|g| *g += 1);
            }
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Shutdown, "{err}");
        let applied = b.live().len();
        // The cut comes after the first batch was applied; the next one may
        // have arrived already (the client asks for it ahead) and be applied
        // too. Whole batches are checkpointed, never more than were received.
        assert!(
            applied >= wsd_sync::limits::BATCH_ENTRIES
                && applied.is_multiple_of(wsd_sync::limits::BATCH_ENTRIES)
                && applied < 600,
            "whole batches were checkpointed: {applied}"
        );

        let report = driver::pull(&mut b, &mut remote, &opts("server", &none), |_| {})
            .await
            .unwrap();
        assert_eq!(
            report.entries as usize,
            600 - applied,
            "the pull resumed after the checkpoint"
        );
        assert_eq!(remote.dials(), 2);
        assert_eq!(b.live(), server.store.live());
        server.stop().await.unwrap();
    });
}

#[test]
fn graceful_shutdown_finishes_the_in_flight_transaction_and_closes_listeners() {
    run(async {
        let store = MemStore::new();
        store.set_apply_delay(Duration::from_millis(600));
        let server = start_on("127.0.0.1:0", store, ServerConfig::default(), None).await;
        let addr = server.addr.clone();
        let c = client::connect(&addr, None, "p").await.unwrap();
        let push = {
            let c = c.clone();
            tokio::task::spawn_local(async move {
                c.push(
                    Some(&ChangeCursor::at(1)),
                    &[dir_entry("d")],
                    Baseline::Off,
                    &[],
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut store = server.stop().await.unwrap();
        assert_eq!(
            store.current_rev().unwrap(),
            1,
            "the push in flight at shutdown committed"
        );
        assert_eq!(
            store.watermarks("p").unwrap().fetch_cursor,
            ChangeCursor::at(1)
        );
        // The caller got its answer, or a retryable error.
        if let Err(e) = push.await.unwrap() {
            assert!(e.is_retryable(), "{e}");
        }
        let err = c.watermarks().await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Shutdown, "{err}");
        let err = client::connect(&addr, None, "p").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Io, "the listener is closed: {err}");
    });
}

#[test]
fn a_reconnecting_client_redials_after_a_restart() {
    run(async {
        let server = start().await;
        let addr = server.addr.clone();
        let mut remote = ReconnectingClient::new(addr.clone(), None, "p");
        let none = IgnoreRules::none();
        let mut a = MemStore::new();
        a.write_file("x", b"1", 0o644);
        driver::push(&mut a, &mut remote, &opts("server", &none), |_| {})
            .await
            .unwrap();
        let store = server.stop().await.unwrap();
        // Same store, same port, new process-equivalent.
        let server = start_on(&addr, store, ServerConfig::default(), None).await;
        a.write_file("y", b"2", 0o644);
        driver::push(&mut a, &mut remote, &opts("server", &none), |_| {})
            .await
            .unwrap();
        assert_eq!(remote.dials(), 2);
        assert_eq!(server.store.live(), a.live());
        server.stop().await.unwrap();
    });
}

// ---------------------------------------------------------------------------
// Shell

/// An exec runner stand-in: `exec` emits `command` parsed as a count of
/// stdout lines, then exit 0; `kill` fails with the code named by the id.
#[derive(Default)]
struct FakeExec {
    /// Events handed to the server so far, across subscriptions.
    produced: Rc<Cell<u64>>,
}

struct FakeEvents {
    id: String,
    lines: u64,
    next_seq: u64,
    produced: Rc<Cell<u64>>,
}

impl ExecEvents for FakeEvents {
    async fn next(&mut self) -> Result<Option<ExecEvent>, WireError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.produced.set(self.produced.get() + 1);
        let kind = match seq {
            s if s <= self.lines => ExecEventKind::Stdout(format!("line {s}\n").into_bytes()),
            s if s == self.lines + 1 => ExecEventKind::Exit(0),
            _ => return Ok(None),
        };
        Ok(Some(ExecEvent {
            id: self.id.clone(),
            seq,
            kind,
            rev: 0,
        }))
    }
}

impl ExecBackend for FakeExec {
    type Events = FakeEvents;

    async fn exec(&self, request: ExecRequest) -> Result<(String, FakeEvents), WireError> {
        let lines = request
            .command
            .parse()
            .map_err(|_| WireError::new(ErrorCode::Invalid, "not a count"))?;
        let id = request.id.unwrap_or_else(|| "e1".into());
        Ok((
            id.clone(),
            FakeEvents {
                id,
                lines,
                next_seq: 1,
                produced: self.produced.clone(),
            },
        ))
    }

    async fn get(&self, id: &str, from: ResumeFrom) -> Result<FakeEvents, WireError> {
        if id == "missing" {
            return Err(WireError::new(ErrorCode::NotFound, format!("exec {id}")));
        }
        let next_seq = match from {
            ResumeFrom::Start => 1,
            ResumeFrom::After(n) => n + 1,
            ResumeFrom::Tail => 11,
        };
        Ok(FakeEvents {
            id: id.into(),
            lines: 10,
            next_seq,
            produced: self.produced.clone(),
        })
    }

    async fn kill(&self, id: &str, _signal: ExecSignal) -> Result<(), WireError> {
        let code = ErrorCode::parse(id).ok_or_else(|| WireError::new(ErrorCode::NotFound, id))?;
        Err(WireError::new(
            code,
            format!("raised for {id}: with a colon"),
        ))
    }

    async fn dispose(&self, _id: &str) -> Result<(), WireError> {
        Ok(())
    }

    async fn write_stdin(&self, id: &str, _bytes: Vec<u8>) -> Result<(), WireError> {
        Err(
            WireError::new(ErrorCode::Invalid, format!("stdin of exec {id} is closed"))
                .with_subject(id),
        )
    }

    async fn close_stdin(&self, _id: &str) -> Result<(), WireError> {
        Ok(())
    }

    async fn live(&self) -> Vec<String> {
        // The fake keeps no commands running between calls.
        Vec::new()
    }
}

async fn collect(stream: &mut client::ExecStream) -> Vec<ExecEvent> {
    let mut out = Vec::new();
    while let Some(e) = stream.next().await.unwrap() {
        out.push(e);
    }
    out
}

#[test]
fn every_error_code_round_trips_through_the_wire() {
    run(async {
        let server = start_on(
            "127.0.0.1:0",
            MemStore::new(),
            ServerConfig::default(),
            Some(FakeExec::default()),
        )
        .await;
        let c = client::connect(&server.addr, None, "p").await.unwrap();
        for code in ErrorCode::ALL {
            let err = c
                .kill_exec(code.as_str(), ExecSignal::Term)
                .await
                .unwrap_err();
            assert_eq!(err.code, code);
            assert_eq!(err.message, format!("raised for {code}: with a colon"));
            // ... and into the sync core's error type with the code intact.
            assert_eq!(SyncError::from(err).code(), code);
        }
        server.stop().await.unwrap();
    });
}

#[test]
fn exec_events_stream_in_order_and_end_cleanly() {
    run(async {
        let server = start_on(
            "127.0.0.1:0",
            MemStore::new(),
            ServerConfig::default(),
            Some(FakeExec::default()),
        )
        .await;
        let c = client::connect(&server.addr, None, "p").await.unwrap();
        let request = ExecRequest {
            command: "1000".into(),
            id: Some("job".into()),
            ..Default::default()
        };
        let mut stream = c.exec(&request).await.unwrap();
        assert_eq!(stream.id(), "job");
        let events = collect(&mut stream).await;
        assert_eq!(events.len(), 1001);
        assert!(
            events
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == i as u64 + 1 && e.id == "job")
        );
        assert_eq!(events.last().unwrap().kind, ExecEventKind::Exit(0));
        assert_eq!(stream.next().await.unwrap(), None);

        let mut resumed = c.get_exec("job", ResumeFrom::After(8)).await.unwrap();
        let seqs: Vec<u64> = collect(&mut resumed).await.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![9, 10, 11]);
        let err = c.get_exec("missing", ResumeFrom::Start).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        let err = c
            .exec(&ExecRequest {
                command: "x".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Invalid);
        c.dispose_exec("job").await.unwrap();
        server.stop().await.unwrap();
    });
}

#[test]
fn shell_calls_without_an_exec_runner_are_eio() {
    run(async {
        let server = start().await;
        let c: Client = client::connect(&server.addr, None, "p").await.unwrap();
        let err = c
            .exec(&ExecRequest {
                command: "true".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Io);
        assert!(err.message.contains("exec not available"), "{err}");
        let err = c.kill_exec("x", ExecSignal::Kill).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Io);
        server.stop().await.unwrap();
    });
}

/// Waits until `counter` stops moving (every task on this thread is idle
/// or blocked) and returns its value.
async fn settle(counter: &Cell<u64>) -> u64 {
    let mut last = counter.get();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = counter.get();
        if now == last {
            return now;
        }
        last = now;
    }
}

#[test]
fn a_reader_that_stops_reading_stalls_the_runner_and_dropping_the_stream_detaches() {
    run(async {
        let exec = FakeExec::default();
        let produced = exec.produced.clone();
        let server = start_on(
            "127.0.0.1:0",
            MemStore::new(),
            ServerConfig::default(),
            Some(exec),
        )
        .await;
        let c = client::connect(&server.addr, None, "p").await.unwrap();
        let request = ExecRequest {
            command: "100000000".into(),
            ..Default::default()
        };
        let mut stream = c.exec(&request).await.unwrap();
        for seq in 1..=5 {
            assert_eq!(stream.next().await.unwrap().unwrap().seq, seq);
        }
        let stalled = settle(&produced).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            produced.get(),
            stalled,
            "no progress while the reader is not reading"
        );
        assert!(
            stalled < 10_000,
            "only a bounded window is in flight: {stalled}"
        );
        // Reading resumes the flow.
        for _ in 0..100 {
            stream.next().await.unwrap().unwrap();
        }
        drop(stream);
        let detached = settle(&produced).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            produced.get(),
            detached,
            "the delivery stopped with the subscription"
        );
        c.watermarks().await.unwrap();
        server.stop().await.unwrap();
    });
}

#[test]
fn connections_beyond_the_bound_wait_until_one_closes() {
    run(async {
        let config = ServerConfig {
            max_connections: 1,
            ..Default::default()
        };
        let server = start_on("127.0.0.1:0", MemStore::new(), config, None).await;
        let first = client::connect(&server.addr, None, "a").await.unwrap();
        first.watermarks().await.unwrap();
        let second = {
            let addr = server.addr.clone();
            tokio::task::spawn_local(async move { client::connect(&addr, None, "b").await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "the second peer waits while the first holds the only slot"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        second.watermarks().await.unwrap();
        server.stop().await.unwrap();
    });
}

#[test]
fn a_silent_connection_is_dropped_at_the_handshake_deadline() {
    use tokio::io::AsyncReadExt;
    run(async {
        let config = ServerConfig {
            handshake_timeout: Duration::from_millis(200),
            ..Default::default()
        };
        let server = start_on("127.0.0.1:0", MemStore::new(), config, None).await;
        let mut silent = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
        let mut buf = [0u8; 16];
        // The server closes its end: the read sees end-of-stream (or a
        // reset), never data and never a hang (the test's own bound).
        let n = silent.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "the server sent bytes to a peer that said nothing");
        server.stop().await.unwrap();
    });
}

#[test]
fn idle_unauthenticated_connections_do_not_keep_a_real_peer_out() {
    run(async {
        let server = start().await;
        // More idle peers than either connection bound.
        let mut idle = Vec::new();
        for _ in 0..(limits::DEFAULT_MAX_CONNECTIONS + limits::DEFAULT_MAX_UNAUTHENTICATED + 20) {
            idle.push(tokio::net::TcpStream::connect(&server.addr).await.unwrap());
        }
        let c = client::connect(&server.addr, None, "real").await.unwrap();
        c.watermarks().await.unwrap();
        drop(idle);
        server.stop().await.unwrap();
    });
}

#[test]
fn next_with_max_zero_is_elimit_as_the_schema_promises() {
    run(async {
        let server = start().await;
        let raw = raw_sync(&server.addr).await;
        let mut open = raw.fetch_changes_request();
        open.get().init_after().set_complete(());
        let changes = open.send().pipeline.get_changes();
        for (max, code) in [(0, ErrorCode::Limit), (4097, ErrorCode::Limit)] {
            let mut req = changes.next_request();
            req.get().set_max(max);
            let err = WireError::from(req.send().promise.await.err().expect("next must fail"));
            assert_eq!(err.code, code, "max={max}: {err}");
            assert_eq!(err.subject.as_deref(), Some("entries per next"));
        }
        let mut req = changes.next_request();
        req.get().set_max(1);
        let response = req.send().promise.await.unwrap();
        assert_eq!(response.get().unwrap().get_entries().unwrap().len(), 0);
        server.stop().await.unwrap();
    });
}

#[test]
fn wait_changes_answers_when_another_peer_pushes_and_otherwise_at_its_timeout() {
    run(async {
        let server = start().await;
        let waiter = client::connect(&server.addr, None, "waiter").await.unwrap();
        let writer = client::connect(&server.addr, None, "writer").await.unwrap();

        // Nothing changes: the poll ends at its (short) timeout with rev 0.
        assert_eq!(
            waiter
                .wait_changes(0, Duration::from_millis(50))
                .await
                .unwrap(),
            0
        );

        // The test's own 60 s bound is what fails a poll that never wakes.
        let poll = {
            let waiter = waiter.clone();
            tokio::task::spawn_local(async move {
                waiter.wait_changes(0, Duration::from_secs(3600)).await
            })
        };
        tokio::task::yield_now().await;
        // Another call on the waiting connection goes on meanwhile.
        assert_eq!(waiter.watermarks().await.unwrap().current_rev, 0);
        writer
            .push(None, &[dir_entry("d")], Baseline::Off, &[])
            .await
            .unwrap();
        assert_eq!(poll.await.unwrap().unwrap(), 1);

        // Already past `after`: answers at once.
        assert_eq!(
            waiter
                .wait_changes(0, Duration::from_secs(3600))
                .await
                .unwrap(),
            1
        );
        server.stop().await.unwrap();
    });
}

#[test]
fn push_and_pull_report_planned_totals_before_objects_move_and_they_match_what_moved() {
    run(async {
        let server = start().await;
        let none = IgnoreRules::none();
        let mut a = MemStore::new();
        // More entries than one batch, a file larger than a batch's object
        // budget, and a duplicate whose chunks move once.
        for i in 0..300 {
            a.write_file(&format!("small/{i}"), &data(i + 10, 2000), 0o644);
        }
        a.write_file("big.bin", &data(1, 5 * 1024 * 1024), 0o600);
        a.write_file("copy.bin", &data(1, 5 * 1024 * 1024), 0o600);
        let mut ca = client::connect(&server.addr, None, "a").await.unwrap();
        driver::reconcile(&mut a, &mut ca, "server").await.unwrap();
        let mut seen = Vec::new();
        let pushed = driver::push(&mut a, &mut ca, &opts("server", &none), |r| {
            seen.push(r.clone())
        })
        .await
        .unwrap();
        assert!(pushed.batches > 1, "{pushed:?}");
        assert!(
            seen.iter()
                .all(|r| r.object_bytes <= r.planned_bytes && r.entries <= r.planned_entries),
            "what moved never runs ahead of the plan: {seen:?}"
        );
        assert!(seen[0].planned_bytes > 0 && seen[0].object_bytes == 0);
        assert!(pushed.plan_complete);
        assert_eq!(pushed.planned_entries, pushed.entries);
        assert_eq!(pushed.planned_bytes, pushed.object_bytes);
        assert!(pushed.deduplicated_bytes >= 5 * 1024 * 1024, "{pushed:?}");

        let mut b = MemStore::new();
        let mut cb = client::connect(&server.addr, None, "b").await.unwrap();
        let mut seen = Vec::new();
        let pulled = driver::pull(&mut b, &mut cb, &opts("server", &none), |r| {
            seen.push(r.clone())
        })
        .await
        .unwrap();
        assert!(
            seen.iter()
                .all(|r| r.object_bytes <= r.planned_bytes && r.entries <= r.planned_entries),
            "what moved never runs ahead of the plan: {seen:?}"
        );
        assert!(
            seen.len() > pulled.batches as usize,
            "a pull reports object slices within a batch too"
        );
        assert!(pulled.plan_complete);
        assert_eq!(pulled.planned_entries, pulled.entries);
        assert_eq!(pulled.planned_bytes, pulled.object_bytes);
        assert_eq!(b.live(), a.live());
        server.stop().await.unwrap();
    });
}

/// A workspace store one of whose files is rewritten (same length, other
/// bytes) right before a push first reads objects: a command writing into
/// the directory while it is pushed.
struct RewrittenWhilePushed {
    inner: crate::store::WorkspaceStore,
    rewrite: Option<(std::path::PathBuf, Vec<u8>)>,
}

impl Store for RewrittenWhilePushed {
    fn current_rev(&mut self) -> Result<u64, SyncError> {
        self.inner.current_rev()
    }
    fn watermarks(&mut self, remote: &str) -> Result<wsd_sync::Watermarks, SyncError> {
        self.inner.watermarks(remote)
    }
    fn open_changes(&mut self, after: &ChangeCursor) -> Result<wsd_sync::ChangesWindow, SyncError> {
        self.inner.open_changes(after)
    }
    fn changes(
        &mut self,
        query: wsd_sync::ChangesQuery<'_>,
    ) -> Result<Vec<ChangeEntry>, SyncError> {
        self.inner.changes(query)
    }
    fn read_entry(&mut self, path: &SyncPath) -> Result<Option<ChangeEntry>, SyncError> {
        self.inner.read_entry(path)
    }
    fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        self.inner.has_objects(hashes)
    }
    fn read_object(&mut self, hash: &Hash) -> Result<Vec<u8>, SyncError> {
        self.inner.read_object(hash)
    }
    fn object_reader<'a>(
        &'a mut self,
        wanted: &[(Hash, u32)],
    ) -> Result<Box<dyn wsd_sync::ObjectReader + 'a>, SyncError> {
        if let Some((path, bytes)) = self.rewrite.take() {
            std::fs::write(path, bytes).unwrap();
        }
        self.inner.object_reader(wanted)
    }
    fn stage_objects(&mut self, objects: &[Object]) -> Result<(), SyncError> {
        self.inner.stage_objects(objects)
    }
    fn apply(
        &mut self,
        batch: wsd_sync::ApplyBatch<'_>,
    ) -> Result<wsd_sync::ApplyOutcome, SyncError> {
        self.inner.apply(batch)
    }
    fn set_push_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        self.inner.set_push_cursor(remote, cursor)
    }
    fn set_fetch_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        self.inner.set_fetch_cursor(remote, cursor)
    }
}

#[test]
fn a_file_rewritten_while_it_is_pushed_fails_the_push_here_and_the_next_push_sends_it() {
    // Objects go from the file straight into the upload's messages: bytes
    // that no longer match the index are caught before they are sent, and
    // the failure is the local store's, naming the file.
    run(async {
        let server = start().await;
        let tmp = tempfile::TempDir::new().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a-small"), b"small").unwrap();
        std::fs::write(root.join("big"), data(1, 300_000)).unwrap();
        let mut inner = crate::store::WorkspaceStore::open(
            &root,
            &tmp.path().join("state"),
            crate::store::StoreOptions {
                watch: false,
                auto_settle: false,
                ..Default::default()
            },
        )
        .unwrap();
        inner.settle().unwrap();
        let mut local = RewrittenWhilePushed {
            inner,
            rewrite: Some((root.join("big"), data(2, 300_000))),
        };
        let none = IgnoreRules::none();
        let mut c = client::connect(&server.addr, None, "a").await.unwrap();
        driver::reconcile(&mut local, &mut c, "server")
            .await
            .unwrap();
        let err = driver::push(&mut local, &mut c, &opts("server", &none), |_| {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Io, "{err}");
        assert!(
            !matches!(err, SyncError::Remote { .. }) && err.to_string().contains("big changed"),
            "{err}"
        );
        assert!(server.store.live().is_empty(), "nothing was applied");
        // The next settle re-hashes the file; the next push sends it whole.
        local.inner.settle().unwrap();
        driver::push(&mut local, &mut c, &opts("server", &none), |_| {})
            .await
            .unwrap();
        let here = local
            .inner
            .read_entry(&SyncPath::new("big").unwrap())
            .unwrap()
            .unwrap();
        let there = server.store.live();
        assert!(there["big"].same_content(&here.state), "{there:?}");
        assert_eq!(there.len(), 2);
        server.stop().await.unwrap();
    });
}
