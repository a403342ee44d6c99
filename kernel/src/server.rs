//! HTTP and WebSocket transport: `GET /health`, `GET /ws`, the OAuth
//! callback and client metadata (the `oauth` domain's), and the life of
//! one connection (handshake deadline, frame checks, in-flight requests,
//! cancellation). One writer task per socket drains a bounded queue, so a
//! slow client only ever blocks itself.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{any, get};
use axum::serve::ListenerExt;
use futures::{FutureExt, SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use crate::body::BodyInbox;
use crate::caps;
use crate::db::now_ms;
use crate::domains::accounts::{self, ProcessIdentity};
use crate::domains::watch;
use crate::error::KernelError;
use crate::kernel::{Kernel, PROTOCOL};
use crate::routing;
use crate::session::{Outgoing, Role, Session};
use gsv_protocol::FrameError;
use gsv_protocol::frames::{self, Inbound, Outbound, Response, UNKNOWN_ID};

/// Frames queued for one socket's writer; a full queue makes that
/// connection's own requests wait, nobody else's.
const OUTBOUND_QUEUE: usize = 64;
/// (user, address) pairs whose failures are remembered at most.
const MAX_TRACKED_LOGIN_FAILURES: usize = 10_000;
/// Longest delay added to a failed login (it doubles per failure from 100 ms).
const MAX_LOGIN_DELAY: Duration = Duration::from_secs(2);

/// Serves the kernel on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    kernel: Arc<Kernel>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(mut addr) = listener.local_addr() {
        // A browser cannot open 0.0.0.0; on this host, loopback works.
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        kernel.oauth.set_bound_origin(format!("http://{addr}"));
    }
    let app = Router::new()
        .route("/health", get(health))
        .route("/ws", get(upgrade))
        .route(
            crate::domains::oauth::CALLBACK_PATH,
            get(crate::domains::oauth::calls::http::callback),
        )
        .route(
            crate::domains::oauth::CLIENT_METADATA_PATH,
            get(crate::domains::oauth::calls::http::client_metadata),
        )
        .route(
            "/repos/{owner}/{repo}/{*rest}",
            any(crate::domains::repo::calls::http::serve),
        )
        .with_state(kernel);
    // Without TCP_NODELAY a frame written while the previous one is still
    // unacknowledged (a call's answer, then a signal: a terminal's echo
    // after `shell.pty.input`'s reply) waits for the peer's delayed ACK,
    // about 40 ms.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on an accepted connection");
        }
    });
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

async fn health(State(k): State<Arc<Kernel>>) -> impl IntoResponse {
    axum::Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": PROTOCOL,
        "connections": k.pool.len(),
    }))
}

async fn upgrade(
    State(k): State<Arc<Kernel>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ws: WebSocketUpgrade,
) -> HttpResponse {
    let Ok(permit) = k.pending.clone().try_acquire_owned() else {
        tracing::warn!(%peer, "refusing a socket: too many unauthenticated connections");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many unauthenticated connections",
        )
            .into_response();
    };
    let limit = k.config.max_frame_bytes;
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| Connection::run(k, socket, peer, permit))
}

/// Connection state owned by its reader loop.
struct Connection {
    kernel: Arc<Kernel>,
    id: String,
    peer: SocketAddr,
    tx: mpsc::Sender<Outgoing>,
    session: Option<Arc<Session>>,
    /// Held until `sys.connect` succeeds.
    pending_permit: Option<OwnedSemaphorePermit>,
    /// Held from `sys.connect` on.
    connected_permit: Option<OwnedSemaphorePermit>,
    /// In-flight requests of this connection by id.
    inflight: Arc<Mutex<HashMap<String, AbortHandle>>>,
    /// Binary bodies arriving on this connection (drivers' answers).
    bodies: Arc<BodyInbox>,
}

impl Connection {
    async fn run(
        kernel: Arc<Kernel>,
        socket: WebSocket,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
    ) {
        let (mut sink, mut stream) = socket.split();
        let (tx, mut rx) = mpsc::channel::<Outgoing>(OUTBOUND_QUEUE);
        tokio::spawn(async move {
            while let Some(out) = rx.recv().await {
                let done = matches!(out, Outgoing::Close(..));
                let msg = match out {
                    Outgoing::Text(t) => Message::Text(t.into()),
                    Outgoing::Close(code, reason) => Message::Close(Some(CloseFrame {
                        code,
                        reason: reason.into(),
                    })),
                };
                if sink.send(msg).await.is_err() || done {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let closed = CancellationToken::new();
        let id = format!("conn_{}", accounts::random_hex(8));
        kernel.pool.add(&id, tx.clone(), closed.clone());
        let deadline = tokio::time::Instant::now() + kernel.config.handshake_timeout;
        let mut conn = Connection {
            kernel,
            id,
            peer,
            tx,
            session: None,
            pending_permit: Some(permit),
            connected_permit: None,
            inflight: Arc::default(),
            bodies: Arc::default(),
        };
        tracing::debug!(conn = %conn.id, %peer, "socket open");
        loop {
            let next = tokio::select! {
                _ = closed.cancelled() => break,
                _ = tokio::time::sleep_until(deadline), if conn.session.is_none() => {
                    conn.close(1008, "Handshake timeout: sys.connect not completed").await;
                    break;
                }
                m = stream.next() => m,
            };
            match next {
                None | Some(Ok(Message::Close(_))) => break,
                Some(Err(e)) => {
                    let text = e.to_string();
                    if text.contains("too long") || text.contains("Space limit") {
                        let limit = conn.kernel.config.max_frame_bytes;
                        conn.close(
                            1009,
                            &format!("Frame too large: the limit is {limit} bytes"),
                        )
                        .await;
                    }
                    tracing::debug!(conn = %conn.id, error = %text, "socket error");
                    break;
                }
                Some(Ok(Message::Text(t))) => conn.on_text(t.as_str()).await,
                Some(Ok(Message::Binary(b))) => conn.bodies.on_binary(&b),
                Some(Ok(_)) => {}
            }
        }
        // Waiters on this connection's bodies may hold the inbox too.
        conn.bodies.close_all();
        for (_, h) in conn.inflight.lock().unwrap().drain() {
            h.abort();
        }
        if let Some((device, _)) = conn.session.as_ref().and_then(|s| s.device.clone()) {
            routing::driver_disconnected(&conn.kernel.router, &conn.id, &device).await;
        }
        if let Some(adapter) = conn.session.as_ref().and_then(|s| s.channel.clone()) {
            routing::adapter_disconnected(&conn.kernel.router, &conn.id, &adapter);
        }
        conn.kernel.watches.connection_closed(&conn.id);
        conn.kernel.pool.remove(&conn.id);
        tracing::debug!(conn = %conn.id, "socket closed");
    }

    async fn close(&self, code: u16, reason: &str) {
        let _ = self.tx.send(Outgoing::Close(code, reason.to_owned())).await;
    }

    async fn send_res(&self, r: Response) {
        let _ = self
            .tx
            .send(Outgoing::Text(Outbound::Res(r).to_text()))
            .await;
    }

    async fn on_text(&mut self, text: &str) {
        let frame = match frames::parse(text) {
            Ok(f) => f,
            Err(e) => return self.send_res(Response::err(UNKNOWN_ID, &e)).await,
        };
        match frame {
            Inbound::Req { id, call, args } => self.on_request(id, call, args).await,
            Inbound::Sig { signal, payload } if signal == "request.cancel" => {
                let Some(target) = payload.get("id").and_then(Value::as_str) else {
                    return self
                        .send_res(Response::err(
                            UNKNOWN_ID,
                            FrameError::InvalidFrame("request.cancel needs payload.id"),
                        ))
                        .await;
                };
                // Only this connection's own requests are in its map, so a
                // cancel can never reach someone else's request.
                if let Some(h) = self.inflight.lock().unwrap().remove(target) {
                    h.abort();
                    tracing::debug!(conn = %self.id, id = target, "request cancelled");
                }
            }
            Inbound::Sig { signal, payload } => match &self.session {
                Some(s) if s.role == Role::Driver && watch::device::is_watch_signal(&signal) => {
                    self.kernel
                        .watches
                        .from_device(&s.connection_id, &signal, payload);
                }
                Some(s) if s.role == Role::Driver => {
                    routing::on_driver_signal(&self.kernel.router, s, &self.tx, &signal, payload)
                        .await;
                }
                _ => tracing::debug!(conn = %self.id, %signal, "ignoring a signal"),
            },
            // Drivers answer routed device calls, services (adapters) the
            // `adapter.*` calls forwarded to them.
            Inbound::Res { id, ok, frame } => match &self.session {
                Some(s) if matches!(s.role, Role::Driver | Role::Service) => {
                    self.kernel
                        .router
                        .on_response(s, &self.bodies, &id, ok, frame);
                }
                _ => tracing::debug!(conn = %self.id, %id, "ignoring an unrouted response"),
            },
        }
    }

    async fn on_request(&mut self, id: String, call: String, args: Map<String, Value>) {
        match call.as_str() {
            "sys.connect" => {
                let r = self.connect(args).await;
                return self.send_res(Response::from_result(id, r)).await;
            }
            "sys.setup" => {
                let r = setup(&self.kernel, args).await;
                return self.send_res(Response::from_result(id, r)).await;
            }
            _ => {}
        }
        let Some(session) = self.session.clone() else {
            let k = self.kernel.clone();
            let setup_mode = k.db.call(|c| accounts::setup_mode(c)).await;
            let e = match setup_mode {
                Ok(true) => KernelError::SetupRequired,
                Ok(false) => KernelError::NotConnected,
                Err(e) => e,
            };
            return self.send_res(Response::err(id, &e)).await;
        };
        let entry = match self.kernel.dispatch.gate(&session, &call) {
            Ok(e) => e,
            Err(e) => return self.send_res(Response::err(id, &e)).await,
        };
        let (k, tx, map, rid) = (
            self.kernel.clone(),
            self.tx.clone(),
            self.inflight.clone(),
            id.clone(),
        );
        let conn_id = session.connection_id.clone();
        let duplicate = {
            // Spawning under the lock: the task's own removal takes the same
            // lock, so it always finds its entry unless a cancel took it.
            let mut inflight = self.inflight.lock().unwrap();
            if inflight.contains_key(&id) {
                true
            } else {
                let task = tokio::spawn(async move {
                    // A panicking handler still answers (500) and frees its id.
                    let router = k.router.clone();
                    let kernel = k.clone();
                    let r = std::panic::AssertUnwindSafe(routing::run_call(
                        &router, entry, kernel, session, &call, args,
                    ))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| {
                        Err(KernelError::Internal(format!("{call} failed unexpectedly")))
                    });
                    // Removed by a cancel already: the caller must not get
                    // a late answer.
                    if map.lock().unwrap().remove(&rid).is_none() {
                        return;
                    }
                    // A watch's first `fs.changed` must follow its answer.
                    let watch_started = match (&r, call.as_str()) {
                        (Ok(v), "fs.watch") => v["watchId"].as_str().map(str::to_owned),
                        _ => None,
                    };
                    // Likewise a terminal's first `shell.pty.output`.
                    let pty_attached = match (&r, call.as_str()) {
                        (Ok(v), "shell.pty.open" | "shell.pty.attach") => {
                            v["ptyId"].as_str().map(str::to_owned)
                        }
                        _ => None,
                    };
                    let res = Response::from_result(rid, r);
                    let _ = tx.send(Outgoing::Text(Outbound::Res(res).to_text())).await;
                    if let Some(w) = watch_started {
                        k.watches.start(&w);
                    }
                    if let Some(p) = pty_attached {
                        k.ptys.start(&p, &conn_id);
                    }
                });
                inflight.insert(id.clone(), task.abort_handle());
                false
            }
        };
        if duplicate {
            let e = KernelError::DuplicateRequest(id.clone());
            self.send_res(Response::err(id, &e)).await;
        }
    }

    async fn connect(&mut self, args: Map<String, Value>) -> Result<Value, KernelError> {
        if self.session.is_some() {
            return Err(KernelError::AlreadyConnected);
        }
        let a: ConnectArgs =
            serde_json::from_value(Value::Object(args)).map_err(|e| KernelError::InvalidArgs {
                call: "sys.connect".into(),
                reason: e.to_string(),
            })?;
        if a.protocol != PROTOCOL {
            return Err(KernelError::UnsupportedProtocol {
                got: a.protocol,
                want: PROTOCOL,
            });
        }
        let role = match a.client.role.as_str() {
            "user" => Role::User,
            "driver" => Role::Driver,
            "service" => Role::Service,
            _ => return Err(KernelError::InvalidClient("Invalid client role".into())),
        };
        let k = self.kernel.clone();
        if k.db.call(|c| accounts::setup_mode(c)).await? {
            return Err(KernelError::SetupRequired);
        }
        let identity = self.authenticate(role, &a).await?;
        let mut extras = Map::new();
        let mut device = None;
        let mut channel = None;
        match role {
            Role::Driver => {
                let implements = a.driver.map(|d| d.implements).unwrap_or_default();
                if implements.is_empty() {
                    return Err(KernelError::InvalidClient(
                        "Driver role requires implements list".into(),
                    ));
                }
                if let Some(bad) = implements.iter().find(|p| !caps::is_valid_pattern(p)) {
                    return Err(KernelError::InvalidClient(format!(
                        "Invalid implements pattern: {bad}"
                    )));
                }
                k.devices.check_owner(&a.client.id, identity.uid).await?;
                extras.insert("device".into(), json!(a.client.id));
                extras.insert("implements".into(), json!(implements));
                device = Some((a.client.id.clone(), implements));
            }
            Role::Service => {
                let Some(name) = a.client.channel.clone().filter(|c| !c.is_empty()) else {
                    return Err(KernelError::InvalidClient(
                        "Service role requires channel field".into(),
                    ));
                };
                // The adapter's name, as `adapter.*` calls spell it.
                let name = name.trim().to_lowercase();
                if !crate::domains::adapter::valid_adapter_name(&name) {
                    return Err(KernelError::InvalidClient(format!(
                        "Invalid channel: {name} (lowercase letters, digits, '-' and '_', \
                         at most 64)"
                    )));
                }
                extras.insert("channel".into(), json!(name));
                channel = Some(name);
            }
            // A user's home process exists from its first connection on.
            Role::User => {
                crate::domains::proc::calls::ensure_init(&k, &identity).await?;
            }
        }
        let capabilities = match role {
            Role::Driver => vec![],
            Role::Service => caps::SERVICE_CAPABILITIES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            Role::User => {
                let gids = identity.gids.clone();
                k.db.call(move |c| accounts::capabilities(c, &gids)).await?
            }
        };
        let permit = k
            .connected
            .clone()
            .try_acquire_owned()
            .map_err(|_| KernelError::Overloaded("authenticated connections"))?;
        let session = Arc::new(Session {
            connection_id: self.id.clone(),
            role,
            identity: identity.clone(),
            capabilities: capabilities.clone(),
            client_id: a.client.id.clone(),
            peer: self.peer,
            device,
            channel,
        });
        if let Some((device_id, implements)) = &session.device {
            let reg = routing::Registration {
                device_id: device_id.clone(),
                implements: implements.clone(),
                platform: a.client.platform.clone(),
                version: a.client.version.clone(),
            };
            routing::register_driver(&k.router, &self.id, self.tx.clone(), &identity, reg).await?;
        }
        if let Some(adapter) = &session.channel {
            routing::register_adapter(&k.router, &self.id, self.tx.clone(), adapter);
        }
        k.pool
            .connected(&self.id, (identity.uid, role, a.client.id.clone()));
        self.session = Some(session);
        self.connected_permit = Some(permit);
        self.pending_permit = None;
        tracing::info!(conn = %self.id, user = %identity.username, role = role.as_str(), client = %a.client.id, "connected");
        let mut ident = json!({
            "role": role.as_str(),
            "process": identity,
            "capabilities": capabilities,
        });
        for (key, v) in extras {
            ident[key] = v;
        }
        Ok(json!({
            "protocol": PROTOCOL,
            "server": {
                "version": env!("CARGO_PKG_VERSION"),
                "release": concat!("wsd-kernel ", env!("CARGO_PKG_VERSION")),
                "connectionId": self.id,
            },
            "identity": ident,
            "syscalls": capabilities,
            "signals": signals_for(role),
        }))
    }

    async fn authenticate(
        &self,
        role: Role,
        a: &ConnectArgs,
    ) -> Result<ProcessIdentity, KernelError> {
        let auth = a
            .auth
            .as_ref()
            .ok_or_else(|| KernelError::AuthFailed("Authentication required".into()))?;
        // A token names its account, so with a token the username is only
        // a cross-check; a password needs it.
        let username = auth.username.clone().filter(|u| !u.is_empty());
        if username.is_none() && auth.token.is_none() {
            return Err(KernelError::AuthFailed("Username required".into()));
        }
        let k = self.kernel.clone();
        let throttle_key = (username.clone().unwrap_or_default(), self.peer.ip());
        let result = match (&auth.password, &auth.token) {
            (Some(_), Some(_)) => Err(KernelError::AuthFailed(
                "Provide either password or token".into(),
            )),
            (Some(_), None) if role != Role::User => Err(KernelError::AuthFailed(
                "Token required for machine connections".into(),
            )),
            (None, None) => Err(KernelError::AuthFailed("Authentication required".into())),
            (Some(pw), None) => {
                let username = username.clone().unwrap_or_default();
                let (u, pw) = (username.clone(), pw.clone());
                let stored = k.db.call(move |c| accounts::password_hash(c, &u)).await?;
                let ok = match stored {
                    Some(h) => {
                        tokio::task::spawn_blocking(move || accounts::verify_password(&h, &pw))
                            .await
                            .unwrap_or(false)
                    }
                    None => false,
                };
                if ok {
                    let u = username.clone();
                    k.db.call(move |c| accounts::identity(c, &u))
                        .await?
                        .ok_or_else(|| KernelError::AuthFailed("Authentication failed".into()))
                } else {
                    Err(KernelError::AuthFailed("Authentication failed".into()))
                }
            }
            (None, Some(tok)) => {
                let tok = tok.clone();
                let client_id = a.client.id.clone();
                let u = username.clone();
                k.db.call(move |c| {
                    let fail = || KernelError::AuthFailed("Authentication failed".into());
                    let t = accounts::authenticate_token(c, &tok)?.ok_or_else(fail)?;
                    if t.allowed_role
                        .as_deref()
                        .is_some_and(|r| r != role.as_str())
                    {
                        return Err(fail());
                    }
                    if role == Role::Driver
                        && t.allowed_device_id.as_deref() != Some(client_id.as_str())
                    {
                        return Err(fail());
                    }
                    let id = accounts::identity_by_uid(c, t.uid)?.ok_or_else(fail)?;
                    if u.as_ref().is_some_and(|u| *u != id.username) {
                        return Err(fail());
                    }
                    Ok(id)
                })
                .await
            }
        };
        match &result {
            Ok(_) => {
                k.login_failures.lock().unwrap().remove(&throttle_key);
            }
            Err(KernelError::AuthFailed(_)) => {
                let n = {
                    let mut f = k.login_failures.lock().unwrap();
                    // Bounded: a flood of distinct names forgets old counts
                    // rather than growing without limit.
                    if f.len() >= MAX_TRACKED_LOGIN_FAILURES {
                        f.clear();
                    }
                    let n = f.entry(throttle_key).or_insert(0);
                    *n = n.saturating_add(1);
                    *n
                };
                // Slows guessing on this (user, address) without ever
                // refusing the right password: the delay only follows a
                // failure.
                let delay = Duration::from_millis(100u64 << n.min(5).saturating_sub(1))
                    .min(MAX_LOGIN_DELAY);
                tracing::warn!(user = ?username, peer = %self.peer, failures = n, "failed login");
                tokio::time::sleep(delay).await;
            }
            Err(_) => {}
        }
        result
    }
}

fn signals_for(role: Role) -> Vec<&'static str> {
    match role {
        Role::User => vec![
            "proc.changed",
            "proc.run.started",
            "proc.run.stream",
            "proc.run.finished",
            "process.exit",
            "device.status",
            "fs.changed",
            "fs.watch.lagged",
        ],
        Role::Driver => vec!["device.status", "device.pong"],
        Role::Service => vec!["adapter.status"],
    }
}

#[derive(Debug, Deserialize)]
struct ConnectArgs {
    protocol: i64,
    client: ClientInfo,
    #[serde(default)]
    driver: Option<DriverInfo>,
    #[serde(default)]
    auth: Option<AuthArgs>,
}

#[derive(Debug, Deserialize)]
struct ClientInfo {
    id: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    platform: String,
    role: String,
    #[serde(default)]
    channel: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DriverInfo {
    implements: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct AuthArgs {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SetupArgs {
    username: String,
    password: String,
    #[serde(default)]
    root_password: Option<String>,
    /// The model endpoint for agent processes (`config/ai/*`).
    #[serde(default)]
    ai: Option<AiSetup>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AiSetup {
    provider: Option<String>,
    model: Option<String>,
    api_key: Option<String>,
    base_url: Option<String>,
}

impl AiSetup {
    fn entries(&self) -> Vec<(&'static str, String)> {
        [
            ("config/ai/provider", &self.provider),
            ("config/ai/model", &self.model),
            ("config/ai/api_key", &self.api_key),
            ("config/ai/base_url", &self.base_url),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

/// `sys.setup`: the first human (and optionally root's password). Allowed
/// before `sys.connect`, only while in setup mode.
async fn setup(k: &Arc<Kernel>, args: Map<String, Value>) -> Result<Value, KernelError> {
    let a: SetupArgs =
        serde_json::from_value(Value::Object(args)).map_err(|e| KernelError::InvalidArgs {
            call: "sys.setup".into(),
            reason: e.to_string(),
        })?;
    if !k.db.call(|c| accounts::setup_mode(c)).await? {
        return Err(KernelError::AlreadyInitialized);
    }
    accounts::validate_username(&a.username).map_err(KernelError::BadRequest)?;
    accounts::validate_password(&a.password).map_err(KernelError::BadRequest)?;
    if let Some(rp) = &a.root_password {
        accounts::validate_password(rp).map_err(KernelError::BadRequest)?;
    }
    let (pw, rp) = (a.password.clone(), a.root_password.clone());
    let (user_hash, root_hash) = tokio::task::spawn_blocking(move || {
        Ok::<_, KernelError>((
            accounts::hash_password(&pw)?,
            rp.map(|p| accounts::hash_password(&p)).transpose()?,
        ))
    })
    .await
    .map_err(|e| KernelError::internal("hashing passwords", e))??;
    let username = a.username.clone();
    let ai = a.ai.as_ref().map(AiSetup::entries).unwrap_or_default();
    let (user, root_locked) =
        k.db.call(move |c| {
            // Re-checked under the writer: two racing setups make one user.
            if !accounts::setup_mode(c)? {
                return Err(KernelError::AlreadyInitialized);
            }
            let user = accounts::create_human(c, &username, &user_hash)?;
            if let Some(h) = root_hash {
                accounts::set_password(c, "root", &h)?;
            }
            for (key, value) in &ai {
                accounts::config_set(c, key, value)?;
            }
            Ok((user, accounts::root_locked(c)?))
        })
        .await?;
    crate::domains::fs::calls::ensure_dir(&k.system, user.home.trim_start_matches('/')).await?;
    tracing::info!(user = %user.username, uid = user.uid, at = now_ms(), "setup complete");
    Ok(json!({"user": user, "rootLocked": root_locked}))
}
