//! Regression test for the daemon's memory growth under the soak: every
//! exec's event sink (and every `fetchObjects` sink) used to leave about
//! 450 bytes in the connection until it closed, because capnp-rpc's
//! per-capability stream flow controller is never freed (see
//! `wsd::rpc::stream`). Counts live heap bytes with a counting allocator;
//! its own binary, so no other test allocates meanwhile.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use wsd::rpc::{
    Backend, ExecBackend, ExecEvent, ExecEventKind, ExecEvents, ExecRequest, ExecSignal, Listener,
    ResumeFrom, ServerConfig, WireError, serve,
};
use wsd::store::{StoreOptions, WorkspaceStore};
use wsd_client::client;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// An exec backend whose every exec exits at once with code 0.
struct InstantExit;

struct OneExit(bool);

impl ExecEvents for OneExit {
    async fn next(&mut self) -> Result<Option<ExecEvent>, WireError> {
        if std::mem::replace(&mut self.0, true) {
            return Ok(None);
        }
        Ok(Some(ExecEvent {
            id: "x".into(),
            seq: 1,
            kind: ExecEventKind::Exit(0),
            rev: 0,
        }))
    }
}

impl ExecBackend for InstantExit {
    type Events = OneExit;
    async fn exec(&self, _: ExecRequest) -> Result<(String, OneExit), WireError> {
        Ok(("x".into(), OneExit(false)))
    }
    async fn get(&self, _: &str, _: ResumeFrom) -> Result<OneExit, WireError> {
        Ok(OneExit(false))
    }
    async fn kill(&self, _: &str, _: ExecSignal) -> Result<(), WireError> {
        Ok(())
    }
    async fn dispose(&self, _: &str) -> Result<(), WireError> {
        Ok(())
    }
    async fn write_stdin(&self, id: &str, _: Vec<u8>) -> Result<(), WireError> {
        // Every exec here has already exited.
        Err(WireError::new(
            wsd_sync::ErrorCode::Invalid,
            format!("stdin of exec {id} is closed"),
        ))
    }
    async fn close_stdin(&self, _: &str) -> Result<(), WireError> {
        Ok(())
    }

    async fn live(&self) -> Vec<String> {
        Vec::new()
    }
}

async fn run_execs(c: &client::Client, n: usize) {
    let req = ExecRequest {
        command: "true".into(),
        ..ExecRequest::default()
    };
    for _ in 0..n {
        let mut s = c.exec(&req).await.expect("exec");
        let mut exit = None;
        while let Some(ev) = s.next().await.expect("event") {
            if let ExecEventKind::Exit(code) = ev.kind {
                exit = Some(code);
            }
        }
        assert_eq!(exit, Some(0));
    }
}

#[test]
fn execs_on_one_connection_do_not_grow_the_heap() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async {
        let store = WorkspaceStore::open(&root, &dir.path().join("state"), StoreOptions::default())
            .unwrap();
        let backend = Backend::new(store).unwrap().with_exec(InstantExit);
        let listener = Listener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::task::spawn_local(serve(
            vec![listener],
            backend,
            ServerConfig::default(),
            async {
                let _ = stop_rx.await;
            },
        ));
        let c = client::connect(&addr, None, "leak-test").await.unwrap();
        // Warm up: connection tables, allocator caches, lazily built state.
        run_execs(&c, 300).await;
        let before = LIVE.load(Ordering::Relaxed);
        const N: usize = 3000;
        run_execs(&c, N).await;
        let grown = LIVE.load(Ordering::Relaxed) - before;
        // The leak was ~450 bytes per exec (~1.3 MB here); allow noise.
        assert!(
            grown < 64 * (N as isize),
            "live heap grew by {grown} bytes over {N} execs on one connection"
        );
        drop(c);
        let _ = stop_tx.send(());
        server.await.unwrap().unwrap();
    });
}
