//! [`WsdHandle`]: a `Send + Sync` face of one connection, for programs that
//! do not run inside a `LocalSet`.
//!
//! Threading model: capnp-rpc's futures are `!Send`, so each handle owns a
//! dedicated OS thread running a current-thread tokio runtime and a
//! `LocalSet` that drives the connection. Handle methods send a job (a
//! `Send` closure that builds the `!Send` future on that thread) over a
//! bounded channel and await its answer on a oneshot. Clones share the
//! thread; it exits once every clone and every [`ExecEvents`] is dropped.
//! Cost per connection: one thread (its stack is reserved, not committed)
//! and one small runtime; see client/DESIGN.md for the measurement and why
//! not a shared pool.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::LocalBoxFuture;
use tokio::sync::{mpsc, oneshot};
use wsd_sync::driver::{self, SyncOptions, SyncReport};
use wsd_sync::{ChangeCursor, ErrorCode, IgnoreRules, Kind, Store, SyncPath, Watermarks};

use crate::client::{Client, connect_with, dial_with_backoff};
use crate::limits::CLIENT_EXEC_EVENT_BUFFER;
use crate::{
    ClientOptions, Endpoint, ExecEvent, ExecRequest, PtyRequest, ResumeFrom, Signal, WsdError,
};

/// Jobs queued for a connection thread before `send` waits. Jobs run
/// concurrently on the thread (each is a local task), so this only bounds
/// the calls accepted but not yet started.
const JOB_QUEUE_CAPACITY: usize = 64;

type Job = Box<dyn FnOnce(Rc<Conn>) -> LocalBoxFuture<'static, ()> + Send>;

/// A connection to one daemon's workspace that any thread may use.
/// Cheap to clone; see the module docs for the threading model.
#[derive(Clone)]
pub struct WsdHandle {
    jobs: mpsc::Sender<Job>,
    endpoint: Arc<str>,
    /// The id of the connection made last ([`WsdHandle::connection`]).
    connection: Arc<AtomicU64>,
}

/// The next connection id: unique in this process, so an id names one
/// connection of one handle.
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for WsdHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsdHandle")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// What a push did, and where it left the local store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushReport {
    pub sync: SyncReport,
    /// The local store's rev when the push ended: every change through it
    /// is on the daemon.
    pub local_rev: u64,
    /// The local store's fetch cursor for this daemon then: every daemon
    /// change through it is in the local store.
    pub fetch_cursor: ChangeCursor,
}

/// What a pull did, with the entries it handed to the store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullReport {
    pub sync: SyncReport,
    /// Every entry the pull delivered to the store, in order (an entry the
    /// store found already matching is included; deletions a baseline's
    /// final sweep makes are not).
    pub applied: Vec<AppliedEntry>,
}

/// One entry a pull applied: enough to tell a person what changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedEntry {
    pub path: SyncPath,
    /// `None`: the path was deleted.
    pub kind: Option<Kind>,
    /// File size in bytes (0 for anything else).
    pub size: u64,
    /// Permission bits (0 for a deletion).
    pub mode: u32,
}

impl AppliedEntry {
    fn of(e: &wsd_sync::ChangeEntry) -> AppliedEntry {
        let size = match &e.state {
            wsd_sync::EntryState::File { size, .. } => *size,
            _ => 0,
        };
        AppliedEntry {
            path: e.path.clone(),
            kind: e.state.kind(),
            size,
            mode: e.state.mode().unwrap_or(0),
        }
    }
}

/// The connection as its thread holds it.
struct Conn {
    endpoint: Endpoint,
    opts: ClientOptions,
    current: RefCell<Option<Client>>,
    /// Whether the sync driver compared watermarks on the current
    /// connection (once per connection; a re-dial resets it).
    reconciled: Cell<bool>,
    /// One push or pull at a time: two on one connection would interleave
    /// their watermark updates.
    sync_turn: tokio::sync::Mutex<()>,
    /// Dials made, the first one included.
    dials: Cell<u64>,
    /// The id of the connection made last, shared with the handles
    /// ([`WsdHandle::connection`]).
    connection: Arc<AtomicU64>,
}

impl Conn {
    /// The live connection, re-dialled with backoff if it was lost.
    async fn client(&self) -> Result<Client, WsdError> {
        if let Some(c) = self.current.borrow().as_ref()
            && c.is_connected()
        {
            return Ok(c.clone());
        }
        self.current.replace(None);
        self.reconciled.set(false);
        let c = dial_with_backoff(&self.endpoint, &self.opts, &self.dials).await?;
        self.connection.store(
            NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.current.replace(Some(c.clone()));
        Ok(c)
    }

    /// Runs `f` on the live connection; a call that fails because the
    /// connection was lost runs once more on a fresh one when `idempotent`.
    async fn call<T, F, Fut>(&self, idempotent: bool, f: F) -> Result<T, WsdError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, WsdError>>,
    {
        match f(self.client().await?).await {
            Err(e) if e.is_retryable() || e.code == ErrorCode::Timeout => {
                self.current.replace(None);
                if !idempotent {
                    return Err(e);
                }
                tracing::info!(error = %e, "retrying an idempotent call on a fresh connection");
                f(self.client().await?).await
            }
            other => other,
        }
    }

    fn remote_name(&self) -> String {
        match &self.opts.remote_name {
            Some(name) => name.clone(),
            None => self.endpoint.to_string(),
        }
    }
}

fn thread_gone() -> WsdError {
    WsdError::connection_lost("the connection thread stopped")
}

impl WsdHandle {
    /// Dials `endpoint` on a new connection thread and performs the
    /// handshake (one attempt: the dial and handshake deadlines of `opts`
    /// bound it). Later calls re-dial with backoff after a lost connection.
    pub async fn connect(endpoint: Endpoint, opts: ClientOptions) -> Result<WsdHandle, WsdError> {
        let (jobs, mut queue) = mpsc::channel::<Job>(JOB_QUEUE_CAPACITY);
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), WsdError>>();
        let name = endpoint.to_string();
        let thread_endpoint = endpoint.clone();
        let connection = Arc::new(AtomicU64::new(
            NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
        ));
        let thread_connection = connection.clone();
        std::thread::Builder::new()
            .name(format!("wsd-conn {name}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(WsdError::new(
                            ErrorCode::Io,
                            format!("cannot start a runtime for {thread_endpoint}: {e}"),
                        )));
                        return;
                    }
                };
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    let client = match connect_with(&thread_endpoint, &opts).await {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let conn = Rc::new(Conn {
                        endpoint: thread_endpoint,
                        opts,
                        current: RefCell::new(Some(client)),
                        reconciled: Cell::new(false),
                        sync_turn: tokio::sync::Mutex::new(()),
                        dials: Cell::new(1),
                        connection: thread_connection,
                    });
                    let _ = ready_tx.send(Ok(()));
                    while let Some(job) = queue.recv().await {
                        tokio::task::spawn_local(job(conn.clone()));
                    }
                    tracing::debug!(endpoint = %conn.endpoint, "every handle dropped; closing");
                });
            })
            .map_err(|e| {
                WsdError::new(
                    ErrorCode::Io,
                    format!("cannot start a connection thread for {name}: {e}"),
                )
                .with_subject(&name)
            })?;
        ready_rx.await.map_err(|_| thread_gone())??;
        Ok(WsdHandle {
            jobs,
            endpoint: name.into(),
            connection,
        })
    }

    /// The address this handle talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The id of this handle's current connection, unique in the process:
    /// a lost connection re-dialled gets a new one (the daemon may have
    /// restarted, and lost what was pushed to it).
    pub fn connection(&self) -> u64 {
        self.connection.load(Ordering::Relaxed)
    }

    /// Runs `f` on the connection thread and returns its answer. Dropping
    /// the returned future cancels the job at its next await.
    async fn run<T, F, Fut>(&self, f: F) -> Result<T, WsdError>
    where
        T: Send + 'static,
        F: FnOnce(Rc<Conn>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, WsdError>> + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            Box::pin(async move {
                let mut tx = tx;
                tokio::select! {
                    result = f(conn) => { let _ = tx.send(result); }
                    () = tx.closed() => {}
                }
            })
        });
        self.jobs.send(job).await.map_err(|_| thread_gone())?;
        rx.await.map_err(|_| thread_gone())?
    }

    /// Pushes every local change of `store` (compared with the daemon's
    /// watermarks once per connection first), holding `store`'s mutex for
    /// the whole run. The local store keeps the daemon's watermarks under
    /// [`ClientOptions::remote_name`] (default: the endpoint's text). Rerun
    /// after a failure: it resumes after the last acknowledged batch.
    pub async fn push<S: Store + Send + 'static>(
        &self,
        store: Arc<Mutex<S>>,
    ) -> Result<PushReport, WsdError> {
        self.run(move |conn| async move {
            let _turn = conn.sync_turn.lock().await;
            let remote_name = conn.remote_name();
            let driven = conn
                .call(true, |client| {
                    let store = store.clone();
                    let conn = conn.clone();
                    let remote_name = remote_name.clone();
                    async move { drive(&conn, &store, client, &remote_name, Direction::Push).await }
                })
                .await?;
            Ok(PushReport {
                sync: driven.sync,
                local_rev: driven.local_rev,
                fetch_cursor: driven.fetch_cursor,
            })
        })
        .await
    }

    /// Pulls every daemon change into `store`, like [`WsdHandle::push`],
    /// and returns the entries it applied.
    pub async fn pull<S: Store + Send + 'static>(
        &self,
        store: Arc<Mutex<S>>,
    ) -> Result<PullReport, WsdError> {
        self.run(move |conn| async move {
            let _turn = conn.sync_turn.lock().await;
            let remote_name = conn.remote_name();
            let driven = conn
                .call(true, |client| {
                    let store = store.clone();
                    let conn = conn.clone();
                    let remote_name = remote_name.clone();
                    async move { drive(&conn, &store, client, &remote_name, Direction::Pull).await }
                })
                .await?;
            Ok(PullReport {
                sync: driven.sync,
                applied: driven.applied,
            })
        })
        .await
    }

    /// One round both ways: a pull, then a push (the order `wsd sync`
    /// uses, so the daemon's changes land before ours are sent).
    pub async fn sync<S: Store + Send + 'static>(
        &self,
        store: Arc<Mutex<S>>,
    ) -> Result<(PullReport, PushReport), WsdError> {
        let pulled = self.pull(store.clone()).await?;
        let pushed = self.push(store).await?;
        Ok((pulled, pushed))
    }

    /// The daemon's health snapshot (version, root, rev, peers, live execs).
    pub async fn status(&self) -> Result<crate::DaemonStatus, WsdError> {
        self.run(|conn| async move { conn.call(true, |c| async move { c.status().await }).await })
            .await
    }

    /// The daemon's watermarks for our peer name.
    pub async fn watermarks(&self) -> Result<Watermarks, WsdError> {
        self.run(|conn| async move {
            conn.call(true, |c| async move { c.watermarks().await })
                .await
        })
        .await
    }

    /// Waits until the daemon's rev exceeds `after` or `wait` passed; see
    /// [`Client::wait_changes`]. Returns the daemon's current rev.
    pub async fn wait_changes(&self, after: u64, wait: Duration) -> Result<u64, WsdError> {
        self.run(move |conn| async move {
            conn.call(true, |c| async move { c.wait_changes(after, wait).await })
                .await
        })
        .await
    }

    /// Starts a command; its events arrive on the returned stream.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecEvents, WsdError> {
        let keep = self.jobs.clone();
        self.run(move |conn| async move {
            // Not retried: a lost answer may have started the command.
            let (stream, daemon) = conn
                .call(false, |c| {
                    let req = req.clone();
                    async move {
                        let stream = c.exec(&req).await?;
                        Ok::<_, WsdError>((stream, c))
                    }
                })
                .await?;
            Ok(ExecEvents::pump(
                stream,
                daemon,
                conn.opts.call_timeout,
                keep,
            ))
        })
        .await
    }

    /// [`WsdHandle::exec`], but only on connection `connection`
    /// ([`WsdHandle::connection`]) while it is still open: `None`, and
    /// nothing started, when it was lost or replaced since (the daemon
    /// may have restarted without what was pushed on it).
    pub async fn exec_on(
        &self,
        connection: u64,
        req: ExecRequest,
    ) -> Result<Option<ExecEvents>, WsdError> {
        let keep = self.jobs.clone();
        self.run(move |conn| async move {
            let current = conn.current.borrow().clone();
            let Some(c) = current.filter(|c| {
                c.is_connected() && conn.connection.load(Ordering::Relaxed) == connection
            }) else {
                return Ok(None);
            };
            let stream = c.exec(&req).await.inspect_err(|e| {
                if e.is_retryable() || e.code == ErrorCode::Timeout {
                    conn.current.replace(None);
                }
            })?;
            Ok(Some(ExecEvents::pump(
                stream,
                c,
                conn.opts.call_timeout,
                keep,
            )))
        })
        .await
    }

    /// Starts a program on a new pseudo-terminal; its output arrives as
    /// `stdout` events. Not retried: a lost answer may have started it.
    pub async fn start_pty(&self, req: PtyRequest) -> Result<ExecEvents, WsdError> {
        let keep = self.jobs.clone();
        self.run(move |conn| async move {
            let (stream, daemon) = conn
                .call(false, |c| {
                    let req = req.clone();
                    async move {
                        let stream = c.start_pty(&req).await?;
                        Ok::<_, WsdError>((stream, c))
                    }
                })
                .await?;
            Ok(ExecEvents::pump(
                stream,
                daemon,
                conn.opts.call_timeout,
                keep,
            ))
        })
        .await
    }

    /// Queues typed input for terminal `id`, in order with
    /// [`WsdHandle::pty_resize`]. Not retried after a lost connection: the
    /// bytes may have arrived.
    pub async fn pty_write(&self, id: &str, bytes: Vec<u8>) -> Result<(), WsdError> {
        let id = id.to_owned();
        self.run(move |conn| async move {
            conn.call(false, |c| {
                let (id, bytes) = (id.clone(), bytes.clone());
                async move { c.pty_write(&id, &bytes).await }
            })
            .await
        })
        .await
    }

    /// Sets the window size of terminal `id` (idempotent, so retried).
    pub async fn pty_resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), WsdError> {
        let id = id.to_owned();
        self.run(move |conn| async move {
            conn.call(true, |c| {
                let id = id.clone();
                async move { c.pty_resize(&id, cols, rows).await }
            })
            .await
        })
        .await
    }

    /// Re-attaches to exec `id` from `from`.
    pub async fn attach(&self, id: &str, from: ResumeFrom) -> Result<ExecEvents, WsdError> {
        let keep = self.jobs.clone();
        let id = id.to_owned();
        self.run(move |conn| async move {
            let (stream, daemon) = conn
                .call(true, |c| {
                    let id = id.clone();
                    async move {
                        let stream = c.get_exec(&id, from).await?;
                        Ok::<_, WsdError>((stream, c))
                    }
                })
                .await?;
            Ok(ExecEvents::pump(
                stream,
                daemon,
                conn.opts.call_timeout,
                keep,
            ))
        })
        .await
    }

    /// Queues `bytes` for the stdin of exec `id`, started with
    /// `stdin_open` (at most [`crate::limits::MAX_STDIN_WRITE_BYTES`] per
    /// call; returns once queued, waiting while the daemon's small queue
    /// is full). Not retried after a lost connection: the bytes may have
    /// arrived.
    pub async fn write_stdin(&self, id: &str, bytes: Vec<u8>) -> Result<(), WsdError> {
        let id = id.to_owned();
        self.run(move |conn| async move {
            conn.call(false, |c| {
                let (id, bytes) = (id.clone(), bytes.clone());
                async move { c.write_stdin(&id, &bytes).await }
            })
            .await
        })
        .await
    }

    /// Closes the stdin of exec `id` (the command reads end of file after
    /// the queued writes). Idempotent.
    pub async fn close_stdin(&self, id: &str) -> Result<(), WsdError> {
        let id = id.to_owned();
        self.run(move |conn| async move {
            conn.call(true, |c| {
                let id = id.clone();
                async move { c.close_stdin(&id).await }
            })
            .await
        })
        .await
    }

    /// Sends `signal` to exec `id`'s process group; `ENOENT` once it is no
    /// longer running (nothing was signalled).
    pub async fn kill(&self, id: &str, signal: Signal) -> Result<(), WsdError> {
        let id = id.to_owned();
        self.run(move |conn| async move {
            conn.call(true, |c| {
                let id = id.clone();
                async move { c.kill_exec(&id, signal).await }
            })
            .await
        })
        .await
    }

    /// Drops exec `id`'s log, killing it first if it still runs.
    pub async fn dispose(&self, id: &str) -> Result<(), WsdError> {
        let id = id.to_owned();
        self.run(move |conn| async move {
            conn.call(true, |c| {
                let id = id.clone();
                async move { c.dispose_exec(&id).await }
            })
            .await
        })
        .await
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Push,
    Pull,
}

/// What one [`drive`] did.
struct Driven {
    sync: SyncReport,
    /// The entries a pull applied (none for a push).
    applied: Vec<AppliedEntry>,
    /// The local store's rev and fetch cursor after a push (zero for a
    /// pull).
    local_rev: u64,
    fetch_cursor: ChangeCursor,
}

/// One run of the sync driver against `store` on `client`, reconciling
/// first if this connection has not yet.
// The mutex is held across awaits on purpose: the run must see one
// consistent store, and it runs on the connection thread, where no other
// task of this connection takes the same lock (`sync_turn` serialises).
#[allow(clippy::await_holding_lock)]
async fn drive<S: Store>(
    conn: &Conn,
    store: &Mutex<S>,
    mut client: Client,
    remote_name: &str,
    direction: Direction,
) -> Result<Driven, WsdError> {
    let mut guard = store.lock().map_err(|_| {
        WsdError::new(
            ErrorCode::Io,
            "the local store's mutex is poisoned (a thread panicked while holding it)",
        )
    })?;
    let local = &mut *guard;
    if !conn.reconciled.get() {
        driver::reconcile(local, &mut client, remote_name).await?;
        conn.reconciled.set(true);
    }
    let ignore = IgnoreRules::none();
    let opts = SyncOptions {
        remote_name,
        ignore: &ignore,
    };
    match direction {
        Direction::Push => {
            let sync = driver::push(local, &mut client, &opts, |_| {}).await?;
            Ok(Driven {
                sync,
                applied: Vec::new(),
                local_rev: local.current_rev()?,
                fetch_cursor: local.watermarks(remote_name)?.fetch_cursor,
            })
        }
        Direction::Pull => {
            let mut applied = Vec::new();
            let sync = driver::pull_with(
                local,
                &mut client,
                &opts,
                |_| {},
                |batch| applied.extend(batch.iter().map(AppliedEntry::of)),
            )
            .await?;
            Ok(Driven {
                sync,
                applied,
                local_rev: 0,
                fetch_cursor: ChangeCursor::ZERO,
            })
        }
    }
}

/// The events of one exec, in seq order, readable from any thread. The
/// connection thread forwards them from the daemon, at most
/// [`CLIENT_EXEC_EVENT_BUFFER`] ahead of the reader (a slow reader slows
/// the command's output, never loses it). Dropping it detaches: the
/// command keeps running and [`WsdHandle::attach`] resumes.
///
/// A stream quiet for the call deadline ([`ClientOptions::call_timeout`])
/// asks the daemon for its status: a daemon that does not answer within
/// the deadline either (frozen, or cut off with its TCP connection still
/// open) ends the stream with `ETIMEDOUT`, instead of a wait that never
/// ends. A quiet command on a live daemon costs one status call per
/// deadline.
pub struct ExecEvents {
    id: String,
    rx: mpsc::Receiver<Result<ExecEvent, WsdError>>,
    /// Keeps the connection thread alive while events may still come.
    _keep: mpsc::Sender<Job>,
}

impl std::fmt::Debug for ExecEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecEvents")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ExecEvents {
    /// Spawns the forwarding task on the connection thread; `daemon` is
    /// the connection the stream came on, asked for its status after each
    /// `quiet` period without an event.
    fn pump(
        mut stream: crate::client::ExecStream,
        daemon: Client,
        quiet: Duration,
        keep: mpsc::Sender<Job>,
    ) -> ExecEvents {
        let (tx, rx) = mpsc::channel(CLIENT_EXEC_EVENT_BUFFER);
        let id = stream.id().to_owned();
        tokio::task::spawn_local(async move {
            loop {
                let next = tokio::select! {
                    next = stream.next() => next,
                    () = tx.closed() => return,
                    () = tokio::time::sleep(quiet) => match daemon.status().await {
                        // The daemon answers: the command is only quiet.
                        Ok(_) => continue,
                        Err(e) => Err(WsdError::new(
                            e.code,
                            format!("exec {}: no event for {quiet:?}, and then {}", stream.id(), e.message),
                        )
                        .with_subject(e.subject.unwrap_or_else(|| stream.id().to_owned()))),
                    },
                };
                match next {
                    Ok(Some(event)) => {
                        if tx.send(Ok(event)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        ExecEvents {
            id,
            rx,
            _keep: keep,
        }
    }

    /// The exec's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The next event; `Ok(None)` after the delivery ended cleanly (after
    /// the exit event). A lost connection is `ESHUTDOWN`: re-attach with
    /// `attach(id, ResumeFrom::After(last_seq))`.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>, WsdError> {
        self.rx.recv().await.transpose()
    }
}

impl futures::Stream for ExecEvents {
    type Item = Result<ExecEvent, WsdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}
