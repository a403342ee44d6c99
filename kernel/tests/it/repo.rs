//! `repo.*` over a real WebSocket, checked against real `git`: fsck, log,
//! ls-tree, a `git daemon` upstream and `git clone` over the kernel's HTTP.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use base64::Engine as _;
use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};

use wsd_test_support::free_port;

use crate::harness::{TestKernel, err_of};

/// Runs git in `dir` with no user or system config; panics on failure.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_cmd(dir, args).output().expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn git_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = git_env(Command::new("git"));
    c.current_dir(dir).args(args);
    c
}

/// `c` with no user or system git config, a fixed identity, and no
/// automatic maintenance: `git commit`, `fetch` and `clone` would otherwise
/// start `git maintenance run --auto --detach`, a daemonised process no
/// test waits for, left running (then a zombie of PID 1) after the tests.
fn git_env(mut c: Command) -> Command {
    c.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "maintenance.auto")
        .env("GIT_CONFIG_VALUE_0", "false")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "up")
        .env("GIT_AUTHOR_EMAIL", "up@example.invalid")
        .env("GIT_COMMITTER_NAME", "up")
        .env("GIT_COMMITTER_EMAIL", "up@example.invalid");
    c
}

fn repo_dir(k: &TestKernel, slug: &str) -> PathBuf {
    k.kernel
        .config()
        .data_dir
        .join("repos")
        .join(format!("{slug}.git"))
}

fn lines(s: &str) -> Vec<String> {
    s.lines().map(str::to_owned).collect()
}

async fn head_of(c: &mut GsvClient, repo: &str) -> Value {
    let r = c.call("repo.refs", json!({"repo": repo})).await.unwrap();
    r["heads"]["main"].clone()
}

async fn apply(c: &mut GsvClient, repo: &str, message: &str, ops: Value) -> String {
    let r = c
        .call(
            "repo.apply",
            json!({"repo": repo, "message": message, "ops": ops}),
        )
        .await
        .unwrap();
    assert_eq!(r["ok"], true, "{r}");
    r["head"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn create_apply_read_log_diff_and_real_git_agree() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let r = a
        .call(
            "repo.create",
            json!({"repo": "alice/notes", "description": "my notes"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (r["created"].clone(), r["ref"].clone()),
        (json!(true), json!("main"))
    );
    let first = r["head"].as_str().unwrap().to_owned();
    let again = a
        .call("repo.create", json!({"repo": "alice/notes"}))
        .await
        .unwrap();
    assert_eq!(
        (again["created"].clone(), again["head"].clone()),
        (json!(false), json!(first))
    );

    let binary = base64::engine::general_purpose::STANDARD.encode(b"\x00\x01\x02bin");
    let second = apply(
        &mut a,
        "alice/notes",
        "add files",
        json!([
            {"type": "put", "path": "a.txt", "content": "alpha\n"},
            {"type": "put", "path": "dir/b.txt", "content": "one\ntwo\nthree\n"},
            {"type": "put", "path": "img.bin", "contentBase64": binary},
        ]),
    )
    .await;
    // Put, delete and move in one commit.
    let third = apply(
        &mut a,
        "alice/notes",
        "reshape",
        json!([
            {"type": "delete", "path": "a.txt"},
            {"type": "move", "from": "dir/b.txt", "to": "c/b.txt"},
            {"type": "put", "path": "c/b.txt", "content": "one\nTWO\nthree\n"},
            {"type": "put", "path": "new.txt", "content": "needle in here\n"},
        ]),
    )
    .await;

    let dir = repo_dir(&k, "alice/notes");
    git(&dir, &["fsck", "--strict", "--no-dangling"]);
    assert_eq!(
        lines(&git(
            &dir,
            &["log", "--first-parent", "--format=%H", "main"]
        )),
        [third.clone(), second.clone(), first.clone()]
    );
    assert_eq!(
        lines(&git(&dir, &["ls-tree", "-r", "--name-only", "main"])),
        ["c/b.txt", "img.bin", "new.txt"]
    );
    assert_eq!(git(&dir, &["show", "main:c/b.txt"]), "one\nTWO\nthree\n");
    assert_eq!(
        git(&dir, &["log", "-1", "--format=%an <%ae>%n%s", "main"]),
        "alice <alice@gsv.local>\nreshape\n"
    );

    let log = a
        .call("repo.log", json!({"repo": "alice/notes"}))
        .await
        .unwrap();
    assert_eq!(
        (log["limit"].clone(), log["offset"].clone()),
        (json!(30), json!(0))
    );
    let hashes: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["hash"].as_str().unwrap())
        .collect();
    assert_eq!(hashes, [third.as_str(), &second, &first]);
    let top = &log["entries"][0];
    assert_eq!(top["message"], "reshape");
    assert_eq!(top["parents"], json!([second]));
    assert_eq!(
        top["treeHash"].as_str().unwrap(),
        git(&dir, &["rev-parse", "main^{tree}"]).trim()
    );
    assert_eq!(
        top["commitTime"].as_i64().unwrap().to_string(),
        git(&dir, &["log", "-1", "--format=%ct", "main"]).trim()
    );
    let page = a
        .call(
            "repo.log",
            json!({"repo": "alice/notes", "limit": 0, "offset": 1}),
        )
        .await
        .unwrap();
    assert_eq!(page["limit"], 1, "limit clamps to at least 1");
    assert_eq!(page["entries"][0]["hash"], json!(second));
    let big = a
        .call("repo.log", json!({"repo": "alice/notes", "limit": 5000}))
        .await
        .unwrap();
    assert_eq!(big["limit"], 100);

    let root = a
        .call("repo.read", json!({"repo": "alice/notes"}))
        .await
        .unwrap();
    assert_eq!(
        (root["kind"].clone(), root["path"].clone()),
        (json!("tree"), json!(""))
    );
    let names: Vec<(&str, &str, &str)> = root["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap(),
                e["type"].as_str().unwrap(),
                e["mode"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("c", "tree", "040000"),
            ("img.bin", "blob", "100644"),
            ("new.txt", "blob", "100644")
        ]
    );
    let f = a
        .call(
            "repo.read",
            json!({"repo": "alice/notes", "path": "c/b.txt"}),
        )
        .await
        .unwrap();
    assert_eq!(f["kind"], "file");
    assert_eq!(
        (
            f["content"].clone(),
            f["isBinary"].clone(),
            f["size"].clone()
        ),
        (json!("one\nTWO\nthree\n"), json!(false), json!(14))
    );
    let b = a
        .call(
            "repo.read",
            json!({"repo": "alice/notes", "path": "img.bin"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            b["content"].clone(),
            b["isBinary"].clone(),
            b["size"].clone()
        ),
        (Value::Null, json!(true), json!(6))
    );
    let old = a
        .call(
            "repo.read",
            json!({"repo": "alice/notes", "ref": second, "path": "a.txt"}),
        )
        .await
        .unwrap();
    assert_eq!(old["content"], "alpha\n", "a commit hash reads as a ref");

    let d = a
        .call("repo.diff", json!({"repo": "alice/notes", "commit": third}))
        .await
        .unwrap();
    assert_eq!(d["parentHash"], json!(second));
    let files: Vec<(&str, &str)> = d["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        files,
        [
            ("a.txt", "deleted"),
            ("c/b.txt", "added"),
            ("dir/b.txt", "deleted"),
            ("new.txt", "added")
        ]
    );
    assert_eq!(
        d["stats"],
        json!({"filesChanged": 4, "additions": 4, "deletions": 4})
    );
    let numstat = git(
        &dir,
        &["diff", "--no-renames", "--numstat", &second, &third],
    );
    let (adds, dels) = numstat.lines().fold((0, 0), |(a, d), l| {
        let mut p = l.split_whitespace();
        (
            a + p.next().unwrap().parse::<i64>().unwrap(),
            d + p.next().unwrap().parse::<i64>().unwrap(),
        )
    });
    assert_eq!((adds, dels), (4, 4), "git agrees on the line counts");

    let cmp = a
        .call(
            "repo.compare",
            json!({"repo": "alice/notes", "base": second, "head": "main", "context": 0}),
        )
        .await
        .unwrap();
    let moved = cmp["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "c/b.txt")
        .unwrap();
    assert_eq!(
        moved["hunks"][0]["lines"],
        json!([{"tag": "add", "content": "one"}, {"tag": "add", "content": "TWO"}, {"tag": "add", "content": "three"}])
    );
    let stat = a
        .call(
            "repo.compare",
            json!({"repo": "alice/notes", "base": second, "head": third, "stat": true}),
        )
        .await
        .unwrap();
    assert_eq!(stat["head"], json!(third));
    assert_eq!(stat["stats"], d["stats"]);
    assert!(
        stat["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f.get("hunks").is_none())
    );

    let s = a
        .call(
            "repo.search",
            json!({"repo": "alice/notes", "query": "needle"}),
        )
        .await
        .unwrap();
    assert_eq!(
        s["matches"],
        json!([{"path": "new.txt", "line": 1, "content": "needle in here"}])
    );
    let s = a
        .call(
            "repo.search",
            json!({"repo": "alice/notes", "query": "TWO", "prefix": "/c"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (s["prefix"].clone(), s["matches"][0]["line"].clone()),
        (json!("c"), json!(2))
    );

    let refs = a
        .call("repo.refs", json!({"repo": "alice/notes"}))
        .await
        .unwrap();
    assert_eq!(refs["heads"], json!({"main": third}));
    assert_eq!(refs["tags"], json!({}));
    let list = a.call("repo.list", json!({})).await.unwrap();
    let notes = list["repos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["repo"] == "alice/notes")
        .unwrap();
    assert_eq!(
        (
            notes["kind"].clone(),
            notes["writable"].clone(),
            notes["public"].clone(),
            notes["description"].clone()
        ),
        (json!("user"), json!(true), json!(false), json!("my notes"))
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_the_head_unchanged() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    a.call("repo.create", json!({"repo": "alice/r"}))
        .await
        .unwrap();
    let head = apply(
        &mut a,
        "alice/r",
        "files",
        json!([{"type": "put", "path": "a", "content": "1"}, {"type": "put", "path": "d/b", "content": "2"}]),
    )
    .await;
    let stale = a
        .call("repo.log", json!({"repo": "alice/r", "offset": 1}))
        .await
        .unwrap()["entries"][0]["hash"]
        .as_str()
        .unwrap()
        .to_owned();

    let refused = |args: Value| {
        let mut base = json!({"repo": "alice/r", "message": "m"});
        base.as_object_mut()
            .unwrap()
            .extend(args.as_object().unwrap().clone());
        base
    };
    let cases = [
        (
            refused(
                json!({"expectedHead": stale, "ops": [{"type": "put", "path": "x", "content": "1"}]}),
            ),
            409,
            "stale",
        ),
        (
            refused(json!({"ops": [{"type": "put", "path": "../x", "content": "1"}]})),
            400,
            "leaves the repository",
        ),
        (
            refused(json!({"ops": [{"type": "put", "path": "d/../../x", "content": "1"}]})),
            400,
            "leaves the repository",
        ),
        (
            refused(json!({"ops": [{"type": "put", "path": "/etc/x", "content": "1"}]})),
            400,
            "absolute",
        ),
        (
            refused(json!({"ops": [{"type": "move", "from": "a", "to": "d/b"}]})),
            400,
            "already exists",
        ),
        (
            refused(json!({"ops": [{"type": "move", "from": "a", "to": "d"}]})),
            400,
            "already exists",
        ),
        (
            refused(json!({"ops": [{"type": "put", "path": "a/c", "content": "1"}]})),
            400,
            "a is a file",
        ),
        (
            refused(
                json!({"ops": [{"type": "put", "path": "ok", "content": "1"}, {"type": "delete", "path": "nope"}]}),
            ),
            404,
            "no such path",
        ),
        (
            refused(json!({"ops": [{"type": "delete", "path": "d"}]})),
            400,
            "recursive",
        ),
        (
            refused(
                json!({"ops": [{"type": "put", "path": "x", "content": "1", "contentBase64": "MQ=="}]}),
            ),
            400,
            "both",
        ),
        (
            refused(json!({"ops": [{"type": "put", "path": "x", "contentBase64": "!!"}]})),
            400,
            "base64",
        ),
        (
            refused(json!({"ops": [{"type": "put", "path": "a", "content": "1"}]})),
            400,
            "nothing to commit",
        ),
        (refused(json!({"message": "  ", "ops": []})), 400, "message"),
        (
            refused(json!({"ref": "bad..ref", "ops": []})),
            400,
            "branch",
        ),
    ];
    for (args, code, text) in cases {
        let f = a.request("repo.apply", args.clone()).await.unwrap();
        let (c, m) = err_of(&f);
        assert_eq!(c, code, "{args}: {m}");
        assert!(m.contains(text), "{args}: {m}");
        assert_eq!(head_of(&mut a, "alice/r").await, json!(head), "{args}");
    }
    let dir = repo_dir(&k, "alice/r");
    assert_eq!(git(&dir, &["rev-parse", "main"]).trim(), head);
    git(&dir, &["fsck", "--strict"]);

    // A current expectedHead and allowEmpty both commit.
    let r = a
        .call(
            "repo.apply",
            json!({"repo": "alice/r", "message": "empty", "expectedHead": head, "allowEmpty": true, "ops": []}),
        )
        .await
        .unwrap();
    assert_ne!(r["head"], json!(head));

    for (call, args, code) in [
        ("repo.read", json!({"repo": "alice/r", "ref": "nope"}), 404),
        (
            "repo.read",
            json!({"repo": "alice/r", "path": "missing"}),
            404,
        ),
        ("repo.read", json!({"repo": "alice/r", "path": "../x"}), 400),
        (
            "repo.diff",
            json!({"repo": "alice/r", "commit": "0123456789012345678901234567890123456789"}),
            404,
        ),
        ("repo.diff", json!({"repo": "alice/r", "commit": ""}), 400),
        (
            "repo.compare",
            json!({"repo": "alice/r", "base": "main", "head": "nope"}),
            404,
        ),
        (
            "repo.search",
            json!({"repo": "alice/r", "query": "  "}),
            400,
        ),
        ("repo.log", json!({"repo": "alice/nothere"}), 404),
    ] {
        let (c, m) = err_of(&a.request(call, args.clone()).await.unwrap());
        assert_eq!(c, code, "{call} {args}: {m}");
    }
    for bad in [
        "alice/a/b",
        "alice/x\ny",
        "alice/sp ace",
        "alice",
        "alice/..",
        "alice/\u{7}",
    ] {
        let (c, m) = err_of(
            &a.request("repo.create", json!({"repo": bad}))
                .await
                .unwrap(),
        );
        assert_eq!(c, 400, "{bad:?}: {m}");
        assert!(m.contains("repo"), "{m}");
    }
    let mut on_disk: Vec<String> =
        std::fs::read_dir(k.kernel.config().data_dir.join("repos/alice"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    on_disk.sort();
    assert_eq!(on_disk, ["r.git"], "refused calls created nothing");
}

#[tokio::test]
async fn private_repositories_are_invisible_to_others_and_public_ones_read_only() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let mut b = k.bob().await;
    let ws = crate::harness::new_workspace(&mut a).await;
    a.call("repo.create", json!({"repo": "alice/secret"}))
        .await
        .unwrap();
    a.call("repo.create", json!({"repo": "alice/open"}))
        .await
        .unwrap();

    let mine = a.call("repo.list", json!({})).await.unwrap();
    let kinds: Vec<(String, String)> = mine["repos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["repo"].as_str().unwrap().to_owned(),
                r["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("alice/home".into(), "home".into())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&(format!("alice/{ws}"), "workspace".into())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("alice/secret".into(), "user".into())),
        "{kinds:?}"
    );

    let theirs = b.call("repo.list", json!({})).await.unwrap();
    assert!(
        theirs["repos"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["owner"] == "bob"),
        "{theirs}"
    );
    let none = b
        .call("repo.list", json!({"owner": "alice"}))
        .await
        .unwrap();
    assert_eq!(none["repos"], json!([]));
    for (call, args) in [
        ("repo.read", json!({"repo": "alice/secret"})),
        ("repo.refs", json!({"repo": "alice/secret"})),
        ("repo.log", json!({"repo": "alice/secret"})),
        ("repo.refs", json!({"repo": "alice/does-not-exist"})),
        (
            "repo.apply",
            json!({"repo": "alice/secret", "message": "x", "ops": [{"type": "put", "path": "x"}]}),
        ),
        ("repo.create", json!({"repo": "alice/bobs"})),
    ] {
        let (c, m) = err_of(&b.request(call, args.clone()).await.unwrap());
        assert_eq!(c, 403, "{call} {args}: {m}");
    }
    assert!(!repo_dir(&k, "alice/bobs").exists());

    let mut root = k.login("root", "root-password").await;
    root.call(
        "sys.config.set",
        json!({"key": "repos/alice/open/visibility", "value": "public"}),
    )
    .await
    .unwrap();
    let listed = b
        .call("repo.list", json!({"owner": "alice"}))
        .await
        .unwrap();
    assert_eq!(listed["repos"].as_array().unwrap().len(), 1, "{listed}");
    let open = &listed["repos"][0];
    assert_eq!(
        (
            open["repo"].clone(),
            open["public"].clone(),
            open["writable"].clone()
        ),
        (json!("alice/open"), json!(true), json!(false))
    );
    b.call("repo.read", json!({"repo": "alice/open"}))
        .await
        .unwrap();
    let (c, _) = err_of(
        &b.request(
            "repo.apply",
            json!({"repo": "alice/open", "message": "x", "allowEmpty": true, "ops": []}),
        )
        .await
        .unwrap(),
    );
    assert_eq!(c, 403, "public is not writable");
    // Root writes anyone's.
    root.call(
        "repo.apply",
        json!({"repo": "alice/open", "message": "by root", "ops": [{"type": "put", "path": "r", "content": "x"}]}),
    )
    .await
    .unwrap();
}

/// An upstream made by real git with `n` commits on `main`.
fn upstream(dir: &Path, n: usize) -> String {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    for i in 0..n {
        commit_upstream(dir, i);
    }
    git(dir, &["rev-parse", "main"]).trim().to_owned()
}

fn commit_upstream(dir: &Path, i: usize) -> String {
    std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", &format!("upstream {i}")]);
    git(dir, &["rev-parse", "main"]).trim().to_owned()
}

/// `git daemon` serving `base` on loopback; ended when dropped.
///
/// It runs as `git-daemon` itself, this process's own child, not through
/// the `git daemon` wrapper: killing the wrapper and `git-daemon` together
/// orphaned `git-daemon`, and a PID 1 that does not reap (this machine's
/// VM init) kept it as a zombie after every test run.
struct GitDaemon {
    child: Child,
    port: u16,
}

impl GitDaemon {
    fn start(base: &Path) -> GitDaemon {
        let exec_path = git(base, &["--exec-path"]);
        let program = Path::new(exec_path.trim()).join("git-daemon");
        for _ in 0..20 {
            let port = free_port();
            let child = git_env(Command::new(&program))
                .current_dir(base)
                .args([
                    "--export-all",
                    "--reuseaddr",
                    "--listen=127.0.0.1",
                    &format!("--port={port}"),
                    &format!("--base-path={}", base.display()),
                    &base.display().to_string(),
                ])
                .stderr(std::process::Stdio::null())
                // A group of its own: Drop's last resort ends the
                // connections' processes with it.
                .process_group(0)
                .spawn()
                .unwrap();
            let mut d = GitDaemon { child, port };
            for _ in 0..200 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return d;
                }
                if d.child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: try another
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
        }
        panic!("git daemon did not start");
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        // `git-daemon` reaps the process it forks per connection; killed
        // before they end, they would be orphans nobody reaps. So wait
        // (bounded) until it has none left, then end the group.
        let pid = self.child.id();
        let children = format!("/proc/{pid}/task/{pid}/children");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(&children).is_ok_and(|c| !c.trim().is_empty())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let group = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn import_from_file_and_git_daemon_then_refresh() {
    let k = TestKernel::with_users().await;
    let tmp = tempfile::tempdir().unwrap();
    let up = tmp.path().join("up");
    let up_head = upstream(&up, 3);
    git(&up, &["tag", "v1"]);
    let mut root = k.login("root", "root-password").await;
    let url = format!("file://{}", up.display());
    let r = root
        .call(
            "repo.import",
            json!({"repo": "alice/imp", "remoteUrl": url}),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            r["changed"].clone(),
            r["head"].clone(),
            r["remoteRef"].clone(),
            r["ref"].clone()
        ),
        (json!(true), json!(up_head), json!("main"), json!("main"))
    );
    let dir = repo_dir(&k, "alice/imp");
    git(&dir, &["fsck", "--strict"]);
    let refs = root
        .call("repo.refs", json!({"repo": "alice/imp"}))
        .await
        .unwrap();
    assert_eq!(refs["tags"], json!({}), "an import writes only its branch");
    assert_eq!(
        git(&dir, &["log", "--format=%H %s", "main"]),
        git(&up, &["log", "--format=%H %s", "main"])
    );
    let again = root
        .call(
            "repo.import",
            json!({"repo": "alice/imp", "remoteUrl": url}),
        )
        .await
        .unwrap();
    assert_eq!(
        (again["changed"].clone(), again["head"].clone()),
        (json!(false), json!(up_head))
    );
    let newer = commit_upstream(&up, 3);
    let moved = root
        .call(
            "repo.import",
            json!({"repo": "alice/imp", "remoteUrl": url, "remoteRef": "main"}),
        )
        .await
        .unwrap();
    assert_eq!(
        (moved["changed"].clone(), moved["head"].clone()),
        (json!(true), json!(newer))
    );
    let mut a = k.alice().await;
    let log = a
        .call("repo.log", json!({"repo": "alice/imp"}))
        .await
        .unwrap();
    assert_eq!(log["entries"].as_array().unwrap().len(), 4);
    assert_eq!(log["entries"][0]["message"], "upstream 3\n");

    // git:// from a real git daemon on loopback, as the owner.
    let daemon = GitDaemon::start(tmp.path());
    let git_url = format!("git://127.0.0.1:{}/up", daemon.port);
    let r = a
        .call(
            "repo.import",
            json!({"repo": "alice/mirror", "remoteUrl": git_url}),
        )
        .await
        .unwrap();
    assert_eq!(
        (r["changed"].clone(), r["head"].clone()),
        (json!(true), json!(newer))
    );
    git(&repo_dir(&k, "alice/mirror"), &["fsck", "--strict"]);
    let r = a
        .call(
            "repo.import",
            json!({"repo": "alice/mirror", "remoteUrl": git_url}),
        )
        .await
        .unwrap();
    assert_eq!(r["changed"], false);

    // Local commits the upstream lacks are not thrown away.
    apply(
        &mut a,
        "alice/mirror",
        "local",
        json!([{"type": "put", "path": "mine", "content": "x"}]),
    )
    .await;
    let local = head_of(&mut a, "alice/mirror").await;
    commit_upstream(&up, 4);
    let (c, m) = err_of(
        &a.request(
            "repo.import",
            json!({"repo": "alice/mirror", "remoteUrl": git_url}),
        )
        .await
        .unwrap(),
    );
    assert_eq!(c, 409, "{m}");
    assert_eq!(head_of(&mut a, "alice/mirror").await, local);

    // Unreachable, not a repository, unknown ref, wrong scheme, file:// by a user.
    let dead = format!("git://127.0.0.1:{}/up", free_port());
    for (args, code) in [
        (json!({"repo": "alice/dead", "remoteUrl": dead}), 502),
        (
            json!({"repo": "alice/dead", "remoteUrl": format!("git://127.0.0.1:{}/nothing", daemon.port)}),
            502,
        ),
        (
            json!({"repo": "alice/dead", "remoteUrl": git_url, "remoteRef": "no-such-branch"}),
            404,
        ),
        (
            json!({"repo": "alice/dead", "remoteUrl": "https://127.0.0.1:1/x.git"}),
            400,
        ),
        (json!({"repo": "alice/dead", "remoteUrl": url}), 403),
        (json!({"repo": "alice/dead", "remoteUrl": ""}), 400),
    ] {
        let (c, m) = err_of(&a.request("repo.import", args.clone()).await.unwrap());
        assert_eq!(c, code, "{args}: {m}");
        assert!(
            !repo_dir(&k, "alice/dead").exists(),
            "{args}: nothing written"
        );
    }
    let (c, _) = err_of(
        &root
            .request("repo.import", json!({"repo": "alice/dead", "remoteUrl": format!("file://{}/nothing", tmp.path().display())}))
            .await
            .unwrap(),
    );
    assert_eq!(c, 502);
    assert!(!repo_dir(&k, "alice/dead").exists());
}

#[tokio::test]
async fn git_clone_over_the_kernel_http_endpoint_gets_the_same_tree() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    a.call("repo.create", json!({"repo": "alice/site"}))
        .await
        .unwrap();
    let head = apply(
        &mut a,
        "alice/site",
        "content",
        json!([
            {"type": "put", "path": "index.html", "content": "<h1>hi</h1>\n"},
            {"type": "put", "path": "css/site.css", "content": "body{}\n"},
        ]),
    )
    .await;
    let token = a
        .call("sys.token.create", json!({"kind": "user", "label": "git"}))
        .await
        .unwrap()["token"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let host = k
        .url
        .trim_start_matches("ws://")
        .trim_end_matches("/ws")
        .to_owned();
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("http://alice:{token}@{host}/repos/alice/site.git");
    let out = tokio::task::spawn_blocking({
        let dir = tmp.path().to_owned();
        move || git(&dir, &["clone", "-q", &url, "site"])
    });
    out.await.unwrap();
    let clone = tmp.path().join("site");
    assert_eq!(git(&clone, &["rev-parse", "HEAD"]).trim(), head);
    assert_eq!(
        lines(&git(&clone, &["ls-files"])),
        ["css/site.css", "index.html"]
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("index.html")).unwrap(),
        "<h1>hi</h1>\n"
    );

    // No credentials, someone else's token, a push: refused.
    let mut b = k.bob().await;
    let bob_token = b
        .call("sys.token.create", json!({"kind": "user"}))
        .await
        .unwrap()["token"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for (name, url) in [
        ("anonymous", format!("http://{host}/repos/alice/site.git")),
        (
            "bob",
            format!("http://bob:{bob_token}@{host}/repos/alice/site.git"),
        ),
        (
            "wrong user",
            format!("http://bob:{token}@{host}/repos/alice/site.git"),
        ),
    ] {
        let dir = tmp.path().to_owned();
        let status = tokio::task::spawn_blocking(move || {
            git_cmd(
                &dir,
                &[
                    "clone",
                    "-q",
                    &url,
                    &format!("x-{}", name.replace(' ', "-")),
                ],
            )
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
        })
        .await
        .unwrap();
        assert!(!status.success(), "{name} must not clone");
    }
    std::fs::write(clone.join("pushed"), "x").unwrap();
    git(&clone, &["add", "pushed"]);
    git(&clone, &["commit", "-q", "-m", "push"]);
    let dir = clone.clone();
    let pushed = tokio::task::spawn_blocking(move || {
        git_cmd(&dir, &["push", "-q", "origin", "HEAD:main"])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!pushed.success(), "pushes go through repo.apply");
    assert_eq!(head_of(&mut a, "alice/site").await, json!(head));
}

/// Runs `gsv ARGS` against `url` as `user`; (success, stdout).
async fn gsv(url: &str, user: &str, pw: &str, args: &[&str]) -> (bool, String) {
    let (url, user, pw) = (url.to_owned(), user.to_owned(), pw.to_owned());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let config = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_gsv"))
            .args(&args)
            .env("GSV_URL", url)
            .env("GSV_USER", user)
            .env("GSV_PASSWORD", pw)
            .env_remove("GSV_TOKEN")
            .env("XDG_CONFIG_HOME", config.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_cli_lists_creates_logs_shows_diffs_and_imports() {
    let k = TestKernel::with_users().await;
    let pw = crate::harness::ALICE_PW;
    let (ok, out) = gsv(&k.url, "alice", pw, &["repo", "create", "alice/cli"]).await;
    assert!(
        ok && out.starts_with("main ") && out.trim_end().ends_with(" created"),
        "{out}"
    );
    let mut a = k.alice().await;
    let head = apply(
        &mut a,
        "alice/cli",
        "add a",
        json!([{"type": "put", "path": "docs/a.md", "content": "# A\n"}]),
    )
    .await;
    let (_, list) = gsv(&k.url, "alice", pw, &["repo", "list"]).await;
    assert!(
        list.lines().any(|l| l == "alice/cli\tuser\trw\tprivate"),
        "{list}"
    );
    let (_, log) = gsv(&k.url, "alice", pw, &["repo", "log", "alice/cli"]).await;
    let first: Vec<&str> = log.lines().next().unwrap().split('\t').collect();
    assert_eq!(
        (first[0], first[2], first[3]),
        (head.as_str(), "alice", "add a")
    );
    assert_eq!(log.lines().count(), 2);
    let (_, file) = gsv(
        &k.url,
        "alice",
        pw,
        &["repo", "show", "alice/cli", "docs/a.md"],
    )
    .await;
    assert_eq!(file, "# A\n");
    let (_, tree) = gsv(&k.url, "alice", pw, &["repo", "show", "alice/cli"]).await;
    assert!(tree.trim_end().ends_with("\tdocs/"), "{tree}");
    let (_, diff) = gsv(&k.url, "alice", pw, &["repo", "diff", "alice/cli", "main"]).await;
    assert_eq!(
        diff,
        "--- /dev/null\n+++ b/docs/a.md\n@@ -0,0 +1,1 @@\n+# A\n"
    );
    let (ok, _) = gsv(&k.url, "alice", pw, &["repo", "show", "alice/cli", "nope"]).await;
    assert!(!ok, "a missing path fails");

    let tmp = tempfile::tempdir().unwrap();
    let up = tmp.path().join("up");
    let up_head = upstream(&up, 1);
    let url = format!("file://{}", up.display());
    let args = ["repo", "import", "root/mirror", url.as_str()];
    let (ok, out) = gsv(&k.url, "root", "root-password", &args).await;
    assert!(ok, "{out}");
    assert_eq!(out, format!("main {up_head} updated\n"));
    let (_, out) = gsv(&k.url, "root", "root-password", &args).await;
    assert_eq!(out, format!("main {up_head} unchanged\n"));
}

/// A bare repository made by `git fast-import`: `main` of `n` commits,
/// with a side branch of five commits forked at 100 and merged at 300
/// (so first-parent history differs from all history).
fn fast_imported(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "--bare", "-b", "main"]);
    let mut stream = String::new();
    let commit = |stream: &mut String, mark: usize, branch: &str, text: &str| {
        let body = format!("{text}\n");
        stream.push_str(&format!(
            "commit refs/heads/{branch}\nmark :{mark}\ncommitter up <up@example.invalid> {} +0000\ndata {}\n{body}",
            1_700_000_000 + mark,
            body.len()
        ));
    };
    for i in 1..=n {
        commit(&mut stream, i, "main", &format!("main {i}"));
        if i > 1 {
            stream.push_str(&format!("from :{}\n", i - 1));
        }
        if i == 300 {
            stream.push_str(&format!("merge :{}\n", n + 5));
        }
        stream.push_str(&format!(
            "M 644 inline f.txt\ndata <<END\nmain {i}\nEND\n\n"
        ));
        if i == 100 {
            for s in 1..=5 {
                commit(&mut stream, n + s, "side", &format!("side {s}"));
                let from = if s == 1 { 100 } else { n + s - 1 };
                stream.push_str(&format!(
                    "from :{from}\nM 644 inline side.txt\ndata <<END\nside {s}\nEND\n\n"
                ));
            }
        }
    }
    let mut child = git_cmd(dir, &["fast-import", "--quiet"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stream.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "git fast-import failed");
}

/// `(hash, parents)` of each `repo.log` entry.
fn hashes_and_parents(log: &Value) -> Vec<String> {
    log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let parents: Vec<&str> = e["parents"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect();
            format!("{} {}", e["hash"].as_str().unwrap(), parents.join(" "))
        })
        .collect()
}

/// `git log --first-parent` of `rev`: `n` entries after `skip`.
fn git_page(dir: &Path, rev: &str, skip: usize, n: usize) -> Vec<String> {
    lines(&git(
        dir,
        &[
            "log",
            "--first-parent",
            "--format=%H %P",
            &format!("--skip={skip}"),
            &format!("--max-count={n}"),
            rev,
        ],
    ))
}

#[tokio::test]
async fn deep_log_pages_and_packed_applies_match_real_git() {
    use gsv_kernel::domains::repo::{pack::MAX_PACKS, store::INDEXED_LOG_OFFSET};
    let k = TestKernel::with_users().await;
    let tmp = tempfile::tempdir().unwrap();
    let up = tmp.path().join("up.git");
    fast_imported(&up, 400);
    let mut root = k.login("root", "root-password").await;
    root.call(
        "repo.import",
        json!({"repo": "alice/deep", "remoteUrl": format!("file://{}", up.display())}),
    )
    .await
    .unwrap();
    let dir = repo_dir(&k, "alice/deep");
    let pack_files = |ext: &str| {
        std::fs::read_dir(dir.join("objects/pack"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == ext))
            .count()
    };
    assert_eq!(pack_files("keep"), 0, "the imported pack may be merged");
    let mut a = k.alice().await;
    let offset = INDEXED_LOG_OFFSET as usize + 50;
    let page = |rev: &str, offset: usize| json!({"repo": "alice/deep", "ref": rev, "limit": 100, "offset": offset});

    // The first deep page builds the index from nothing.
    let log = a.call("repo.log", page("main", offset)).await.unwrap();
    assert_eq!(
        hashes_and_parents(&log),
        git_page(&dir, "main", offset, 100)
    );
    assert!(dir.join("gsv-first-parent").is_file());

    // Enough applies to pass the pack limit: each writes one pack, small
    // ones are merged, nothing is written loose.
    for i in 0..(MAX_PACKS + 4) {
        apply(
            &mut a,
            "alice/deep",
            &format!("apply {i}"),
            json!([{"type": "put", "path": format!("d/{i}.txt"), "content": format!("{i}\n")}]),
        )
        .await;
    }
    let packs = pack_files("idx");
    assert!(packs <= MAX_PACKS, "{packs} packs after merging");
    let counted = git(&dir, &["count-objects", "-v"]);
    assert!(
        counted.starts_with("count: 0\n"),
        "loose objects: {counted}"
    );
    git(&dir, &["fsck", "--strict", "--no-dangling"]);

    // A head that moved extends the index; an older commit reads a prefix
    // of it; both equal git's first-parent log, as does the shallow path.
    for (rev, offset) in [
        ("main", offset),
        ("main", 10),
        ("main~30", offset),
        ("main~30", 0),
    ] {
        let log = a.call("repo.log", page(rev, offset)).await.unwrap();
        assert_eq!(
            hashes_and_parents(&log),
            git_page(&dir, rev, offset, 100),
            "{rev} at {offset}"
        );
    }
    let past = a.call("repo.log", page("main", 5000)).await.unwrap();
    assert_eq!(past["entries"], json!([]));
    assert_eq!(
        git(&dir, &["ls-tree", "-r", "--name-only", "main", "d/"])
            .lines()
            .count(),
        MAX_PACKS + 4
    );
}
