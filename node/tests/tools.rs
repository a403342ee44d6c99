//! The node tools through their single entry, `NodeTools::handle`, on real
//! temp directories and real processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gsv_node::{
    ExecEventKind, MAX_OUTPUT_CHARS, NodeRoot, NodeTools, ShellConfig, TAIL_CHARS, ToolError,
};
use gsv_protocol::fs::{MAX_READ_CONTENT_BYTES, MAX_SEARCH_LINE_CHARS, MAX_SEARCH_MATCHES};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// A temp dir holding `root/` (the node root) and `outside/` beside it,
/// with `root/out` a symlink to `outside/`.
struct Node {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    tools: NodeTools,
}

/// Commands run by `/bin/sh -c`, so tests do not depend on the user's
/// `$SHELL` or profile; the default launch has its own test.
fn node() -> Node {
    node_with(sh_config())
}

fn sh_config() -> ShellConfig {
    ShellConfig {
        shell: Some(PathBuf::from("/bin/sh")),
        login: false,
        ..ShellConfig::default()
    }
}

fn node_with(config: ShellConfig) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "needle outside\n").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    let tools = NodeTools::with_config(NodeRoot::new(&root).unwrap(), config);
    Node {
        _tmp: tmp,
        root,
        outside,
        tools,
    }
}

impl Node {
    async fn call(&self, call: &str, args: Value) -> Value {
        tokio::time::timeout(Duration::from_secs(60), self.tools.handle(call, args))
            .await
            .expect("tool call finished within its deadline")
            .expect("tool call answered")
    }

    fn write(&self, rel: &str, content: impl AsRef<[u8]>) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap()
    }
}

fn assert_op_error(v: &Value, code: &str, mentions: &str) {
    assert_eq!(v["ok"], json!(false), "{v}");
    assert_eq!(v["code"], json!(code), "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains(mentions),
        "error {msg:?} should mention {mentions:?}"
    );
}

/// True once `pid` no longer runs (gone, or a zombie waiting for init).
fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .chars()
                .next();
            matches!(state, Some('Z' | 'X'))
        }
    }
}

async fn wait_until(mut ok: impl FnMut() -> bool) -> bool {
    for _ in 0..400 {
        if ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    ok()
}

async fn read_pid(path: &Path) -> i32 {
    assert!(
        wait_until(|| std::fs::read_to_string(path).is_ok_and(|s| s.trim().parse::<i32>().is_ok()))
            .await,
        "pid file {} appeared",
        path.display()
    );
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

// ---- fs.read ----

#[tokio::test]
async fn read_numbers_lines_from_offset_plus_one_and_honours_limit() {
    let n = node();
    n.write("notes.txt", "alpha\nbeta\ngamma\ndelta\n");
    let all = n.call("fs.read", json!({"path": "notes.txt"})).await;
    assert_eq!(all["ok"], json!(true));
    assert_eq!(
        all["content"],
        json!("1\talpha\n2\tbeta\n3\tgamma\n4\tdelta")
    );
    assert_eq!(all["lines"], json!(4));
    assert_eq!(all["kind"], json!("text"));
    assert_eq!(all["path"], json!(n.root.join("notes.txt")));
    assert_eq!(all["size"], json!(23));

    let window = n
        .call(
            "fs.read",
            json!({"path": "notes.txt", "offset": 1, "limit": 2}),
        )
        .await;
    assert_eq!(window["content"], json!("2\tbeta\n3\tgamma"));
    assert_eq!(window["lines"], json!(2));
    assert!(window.get("truncated").is_none());

    let abs = n.root.join("notes.txt");
    let by_abs = n.call("fs.read", json!({"path": abs, "offset": 3})).await;
    assert_eq!(by_abs["content"], json!("4\tdelta"));
}

#[tokio::test]
async fn read_of_a_directory_lists_files_and_directories_sorted() {
    let n = node();
    n.write("b.txt", "");
    n.write("a.txt", "");
    n.write("zdir/x", "");
    n.write("adir/y", "");
    let v = n.call("fs.read", json!({"path": "."})).await;
    assert_eq!(v["ok"], json!(true));
    assert_eq!(v["files"], json!(["a.txt", "b.txt", "out"]));
    assert_eq!(v["directories"], json!(["adir", "zdir"]));
    assert_eq!(v["path"], json!(n.root));
}

#[tokio::test]
async fn read_of_an_image_returns_it_inline_as_a_base64_block_whatever_its_name() {
    let n = node();
    let mut png = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    png.extend_from_slice(&[0, 0, 0, 13, b'I', b'H', b'D', b'R', 1, 2, 3]);
    n.write("picture.txt", &png);
    let v = n.call("fs.read", json!({"path": "picture.txt"})).await;
    assert_eq!(v["kind"], json!("image"), "{v}");
    assert_eq!(v["contentType"], json!("image/png"));
    assert_eq!(v["size"], json!(png.len()));
    let block = &v["content"][0];
    assert_eq!(block["type"], json!("image"));
    assert_eq!(block["mimeType"], json!("image/png"));
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD
        .decode(block["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(data, png);
}

#[tokio::test]
async fn read_refuses_binary_files_and_reports_missing_ones_by_path() {
    let n = node();
    n.write("blob.bin", [0u8, 1, 2, 0, 255]);
    let v = n.call("fs.read", json!({"path": "blob.bin"})).await;
    assert_op_error(&v, "binary_file", "blob.bin");
    let v = n.call("fs.read", json!({"path": "nope/missing.txt"})).await;
    assert_op_error(&v, "not_found", "nope/missing.txt");
}

#[tokio::test]
async fn reading_a_fifo_is_an_error_not_a_hang() {
    let n = node();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        n.root.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let v = n.call("fs.read", json!({"path": "pipe"})).await;
    assert_op_error(&v, "not_a_file", "pipe");
    let v = n.call("fs.search", json!({"query": "x"})).await;
    assert_eq!(v["count"], json!(0), "{v}");
}

#[tokio::test]
async fn a_read_window_larger_than_the_cap_stops_at_a_line_and_says_where_to_go_on() {
    let n = node();
    let line = "x".repeat(1000);
    let text: String = (0..400).map(|_| format!("{line}\n")).collect();
    n.write("big.txt", &text);
    let v = n.call("fs.read", json!({"path": "big.txt"})).await;
    assert_eq!(v["truncated"], json!(true), "{}", v["lines"]);
    let got = v["lines"].as_u64().unwrap();
    assert!(got > 0 && got < 400);
    assert_eq!(v["nextOffset"], json!(got));
    assert!(v["content"].as_str().unwrap().len() <= MAX_READ_CONTENT_BYTES);
    let rest = n
        .call(
            "fs.read",
            json!({"path": "big.txt", "offset": got, "limit": 1}),
        )
        .await;
    assert_eq!(rest["content"], json!(format!("{}\t{line}", got + 1)));
}

#[tokio::test]
async fn a_file_without_newlines_is_read_as_one_cut_line_not_loaded_whole() {
    let n = node();
    let cap = MAX_READ_CONTENT_BYTES;
    n.write("one.txt", "é".repeat(cap));
    let v = n.call("fs.read", json!({"path": "one.txt"})).await;
    assert_eq!(v["ok"], json!(true), "{}", v["error"]);
    assert_eq!(v["truncated"], json!(true));
    assert_eq!(v["lines"], json!(1));
    let content = v["content"].as_str().unwrap();
    assert!(content.starts_with("1\té"));
    assert!(content.len() <= cap);
    assert!(content.len() > cap - 64);
}

// ---- fs.write / fs.edit / fs.delete ----

#[tokio::test]
async fn write_creates_parents_replaces_whole_files_and_reports_bytes() {
    let n = node();
    let v = n
        .call(
            "fs.write",
            json!({"path": "deep/er/new.txt", "content": "héllo"}),
        )
        .await;
    assert_eq!(v["ok"], json!(true), "{v}");
    assert_eq!(v["size"], json!(6));
    assert_eq!(v["path"], json!(n.root.join("deep/er/new.txt")));
    assert_eq!(n.read("deep/er/new.txt"), "héllo");

    use std::os::unix::fs::PermissionsExt;
    let script = n.root.join("run.sh");
    std::fs::write(&script, "old").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
    let v = n
        .call("fs.write", json!({"path": "run.sh", "content": "new"}))
        .await;
    assert_eq!(v["ok"], json!(true));
    assert_eq!(n.read("run.sh"), "new");
    let mode = std::fs::metadata(&script).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
    let leftovers: Vec<_> = std::fs::read_dir(&n.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn edit_replaces_one_exact_match_and_refuses_ambiguous_or_missing_ones() {
    let n = node();
    n.write("f.txt", "one two two three");
    let v = n
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "one", "newString": "1"}),
        )
        .await;
    assert_eq!(
        v,
        json!({"ok": true, "path": n.root.join("f.txt"), "replacements": 1})
    );
    assert_eq!(n.read("f.txt"), "1 two two three");

    let v = n
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "two", "newString": "2"}),
        )
        .await;
    assert_op_error(&v, "multiple_matches", "found 2 times");
    assert!(v["error"].as_str().unwrap().contains("replaceAll: true"));
    assert_eq!(
        n.read("f.txt"),
        "1 two two three",
        "a refused edit changes nothing"
    );

    let v = n
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "two", "newString": "2", "replaceAll": true}),
        )
        .await;
    assert_eq!(v["replacements"], json!(2));
    assert_eq!(n.read("f.txt"), "1 2 2 three");

    let v = n
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "four", "newString": "4"}),
        )
        .await;
    assert_op_error(&v, "no_match", "f.txt");
}

#[tokio::test]
async fn delete_removes_files_and_trees_but_only_the_link_of_a_symlink() {
    let n = node();
    n.write("gone.txt", "x");
    n.write("tree/a/b.txt", "x");
    let v = n.call("fs.delete", json!({"path": "gone.txt"})).await;
    assert_eq!(v, json!({"ok": true, "path": n.root.join("gone.txt")}));
    assert!(!n.root.join("gone.txt").exists());
    let v = n.call("fs.delete", json!({"path": "tree"})).await;
    assert_eq!(v["ok"], json!(true));
    assert!(!n.root.join("tree").exists());

    // `out` is a symlink leading outside: deleting it removes the link,
    // never what it points at.
    let v = n.call("fs.delete", json!({"path": "out"})).await;
    assert_eq!(v["ok"], json!(true), "{v}");
    assert!(n.outside.join("secret.txt").exists());

    let v = n.call("fs.delete", json!({"path": "."})).await;
    assert_op_error(&v, "invalid_argument", "node root itself");
    assert!(n.root.exists());
    let v = n.call("fs.delete", json!({"path": "missing"})).await;
    assert_op_error(&v, "not_found", "missing");
}

// ---- fs.search ----

#[tokio::test]
async fn search_is_literal_reports_one_based_lines_and_filters_by_include() {
    let n = node();
    n.write("src/a.rs", "fn a() {}\nlet x = a.c;\n");
    n.write("src/b.md", "abc\nmention a.c here\n");
    n.write("src/c.txt", "a.c in text\n");
    n.write("bin.dat", b"a.c\0binary");
    let v = n.call("fs.search", json!({"query": "a.c"})).await;
    assert_eq!(v["ok"], json!(true));
    let mut hits: Vec<(String, u64)> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let p = PathBuf::from(m["path"].as_str().unwrap());
            let rel = p.strip_prefix(&n.root).unwrap().display().to_string();
            (rel, m["line"].as_u64().unwrap())
        })
        .collect();
    hits.sort();
    assert_eq!(
        hits,
        [
            ("src/a.rs".to_owned(), 2),
            ("src/b.md".to_owned(), 2),
            ("src/c.txt".to_owned(), 1)
        ],
        "literal '.' matches only a dot; binaries and the symlink out are skipped"
    );
    assert_eq!(v["count"], json!(3));

    let v = n
        .call(
            "fs.search",
            json!({"query": "a.c", "path": "src", "include": "*.{rs,md}"}),
        )
        .await;
    assert_eq!(v["count"], json!(2), "{v}");

    let v = n
        .call("fs.search", json!({"query": "a.c", "include": "[z-a"}))
        .await;
    assert_op_error(&v, "invalid_argument", "[z-a");
    let v = n.call("fs.search", json!({"query": ""})).await;
    assert_op_error(&v, "invalid_argument", "query is required");
}

#[tokio::test]
async fn search_stops_at_the_match_cap_and_says_truncated() {
    let n = node();
    let text: String = (0..MAX_SEARCH_MATCHES + 20)
        .map(|i| format!("hit {i} {}\n", "y".repeat(300)))
        .collect();
    n.write("many.txt", text);
    let v = n.call("fs.search", json!({"query": "hit"})).await;
    assert_eq!(v["truncated"], json!(true));
    assert_eq!(v["count"], json!(MAX_SEARCH_MATCHES));
    let first = v["matches"][0]["content"].as_str().unwrap();
    assert_eq!(first.chars().count(), MAX_SEARCH_LINE_CHARS);
}

// ---- path escapes ----

#[tokio::test]
async fn every_tool_refuses_paths_that_leave_the_root_and_changes_nothing_outside() {
    let n = node();
    n.write("sub/keep.txt", "");
    let secret = n.outside.join("secret.txt");
    // A final symlink leading out: following it is an escape.
    std::os::unix::fs::symlink(&secret, n.root.join("leak.txt")).unwrap();
    let escapes = [
        "../outside/secret.txt".to_owned(),
        "sub/../../outside/secret.txt".to_owned(),
        "out/secret.txt".to_owned(),
        secret.display().to_string(),
        "/etc/passwd".to_owned(),
        "leak.txt".to_owned(),
    ];
    for p in &escapes {
        let calls = [
            ("fs.read", json!({"path": p})),
            ("fs.write", json!({"path": p, "content": "pwned"})),
            (
                "fs.edit",
                json!({"path": p, "oldString": "needle", "newString": "pwned"}),
            ),
            ("fs.delete", json!({"path": p})),
            ("fs.search", json!({"query": "needle", "path": p})),
        ];
        for (call, args) in calls {
            if call == "fs.delete" && p == "leak.txt" {
                // Deleting a link removes the link itself: not an escape.
                continue;
            }
            let v = n.call(call, args).await;
            assert_op_error(&v, "path_escape", p);
        }
    }
    // A search of the whole root neither walks nor reads through links out.
    let v = n.call("fs.search", json!({"query": "needle"})).await;
    assert_eq!(v["count"], json!(0), "{v}");
    n.write("inside.txt", "needle inside\n");
    let v = n.call("fs.search", json!({"query": "needle"})).await;
    assert_eq!(v["count"], json!(1), "{v}");

    let v = n
        .call(
            "fs.write",
            json!({"path": "out/planted/x.txt", "content": "x"}),
        )
        .await;
    assert_op_error(&v, "path_escape", "out/planted/x.txt");
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "needle outside\n"
    );
    assert!(!n.outside.join("planted").exists());

    let v = n
        .call("shell.exec", json!({"input": "pwd", "cwd": "out"}))
        .await;
    assert_op_error(&v, "path_escape", "out");
    let v = n
        .call("shell.exec", json!({"input": "pwd", "cwd": ".."}))
        .await;
    assert_op_error(&v, "path_escape", "..");
}

#[tokio::test]
async fn unknown_calls_are_tool_errors_and_bad_arguments_are_operation_errors() {
    let n = node();
    let e = n.tools.handle("net.fetch", json!({})).await.unwrap_err();
    assert!(matches!(e, ToolError::UnknownCall(ref c) if c == "net.fetch"));
    assert_eq!(e.code(), 404);
    let v = n.call("fs.read", json!({"paht": "x"})).await;
    assert_op_error(&v, "invalid_argument", "Invalid arguments");
    let v = n.call("shell.exec", json!({"input": "   "})).await;
    assert_op_error(&v, "invalid_argument", "input must not be empty");
}

// ---- shell.exec ----

#[tokio::test]
async fn by_default_commands_run_in_the_users_login_shell_or_bin_sh() {
    let n = node_with(ShellConfig::default());
    let v = n.call("shell.exec", json!({"input": "echo hi"})).await;
    assert_eq!(v["status"], json!("completed"), "{v}");
    // A profile may print something of its own first.
    assert!(v["stdout"].as_str().unwrap().ends_with("hi\n"), "{v}");
}

#[tokio::test]
async fn the_configured_shell_runs_commands_as_a_login_shell_or_not() {
    for (login, expect) in [(false, "plain"), (true, "login")] {
        let n = node_with(ShellConfig {
            shell: Some(PathBuf::from("/bin/bash")),
            login,
            ..ShellConfig::default()
        });
        let v = n
            .call(
                "shell.exec",
                json!({"input": "shopt -q login_shell && echo login || echo plain; echo $BASH"}),
            )
            .await;
        assert_eq!(v["output"], json!(format!("{expect}\n/bin/bash\n")), "{v}");
    }
}

#[tokio::test]
async fn a_quick_command_completes_with_its_output_in_the_requested_cwd() {
    let n = node();
    std::fs::create_dir(n.root.join("sub")).unwrap();
    let v = n
        .call(
            "shell.exec",
            json!({"input": "pwd; echo err >&2; echo hi", "cwd": "sub"}),
        )
        .await;
    assert_eq!(v["status"], json!("completed"), "{v}");
    assert_eq!(v["exitCode"], json!(0));
    assert_eq!(v["error"], Value::Null);
    assert_eq!(v["timedOut"], json!(false));
    let sub = n.root.join("sub").display().to_string();
    assert_eq!(v["stdout"], json!(format!("{sub}\nhi\n")));
    assert_eq!(v["stderr"], json!("err\n"));
    assert!(v["output"].as_str().unwrap().contains("hi\n"));
    assert_eq!(v["tail"], v["output"]);
    assert_eq!(v["cwd"], json!(sub));
    assert_eq!(v["truncated"], json!(false));
    assert!(v["sessionId"].as_str().is_some_and(|s| s.len() == 36));

    let v = n.call("shell.exec", json!({"input": "exit 3"})).await;
    assert_eq!(v["status"], json!("failed"));
    assert_eq!(v["exitCode"], json!(3));
    assert_eq!(v["error"], json!("Command exited with code 3"));
    // The old tool's argument names still work.
    let v = n
        .call(
            "shell.exec",
            json!({"command": "echo old", "workdir": "sub"}),
        )
        .await;
    assert_eq!(v["output"], json!("old\n"));
}

#[tokio::test]
async fn a_timeout_terms_then_kills_the_whole_process_group() {
    let n = node();
    // The grandchild ignores SIGTERM; only the SIGKILL to the group ends it.
    let v = n
        .call(
            "shell.exec",
            json!({
                "input": "sh -c 'trap \"\" TERM; echo $$ > grandchild.pid; exec sleep 30' & wait",
                // Long enough for the shell to start the grandchild on a
                // loaded machine.
                "timeout": 1500,
            }),
        )
        .await;
    assert_eq!(v["status"], json!("failed"), "{v}");
    assert_eq!(v["timedOut"], json!(true));
    assert_eq!(v["error"], json!("Command timed out"));
    let pid = read_pid(&n.root.join("grandchild.pid")).await;
    assert!(
        wait_until(|| is_gone(pid)).await,
        "grandchild {pid} was killed"
    );
}

#[tokio::test]
async fn a_background_session_is_polled_to_completion_then_forgotten() {
    let n = node();
    let v = n
        .call(
            "shell.exec",
            json!({"input": "sleep 0.3; echo done", "background": true}),
        )
        .await;
    assert_eq!(v["status"], json!("running"), "{v}");
    assert!(v["pid"].as_u64().is_some());
    let id = v["sessionId"].as_str().unwrap().to_owned();

    let mut last = json!(null);
    for _ in 0..20 {
        last = n
            .call(
                "shell.exec",
                json!({"sessionId": id, "input": "", "yieldMs": 5000}),
            )
            .await;
        if last["status"] != json!("running") {
            break;
        }
    }
    assert_eq!(last["status"], json!("completed"), "{last}");
    assert_eq!(last["output"], json!("done\n"));
    assert_eq!(last["sessionId"], json!(id));

    let again = n
        .call("shell.exec", json!({"sessionId": id, "input": ""}))
        .await;
    assert_op_error(&again, "unknown_session", &id);
}

#[tokio::test]
async fn a_command_outliving_its_yield_becomes_a_session_and_outputs_are_not_repeated() {
    let n = node();
    let v = n
        .call(
            "shell.exec",
            json!({"input": "echo first; read x; echo \"got $x\"", "yieldMs": 300}),
        )
        .await;
    // It waits on stdin, so it cannot have finished.
    assert_eq!(v["status"], json!("running"), "{v}");
    let id = v["sessionId"].as_str().unwrap().to_owned();
    let mut outputs = v["output"].as_str().unwrap().to_owned();
    // Once "first" is out, writing stdin lets it finish.
    for _ in 0..100 {
        if outputs.contains("first") {
            break;
        }
        let v = n
            .call("shell.exec", json!({"sessionId": id, "yieldMs": 250}))
            .await;
        assert_eq!(v["status"], json!("running"), "{v}");
        outputs.push_str(v["output"].as_str().unwrap());
    }
    let mut v = n
        .call(
            "shell.exec",
            json!({"sessionId": id, "input": "hello\n", "yieldMs": 5000}),
        )
        .await;
    for _ in 0..10 {
        if v["status"] != json!("running") {
            break;
        }
        outputs.push_str(v["output"].as_str().unwrap());
        v = n
            .call("shell.exec", json!({"sessionId": id, "yieldMs": 5000}))
            .await;
    }
    assert_eq!(v["status"], json!("completed"), "{v}");
    outputs.push_str(v["output"].as_str().unwrap());
    assert_eq!(
        outputs, "first\ngot hello\n",
        "each answer carries only what is new"
    );
    assert_eq!(v["stdout"], json!("first\ngot hello\n"));
}

#[tokio::test]
async fn session_actions_log_submit_kill_and_list() {
    let n = node();
    let v = n
        .call(
            "shell.exec",
            json!({"input": "for i in 1 2 3 4 5; do echo line$i; done; read x; echo \"in:$x\"; sleep 30", "background": true}),
        )
        .await;
    let id = v["sessionId"].as_str().unwrap().to_owned();

    let mut log = json!(null);
    for _ in 0..100 {
        log = n
            .call(
                "shell.exec",
                json!({"sessionId": id, "action": "log", "offset": 1, "limit": 2}),
            )
            .await;
        if log["totalLines"] == json!(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(log["output"], json!("line2\nline3"), "{log}");
    assert_eq!(log["lines"], json!(2));
    assert_eq!(log["status"], json!("running"));

    let v = n
        .call(
            "shell.exec",
            json!({"sessionId": id, "action": "submit", "input": "typed", "yieldMs": 250}),
        )
        .await;
    assert_eq!(v["status"], json!("running"));

    let list = n.call("shell.exec", json!({"action": "list"})).await;
    let rows = list["sessions"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["sessionId"] == json!(id) && r["status"] == json!("running"))
    );

    let v = n
        .call("shell.exec", json!({"sessionId": id, "action": "kill"}))
        .await;
    assert_eq!(v["status"], json!("failed"), "{v}");
    assert_eq!(v["signal"], json!("SIGKILL"));
    assert!(v["stdout"].as_str().unwrap().contains("in:typed\n"), "{v}");
    let pid = v["pid"].as_i64().unwrap() as i32;
    assert!(wait_until(|| is_gone(pid)).await);

    let v = n
        .call("shell.exec", json!({"sessionId": id, "input": "late"}))
        .await;
    assert_op_error(&v, "unknown_session", &id);
}

#[tokio::test]
async fn writing_to_a_finished_session_says_stdin_is_closed() {
    let n = node();
    let v = n
        .call("shell.exec", json!({"input": "true", "background": true}))
        .await;
    let id = v["sessionId"].as_str().unwrap().to_owned();
    let events = n.tools.exec_events();
    let mut seen = Vec::new();
    assert!(
        wait_until(|| {
            seen.extend(events.drain());
            seen.iter()
                .any(|e| e.session_id == id && e.event == ExecEventKind::Finished)
        })
        .await,
        "the session finished: {seen:?}"
    );
    let v = n
        .call("shell.exec", json!({"sessionId": id, "input": "x"}))
        .await;
    assert_op_error(&v, "stdin_closed", &id);
}

#[tokio::test]
async fn output_keeps_the_last_200000_chars_with_a_4000_char_tail() {
    let n = node();
    let v = n
        .call(
            "shell.exec",
            json!({"input": "head -c 300000 /dev/zero | tr '\\0' a; printf END"}),
        )
        .await;
    assert_eq!(v["status"], json!("completed"), "{}", v["error"]);
    assert_eq!(v["truncated"], json!(true));
    let out = v["output"].as_str().unwrap();
    assert_eq!(out.chars().count(), MAX_OUTPUT_CHARS);
    assert!(out.ends_with("aaaEND"));
    let tail = v["tail"].as_str().unwrap();
    assert_eq!(tail.chars().count(), TAIL_CHARS);
    assert!(out.ends_with(tail));
}

#[tokio::test]
async fn background_sessions_report_started_and_finished_events() {
    let n = node();
    let v = n
        .call(
            "shell.exec",
            json!({"input": "echo bye; exit 4", "background": true}),
        )
        .await;
    let id = v["sessionId"].as_str().unwrap().to_owned();
    let events = n.tools.exec_events();
    let mut seen = Vec::new();
    assert!(
        wait_until(|| {
            seen.extend(events.drain());
            seen.iter().any(|e| e.event != ExecEventKind::Started)
        })
        .await
    );
    assert_eq!(seen[0].event, ExecEventKind::Started);
    assert_eq!(seen[0].session_id, id);
    let end = &seen[1];
    assert_eq!(end.event, ExecEventKind::Failed);
    assert_eq!(end.exit_code, Some(4));
    assert_eq!(end.output_tail.as_deref(), Some("bye\n"));
    let wire = serde_json::to_value(end).unwrap();
    assert_eq!(wire["sessionId"], json!(id));
    assert_eq!(wire["event"], json!("failed"));

    // A command answered in the foreground reports nothing.
    n.call("shell.exec", json!({"input": "true"})).await;
    assert!(events.drain().is_empty());
}

#[tokio::test]
async fn finished_sessions_nobody_collects_are_dropped_after_the_retention_time() {
    let n = node_with(ShellConfig {
        retention: Duration::from_millis(200),
        ..sh_config()
    });
    let v = n
        .call("shell.exec", json!({"input": "true", "background": true}))
        .await;
    let id = v["sessionId"].as_str().unwrap().to_owned();
    let list_has = |list: &Value| {
        list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["sessionId"] == json!(id))
    };
    let list = n.call("shell.exec", json!({"action": "list"})).await;
    assert!(list_has(&list), "{list}");
    let mut gone = false;
    for _ in 0..200 {
        let list = n.call("shell.exec", json!({"action": "list"})).await;
        if !list_has(&list) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(gone);
    let v = n.call("shell.exec", json!({"sessionId": id})).await;
    assert_op_error(&v, "unknown_session", &id);
}

#[tokio::test]
async fn commands_beyond_the_running_cap_are_refused_until_one_ends() {
    let n = node_with(ShellConfig {
        max_running: 1,
        ..sh_config()
    });
    let v = n
        .call(
            "shell.exec",
            json!({"input": "sleep 30", "background": true}),
        )
        .await;
    let id = v["sessionId"].as_str().unwrap().to_owned();
    let v = n.call("shell.exec", json!({"input": "echo second"})).await;
    assert_op_error(&v, "too_many_sessions", "at most 1");
    let v = n
        .call("shell.exec", json!({"sessionId": id, "action": "kill"}))
        .await;
    assert_eq!(v["status"], json!("failed"));
    let v = n.call("shell.exec", json!({"input": "echo third"})).await;
    assert_eq!(v["output"], json!("third\n"), "{v}");
}

#[tokio::test]
async fn dropping_a_foreground_request_kills_its_process_group() {
    let n = node();
    let tools = n.tools.clone();
    let call = tokio::spawn(async move {
        tools
            .handle(
                "shell.exec",
                json!({"input": "echo $$ > shell.pid; sleep 30", "yieldMs": 30000}),
            )
            .await
    });
    let pid = read_pid(&n.root.join("shell.pid")).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert!(wait_until(|| is_gone(pid)).await, "shell {pid} was killed");
}

#[tokio::test]
async fn a_cancelled_request_answers_cancelled_and_a_cancelled_poll_leaves_the_session_running() {
    let n = node();
    let v = n
        .call(
            "shell.exec",
            json!({"input": "sleep 30", "background": true}),
        )
        .await;
    let id = v["sessionId"].as_str().unwrap().to_owned();
    let pid = v["pid"].as_i64().unwrap() as i32;

    let cancel = CancellationToken::new();
    let tools = n.tools.clone();
    let token = cancel.clone();
    let poll_id = id.clone();
    let poll = tokio::spawn(async move {
        tools
            .handle_cancellable(
                "shell.exec",
                json!({"sessionId": poll_id, "yieldMs": 30000}),
                &token,
            )
            .await
    });
    tokio::task::yield_now().await;
    cancel.cancel();
    let r = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(r, Err(ToolError::Cancelled)), "{r:?}");
    assert!(
        !is_gone(pid),
        "the background command survives a cancelled poll"
    );

    let v = n
        .call("shell.exec", json!({"sessionId": id, "action": "kill"}))
        .await;
    assert_eq!(v["status"], json!("failed"));
}

/// The `fs.*` contract suite (`gsv_protocol::fs::testkit`) on the node's
/// disk tools, through `NodeTools::handle` as the driver calls them.
mod fs_contract {
    use gsv_protocol::fs::testkit::FsTarget;
    use gsv_protocol::fs::*;
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use super::{Node, node};

    async fn call<A: Serialize, T: DeserializeOwned>(n: &Node, call: &str, args: A) -> FsResult<T> {
        let v = n.call(call, serde_json::to_value(args).unwrap()).await;
        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{call} answered {v}: {e}"))
    }

    impl FsTarget for Node {
        fn path(&self, rel: &str) -> String {
            rel.to_owned()
        }
        async fn put(&self, rel: &str, bytes: &[u8]) {
            self.write(rel, bytes);
        }
        async fn read(&self, a: ReadArgs) -> FsResult<ReadResult> {
            call(self, "fs.read", a).await
        }
        async fn write(&self, a: WriteArgs) -> FsResult<WriteResult> {
            call(self, "fs.write", a).await
        }
        async fn edit(&self, a: EditArgs) -> FsResult<EditResult> {
            call(self, "fs.edit", a).await
        }
        async fn delete(&self, a: DeleteArgs) -> FsResult<DeleteResult> {
            call(self, "fs.delete", a).await
        }
        async fn search(&self, a: SearchArgs) -> FsResult<SearchResult> {
            call(self, "fs.search", a).await
        }
    }

    async fn target() -> Node {
        node()
    }

    gsv_protocol::fs_contract_tests!(target);
}
