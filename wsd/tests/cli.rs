//! The `wsd` binary's own surface: help text, argument errors, exit codes.
//! (Its presence also makes `cargo test` build the binary that the
//! cross-crate scenarios in `tests/` drive.)

use std::process::Command;

fn wsd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wsd"));
    c.env_remove("WSD_REMOTE")
        .env_remove("WSD_TOKEN_FILE")
        .env_remove("WSD_TOKEN");
    c
}

#[test]
fn help_lists_every_subcommand() {
    let out = wsd().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for sub in [
        "serve",
        "push",
        "pull",
        "sync",
        "watermarks",
        "exec",
        "attach",
        "kill",
    ] {
        assert!(text.contains(sub), "--help does not mention {sub}:\n{text}");
    }
}

#[test]
fn a_missing_remote_is_a_usage_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = wsd().arg("push").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--remote"));
}

#[test]
fn an_unreachable_remote_fails_with_exit_code_1_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    // A port that was just free: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let out = wsd()
        .arg("push")
        .arg(dir.path())
        .args(["--remote", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&addr), "{err}");
}
