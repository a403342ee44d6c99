//! Accepting connections and the bootstrap: listeners, admission, the token
//! and version check, bounded connections, graceful shutdown.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use capnp_rpc::{RpcSystem, rpc_twoparty_capnp};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use wsd_client::{DaemonStatus, PeerStatus};
use wsd_schema::workspace_capnp as wire;
use wsd_sync::{ErrorCode, Store};

use super::auth::{PeerOrigin, Token, admit};
use super::conn::{Conn, run_call};
use super::convert::{status_to, text};
use super::exec_backend::{DynExecBackend, ExecBackend};
use super::limits::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_IN_FLIGHT_CALLS,
    DEFAULT_MAX_UNAUTHENTICATED, MAX_PEER_NAME_BYTES,
};
use super::server_shell::ShellServer;
use super::server_sync::{PeersSeen, SyncServer};
use super::store_thread::{StoreCaller, StoreHandle, StoreThread};
use super::transport::network;
use super::{PROTOCOL_VERSION, WireError};

/// How the server runs. `Default` is: no token (loopback peers only),
/// [`DEFAULT_MAX_CONNECTIONS`], [`DEFAULT_MAX_UNAUTHENTICATED`],
/// [`DEFAULT_HANDSHAKE_TIMEOUT`], [`DEFAULT_MAX_IN_FLIGHT_CALLS`], 2 s grace.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The shared secret peers must present; `None` admits only loopback
    /// and unix-socket peers, and any token they present.
    pub token: Option<Token>,
    /// Connections that completed `Bootstrap.connect`. A peer whose
    /// handshake finds them all taken waits for one (within its handshake
    /// deadline).
    pub max_connections: usize,
    /// Connections that have not completed `Bootstrap.connect` yet. When a
    /// new one would exceed it, the oldest is dropped: silent peers cost
    /// only their own connections and never hold up the accept loop.
    pub max_unauthenticated: usize,
    /// How long a new connection has to complete `Bootstrap.connect`
    /// before it is dropped.
    pub handshake_timeout: Duration,
    pub max_in_flight_calls: usize,
    /// How long shutdown waits for connections to flush their last replies
    /// before closing them.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_unauthenticated: DEFAULT_MAX_UNAUTHENTICATED,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_in_flight_calls: DEFAULT_MAX_IN_FLIGHT_CALLS,
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

/// What the server serves: a store and, optionally, an exec runner.
pub struct Backend<S> {
    store: StoreHandle<S>,
    store_thread: StoreThread<S>,
    exec: Option<Rc<dyn DynExecBackend>>,
    /// The workspace root `status` reports (empty when not set).
    root: Option<PathBuf>,
    /// Signalled when the store's tree changed behind it (its watcher saw
    /// a write): the server then settles, so `waitChanges` sees it.
    change_hint: Option<Arc<Notify>>,
}

impl<S> std::fmt::Debug for Backend<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("exec", &self.exec.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Store + Send + 'static> Backend<S> {
    /// A backend without an exec runner: shell calls fail with
    /// `EIO: exec not available`.
    /// Moves `store` onto its own thread (named `wsd-store`) right away, so
    /// that [`Backend::store_caller`] works before [`serve`] starts.
    pub fn new(store: S) -> Result<Backend<S>, ServeError> {
        let (store, store_thread) = StoreHandle::spawn(store).map_err(ServeError::StoreThread)?;
        Ok(Backend {
            store,
            store_thread,
            exec: None,
            root: None,
            change_hint: None,
        })
    }

    /// A `Send` handle for blocking calls into the store from other threads
    /// (the exec runner settles the workspace through it).
    pub fn store_caller(&self) -> StoreCaller<S> {
        self.store.caller()
    }

    pub fn with_exec(mut self, exec: impl ExecBackend) -> Backend<S> {
        self.exec = Some(Rc::new(exec));
        self
    }

    /// Settles the store (through [`Store::idle`], which looks only at what
    /// the watcher reported) shortly after each `notify_one` of `hint`, so
    /// that changes made behind the store reach `Sync.waitChanges` without
    /// any peer asking. Bursts within [`CHANGE_DEBOUNCE`] settle once.
    pub fn with_change_hint(mut self, hint: Arc<Notify>) -> Backend<S> {
        self.change_hint = Some(hint);
        self
    }

    /// The workspace root `Workspace.status` reports.
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Backend<S> {
        self.root = Some(root.into());
        self
    }
}

/// A bound listening socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    /// The socket file is removed when the server stops.
    Unix {
        listener: tokio::net::UnixListener,
        path: PathBuf,
    },
}

impl Listener {
    /// Binds `addr`: `"host:port"` for TCP or `"unix:/path"` for a unix
    /// socket. A socket file already at that path is probed: if a server
    /// answers on it the bind fails with `AddrInUse` (its socket is left
    /// alone); if nothing does, the stale file is replaced.
    pub async fn bind(addr: &str) -> std::io::Result<Listener> {
        if let Some(path) = addr.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                match std::os::unix::net::UnixStream::connect(&path) {
                    Ok(_) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            format!("a server is already listening on {}", path.display()),
                        ));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        tracing::info!(path = %path.display(), "replacing a stale socket file");
                        std::fs::remove_file(&path)?;
                    }
                    // A full backlog (EAGAIN) is a live server too; anything
                    // else is reported rather than guessed at.
                    Err(e) => return Err(e),
                }
            }
            let listener = tokio::net::UnixListener::bind(&path)?;
            return Ok(Listener::Unix { listener, path });
        }
        Ok(Listener::Tcp(tokio::net::TcpListener::bind(addr).await?))
    }

    /// The address in the form [`Listener::bind`] and `client::connect`
    /// accept (useful after binding port 0).
    pub fn local_addr(&self) -> std::io::Result<String> {
        match self {
            Listener::Tcp(l) => Ok(l.local_addr()?.to_string()),
            Listener::Unix { path, .. } => Ok(format!("unix:{}", path.display())),
        }
    }
}

/// Why [`serve`] could not run or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("starting the store thread: {0}")]
    StoreThread(std::io::Error),
    #[error("the store thread died (a store call panicked)")]
    StoreDied,
}

/// State shared by every connection of one server.
pub(crate) struct Shared<S> {
    pub(crate) store: StoreHandle<S>,
    pub(crate) exec: Option<Rc<dyn DynExecBackend>>,
    /// What `status` reports besides the store's and the runner's state.
    root: Option<PathBuf>,
    started: Instant,
    /// The peers whose watermarks `status` lists.
    peers_seen: PeersSeen,
    token: Option<Token>,
    /// Slots for authenticated connections ([`ServerConfig::max_connections`]).
    connections: Arc<Semaphore>,
}

/// Connections that have not completed their handshake, oldest first.
struct Unauthenticated {
    max: usize,
    next_id: Cell<u64>,
    queue: RefCell<VecDeque<(u64, CancellationToken)>>,
}

/// A connection's place among the unauthenticated ones; leaving (drop)
/// frees it.
struct UnauthSlot {
    owner: Rc<Unauthenticated>,
    id: u64,
    /// Cancelled when a newer connection pushes this one out.
    evicted: CancellationToken,
}

impl Unauthenticated {
    /// Takes a slot for a new connection, evicting the oldest holder if all
    /// are taken.
    fn admit(self: &Rc<Self>) -> UnauthSlot {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let evicted = CancellationToken::new();
        let mut queue = self.queue.borrow_mut();
        while queue.len() >= self.max.max(1) {
            if let Some((_, oldest)) = queue.pop_front() {
                oldest.cancel();
            }
        }
        queue.push_back((id, evicted.clone()));
        UnauthSlot {
            owner: self.clone(),
            id,
            evicted,
        }
    }
}

impl Drop for UnauthSlot {
    fn drop(&mut self) {
        self.owner
            .queue
            .borrow_mut()
            .retain(|(id, _)| *id != self.id);
    }
}

/// A connection's handshake state, shared between its task and its
/// bootstrap capability.
#[derive(Default)]
struct Handshake {
    /// Cancelled once `Bootstrap.connect` succeeded.
    done: CancellationToken,
    /// The authenticated-connection slot, held until the connection ends.
    permit: RefCell<Option<OwnedSemaphorePermit>>,
}

/// Serves `backend` on `listeners` until `shutdown` resolves, then stops
/// accepting (listeners closed, unix socket files removed), refuses new
/// calls with `ESHUTDOWN`, lets the store finish every call already queued
/// (so an in-flight transaction completes), gives connections
/// [`ServerConfig::shutdown_grace`] to flush their replies, closes them and
/// returns the store.
///
/// Must run inside a [`tokio::task::LocalSet`] (capnp-rpc is `!Send`),
/// normally on a current-thread runtime; the store runs on its own thread.
pub async fn serve<S: Store + Send + 'static>(
    listeners: Vec<Listener>,
    backend: Backend<S>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<S, ServeError> {
    let Backend {
        store,
        mut store_thread,
        exec,
        root,
        change_hint,
    } = backend;
    let shared = Rc::new(Shared {
        store,
        exec,
        root,
        started: Instant::now(),
        peers_seen: PeersSeen::default(),
        token: config.token.clone(),
        connections: Arc::new(Semaphore::new(config.max_connections)),
    });
    if config.token.is_none() {
        tracing::warn!("no token configured: only loopback and unix-socket peers are admitted");
    }
    let unauthenticated = Rc::new(Unauthenticated {
        max: config.max_unauthenticated,
        next_id: Cell::new(0),
        queue: RefCell::new(VecDeque::new()),
    });
    let config = Rc::new(config);
    let stop_accepting = CancellationToken::new();
    let disconnect = CancellationToken::new();
    // Every accept loop and connection task holds a sender; `recv` returns
    // `None` once all of them have finished.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    for listener in listeners {
        match listener.local_addr() {
            Ok(addr) => tracing::info!(%addr, "listening"),
            Err(e) => tracing::warn!(error = %e, "listening on an address that cannot be named"),
        }
        let ctx = AcceptCtx {
            shared: shared.clone(),
            config: config.clone(),
            unauthenticated: unauthenticated.clone(),
            stop: stop_accepting.clone(),
            disconnect: disconnect.clone(),
            alive: alive_tx.clone(),
        };
        tokio::task::spawn_local(accept_loop(listener, ctx));
    }
    if let Some(hint) = change_hint {
        tokio::task::spawn_local(settle_on_hint(
            shared.store.clone(),
            hint,
            stop_accepting.clone(),
        ));
    }
    tokio::select! {
        _ = shutdown => {}
        _ = store_thread.ended() => {
            // The panic's message and place were printed by the panic hook
            // just before. Stopping (the process exits non-zero) lets a
            // supervisor restart the daemon, whose start reconciles the
            // directory with the index; serving on would answer `EIO` to
            // every call.
            tracing::error!("the store thread died (a store call panicked): stopping the server");
        }
    }
    tracing::info!("shutting down: no new connections or calls");
    stop_accepting.cancel();
    shared.store.close();
    let store = store_thread.join().await;
    tracing::info!("store drained; closing connections");
    disconnect.cancel();
    drop(alive_tx);
    let _ = alive_rx.recv().await;
    tracing::info!("server stopped");
    store.ok_or(ServeError::StoreDied)
}

/// How long the server lets a burst of local writes go on before it
/// settles them: one settle per burst instead of one per event.
pub const CHANGE_DEBOUNCE: Duration = Duration::from_millis(50);

/// Settles the store after each change hint until `stop`.
async fn settle_on_hint<S: Store + Send + 'static>(
    store: StoreHandle<S>,
    hint: Arc<Notify>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = hint.notified() => {}
        }
        tokio::time::sleep(CHANGE_DEBOUNCE).await;
        if let Err(e) = store.call(|s| s.idle()).await {
            if e.code == ErrorCode::Shutdown {
                return;
            }
            tracing::debug!(error = %e, "settling after a local change failed");
        }
    }
}

struct AcceptCtx<S> {
    shared: Rc<Shared<S>>,
    config: Rc<ServerConfig>,
    unauthenticated: Rc<Unauthenticated>,
    stop: CancellationToken,
    disconnect: CancellationToken,
    alive: mpsc::Sender<()>,
}

async fn accept_loop<S: Store + Send + 'static>(listener: Listener, ctx: AcceptCtx<S>) {
    loop {
        // Never wait for a slot before accepting: a full server would leave
        // every new peer, authenticated or not, in the kernel's backlog
        // behind whoever holds the slots (idle peers, before this rule).
        // EMFILE and friends: back off (50 ms doubling to 1 s, afresh after
        // each success) instead of spinning, and never give up.
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(1))
            .without_max_times();
        let accepted = (|| accept(&listener))
            .retry(backoff)
            .notify(|e, after| tracing::warn!(error = %e, ?after, "accept failed"));
        let (stream, origin) = tokio::select! {
            _ = ctx.stop.cancelled() => break,
            a = accepted => match a {
                Ok(a) => a,
                // Unreachable without a retry limit; stop rather than spin.
                Err(e) => {
                    tracing::error!(error = %e, "accepting failed for good");
                    break;
                }
            },
        };
        if let Err(e) = admit(origin, ctx.shared.token.is_some()) {
            tracing::warn!(?origin, error = %e, "connection refused");
            continue;
        }
        tracing::debug!(?origin, "connection accepted");
        let slot = ctx.unauthenticated.admit();
        let shared = ctx.shared.clone();
        let config = ctx.config.clone();
        let disconnect = ctx.disconnect.clone();
        let alive = ctx.alive.clone();
        tokio::task::spawn_local(async move {
            run_connection(stream, origin, shared, &config, slot, disconnect).await;
            drop(alive);
        });
    }
    if let Listener::Unix { path, .. } = &listener
        && let Err(e) = std::fs::remove_file(path)
    {
        tracing::warn!(path = %path.display(), error = %e, "removing the socket file");
    }
    tracing::debug!("accept loop stopped");
}

trait Stream: AsyncRead + AsyncWrite + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + 'static> Stream for T {}

async fn accept(listener: &Listener) -> std::io::Result<(Box<dyn Stream>, PeerOrigin)> {
    match listener {
        Listener::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            // Small request/response messages: do not wait for Nagle.
            s.set_nodelay(true)?;
            Ok((Box::new(s), PeerOrigin::Tcp(addr.ip())))
        }
        Listener::Unix { listener, .. } => {
            let (s, _) = listener.accept().await?;
            Ok((Box::new(s), PeerOrigin::Unix))
        }
    }
}

async fn run_connection<S: Store + Send + 'static>(
    stream: Box<dyn Stream>,
    origin: PeerOrigin,
    shared: Rc<Shared<S>>,
    config: &ServerConfig,
    slot: UnauthSlot,
    disconnect: CancellationToken,
) {
    let conn = Rc::new(Conn::new(config.max_in_flight_calls));
    let handshake = Rc::new(Handshake::default());
    let bootstrap: wire::bootstrap::Client = capnp_rpc::new_client(BootstrapServer {
        shared,
        conn,
        handshake: handshake.clone(),
    });
    let rpc = RpcSystem::new(
        network(stream, rpc_twoparty_capnp::Side::Server),
        Some(bootstrap.client),
    );
    let disconnector = rpc.get_disconnector();
    let mut rpc = std::pin::pin!(rpc);
    let evicted = slot.evicted.clone();
    let mut slot = Some(slot);
    let deadline = tokio::time::sleep(config.handshake_timeout);
    let mut deadline = std::pin::pin!(deadline);
    loop {
        tokio::select! {
            r = &mut rpc => {
                match r {
                    Ok(()) => tracing::debug!(?origin, "connection closed"),
                    Err(e) => tracing::debug!(?origin, error = %e, "connection failed"),
                }
                break;
            }
            _ = disconnect.cancelled() => {
                // Keep driving the connection while it shuts down so
                // replies already queued are flushed.
                let flush = futures::future::join(rpc, disconnector);
                if tokio::time::timeout(config.shutdown_grace, flush).await.is_err() {
                    tracing::debug!(?origin, "connection did not close within the grace period");
                }
                break;
            }
            _ = handshake.done.cancelled(), if slot.is_some() => {
                slot = None;
            }
            _ = evicted.cancelled(), if slot.is_some() => {
                tracing::debug!(?origin, "dropped before its handshake: too many unauthenticated connections");
                break;
            }
            _ = &mut deadline, if slot.is_some() => {
                tracing::debug!(?origin, timeout = ?config.handshake_timeout, "dropped: no handshake within the deadline");
                break;
            }
        }
    }
    // Dropping `rpc` (on return) closes the socket; the slot goes with it.
    drop(handshake.permit.borrow_mut().take());
}

struct BootstrapServer<S> {
    shared: Rc<Shared<S>>,
    conn: Rc<Conn>,
    handshake: Rc<Handshake>,
}

/// Checks a peer name: 1..=255 bytes, no control characters.
fn check_peer_name(peer: &str) -> Result<(), WireError> {
    if peer.is_empty() || peer.chars().any(char::is_control) {
        return Err(WireError::new(
            ErrorCode::Invalid,
            format!("peer name {peer:?} is empty or has control characters"),
        ));
    }
    WireError::check_limit("peer name length (bytes)", MAX_PEER_NAME_BYTES, peer.len())
}

impl<S: Store + Send + 'static> wire::bootstrap::Server for BootstrapServer<S> {
    async fn connect(
        self: Rc<Self>,
        params: wire::bootstrap::ConnectParams,
        mut results: wire::bootstrap::ConnectResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "connect", async {
            let p = params.get()?;
            if let Some(token) = &self.shared.token {
                let presented = p.get_token()?;
                // An empty token is none (clients send one when they have
                // none): say so, instead of "wrong" for a token never given.
                if presented.is_empty() {
                    tracing::warn!("connect refused: no token given");
                    return Err(WireError::new(
                        ErrorCode::Auth,
                        "no token given; this daemon requires one",
                    ));
                }
                if !token.matches(presented) {
                    tracing::warn!("connect refused: wrong token");
                    return Err(WireError::new(ErrorCode::Auth, "wrong token"));
                }
            }
            let version = p.get_protocol_version();
            if version != PROTOCOL_VERSION {
                return Err(WireError::new(
                    ErrorCode::Protocol,
                    format!("protocol version {version} is not supported (this daemon speaks {PROTOCOL_VERSION})"),
                ));
            }
            let peer = text(p.get_peer(), "peer name")?;
            check_peer_name(&peer)?;
            if !self.handshake.done.is_cancelled() {
                // Waits while every authenticated slot is taken; the
                // connection's handshake deadline bounds the wait.
                let permit = self.shared.connections.clone().acquire_owned().await.map_err(
                    |_| WireError::new(ErrorCode::Shutdown, "the server is shutting down"),
                )?;
                *self.handshake.permit.borrow_mut() = Some(permit);
                self.handshake.done.cancel();
            }
            tracing::info!(peer, "peer connected");
            let workspace = WorkspaceServer {
                shared: self.shared.clone(),
                conn: self.conn.clone(),
                peer: Arc::from(peer),
            };
            results.get().set_workspace(capnp_rpc::new_client(workspace));
            Ok(())
        })
        .await
    }
}

struct WorkspaceServer<S> {
    shared: Rc<Shared<S>>,
    conn: Rc<Conn>,
    peer: Arc<str>,
}

impl<S: Store + Send + 'static> wire::workspace::Server for WorkspaceServer<S> {
    async fn sync(
        self: Rc<Self>,
        _: wire::workspace::SyncParams,
        mut results: wire::workspace::SyncResults,
    ) -> Result<(), capnp::Error> {
        let sync = SyncServer::new(
            self.shared.store.clone(),
            self.conn.clone(),
            self.peer.clone(),
            self.shared.peers_seen.clone(),
        );
        results.get().set_sync(capnp_rpc::new_client(sync));
        Ok(())
    }

    async fn shell(
        self: Rc<Self>,
        _: wire::workspace::ShellParams,
        mut results: wire::workspace::ShellResults,
    ) -> Result<(), capnp::Error> {
        let store = self.shared.store.clone();
        let current_rev: super::server_shell::CurrentRev = Rc::new(move || {
            let store = store.clone();
            Box::pin(async move { store.call(|s| s.current_rev()).await })
        });
        let shell = ShellServer::new(self.shared.exec.clone(), self.conn.clone(), current_rev);
        results.get().set_shell(capnp_rpc::new_client(shell));
        Ok(())
    }

    async fn status(
        self: Rc<Self>,
        _: wire::workspace::StatusParams,
        mut results: wire::workspace::StatusResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "status", async {
            let names: Vec<Arc<str>> = self.shared.peers_seen.borrow().iter().cloned().collect();
            // One store call for the rev and every peer: a consistent view,
            // and a wedged store fails the probe instead of half-answering.
            let (current_rev, peers) = self
                .shared
                .store
                .call(move |s| {
                    let rev = s.current_rev()?;
                    let mut peers = Vec::with_capacity(names.len());
                    for name in names {
                        let wm = s.watermarks(&name)?;
                        peers.push(PeerStatus {
                            peer: name.to_string(),
                            push_cursor: wm.push_cursor,
                            fetch_cursor: wm.fetch_cursor,
                        });
                    }
                    Ok((rev, peers))
                })
                .await?;
            let mut live_execs = match &self.shared.exec {
                Some(exec) => exec.live().await,
                None => Vec::new(),
            };
            live_execs.sort();
            let status = DaemonStatus {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                root: self
                    .shared
                    .root
                    .as_deref()
                    .map(|r| r.display().to_string())
                    .unwrap_or_default(),
                current_rev,
                uptime_ms: u64::try_from(self.shared.started.elapsed().as_millis())
                    .unwrap_or(u64::MAX),
                live_execs,
                peers,
            };
            status_to(results.get().init_status(), &status);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_store_call_stops_the_server() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, async {
            let backend = Backend::new(wsd_sync::testkit::MemStore::new()).unwrap();
            let caller = backend.store_caller();
            let served = tokio::task::spawn_local(serve(
                Vec::new(),
                backend,
                ServerConfig::default(),
                std::future::pending::<()>(),
            ));
            let answer = tokio::task::spawn_blocking(move || {
                caller
                    .call_blocking(|_| -> Result<(), wsd_sync::SyncError> { panic!("a store bug") })
            })
            .await
            .unwrap();
            assert_eq!(answer.unwrap_err().code, ErrorCode::Io);
            // Without a shutdown signal the server still ends, reporting
            // the dead store (bounded: a hang fails the test).
            let ended = tokio::time::timeout(Duration::from_secs(10), served)
                .await
                .expect("the server stops by itself")
                .unwrap();
            assert!(matches!(ended, Err(ServeError::StoreDied)));
        });
    }

    #[test]
    fn peer_names_are_checked() {
        assert!(check_peer_name("gateway-1").is_ok());
        assert_eq!(check_peer_name("").unwrap_err().code, ErrorCode::Invalid);
        assert_eq!(
            check_peer_name("a\nb").unwrap_err().code,
            ErrorCode::Invalid
        );
        assert_eq!(
            check_peer_name(&"x".repeat(256)).unwrap_err().code,
            ErrorCode::Limit
        );
    }
}
