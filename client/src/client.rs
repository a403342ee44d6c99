//! The client: dial a daemon, authenticate, and use its `sync` half as a
//! [`wsd_sync::Remote`] and its `shell` half through [`ExecStream`]s.
//!
//! Everything here must run inside a [`tokio::task::LocalSet`]: the
//! connection is driven by a local task (capnp-rpc is `!Send`). The driver's
//! own store calls happen on the same thread, between awaits.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use capnp_rpc::{RpcSystem, rpc_twoparty_capnp};
use tokio::sync::mpsc;
use wsd_schema::workspace_capnp as wire;
use wsd_sync::chunk::MAX_CHUNK;
use wsd_sync::limits::MAX_HASHES_PER_CALL;
use wsd_sync::{
    Baseline, ChangeCursor, ChangeEntry, ChangeStream, ErrorCode, FetchOpened, Hash, Object,
    ObjectReader, PendingProbe, PendingPush, PendingUpload, PushOutcome, Remote, SyncError,
    SyncPath, Watermarks,
};

use crate::convert::{
    baseline_to, cursor_from, cursor_to, entries_from, entries_to, exec_event_from,
    exec_request_to, hashes_from, hashes_to, ignore_to, maybe_entry_from, objects_from,
    pty_request_to, resume_to, signal_to, status_from, watermarks_from, wire_error_from,
};
use crate::exec::{ExecEvent, ExecRequest, PtyRequest, ResumeFrom, Signal};
use crate::limits::{
    CLIENT_EXEC_EVENT_BUFFER, MAX_CHANGES_PER_NEXT, MAX_PTY_WRITE_BYTES, MAX_STDIN_WRITE_BYTES,
    OBJECT_WRITE_BYTES,
};
use crate::options::timed_out;
use crate::status::DaemonStatus;
use crate::stream::{self, StreamWindow, message_bytes};
use crate::transport::network;
use crate::{ClientOptions, Endpoint, PROTOCOL_VERSION, WsdError};

/// An upload already sent ([`Client::push_objects_send`]): resolves once
/// the daemon has staged every object of it.
pub type UploadStaged = std::pin::Pin<Box<dyn Future<Output = Result<(), WsdError>>>>;

/// A connection to one daemon's workspace, as one named peer. Cheap to
/// clone (clones share the connection). The connection closes when the
/// last clone is dropped.
#[derive(Clone)]
pub struct Client {
    workspace: wire::workspace::Client,
    sync: wire::sync::Client,
    shell: wire::shell::Client,
    conn: Rc<Connection>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

struct Connection {
    alive: Rc<Cell<bool>>,
    task: tokio::task::JoinHandle<()>,
    /// The address, for errors.
    endpoint: String,
    call_timeout: Duration,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Connection {
    /// Awaits one call under the idle-progress deadline. A call that times
    /// out drops the connection: its answer may still come, and the calls
    /// after it would queue behind a daemon that does not answer.
    async fn deadline<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, capnp::Error>>,
    ) -> Result<T, WsdError> {
        self.deadline_after(Duration::ZERO, what, call).await
    }

    /// [`Connection::deadline`] for a call the server may hold for `held`
    /// before it answers (a long poll).
    async fn deadline_after<T>(
        &self,
        held: Duration,
        what: &str,
        call: impl Future<Output = Result<T, capnp::Error>>,
    ) -> Result<T, WsdError> {
        let limit = held + self.call_timeout;
        match tokio::time::timeout(limit, call).await {
            Ok(result) => Ok(result?),
            Err(_) => {
                self.close();
                Err(timed_out(&self.endpoint, what, limit))
            }
        }
    }

    fn close(&self) {
        self.alive.set(false);
        self.task.abort();
    }
}

/// Dials `addr` (`"host:port"` or `"unix:/path"`) with the default
/// [`ClientOptions`], presenting `token` as the peer named `peer`; see
/// [`connect_with`].
pub async fn connect(addr: &str, token: Option<Vec<u8>>, peer: &str) -> Result<Client, WsdError> {
    let endpoint: Endpoint = addr.parse()?;
    let opts = ClientOptions {
        token,
        peer: peer.to_owned(),
        ..ClientOptions::default()
    };
    connect_with(&endpoint, &opts).await
}

/// Dials `endpoint`, checks the protocol version and presents the token
/// as the peer `opts.peer` (the name the daemon keeps our watermarks under:
/// use the same one every time).
///
/// Fails with `EAUTH` (no token given, a wrong one, or a refused origin), `EPROTOCOL` (version
/// mismatch), `EIO` (cannot dial), `ETIMEDOUT` (dial or handshake deadline
/// passed), each naming the address. Must be called inside a `LocalSet`.
pub async fn connect_with(endpoint: &Endpoint, opts: &ClientOptions) -> Result<Client, WsdError> {
    let addr = endpoint.to_string();
    let dial_err = |e: std::io::Error| {
        WsdError::new(ErrorCode::Io, format!("cannot connect to {addr}: {e}")).with_subject(&addr)
    };
    let dial = async {
        Ok::<_, WsdError>(match endpoint {
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(dial_err)?;
                network(stream, rpc_twoparty_capnp::Side::Client)
            }
            Endpoint::Tcp(host_port) => {
                let stream = tokio::net::TcpStream::connect(host_port.as_str())
                    .await
                    .map_err(dial_err)?;
                stream.set_nodelay(true).map_err(dial_err)?;
                network(stream, rpc_twoparty_capnp::Side::Client)
            }
        })
    };
    let network = tokio::time::timeout(opts.connect_timeout, dial)
        .await
        .map_err(|_| timed_out(&addr, "connect", opts.connect_timeout))??;
    let mut rpc = RpcSystem::new(network, None);
    let bootstrap: wire::bootstrap::Client = rpc.bootstrap(rpc_twoparty_capnp::Side::Server);
    let alive = Rc::new(Cell::new(true));
    let task = {
        let alive = alive.clone();
        let addr = addr.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = rpc.await {
                tracing::debug!(addr, error = %e, "connection ended");
            }
            alive.set(false);
        })
    };
    let conn = Rc::new(Connection {
        alive,
        task,
        endpoint: addr.clone(),
        call_timeout: opts.call_timeout,
    });
    let mut req = bootstrap.connect_request();
    {
        let mut p = req.get();
        p.set_token(opts.token.as_deref().unwrap_or_default());
        p.set_protocol_version(PROTOCOL_VERSION);
        p.set_peer(opts.peer.as_str());
    }
    let response = tokio::time::timeout(opts.handshake_timeout, req.send().promise)
        .await
        .map_err(|_| timed_out(&addr, "handshake", opts.handshake_timeout))?
        .map_err(|e| WsdError::from(e).with_subject(&addr))?;
    let workspace = response.get()?.get_workspace()?;
    // Pipelined: both halves resolve in the same round trip.
    let sync = workspace.sync_request().send().pipeline.get_sync();
    let shell = workspace.shell_request().send().pipeline.get_shell();
    Ok(Client {
        workspace,
        sync,
        shell,
        conn,
    })
}

impl Client {
    /// False once the connection broke or closed; every call then fails
    /// with `ESHUTDOWN` ("connection lost").
    pub fn is_connected(&self) -> bool {
        self.conn.alive.get()
    }

    fn check_alive(&self) -> Result<(), WsdError> {
        if self.is_connected() {
            Ok(())
        } else {
            Err(WsdError::connection_lost("closed"))
        }
    }

    /// The daemon's health snapshot.
    pub async fn status(&self) -> Result<DaemonStatus, WsdError> {
        self.check_alive()?;
        let response = self
            .conn
            .deadline("status", self.workspace.status_request().send().promise)
            .await?;
        status_from(response.get()?.get_status()?)
    }

    pub async fn watermarks(&self) -> Result<Watermarks, WsdError> {
        self.check_alive()?;
        let response = self
            .conn
            .deadline("watermarks", self.sync.watermarks_request().send().promise)
            .await?;
        let r = response.get()?;
        watermarks_from(
            r.get_current_rev(),
            r.get_push_cursor()?,
            r.get_fetch_cursor()?,
        )
    }

    /// Waits until the daemon's rev exceeds `after` (a change was
    /// committed or noticed there) or `wait` passed (at most
    /// [`MAX_WAIT_CHANGES`](crate::limits::MAX_WAIT_CHANGES)), and returns
    /// its current rev. A long poll: other calls on this connection go on
    /// meanwhile.
    pub async fn wait_changes(&self, after: u64, wait: Duration) -> Result<u64, WsdError> {
        self.check_alive()?;
        let wait = wait.min(crate::limits::MAX_WAIT_CHANGES);
        let mut req = self.sync.wait_changes_request();
        req.get().set_after(after);
        req.get()
            .set_timeout_ms(u32::try_from(wait.as_millis()).unwrap_or(u32::MAX));
        let response = self
            .conn
            .deadline_after(wait, "waitChanges", req.send().promise)
            .await?;
        Ok(response.get()?.get_current_rev())
    }

    pub async fn read_entry(&self, path: &SyncPath) -> Result<Option<ChangeEntry>, WsdError> {
        self.check_alive()?;
        let mut req = self.sync.read_entry_request();
        req.get().set_path(path.as_str());
        let response = self.conn.deadline("readEntry", req.send().promise).await?;
        maybe_entry_from(response.get()?.get_entry()?)
    }

    pub async fn fetch_changes(
        &self,
        after: &ChangeCursor,
        ignore: &[String],
    ) -> Result<(FetchOpened, RemoteChanges), WsdError> {
        self.check_alive()?;
        let mut req = self.sync.fetch_changes_request();
        {
            let mut p = req.get();
            cursor_to(p.reborrow().init_after(), after);
            ignore_to(p.init_ignore(ignore.len() as u32), ignore);
        }
        let response = self
            .conn
            .deadline("fetchChanges", req.send().promise)
            .await?;
        let r = response.get()?;
        let opened = FetchOpened {
            current: cursor_from(r.get_current_cursor()?)?,
            applied_push_cursor: cursor_from(r.get_applied_push_cursor()?)?,
            baseline: r.get_baseline(),
        };
        Ok((
            opened,
            RemoteChanges {
                iter: r.get_changes()?,
                conn: self.conn.clone(),
                ahead: None,
            },
        ))
    }

    pub async fn has_objects(&self, hashes: &[Hash]) -> Result<Vec<Hash>, WsdError> {
        self.has_objects_send(hashes)?.await
    }

    /// Sends a `hasObjects`; its answer arrives on the returned future,
    /// which borrows nothing.
    pub fn has_objects_send(
        &self,
        hashes: &[Hash],
    ) -> Result<impl Future<Output = Result<Vec<Hash>, WsdError>> + 'static, WsdError> {
        self.check_alive()?;
        let mut req = self.sync.has_objects_request();
        hashes_to(req.get().init_hashes(hashes.len() as u32), hashes);
        let promise = req.send().promise;
        let conn = self.conn.clone();
        Ok(async move {
            let response = conn.deadline("hasObjects", promise).await?;
            hashes_from(response.get()?.get_held()?, MAX_HASHES_PER_CALL)
        })
    }

    /// The objects in request order. The daemon streams them into a local
    /// sink; the caller bounds memory by the size of `hashes`.
    pub async fn fetch_objects(&self, hashes: &[Hash]) -> Result<Vec<Object>, WsdError> {
        self.check_alive()?;
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        let received = Rc::new(RefCell::new(Vec::with_capacity(hashes.len())));
        let sink = CollectSink {
            received: received.clone(),
            expected: hashes.len(),
        };
        let mut req = self.sync.fetch_objects_request();
        {
            let mut p = req.get();
            hashes_to(p.reborrow().init_hashes(hashes.len() as u32), hashes);
            p.set_sink(capnp_rpc::new_client(sink));
        }
        self.conn
            .deadline("fetchObjects", req.send().promise)
            .await?;
        let objects = received.take();
        if objects.len() != hashes.len() || objects.iter().zip(hashes).any(|(o, h)| o.hash != *h) {
            return Err(WsdError::new(
                ErrorCode::Protocol,
                format!(
                    "fetchObjects delivered {} objects for {} requested, or out of order",
                    objects.len(),
                    hashes.len()
                ),
            ));
        }
        Ok(objects)
    }

    /// Streams `objects` into an upload sink in writes of about
    /// [`OBJECT_WRITE_BYTES`], paced by the daemon's stream window.
    pub async fn push_objects(&self, objects: &[Object]) -> Result<(), WsdError> {
        self.push_objects_send(objects).await?.await
    }

    /// [`Client::push_objects`], returning once every write is sent (the
    /// stream window permitting); the returned future resolves when the
    /// daemon has staged them all.
    pub async fn push_objects_send(&self, objects: &[Object]) -> Result<UploadStaged, WsdError> {
        let wanted = objects
            .iter()
            .map(|o| {
                u32::try_from(o.bytes.len())
                    .map(|size| (o.hash, size))
                    .map_err(|_| WsdError::limit("object size (bytes)", MAX_CHUNK, o.bytes.len()))
            })
            .collect::<Result<Vec<_>, WsdError>>()?;
        let mut next = objects.iter();
        self.push_objects_send_from(&wanted, |_, buf: &mut [u8]| {
            let object = next.next().expect("one object per wanted entry");
            buf.copy_from_slice(&object.bytes);
            Ok::<(), WsdError>(())
        })
        .await
    }

    /// [`Client::push_objects_send`] of the objects `wanted` names (hash and
    /// size), each written by `read` straight into the message it goes out
    /// in, so a sender keeps no copy of its own. A failure of `read` ends
    /// the upload (what was sent before it may stay staged on the daemon)
    /// and is returned as it is.
    pub async fn push_objects_send_from<E: From<WsdError>>(
        &self,
        wanted: &[(Hash, u32)],
        mut read: impl FnMut(&Hash, &mut [u8]) -> Result<(), E>,
    ) -> Result<UploadStaged, E> {
        self.check_alive()?;
        if wanted.is_empty() {
            return Ok(Box::pin(std::future::ready(Ok(()))));
        }
        let sink = self.sync.push_objects_request().send().pipeline.get_sink();
        let mut start = 0;
        let mut window = StreamWindow::new();
        while start < wanted.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < wanted.len()
                && (end == start || bytes + wanted[end].1 as usize <= OBJECT_WRITE_BYTES)
            {
                bytes += wanted[end].1 as usize;
                end += 1;
            }
            let mut req = stream::object_write_call(&sink);
            {
                let mut list = req.get().init_objects((end - start) as u32);
                for (i, (hash, size)) in wanted[start..end].iter().enumerate() {
                    let mut object = list.reborrow().get(i as u32);
                    object.set_hash(hash.as_bytes());
                    read(hash, object.init_bytes(*size))?;
                }
            }
            let size = message_bytes(req.get().into_reader().total_size());
            self.conn
                .deadline("pushObjects", window.send(req, size))
                .await?;
            start = end;
        }
        // `done` may go out before the writes are acknowledged: the daemon
        // runs a streaming capability's calls one at a time, so it answers
        // `done` after the last write is staged (or repeats its failure).
        let done = sink.done_request().send().promise;
        let conn = self.conn.clone();
        Ok(Box::pin(async move {
            conn.deadline("pushObjects", window.finish()).await?;
            conn.deadline("pushObjects", done).await?;
            Ok(())
        }))
    }

    /// `sender: None` is an external writer (wire `senderRev = 0`). A
    /// sender cursor at rev 0 is indistinguishable on the wire and is
    /// applied as an external writer too; it only arises for an empty
    /// sender, whose entries list is then empty anyway. `ignore` is the
    /// sender's exclusions, which a sweep spares on the daemon.
    pub async fn push(
        &self,
        sender: Option<&ChangeCursor>,
        entries: &[ChangeEntry],
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PushOutcome, WsdError> {
        self.push_send(sender, entries, baseline, ignore)?.await
    }

    /// Sends a `push` and returns its outcome as a future that borrows
    /// nothing: calls made after this one reach the daemon after it.
    pub fn push_send(
        &self,
        sender: Option<&ChangeCursor>,
        entries: &[ChangeEntry],
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<impl Future<Output = Result<PushOutcome, WsdError>> + 'static, WsdError> {
        self.check_alive()?;
        let mut req = self.sync.push_request();
        {
            let mut p = req.get();
            cursor_to(
                p.reborrow().init_sender(),
                sender.unwrap_or(&ChangeCursor::ZERO),
            );
            p.set_baseline(baseline_to(baseline));
            entries_to(p.reborrow().init_entries(entries.len() as u32), entries);
            if !ignore.is_empty() {
                ignore_to(p.init_ignore(ignore.len() as u32), ignore);
            }
        }
        let promise = req.send().promise;
        let conn = self.conn.clone();
        Ok(async move {
            let response = conn.deadline("push", promise).await?;
            let r = response.get()?;
            Ok(PushOutcome {
                rev: r.get_rev(),
                applied_push_cursor: cursor_from(r.get_applied_push_cursor()?)?,
            })
        })
    }

    /// Starts a command; its events arrive on the returned stream.
    pub async fn exec(&self, request: &ExecRequest) -> Result<ExecStream, WsdError> {
        self.check_alive()?;
        let (sink, rx) = EventSink::new();
        let mut req = self.shell.exec_request();
        {
            let mut p = req.get();
            exec_request_to(p.reborrow().init_request(), request);
            p.set_events(capnp_rpc::new_client(sink));
        }
        let response = self.conn.deadline("exec", req.send().promise).await?;
        let r = response.get()?;
        Ok(ExecStream::new(
            r.get_id()?
                .to_string()
                .map_err(|e| WsdError::new(ErrorCode::Protocol, e.to_string()))?,
            r.get_subscription()?,
            rx,
            self.conn.clone(),
        ))
    }

    /// Starts a program on a new pseudo-terminal; its output arrives on
    /// the returned stream as `stdout` events.
    pub async fn start_pty(&self, request: &PtyRequest) -> Result<ExecStream, WsdError> {
        self.check_alive()?;
        let (sink, rx) = EventSink::new();
        let mut req = self.shell.start_pty_request();
        {
            let mut p = req.get();
            pty_request_to(p.reborrow().init_request(), request);
            p.set_events(capnp_rpc::new_client(sink));
        }
        let response = self.conn.deadline("startPty", req.send().promise).await?;
        let r = response.get()?;
        Ok(ExecStream::new(
            r.get_id()?
                .to_string()
                .map_err(|e| WsdError::new(ErrorCode::Protocol, e.to_string()))?,
            r.get_subscription()?,
            rx,
            self.conn.clone(),
        ))
    }

    /// Queues `bytes` (at most [`MAX_PTY_WRITE_BYTES`]) as typed input of
    /// terminal `id`. Checked here too, so an oversized write fails before
    /// it is sent.
    pub async fn pty_write(&self, id: &str, bytes: &[u8]) -> Result<(), WsdError> {
        self.check_alive()?;
        WsdError::check_limit(
            "terminal input bytes per write",
            MAX_PTY_WRITE_BYTES,
            bytes.len(),
        )?;
        let mut req = self.shell.pty_write_request();
        req.get().set_id(id);
        req.get().set_data(bytes);
        self.conn.deadline("ptyWrite", req.send().promise).await?;
        Ok(())
    }

    /// Sets the window size of terminal `id`.
    pub async fn pty_resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), WsdError> {
        self.check_alive()?;
        let mut req = self.shell.pty_resize_request();
        req.get().set_id(id);
        req.get().set_cols(cols);
        req.get().set_rows(rows);
        self.conn.deadline("ptyResize", req.send().promise).await?;
        Ok(())
    }

    /// Re-attaches to an exec from `from`.
    pub async fn get_exec(&self, id: &str, from: ResumeFrom) -> Result<ExecStream, WsdError> {
        self.check_alive()?;
        let (sink, rx) = EventSink::new();
        let mut req = self.shell.get_exec_request();
        {
            let mut p = req.get();
            p.set_id(id);
            resume_to(p.reborrow().init_after(), from);
            p.set_events(capnp_rpc::new_client(sink));
        }
        let response = self.conn.deadline("getExec", req.send().promise).await?;
        Ok(ExecStream::new(
            id.to_owned(),
            response.get()?.get_subscription()?,
            rx,
            self.conn.clone(),
        ))
    }

    pub async fn kill_exec(&self, id: &str, signal: Signal) -> Result<(), WsdError> {
        self.check_alive()?;
        let mut req = self.shell.kill_exec_request();
        req.get().set_id(id);
        req.get().set_signal(signal_to(signal));
        self.conn.deadline("killExec", req.send().promise).await?;
        Ok(())
    }

    /// Queues `bytes` (at most [`MAX_STDIN_WRITE_BYTES`]) for the stdin
    /// of exec `id`, started with `stdin_open`. Checked here too, so an
    /// oversized write fails before it is sent.
    pub async fn write_stdin(&self, id: &str, bytes: &[u8]) -> Result<(), WsdError> {
        self.check_alive()?;
        WsdError::check_limit("stdin bytes per write", MAX_STDIN_WRITE_BYTES, bytes.len())?;
        let mut req = self.shell.write_stdin_request();
        req.get().set_id(id);
        req.get().set_data(bytes);
        self.conn.deadline("writeStdin", req.send().promise).await?;
        Ok(())
    }

    /// Closes the stdin of exec `id` after its queued writes.
    pub async fn close_stdin(&self, id: &str) -> Result<(), WsdError> {
        self.check_alive()?;
        let mut req = self.shell.close_stdin_request();
        req.get().set_id(id);
        self.conn.deadline("closeStdin", req.send().promise).await?;
        Ok(())
    }

    pub async fn dispose_exec(&self, id: &str) -> Result<(), WsdError> {
        self.check_alive()?;
        let mut req = self.shell.dispose_exec_request();
        req.get().set_id(id);
        self.conn
            .deadline("disposeExec", req.send().promise)
            .await?;
        Ok(())
    }
}

/// A remote change window ([`Remote::fetch_changes`]); pulls batches with
/// `ChangeIterator.next`. Dropping it closes the window on the daemon.
pub struct RemoteChanges {
    iter: wire::change_iterator::Client,
    conn: Rc<Connection>,
    /// The next batch, requested as soon as a full batch arrived, so the
    /// daemon pages its index while the caller applies the current one.
    ahead: Option<NextPromise>,
}

type NextPromise = capnp::capability::Promise<
    capnp::capability::Response<wire::change_iterator::next_results::Owned>,
    capnp::Error,
>;

impl std::fmt::Debug for RemoteChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteChanges").finish_non_exhaustive()
    }
}

impl RemoteChanges {
    /// Up to `max` next entries. After a full batch the following one is
    /// requested at once (with the same `max`) and returned by the next call
    /// whatever `max` that call passes, since the daemon's cursor has moved.
    pub async fn next(&mut self, max: usize) -> Result<Vec<ChangeEntry>, WsdError> {
        if !self.conn.alive.get() {
            return Err(WsdError::connection_lost("closed"));
        }
        let max = max.clamp(1, MAX_CHANGES_PER_NEXT);
        let promise = match self.ahead.take() {
            Some(p) => p,
            None => self.request(max),
        };
        let response = self.conn.deadline("ChangeIterator.next", promise).await?;
        let entries = entries_from(
            response.get()?.get_entries()?,
            "entries per next",
            MAX_CHANGES_PER_NEXT,
        )?;
        if entries.len() >= max {
            self.ahead = Some(self.request(max));
        }
        Ok(entries)
    }

    fn request(&self, max: usize) -> NextPromise {
        let mut req = self.iter.next_request();
        req.get().set_max(max as u32);
        req.send().promise
    }
}

impl ChangeStream for RemoteChanges {
    async fn next_batch(&mut self, max: usize) -> Result<Vec<ChangeEntry>, SyncError> {
        Ok(self.next(max).await?)
    }
}

impl Remote for Client {
    type Changes = RemoteChanges;

    async fn watermarks(&mut self) -> Result<Watermarks, SyncError> {
        Ok(Client::watermarks(self).await?)
    }

    async fn fetch_changes(
        &mut self,
        after: &ChangeCursor,
        ignore: &[String],
    ) -> Result<(FetchOpened, RemoteChanges), SyncError> {
        Ok(Client::fetch_changes(self, after, ignore).await?)
    }

    async fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        Ok(Client::has_objects(self, hashes).await?)
    }

    async fn fetch_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError> {
        Ok(Client::fetch_objects(self, hashes).await?)
    }

    async fn push_objects(&mut self, objects: Vec<Object>) -> Result<(), SyncError> {
        Ok(Client::push_objects(self, &objects).await?)
    }

    async fn push(
        &mut self,
        sender: Option<ChangeCursor>,
        entries: Vec<ChangeEntry>,
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PushOutcome, SyncError> {
        Ok(Client::push(self, sender.as_ref(), &entries, baseline, ignore).await?)
    }

    async fn push_pipelined(
        &mut self,
        sender: Option<ChangeCursor>,
        entries: Vec<ChangeEntry>,
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PendingPush, SyncError> {
        let pending = self.push_send(sender.as_ref(), &entries, baseline, ignore)?;
        Ok(Box::pin(async move { Ok(pending.await?) }))
    }

    async fn has_objects_pipelined(&mut self, hashes: &[Hash]) -> Result<PendingProbe, SyncError> {
        let pending = self.has_objects_send(hashes)?;
        Ok(Box::pin(async move { Ok(pending.await?) }))
    }

    async fn push_objects_pipelined(
        &mut self,
        objects: Vec<Object>,
    ) -> Result<PendingUpload, SyncError> {
        let pending = self.push_objects_send(&objects).await?;
        Ok(Box::pin(async move { Ok(pending.await?) }))
    }

    async fn push_objects_from(
        &mut self,
        wanted: &[(Hash, u32)],
        reader: &mut dyn ObjectReader,
    ) -> Result<PendingUpload, SyncError> {
        let pending = self
            .push_objects_send_from(wanted, |hash, buf| reader.read_into(hash, buf))
            .await?;
        Ok(Box::pin(async move { Ok(pending.await?) }))
    }
}

/// Receives `fetchObjects` writes.
struct CollectSink {
    received: Rc<RefCell<Vec<Object>>>,
    expected: usize,
}

impl wire::object_sink::Server for CollectSink {
    async fn write(
        self: Rc<Self>,
        params: wire::object_sink::WriteParams,
    ) -> Result<(), capnp::Error> {
        let result = (|| {
            let objects = objects_from(params.get()?.get_objects()?)?;
            let mut received = self.received.borrow_mut();
            if received.len() + objects.len() > self.expected {
                return Err(WsdError::new(
                    ErrorCode::Protocol,
                    "fetchObjects sent more objects than requested",
                ));
            }
            received.extend(objects);
            Ok(())
        })();
        result.map_err(|e| crate::convert::error_to(&e))
    }

    async fn done(
        self: Rc<Self>,
        _: wire::object_sink::DoneParams,
        _: wire::object_sink::DoneResults,
    ) -> Result<(), capnp::Error> {
        Ok(())
    }
}

enum SinkItem {
    Event(ExecEvent),
    End(Option<WsdError>),
}

/// Receives an exec's events into a bounded channel; when the reader of
/// the [`ExecStream`] falls behind, `event` stops returning, which fills
/// the capnp stream window and slows the daemon's runner.
struct EventSink {
    tx: mpsc::Sender<SinkItem>,
}

impl EventSink {
    fn new() -> (EventSink, mpsc::Receiver<SinkItem>) {
        let (tx, rx) = mpsc::channel(CLIENT_EXEC_EVENT_BUFFER);
        (EventSink { tx }, rx)
    }
}

impl wire::exec_event_sink::Server for EventSink {
    async fn event(
        self: Rc<Self>,
        params: wire::exec_event_sink::EventParams,
    ) -> Result<(), capnp::Error> {
        let event = exec_event_from(params.get()?.get_event()?)
            .map_err(|e| crate::convert::error_to(&e))?;
        self.tx
            .send(SinkItem::Event(event))
            .await
            .map_err(|_| capnp::Error::failed("ESHUTDOWN: the exec stream was dropped".into()))
    }

    async fn end(
        self: Rc<Self>,
        params: wire::exec_event_sink::EndParams,
        _: wire::exec_event_sink::EndResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let error = if p.has_error() {
            Some(wire_error_from(p.get_error()?).unwrap_or_else(|e| e))
        } else {
            None
        };
        let _ = self.tx.send(SinkItem::End(error)).await;
        Ok(())
    }
}

/// The events of one exec, in seq order. Dropping it stops the delivery
/// (the command keeps running; [`Client::get_exec`] re-attaches).
pub struct ExecStream {
    id: String,
    rx: mpsc::Receiver<SinkItem>,
    ended: bool,
    _subscription: wire::exec_subscription::Client,
    /// Keeps the connection driven while the stream lives, even after the
    /// [`Client`] it came from is dropped (without it the events stop and
    /// `next` waits forever).
    _conn: Rc<Connection>,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream")
            .field("id", &self.id)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl ExecStream {
    fn new(
        id: String,
        subscription: wire::exec_subscription::Client,
        rx: mpsc::Receiver<SinkItem>,
        conn: Rc<Connection>,
    ) -> Self {
        ExecStream {
            id,
            rx,
            ended: false,
            _subscription: subscription,
            _conn: conn,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The next event; `Ok(None)` after the delivery ended cleanly (after
    /// the exit event). A delivery that ended with an error returns it; a
    /// connection lost mid-stream is `ESHUTDOWN` ("connection lost"):
    /// re-attach with `get_exec(id, ResumeFrom::After(last_seq))`.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>, WsdError> {
        if self.ended {
            return Ok(None);
        }
        match self.rx.recv().await {
            Some(SinkItem::Event(e)) => Ok(Some(e)),
            Some(SinkItem::End(None)) => {
                self.ended = true;
                Ok(None)
            }
            Some(SinkItem::End(Some(e))) => {
                self.ended = true;
                Err(e)
            }
            None => {
                self.ended = true;
                Err(WsdError::connection_lost(
                    "the exec event stream ended without its end marker",
                ))
            }
        }
    }
}

/// Re-dial attempts after a lost connection before giving up, and the
/// backoff between them (exponential with jitter, 100 ms up to 5 s: a
/// restarting daemon is back within a few seconds).
pub const REDIAL_ATTEMPTS: usize = 6;
const REDIAL_MIN_DELAY: Duration = Duration::from_millis(100);
const REDIAL_MAX_DELAY: Duration = Duration::from_secs(5);

/// Dials with [`connect_with`], retrying with backoff while the failure is
/// one a later dial may not have (`ESHUTDOWN`, `EIO`: the daemon restarting
/// or not listening yet); a refused token or version is returned at once,
/// and so is `ETIMEDOUT`: that dial already waited out its whole deadline
/// on a host that is frozen or cut off, and dialling again would multiply
/// the caller's wait. `dials` counts every attempt.
pub async fn dial_with_backoff(
    endpoint: &Endpoint,
    opts: &ClientOptions,
    dials: &Cell<u64>,
) -> Result<Client, WsdError> {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(REDIAL_MIN_DELAY)
        .with_max_delay(REDIAL_MAX_DELAY)
        .with_max_times(REDIAL_ATTEMPTS)
        .with_jitter();
    (|| {
        dials.set(dials.get() + 1);
        connect_with(endpoint, opts)
    })
    .retry(backoff)
    .when(|e| matches!(e.code, ErrorCode::Shutdown | ErrorCode::Io))
    .notify(|e, after| tracing::info!(%endpoint, error = %e, ?after, "re-dialling"))
    .await
}

/// A [`Remote`] that dials lazily and re-dials (with backoff, see
/// [`dial_with_backoff`]) after a lost connection, for code inside a
/// `LocalSet`; [`crate::WsdHandle`] does the same for any thread and also
/// reconciles after each dial.
///
/// A call that fails with a retryable error (`ESHUTDOWN`: connection lost
/// or daemon restarting; `ETIMEDOUT`) drops the connection; the call is
/// retried once on a fresh one when it is idempotent: every read,
/// `pushObjects` (staging is idempotent) and a peer `push` (senderRev > 0:
/// already-applied entries are skipped and the fetch cursor never moves
/// backwards). An external writer's push is not retried. The pipelined
/// calls keep [`Remote`]'s sequential defaults here, since a call already
/// on the wire when the connection broke could not be retried: a push
/// through this type waits for each round trip (use [`Client`] for the
/// pipelined speed). A change stream cut mid-way
/// fails; the driver's checkpoints make re-running the push or pull resume
/// where it stopped. After a re-dial the caller should run
/// [`wsd_sync::driver::reconcile`] again ([`ReconnectingClient::dials`]
/// tells it one happened).
#[derive(Debug)]
pub struct ReconnectingClient {
    addr: String,
    opts: ClientOptions,
    current: Option<Client>,
    dials: Cell<u64>,
}

impl ReconnectingClient {
    /// `addr` is parsed at the first dial (a malformed one fails that
    /// call with `EINVAL`).
    pub fn new(addr: impl Into<String>, token: Option<Vec<u8>>, peer: impl Into<String>) -> Self {
        ReconnectingClient::with_options(
            addr,
            ClientOptions {
                token,
                peer: peer.into(),
                ..ClientOptions::default()
            },
        )
    }

    pub fn with_options(addr: impl Into<String>, opts: ClientOptions) -> Self {
        ReconnectingClient {
            addr: addr.into(),
            opts,
            current: None,
            dials: Cell::new(0),
        }
    }

    /// How many times a connection was dialled so far.
    pub fn dials(&self) -> u64 {
        self.dials.get()
    }

    /// The live connection, dialling one if there is none.
    pub async fn client(&mut self) -> Result<Client, WsdError> {
        if let Some(c) = &self.current
            && c.is_connected()
        {
            return Ok(c.clone());
        }
        self.current = None;
        if self.dials.get() > 0 {
            tracing::info!(addr = self.addr, "re-dialling after a lost connection");
        }
        let endpoint: Endpoint = self.addr.parse()?;
        let c = dial_with_backoff(&endpoint, &self.opts, &self.dials).await?;
        self.current = Some(c.clone());
        Ok(c)
    }

    async fn call<T, F, Fut>(&mut self, idempotent: bool, f: F) -> Result<T, WsdError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, WsdError>>,
    {
        let client = self.client().await?;
        match f(client).await {
            Err(e) if e.is_retryable() || e.code == ErrorCode::Timeout => {
                self.current = None;
                if !idempotent {
                    return Err(e);
                }
                tracing::info!(error = %e, "retrying an idempotent call on a fresh connection");
                f(self.client().await?).await
            }
            other => other,
        }
    }
}

impl Remote for ReconnectingClient {
    type Changes = RemoteChanges;

    async fn watermarks(&mut self) -> Result<Watermarks, SyncError> {
        Ok(self
            .call(true, |c| async move { c.watermarks().await })
            .await?)
    }

    async fn fetch_changes(
        &mut self,
        after: &ChangeCursor,
        ignore: &[String],
    ) -> Result<(FetchOpened, RemoteChanges), SyncError> {
        Ok(self
            .call(
                true,
                |c| async move { c.fetch_changes(after, ignore).await },
            )
            .await?)
    }

    async fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        Ok(self
            .call(true, |c| async move { c.has_objects(hashes).await })
            .await?)
    }

    async fn fetch_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError> {
        Ok(self
            .call(true, |c| async move { c.fetch_objects(hashes).await })
            .await?)
    }

    async fn push_objects(&mut self, objects: Vec<Object>) -> Result<(), SyncError> {
        let objects = &objects;
        Ok(self
            .call(true, |c| async move { c.push_objects(objects).await })
            .await?)
    }

    async fn push(
        &mut self,
        sender: Option<ChangeCursor>,
        entries: Vec<ChangeEntry>,
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PushOutcome, SyncError> {
        let (sender, entries) = (sender.as_ref(), &entries);
        let idempotent = sender.is_some();
        Ok(self
            .call(idempotent, |c| async move {
                c.push(sender, entries, baseline, ignore).await
            })
            .await?)
    }
}
