//! The fault harness (issue 29, item 5): the kernel (this process) and
//! three wsd hosts, each in a network namespace of its own joined to ours
//! by a veth pair on a private /30, each the `remote` backend of one
//! workspace. One host is killed, wiped, frozen (SIGSTOP) or cut off while
//! commands run on the other two.
//!
//! Needs root and `ip netns` (iproute2). Without them each test prints why
//! and passes, unless `GSV_REQUIRE_NETNS` is set (`.ci/run` sets it).
//! Namespace, veth and address names carry this process's id and a
//! counter; a test's hosts (their namespaces, veths and every process in
//! them) are removed when it ends, passed or failed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use wsd_test_support::{Daemon, show, text, tree_digest};

use crate::harness::{TestKernel, wsd_bin};

/// `KernelConfig::wsd_timeout` of these kernels: the deadline every wsd
/// call gets, and how long a running command may stay silent before the
/// kernel asks whether its wsd still answers.
const WSD_DEADLINE: Duration = Duration::from_secs(3);
/// Every host listens on this port of its own address.
const WSD_PORT: u16 = 45678;

/// Hosts made by this process so far (for unique names and subnets).
static HOSTS_MADE: AtomicU32 = AtomicU32::new(0);

/// Held while namespaces are made: the first `ip netns add` on a machine
/// also sets up `/run/netns`, which tests starting together must not race.
static SETUP: Mutex<()> = Mutex::new(());

/// Runs `ip ARGS`, failing the test with its stderr if it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(out.status.success(), "ip {args:?}: {}", show(&out));
}

/// Why network namespaces cannot be made here, if they cannot: a probe
/// namespace is added and deleted.
fn netns_unavailable() -> Option<String> {
    let probe = format!(
        "gsv-probe-{}-{}",
        std::process::id(),
        HOSTS_MADE.fetch_add(1, Ordering::SeqCst)
    );
    match Command::new("ip").args(["netns", "add", &probe]).output() {
        Err(e) => Some(format!("`ip` (iproute2) cannot run: {e}")),
        Ok(out) if !out.status.success() => Some(format!(
            "`ip netns add` failed (root needed): {}",
            text(&out.stderr).trim()
        )),
        Ok(_) => {
            ip(&["netns", "del", &probe]);
            None
        }
    }
}

/// A wsd host: a namespace, the veth pair to it, and `wsd serve` inside.
struct Host {
    ns: String,
    /// The veth end in our namespace.
    near: String,
    /// The veth end inside the host's namespace.
    far: String,
    /// `ADDR:PORT` the host's wsd listens on.
    addr: String,
    token: PathBuf,
    /// `None` only while it is being set up.
    daemon: Option<Daemon>,
}

impl Host {
    /// A namespace with a veth pair to ours, and a wsd listening in it on
    /// `10.X.N.2` (roots and state under `dir`).
    fn start(dir: &Path) -> Host {
        let pid = std::process::id();
        let n = HOSTS_MADE.fetch_add(1, Ordering::SeqCst);
        let net = format!("10.{}.{}", 100 + pid % 150, n % 256);
        let mut host = Host {
            ns: format!("gsv-fault-{pid}-{n}"),
            near: format!("gf{pid}n{n}"),
            far: format!("gf{pid}f{n}"),
            addr: format!("{net}.2:{WSD_PORT}"),
            token: dir.join("token"),
            daemon: None,
        };
        // Set up step by step: a failure half-way is cleaned by drop.
        ip(&["netns", "add", &host.ns]);
        ip(&[
            "link", "add", &host.near, "type", "veth", "peer", "name", &host.far,
        ]);
        ip(&["link", "set", &host.far, "netns", &host.ns]);
        ip(&["addr", "add", &format!("{net}.1/30"), "dev", &host.near]);
        ip(&["link", "set", &host.near, "up"]);
        host.inside(&["addr", "add", &format!("{net}.2/30"), "dev", &host.far]);
        host.inside(&["link", "set", &host.far, "up"]);
        host.inside(&["link", "set", "lo", "up"]);
        std::fs::write(&host.token, format!("token-of-{}", host.ns)).unwrap();
        let wsd = wsd_bin();
        let program = [
            "ip",
            "netns",
            "exec",
            host.ns.as_str(),
            wsd.to_str().unwrap(),
        ];
        host.daemon = Some(
            Daemon::builder(&dir.join("root"))
                .state(&dir.join("state"))
                .token_file(&host.token)
                .listen(&host.addr)
                .program(program)
                .log(&dir.join("wsd.log"))
                .start(),
        );
        host
    }

    /// `ip ARGS` inside the host's namespace.
    fn inside(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", self.ns.as_str(), "ip"];
        all.extend_from_slice(args);
        ip(&all);
    }

    fn daemon(&mut self) -> &mut Daemon {
        self.daemon.as_mut().expect("a started host")
    }

    /// Sends `signal` (`STOP`, `CONT`) to the host's wsd.
    fn signal(&mut self, signal: &str) {
        let pid = self.daemon().pid().to_string();
        let out = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .output()
            .unwrap();
        assert!(out.status.success(), "kill -{signal} {pid}: {}", show(&out));
    }

    /// The host's tree on its disk.
    fn tree(&mut self) -> BTreeMap<String, String> {
        tree_digest(&self.daemon().root)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.as_mut() {
            d.kill9();
        }
        // The commands a killed wsd started outlive it (in process groups
        // of their own), and a namespace lasts while anything runs in it.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
        {
            for pid in text(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        // Gone with the namespace (its peer was in it) unless setup
        // stopped before moving the peer there.
        let _ = Command::new("ip")
            .args(["link", "del", &self.near])
            .output();
    }
}

/// A kernel, three hosts and a workspace on each, seeded through `fs.write`.
struct Lab {
    k: TestKernel,
    root: GsvClient,
    hosts: Vec<Host>,
    /// Workspace ids, one per host, in the same order.
    ws: Vec<String>,
    _dir: TempDir,
}

impl Lab {
    /// The lab, or `None` (after saying why) where namespaces cannot be made.
    async fn start() -> Option<Lab> {
        let setup = SETUP
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(why) = netns_unavailable() {
            assert!(
                std::env::var_os("GSV_REQUIRE_NETNS").is_none(),
                "GSV_REQUIRE_NETNS is set but {why}"
            );
            eprintln!("skipped: the fault harness needs network namespaces: {why}");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let hosts: Vec<Host> = (0..3)
            .map(|i| {
                let d = dir.path().join(format!("host{i}"));
                std::fs::create_dir_all(&d).unwrap();
                Host::start(&d)
            })
            .collect();
        drop(setup);
        let k = TestKernel::with_users_tuned(|c| c.wsd_timeout = WSD_DEADLINE).await;
        let mut root = k.login("root", "root-password").await;
        let mut ws = Vec::new();
        for (i, h) in hosts.iter().enumerate() {
            let d = root
                .call(
                    "sys.workspace.create",
                    json!({"backend": {"kind": "remote", "address": h.addr, "tokenFile": h.token}}),
                )
                .await
                .unwrap();
            let id = d["workspace"]["workspaceId"].as_str().unwrap().to_owned();
            root.call(
                "fs.write",
                json!({"path": format!("/workspaces/{id}/seed.txt"), "content": format!("seed {i}\n")}),
            )
            .await
            .unwrap();
            ws.push(id);
        }
        Some(Lab {
            k,
            root,
            hosts,
            ws,
            _dir: dir,
        })
    }

    /// Starts `input` in workspace `i`; answers at once (`running`) unless
    /// the call failed before the command ran.
    async fn start_cmd(&mut self, i: usize, input: &str) -> Value {
        self.root
            .call(
                "shell.exec",
                json!({"cwd": format!("/workspaces/{}", self.ws[i]), "input": input, "yieldMs": 250}),
            )
            .await
            .unwrap()
    }

    /// Polls the answer `d` until its command is over; the final answer and
    /// all the stdout the answers carried. Bounded: 90 polls of at most 1 s.
    async fn finish(&mut self, mut d: Value) -> (Value, String) {
        let mut stdout = String::new();
        for _ in 0..90 {
            stdout.push_str(d["stdout"].as_str().unwrap_or(""));
            if d["status"] != "running" {
                return (d, stdout);
            }
            let sid = d["sessionId"].as_str().unwrap().to_owned();
            d = self
                .root
                .call(
                    "shell.exec",
                    json!({"sessionId": sid, "input": "", "yieldMs": 1000}),
                )
                .await
                .unwrap();
        }
        panic!("the command never finished: {d}");
    }

    /// Runs `input` in workspace `i` to its end.
    async fn run(&mut self, i: usize, input: &str) -> (Value, String) {
        let d = self.start_cmd(i, input).await;
        self.finish(d).await
    }

    /// Waits until the running command of answer `d` printed `word`.
    async fn wait_for_output(&mut self, d: &Value, word: &str) {
        let sid = d["sessionId"]
            .as_str()
            .expect("a running command")
            .to_owned();
        let mut seen = d["stdout"].as_str().unwrap_or("").to_owned();
        for _ in 0..30 {
            if seen.contains(word) {
                return;
            }
            let d = self
                .root
                .call(
                    "shell.exec",
                    json!({"sessionId": sid, "input": "", "yieldMs": 1000, "stream": true}),
                )
                .await
                .unwrap();
            assert_eq!(d["status"], "running", "ended before printing {word}: {d}");
            seen.push_str(d["stdout"].as_str().unwrap_or(""));
        }
        panic!("the command never printed {word}: {seen}");
    }

    /// Workspace `i`'s tree as the kernel's store holds it, in the format
    /// of [`tree_digest`].
    fn store_tree(&self, i: usize) -> BTreeMap<String, String> {
        let w = self
            .k
            .kernel
            .workspaces()
            .open_list()
            .into_iter()
            .find(|w| w.id == self.ws[i])
            .expect("an open workspace");
        let d = w.dofs.lock().unwrap();
        d.check_integrity().unwrap();
        let mut out = BTreeMap::new();
        store_walk(&d, None, &mut out);
        out
    }

    /// Every host's tree equals its workspace's store.
    fn assert_converged(&mut self) {
        let stores: Vec<_> = (0..self.ws.len()).map(|i| self.store_tree(i)).collect();
        for (i, (host, store)) in self.hosts.iter_mut().zip(stores).enumerate() {
            assert!(!store.is_empty(), "host {i}: an empty store proves nothing");
            assert_eq!(host.tree(), store, "host {i} and its store differ");
        }
    }

    /// `fs.read` of `name` in workspace `i`: its lines as `fs.read` numbers them.
    async fn read(&mut self, i: usize, name: &str) -> String {
        let r = self
            .root
            .call(
                "fs.read",
                json!({"path": format!("/workspaces/{}/{name}", self.ws[i])}),
            )
            .await
            .unwrap();
        r["content"].as_str().unwrap_or_default().to_owned()
    }
}

fn store_walk(
    d: &wsd_dofs::Dofs,
    dir: Option<&wsd_sync::SyncPath>,
    out: &mut BTreeMap<String, String>,
) {
    for e in d.readdir(dir).unwrap() {
        let rel = e.path.as_str().to_owned();
        match e.stat.kind {
            wsd_sync::Kind::Dir => {
                out.insert(rel, format!("d {:o}", e.stat.mode));
                store_walk(d, Some(&e.path), out);
            }
            wsd_sync::Kind::Symlink => {
                out.insert(rel, format!("l {}", e.stat.target.unwrap_or_default()));
            }
            _ => {
                let bytes = d.read_file(&e.path).unwrap();
                let hash = hex::encode(Sha256::digest(&bytes));
                out.insert(rel, format!("f {:o} {} {hash}", e.stat.mode, bytes.len()));
            }
        }
    }
}

/// What the bystanders (the hosts not at fault) run meanwhile: silent for
/// longer than the deadline, which a live wsd's answer to the status probe
/// must not cut short.
const COUNT: &str =
    "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.5; done > count.txt; cat count.txt";
const COUNTED: &str = "1\n2\n3\n4\n5\n6\n7\n8\n";

/// Starts [`COUNT`] on hosts 0 and 2.
async fn start_bystanders(lab: &mut Lab) -> [Value; 2] {
    [lab.start_cmd(0, COUNT).await, lab.start_cmd(2, COUNT).await]
}

/// The bystanders' commands completed as if nothing happened elsewhere.
async fn assert_bystanders_untouched(lab: &mut Lab, started: [Value; 2]) {
    for (i, d) in [0, 2].into_iter().zip(started) {
        let (d, stdout) = lab.finish(d).await;
        assert_eq!(
            (&d["status"], &d["exitCode"], stdout.as_str()),
            (&json!("completed"), &json!(0), COUNTED),
            "host {i}: {d}"
        );
    }
}

#[tokio::test]
async fn a_host_killed_mid_exec_fails_its_call_alone_and_comes_back_empty_rebaselined() {
    let Some(mut lab) = Lab::start().await else {
        return;
    };
    let victim = lab.start_cmd(1, "echo started; sleep 30").await;
    let bystanders = start_bystanders(&mut lab).await;
    lab.wait_for_output(&victim, "started").await;
    lab.hosts[1].daemon().kill9();

    let (d, _) = lab.finish(victim).await;
    assert_eq!(d["status"], "failed", "{d}");
    let error = d["error"].as_str().unwrap();
    assert!(
        error.contains("lost the command") && error.contains(&lab.hosts[1].addr),
        "a clear error naming the host: {d}"
    );
    assert_bystanders_untouched(&mut lab, bystanders).await;

    // The host comes back at the same address with nothing: no tree, no
    // sync state. The next bracket re-baselines it from the store.
    {
        let d = lab.hosts[1].daemon();
        std::fs::remove_dir_all(&d.root).unwrap();
        std::fs::remove_dir_all(&d.state).unwrap();
        std::fs::create_dir_all(&d.root).unwrap();
        d.restart();
    }
    assert!(lab.hosts[1].tree().is_empty());
    let (d, stdout) = lab.run(1, "cat seed.txt; echo back > back.txt").await;
    assert_eq!(
        (&d["status"], stdout.as_str()),
        (&json!("completed"), "seed 1\n"),
        "{d}"
    );
    assert_eq!(lab.read(1, "back.txt").await, "1\tback");
    assert_eq!(lab.read(0, "count.txt").await.lines().count(), 8);
    lab.assert_converged();
}

#[tokio::test]
async fn a_stopped_host_fails_its_calls_at_the_deadline_and_recovers_after_sigcont() {
    let Some(mut lab) = Lab::start().await else {
        return;
    };
    let victim = lab
        .start_cmd(1, "echo started; sleep 1; echo late > late.txt")
        .await;
    let bystanders = start_bystanders(&mut lab).await;
    lab.wait_for_output(&victim, "started").await;
    lab.hosts[1].signal("STOP");

    // The frozen wsd keeps its connection open and says nothing: the
    // session ends once its events and a status call outlast the deadline.
    let (d, _) = lab.finish(victim).await;
    assert_eq!(
        (&d["status"], &d["code"]),
        (&json!("failed"), &json!("ETIMEDOUT")),
        "{d}"
    );
    let error = d["error"].as_str().unwrap();
    assert!(
        error.contains("stopped answering") && error.contains(&lab.hosts[1].addr),
        "{d}"
    );
    assert_bystanders_untouched(&mut lab, bystanders).await;

    // A new command on the frozen host fails before it runs, at the
    // deadline of the dial.
    let d = lab.start_cmd(1, "touch never.txt").await;
    assert_eq!(
        (&d["status"], &d["code"]),
        (&json!("failed"), &json!("ETIMEDOUT")),
        "{d}"
    );
    assert!(d.get("sessionId").is_none(), "nothing started: {d}");

    lab.hosts[1].signal("CONT");
    // The command ran on while its wsd was frozen; the next bracket brings
    // what it wrote.
    let (d, stdout) = lab.run(1, "cat late.txt; ls").await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(stdout, "late\nlate.txt\nseed.txt\n", "{d}");
    assert_eq!(lab.read(1, "late.txt").await, "1\tlate");
    lab.assert_converged();
}

#[tokio::test]
async fn a_host_cut_off_fails_its_calls_at_the_deadline_and_converges_once_restored() {
    let Some(mut lab) = Lab::start().await else {
        return;
    };
    let victim = lab
        .start_cmd(1, "echo started; sleep 1; echo cut > cut.txt")
        .await;
    let bystanders = start_bystanders(&mut lab).await;
    lab.wait_for_output(&victim, "started").await;
    // The link goes down on the host's side: our end loses its carrier and
    // drops what we send, with no error; the connection stays open.
    let far = lab.hosts[1].far.clone();
    lab.hosts[1].inside(&["link", "set", &far, "down"]);

    let (d, _) = lab.finish(victim).await;
    assert_eq!(
        (&d["status"], &d["code"]),
        (&json!("failed"), &json!("ETIMEDOUT")),
        "{d}"
    );
    assert!(
        d["error"].as_str().unwrap().contains(&lab.hosts[1].addr),
        "{d}"
    );
    assert_bystanders_untouched(&mut lab, bystanders).await;

    let d = lab.start_cmd(1, "touch never.txt").await;
    assert_eq!(d["status"], "failed", "{d}");
    assert!(d.get("sessionId").is_none(), "nothing started: {d}");
    // Written while cut off: in the store only, until the link is back.
    lab.root
        .call(
            "fs.write",
            json!({"path": format!("/workspaces/{}/while-cut.txt", lab.ws[1]), "content": "kept\n"}),
        )
        .await
        .unwrap();

    lab.hosts[1].inside(&["link", "set", &far, "up"]);
    let (d, stdout) = lab.run(1, "cat cut.txt while-cut.txt").await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(stdout, "cut\nkept\n", "{d}");
    assert_eq!(lab.read(1, "cut.txt").await, "1\tcut");
    lab.assert_converged();
}
