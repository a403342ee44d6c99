//! The `gsv` binary: `serve` plus the user CLI against it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::harness::wsd_bin;

/// `gsv serve` on a free port; killed when dropped.
struct Served {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gsv"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .arg("--wsd-bin")
        .arg(wsd_bin())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect(&line)
        .to_owned();
    Served {
        child,
        url: format!("ws://{addr}/ws"),
        _dir: dir,
    }
}

fn gsv(s: &Served, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gsv"))
        .args(args)
        .env("GSV_URL", &s.url)
        .env("GSV_USER", "alice")
        .env("GSV_PASSWORD", "alice-password")
        .env_remove("GSV_TOKEN")
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn the_cli_sets_up_creates_a_workspace_writes_runs_and_reads_back() {
    let s = serve();
    let (ok, out) = gsv(
        &s,
        &[
            "call",
            "sys.setup",
            r#"{"username":"alice","password":"alice-password"}"#,
        ],
    );
    assert!(ok, "{out}");
    let (ok, ws) = gsv(&s, &["workspace", "create", "--label", "demo"]);
    assert!(ok);
    let ws = ws.trim().to_owned();
    assert!(ws.starts_with("ws_"), "{ws}");
    let (_, list) = gsv(&s, &["workspace", "list"]);
    assert!(list.contains(&ws) && list.contains("demo"), "{list}");
    let args = format!(r#"{{"path":"/workspaces/{ws}/hello.txt","content":"hi from the cli\n"}}"#);
    assert!(gsv(&s, &["call", "fs.write", &args]).0);
    let (ok, out) = gsv(
        &s,
        &[
            "exec",
            &ws,
            "--",
            "cat",
            "hello.txt",
            "&&",
            "echo",
            "ran",
            ">",
            "out.txt",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(out, "hi from the cli\n");
    let args = format!(r#"{{"path":"/workspaces/{ws}/out.txt"}}"#);
    let (ok, out) = gsv(&s, &["call", "fs.read", &args]);
    assert!(ok);
    assert!(out.contains("1\\tran"), "{out}");
    let (ok, out) = gsv(&s, &["exec", &ws, "--", "exit", "7"]);
    assert!(!ok, "a failing command fails the CLI: {out}");
    let (ok, out) = gsv(&s, &["call", "no.such.call"]);
    assert!(!ok && out.contains("403"), "{out}");
}
