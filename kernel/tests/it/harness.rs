//! The one place test setup lives: a kernel on loopback, logged-in
//! clients (a second socket of a user included), workspaces, node tokens
//! and a scripted driver speaking raw JSON frames.

use std::sync::Arc;
use std::time::Duration;

use gsv_kernel::client::{Credentials, GsvClient, connect_args};
use gsv_kernel::{Kernel, KernelConfig};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::oneshot;

pub const ALICE_PW: &str = "alice-password";
pub const BOB_PW: &str = "bob-password";

/// A running kernel; stopped when dropped.
pub struct TestKernel {
    pub url: String,
    /// For tests that look inside (e.g. a workspace's wsd child).
    #[allow(dead_code)]
    pub kernel: Arc<Kernel>,
    _dir: Option<TempDir>,
    stop: Option<oneshot::Sender<()>>,
    /// The server task; it ends after the kernel's shutdown.
    served: Option<tokio::task::JoinHandle<()>>,
}

/// A kernel's data directory while no kernel runs on it (see
/// [`TestKernel::stop`]).
pub struct StoppedKernel {
    dir: TempDir,
}

impl StoppedKernel {
    /// The data directory, for tests that open its stores directly.
    #[allow(dead_code)]
    pub fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Starts a kernel again on the same data directory.
    pub async fn start(self) -> TestKernel {
        let mut k = TestKernel::start_in(self.dir.path().join("data"), |_| {}).await;
        k._dir = Some(self.dir);
        k
    }
}

impl Drop for TestKernel {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // A shutdown leaves the wsd a terminal runs in for the next
        // kernel; there is none after a test's own kernel.
        if let Some(dir) = &self._dir {
            kill_leftover_children(&dir.path().join("data"));
        }
    }
}

/// Kills, when dropped (a failed assertion too), the local wsd children a
/// kernel on its data directory left running: because a test let it vanish
/// without shutting down (a simulated crash), or because a terminal ran in
/// them at its shutdown: each workspace's `wsd.pid`, if that process still
/// serves from the directory.
pub struct LeftoverChildren(pub std::path::PathBuf);

impl Drop for LeftoverChildren {
    fn drop(&mut self) {
        kill_leftover_children(&self.0);
    }
}

pub fn kill_leftover_children(data: &std::path::Path) {
    let Ok(dirs) = std::fs::read_dir(data.join("workspaces")) else {
        return;
    };
    for dir in dirs.flatten() {
        let Some(pid) = std::fs::read_to_string(dir.path().join("wsd.pid"))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let ours = String::from_utf8_lossy(&cmdline).contains(&*data.to_string_lossy());
        if let (true, Some(p)) = (ours, rustix::process::Pid::from_raw(pid)) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

impl TestKernel {
    /// A fresh kernel in setup mode.
    pub async fn start() -> TestKernel {
        TestKernel::start_with(|_| {}).await
    }

    pub async fn start_with(tune: impl FnOnce(&mut KernelConfig)) -> TestKernel {
        let dir = tempfile::tempdir().unwrap();
        let mut k = TestKernel::start_in(dir.path().join("data"), tune).await;
        k._dir = Some(dir);
        k
    }

    /// A kernel on an existing (or new) data directory the caller owns,
    /// for restarts.
    pub async fn start_in(
        data: std::path::PathBuf,
        tune: impl FnOnce(&mut KernelConfig),
    ) -> TestKernel {
        let mut config = KernelConfig::new(data);
        config.wsd_bin = wsd_bin();
        config.wsd_sandbox = bwrap_available();
        tune(&mut config);
        let kernel = Kernel::open(config).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/ws", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let k = kernel.clone();
        let served = tokio::spawn(async move {
            gsv_kernel::server::serve(listener, k.clone(), async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
            k.shutdown().await;
        });
        TestKernel {
            url,
            kernel,
            _dir: None,
            stop: Some(stop),
            served: Some(served),
        }
    }

    /// Stops the server and waits for the kernel's shutdown (its timer
    /// task included), keeping the data directory for [`StoppedKernel::start`].
    /// Close this kernel's clients first.
    #[allow(dead_code)]
    pub async fn stop(mut self) -> StoppedKernel {
        let dir = self
            ._dir
            .take()
            .expect("the kernel owns its data directory");
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.unwrap();
        }
        StoppedKernel { dir }
    }

    /// A kernel set up with `alice` (and `bob`, created by root).
    pub async fn with_users() -> TestKernel {
        TestKernel::with_users_tuned(|_| {}).await
    }

    /// [`TestKernel::with_users`] with `tune` applied to the config.
    pub async fn with_users_tuned(tune: impl FnOnce(&mut KernelConfig)) -> TestKernel {
        let k = TestKernel::start_with(tune).await;
        k.setup().await;
        let mut root = k.login("root", "root-password").await;
        root.call(
            "account.create",
            json!({"kind": "human", "username": "bob", "password": BOB_PW}),
        )
        .await
        .unwrap();
        root.close().await;
        k
    }

    pub async fn setup(&self) {
        let mut c = self.raw().await;
        let d = c
            .call(
                "sys.setup",
                json!({"username": "alice", "password": ALICE_PW, "rootPassword": "root-password"}),
            )
            .await
            .unwrap();
        assert_eq!(d["user"]["username"], "alice");
        c.close().await;
    }

    /// An unauthenticated client.
    pub async fn raw(&self) -> GsvClient {
        let mut c = GsvClient::connect(&self.url).await.unwrap();
        c.timeout = Duration::from_secs(30);
        c
    }

    /// A socket of `user` (client id `client_id`) whose receive buffer
    /// holds only `bytes`: once it stops reading, the kernel's writes to
    /// it stop soon after (a loopback socket's own buffer grows to MBs).
    pub async fn login_small_buffer(
        &self,
        client_id: &str,
        user: &str,
        pw: &str,
        bytes: u32,
    ) -> GsvClient {
        let addr = self
            .url
            .trim_start_matches("ws://")
            .trim_end_matches("/ws")
            .parse::<std::net::SocketAddr>()
            .unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let stream = socket.connect(addr).await.unwrap();
        let mut c = GsvClient::over(&self.url, stream).await.unwrap();
        c.timeout = Duration::from_secs(30);
        let auth = json!({"username": user, "password": pw});
        c.call("sys.connect", connect_args(client_id, "user", auth))
            .await
            .unwrap();
        c
    }

    pub async fn login(&self, user: &str, pw: &str) -> GsvClient {
        let mut c = self.raw().await;
        c.login(user, &Credentials::Password(pw.into()))
            .await
            .unwrap();
        c
    }

    /// A second (third, …) socket of `user`: a client id of its own, so
    /// it does not replace the user's other connections.
    pub async fn login_from(&self, client_id: &str, user: &str, pw: &str) -> GsvClient {
        let mut c = self.raw().await;
        let auth = json!({"username": user, "password": pw});
        c.call("sys.connect", connect_args(client_id, "user", auth))
            .await
            .unwrap();
        c
    }

    pub async fn alice(&self) -> GsvClient {
        self.login("alice", ALICE_PW).await
    }

    pub async fn bob(&self) -> GsvClient {
        self.login("bob", BOB_PW).await
    }
}

/// A client that keeps the signals it sees while waiting for answers.
#[allow(dead_code)]
pub struct Watcher {
    pub c: GsvClient,
    pub seen: std::collections::VecDeque<Value>,
}

#[allow(dead_code)]
impl Watcher {
    pub fn new(c: GsvClient) -> Watcher {
        Watcher {
            c,
            seen: Default::default(),
        }
    }

    /// The whole response frame; signals before it are kept.
    pub async fn request(&mut self, call: &str, args: Value) -> Value {
        let id = self.c.fresh_id();
        self.c.send_request(&id, call, args).await.unwrap();
        loop {
            let f = self.c.recv().await.unwrap();
            if f["type"] == "res" && f["id"] == id {
                return f;
            }
            if f["type"] == "sig" {
                self.seen.push_back(f);
            }
        }
    }

    /// `data` of a successful response, or a panic.
    pub async fn call(&mut self, call: &str, args: Value) -> Value {
        let f = self.request(call, args).await;
        assert_eq!(f["ok"], true, "{call}: {f}");
        f["data"].clone()
    }

    /// The next signal named `name` (kept ones first); bounded by the
    /// client's timeout.
    pub async fn signal(&mut self, name: &str) -> Value {
        if let Some(i) = self.seen.iter().position(|s| s["signal"] == name) {
            return self.seen.remove(i).unwrap()["payload"].clone();
        }
        loop {
            let f = self.c.recv().await.unwrap();
            if f["type"] == "sig" {
                if f["signal"] == name {
                    return f["payload"].clone();
                }
                self.seen.push_back(f);
            }
        }
    }

    /// Names of the signals kept so far.
    pub fn seen_names(&self) -> Vec<String> {
        self.seen
            .iter()
            .map(|s| s["signal"].as_str().unwrap_or("").to_owned())
            .collect()
    }
}

/// Polls `check` every 50 ms until it gives a value; panics after 30 s.
#[allow(dead_code)]
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The error object of a failed response frame, or a panic.
pub fn err_of(frame: &Value) -> (i64, String) {
    assert_eq!(frame["ok"], false, "expected a failure: {frame}");
    (
        frame["error"]["code"].as_i64().unwrap(),
        frame["error"]["message"].as_str().unwrap().to_owned(),
    )
}

/// `sys.connect` args as a user with `auth`.
pub fn user_connect(auth: Value) -> Value {
    connect_args("test", "user", auth)
}

pub use wsd_test_support::wsd_bin;

/// Whether `bwrap` (Debian package bubblewrap) is installed, which the
/// kernel's default `wsd serve --sandbox` needs. Without it the tests run
/// local workspaces unsandboxed, unless `WSD_REQUIRE_SANDBOX` (set by
/// `.ci/run`) makes that a failure.
pub fn bwrap_available() -> bool {
    let found = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || std::env::var_os("WSD_REQUIRE_SANDBOX").is_none(),
        "WSD_REQUIRE_SANDBOX is set but bwrap is not installed (apt-get install bubblewrap)"
    );
    found
}

/// A new workspace of `c`'s user; its id.
pub async fn new_workspace(c: &mut GsvClient) -> String {
    let d = c.call("sys.workspace.create", json!({})).await.unwrap();
    d["workspace"]["workspaceId"].as_str().unwrap().to_owned()
}

/// A node token for `device`, created by `owner`.
pub async fn node_token(owner: &mut GsvClient, device: &str) -> String {
    let d = owner
        .call(
            "sys.token.create",
            json!({"kind": "node", "allowedRole": "driver", "allowedDeviceId": device}),
        )
        .await
        .unwrap();
    d["token"]["token"].as_str().unwrap().to_owned()
}

/// A driver written with nothing but JSON text frames.
pub struct ScriptedDriver {
    pub ws: GsvClient,
}

impl ScriptedDriver {
    /// Connects as `device` of `user` with `token`; returns the
    /// `sys.connect` response frame.
    pub async fn try_connect(
        k: &TestKernel,
        user: &str,
        token: &str,
        device: &str,
        implements: &[&str],
    ) -> (ScriptedDriver, Value) {
        let mut ws = GsvClient::connect(&k.url).await.unwrap();
        ws.timeout = Duration::from_secs(30);
        let hello = json!({
            "type": "req", "id": "hello", "call": "sys.connect",
            "args": {
                "protocol": 2,
                "client": {"id": device, "version": "0.0.1", "platform": "scripted", "role": "driver"},
                "driver": {"implements": implements},
                "auth": {"username": user, "token": token},
            }
        });
        ws.send_text(hello.to_string()).await.unwrap();
        let res = ws.response_to("hello").await.unwrap();
        (ScriptedDriver { ws }, res)
    }

    pub async fn connect(
        k: &TestKernel,
        user: &str,
        token: &str,
        device: &str,
        implements: &[&str],
    ) -> ScriptedDriver {
        let (d, res) = ScriptedDriver::try_connect(k, user, token, device, implements).await;
        assert_eq!(res["ok"], true, "driver connect failed: {res}");
        d
    }

    /// The next routed request (signals before it are skipped).
    pub async fn next_req(&mut self) -> Value {
        loop {
            let f = self.ws.recv().await.unwrap();
            if f["type"] == "req" {
                return f;
            }
        }
    }

    /// The next signal named `name`.
    pub async fn next_sig(&mut self, name: &str) -> Value {
        loop {
            let f = self.ws.recv().await.unwrap();
            if f["type"] == "sig" && f["signal"] == name {
                return f;
            }
        }
    }

    pub async fn reply(&mut self, id: &Value, data: Value) {
        let res = json!({"type": "res", "id": id, "ok": true, "data": data});
        self.ws.send_text(res.to_string()).await.unwrap();
    }
}

/// A kernel with alice and bob, alice's token for `dev1`, and a scripted
/// driver for it implementing `implements`.
pub async fn with_driver(implements: &[&str]) -> (TestKernel, GsvClient, ScriptedDriver) {
    with_driver_tuned(implements, |_| {}).await
}

pub async fn with_driver_tuned(
    implements: &[&str],
    tune: impl FnOnce(&mut KernelConfig),
) -> (TestKernel, GsvClient, ScriptedDriver) {
    let k = TestKernel::with_users_tuned(tune).await;
    let mut alice = k.alice().await;
    let token = node_token(&mut alice, "dev1").await;
    let drv = ScriptedDriver::connect(&k, "alice", &token, "dev1", implements).await;
    (k, alice, drv)
}
