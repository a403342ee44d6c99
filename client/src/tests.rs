//! Deadlines against peers that never answer: a listener that accepts and
//! stays silent, and a daemon stand-in that answers the handshake but never
//! a call. Real TCP on 127.0.0.1:0; the deadlines are short, and a test
//! fails only if a call hangs past its own deadline plus a generous margin
//! (the outer timeout), never on how fast the error came.

use std::rc::Rc;
use std::time::Duration;

use capnp_rpc::{RpcSystem, rpc_twoparty_capnp};
use wsd_schema::workspace_capnp as wire;
use wsd_sync::ErrorCode;

use crate::client::connect_with;
use crate::transport::network;
use crate::{ClientOptions, Endpoint, WsdHandle};

/// Far beyond every deadline below: only a hang reaches it.
const HANG: Duration = Duration::from_secs(30);

fn short_deadlines() -> ClientOptions {
    ClientOptions {
        peer: "deadline-test".into(),
        connect_timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(300),
        call_timeout: Duration::from_millis(300),
        ..ClientOptions::default()
    }
}

fn run_local<F: std::future::Future<Output = ()>>(body: F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async {
        tokio::time::timeout(HANG, body).await.expect("a call hung");
    });
}

/// A listener that accepts connections and never reads or writes; the
/// accepted sockets stay open until the returned task is dropped.
async fn silent_listener() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, task)
}

#[test]
fn a_listener_that_never_answers_fails_the_handshake_naming_the_address() {
    run_local(async {
        let (addr, _listener) = silent_listener().await;
        let endpoint: Endpoint = addr.parse().unwrap();
        let err = connect_with(&endpoint, &short_deadlines())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Timeout, "{err}");
        assert_eq!(
            err.message,
            format!("handshake with {addr} timed out after 300 ms")
        );
        assert_eq!(err.subject.as_deref(), Some(addr.as_str()));
    });
}

#[test]
fn a_send_handle_to_a_silent_listener_fails_within_its_deadline_from_a_plain_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (addr, _listener) = silent_listener().await;
        let connect = WsdHandle::connect(addr.parse().unwrap(), short_deadlines());
        let err = tokio::time::timeout(HANG, connect)
            .await
            .expect("connect hung")
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Timeout, "{err}");
        assert!(err.message.starts_with("handshake with "), "{err}");
    });
}

#[test]
fn a_refused_dial_is_eio_naming_the_address() {
    run_local(async {
        // A port that was just free: nothing listens on it.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let err = connect_with(&addr.parse().unwrap(), &short_deadlines())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Io, "{err}");
        assert_eq!(err.subject.as_deref(), Some(addr.as_str()));
    });
}

/// Answers `connect`, `sync` and `shell`; never answers `watermarks`.
struct Stuck;

impl wire::bootstrap::Server for Stuck {
    async fn connect(
        self: Rc<Self>,
        _: wire::bootstrap::ConnectParams,
        mut results: wire::bootstrap::ConnectResults,
    ) -> Result<(), capnp::Error> {
        results
            .get()
            .set_workspace(capnp_rpc::new_client::<wire::workspace::Client, _>(Stuck));
        Ok(())
    }
}

impl wire::workspace::Server for Stuck {
    async fn sync(
        self: Rc<Self>,
        _: wire::workspace::SyncParams,
        mut results: wire::workspace::SyncResults,
    ) -> Result<(), capnp::Error> {
        results
            .get()
            .set_sync(capnp_rpc::new_client::<wire::sync::Client, _>(Stuck));
        Ok(())
    }
}

impl wire::sync::Server for Stuck {
    async fn watermarks(
        self: Rc<Self>,
        _: wire::sync::WatermarksParams,
        _: wire::sync::WatermarksResults,
    ) -> Result<(), capnp::Error> {
        std::future::pending().await
    }
}

#[test]
fn a_call_the_daemon_never_answers_times_out_and_drops_the_connection() {
    run_local(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::task::spawn_local(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let bootstrap: wire::bootstrap::Client = capnp_rpc::new_client(Stuck);
            let rpc = RpcSystem::new(
                network(socket, rpc_twoparty_capnp::Side::Server),
                Some(bootstrap.client),
            );
            let _ = rpc.await;
        });
        let client = connect_with(&addr.parse().unwrap(), &short_deadlines())
            .await
            .unwrap();
        let err = client.watermarks().await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Timeout, "{err}");
        assert_eq!(
            err.message,
            format!("watermarks with {addr} timed out after 300 ms")
        );
        assert!(!client.is_connected());
        let err = client.watermarks().await.unwrap_err();
        assert!(
            err.is_retryable(),
            "later calls see a lost connection: {err}"
        );
    });
}
