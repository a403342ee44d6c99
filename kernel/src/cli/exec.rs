//! `gsv exec` and `gsv attach`: a command in a workspace, followed like
//! `wsd exec` (and `docker exec`) follows it. Output is printed as it is
//! produced (streamed long polls of `shell.exec`), stdin is closed unless
//! `-i` streams ours, Ctrl-C sends TERM and a second one detaches, and the
//! command's exit code is ours.

use std::collections::VecDeque;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use gsv_kernel::client::GsvClient;
use gsv_node::output::Utf8Stream;
use serde_json::{Value, json};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::conn::{ConnArgs, Resolved, connect_resolved, explain};

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The workspace id (`ws_…`, from `gsv workspace create` or `list`).
    workspace: String,
    /// Working directory, relative to the workspace root (or an absolute
    /// `/workspaces/<id>/…` path).
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,
    /// Extra environment for the command (repeatable).
    #[arg(short = 'e', long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Stop the command after this long: TERM to its process group, KILL
    /// after a grace period; we say so on stderr and exit 143. DURATION
    /// has a unit: `500ms`, `30s`, `5m`, `1h 30m`; a bare number is
    /// seconds (`30` = `30s`). Without it the command runs until it ends.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    timeout: Option<Duration>,
    /// Print the session id and return; the command keeps running
    /// (`gsv attach SESSION` follows it).
    #[arg(long)]
    detach: bool,
    /// Stream this program's stdin (as UTF-8 text) to the command until
    /// end of file. Without it the command's stdin is closed (it reads end
    /// of file at once).
    #[arg(short = 'i', long = "interactive", conflicts_with = "detach")]
    interactive: bool,
    /// Run the command on a terminal, interactively (`gsv shell` with a
    /// command): raw mode, window size, Ctrl-] detaches.
    #[arg(short = 't', long = "tty", conflicts_with_all = ["detach", "interactive", "timeout"])]
    tty: bool,
    /// The command after `--`: one word is a shell line (`'a | b'`); two
    /// or more are a program and its arguments, each quoted for the shell,
    /// as `wsd exec` does.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The session id `gsv exec --detach` printed (`sh_…`).
    session: String,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not K=V")),
    }
}

/// A `humantime` duration such as `30s` or `500ms`; a bare number is
/// seconds, as for timeout(1) and `wsd exec`. Zero is refused: on the wire
/// it means "no timeout".
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let t = match s.trim().parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a duration (e.g. 30s, 500ms, 5m; 30 = 30s): {e}"))?,
    };
    if t.is_zero() {
        return Err(format!(
            "{s:?} is no time at all; leave --timeout out for none"
        ));
    }
    Ok(t)
}

/// The protocol's command line (a shell string) for the words after
/// `--`, as `wsd exec` builds it: one word is already a command line;
/// several are an argv, quoted word by word so the shell hands the program
/// exactly those words.
fn command_line(words: &[String]) -> Result<String> {
    match words {
        [one] => Ok(one.clone()),
        many => shlex::try_join(many.iter().map(String::as_str))
            .map_err(|e| anyhow::anyhow!("the command cannot be quoted for the shell: {e}")),
    }
}

/// How long one streamed poll may wait with nothing to say (the kernel's
/// most; each answer still has the client's deadline on top).
const POLL_MS: u64 = 30_000;
/// Our exit code when the command's end is unknown (the kernel or its wsd
/// lost it), or for a status outside 0–255, as `wsd exec`'s.
const EXIT_LOST: u8 = 255;
/// After a second Ctrl-C detached us (the shell's code for SIGINT).
const DETACHED_BY_INTERRUPT: u8 = 130;
/// When our own stdout went away (the shell's code for SIGPIPE).
const OUTPUT_CLOSED: u8 = 141;
/// 128 + the signal number: how a command TERM or KILL ended exits.
const EXIT_TERM: i64 = 128 + 15;
const EXIT_KILL: i64 = 128 + 9;
/// How long a follower keeps trying to reach the kernel again after
/// losing it, as `wsd exec --reattach-for`'s default.
const REATTACH_FOR: Duration = Duration::from_secs(30);
/// The most stdin text one control call carries.
const MAX_STDIN_PER_CALL: usize = 512 * 1024;

pub async fn exec(conn: &ConnArgs, a: ExecArgs) -> Result<ExitCode> {
    if a.tty {
        // One word is a shell line, as without -t; more are an argv.
        let argv = match a.command.as_slice() {
            [line] => vec!["/bin/sh".to_owned(), "-c".to_owned(), line.clone()],
            words => words.to_vec(),
        };
        let cmd = super::shell::TerminalCommand {
            workspace: a.workspace,
            cwd: a.cwd,
            env: a.env,
            argv,
        };
        return super::shell::exec_tty(conn, cmd).await;
    }
    let mut interrupts = interrupts()?;
    let input = command_line(&a.command)?;
    let login = conn.resolve()?;
    let mut c = connect_resolved(&login).await?;
    let cwd = match a.cwd {
        Some(d) if d.starts_with('/') => d,
        Some(d) => format!("/workspaces/{}/{d}", a.workspace),
        None => format!("/workspaces/{}", a.workspace),
    };
    let env: serde_json::Map<String, Value> =
        a.env.into_iter().map(|(k, v)| (k, json!(v))).collect();
    let timeout_ms = a.timeout.map_or(0, |t| {
        u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
    });
    let start = json!({
        "cwd": cwd, "input": input, "env": env, "openStdin": a.interactive,
        // 0: none (the kernel's default would stop it after 5 minutes).
        "timeout": timeout_ms,
        "stream": true,
        // The session id soon, whatever the command does: stdin, a Ctrl-C
        // and `--detach` wait for it. The kernel's least wait.
        "yieldMs": 0,
    });
    c.timeout = Duration::from_millis(POLL_MS) + Duration::from_secs(60);
    let asked = Instant::now();
    if a.detach {
        let d = c.call("shell.exec", start).await.map_err(explain)?;
        let Some(sid) = d["sessionId"].as_str() else {
            bail!("{}", failure_text(&d));
        };
        println!("{sid}");
        c.close().await;
        return Ok(ExitCode::SUCCESS);
    }
    let stdin = a.interactive.then(forward_stdin);
    let mut f = Follow {
        c,
        login,
        role: Role::Owner,
        sid: None,
        poll: String::new(),
        controls: VecDeque::new(),
        control_in_flight: None,
        interrupted: false,
        deadline: a.timeout.map(|t| (t, asked)),
    };
    f.poll = f.c.fresh_id();
    f.c.send_request(&f.poll, "shell.exec", start).await?;
    let code = f.run(stdin, &mut interrupts).await;
    f.c.close().await;
    code
}

pub async fn attach(conn: &ConnArgs, a: AttachArgs) -> Result<ExitCode> {
    let mut interrupts = interrupts()?;
    let login = conn.resolve()?;
    let mut c = connect_resolved(&login).await?;
    c.timeout = Duration::from_millis(POLL_MS) + Duration::from_secs(60);
    let mut f = Follow {
        c,
        login,
        role: Role::Watcher,
        sid: Some(a.session),
        poll: String::new(),
        controls: VecDeque::new(),
        control_in_flight: None,
        interrupted: false,
        deadline: None,
    };
    f.send_poll().await?;
    let code = f.run(None, &mut interrupts).await;
    f.c.close().await;
    code
}

/// SIGINT as a stream, registered before anything is sent, so a Ctrl-C
/// while the start is in flight still reaches the command.
fn interrupts() -> Result<Signal> {
    signal(SignalKind::interrupt()).context("listening for SIGINT")
}

/// Who is following: the `gsv exec` that started the command owns it (a
/// Ctrl-C or a closed stdout stops it); `gsv attach` only watches (either
/// detaches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Owner,
    Watcher,
}

/// Our stdin as it arrives: text chunks, then `None` at end of file.
type StdinChunks = tokio::sync::mpsc::Receiver<Option<String>>;

/// One command being followed over one connection: a streamed poll always
/// in flight, and control calls (stdin, close, signal) one at a time so
/// the kernel applies them in order.
struct Follow {
    c: GsvClient,
    /// How to log in again after losing the kernel.
    login: Resolved,
    role: Role,
    /// Known once the start answered.
    sid: Option<String>,
    /// The request id of the poll in flight.
    poll: String,
    /// Control calls waiting their turn.
    controls: VecDeque<Value>,
    control_in_flight: Option<String>,
    interrupted: bool,
    /// The `--timeout` we asked for and when we asked.
    deadline: Option<(Duration, Instant)>,
}

impl Follow {
    async fn run(
        &mut self,
        mut stdin: Option<StdinChunks>,
        interrupts: &mut Signal,
    ) -> Result<ExitCode> {
        loop {
            tokio::select! {
                frame = self.c.recv() => {
                    let frame = match frame {
                        Ok(f) => f,
                        Err(e) => {
                            if self.reconnect(&e).await {
                                continue;
                            }
                            let sid = self.sid.as_deref().unwrap_or("the command");
                            eprintln!(
                                "gsv: lost the kernel while {sid} ran ({e}); it may still run: \
                                 `gsv attach {sid}` follows it"
                            );
                            return Ok(ExitCode::from(EXIT_LOST));
                        }
                    };
                    if let Some(code) = self.on_frame(frame).await? {
                        return Ok(code);
                    }
                }
                chunk = recv_stdin(&mut stdin) => {
                    match chunk {
                        Some(text) => self.queue_stdin(text),
                        None => {
                            stdin = None;
                            self.controls.push_back(json!({"closeStdin": true}));
                        }
                    }
                    self.send_control().await?;
                }
                _ = interrupts.recv() => {
                    let sid = self.sid.clone().unwrap_or_else(|| "the command".into());
                    if self.role == Role::Watcher || self.interrupted {
                        eprintln!("gsv: detached from {sid}; it keeps running (`gsv attach {sid}`)");
                        return Ok(ExitCode::from(DETACHED_BY_INTERRUPT));
                    }
                    self.interrupted = true;
                    eprintln!("gsv: interrupted; sending TERM to {sid} (Ctrl-C again to detach)");
                    self.controls.push_front(json!({"signal": "TERM"}));
                    self.send_control().await?;
                }
            }
        }
    }

    /// After losing the connection: logs in again (retrying for up to
    /// [`REATTACH_FOR`], a kernel restart included) and polls the session
    /// again. False when there is no session to go back to or no kernel
    /// came back. Output an answer lost on the way carried is lost with it;
    /// a control call in flight is not sent again (it may have arrived).
    async fn reconnect(&mut self, lost: &gsv_kernel::client::ClientError) -> bool {
        use backon::Retryable as _;
        let Some(sid) = self.sid.clone() else {
            return false;
        };
        tracing::warn!(error = %lost, "lost the kernel; reconnecting to follow {sid}");
        let backoff = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(1))
            .without_max_times()
            .with_total_delay(Some(REATTACH_FOR));
        let login = self.login.clone();
        let Ok(mut c) = (|| connect_resolved(&login)).retry(backoff).await else {
            return false;
        };
        c.timeout = self.c.timeout;
        self.c = c;
        self.control_in_flight = None;
        self.send_poll().await.is_ok()
    }

    /// Adds stdin text to the last queued write when it has room, so a
    /// fast producer costs few calls.
    fn queue_stdin(&mut self, text: String) {
        if let Some(last) = self.controls.back_mut()
            && let Some(queued) = last.get_mut("stdin")
            && let Some(q) = queued.as_str()
            && q.len() + text.len() <= MAX_STDIN_PER_CALL
        {
            *queued = json!(format!("{q}{text}"));
            return;
        }
        self.controls.push_back(json!({ "stdin": text }));
    }

    /// Sends the next control call, unless one is in flight or the
    /// session id is not known yet.
    async fn send_control(&mut self) -> Result<()> {
        if self.control_in_flight.is_some() {
            return Ok(());
        }
        let Some(sid) = self.sid.clone() else {
            return Ok(());
        };
        let Some(control) = self.controls.pop_front() else {
            return Ok(());
        };
        let id = self.c.fresh_id();
        self.c
            .send_request(
                &id,
                "shell.exec",
                json!({"sessionId": sid, "control": control}),
            )
            .await?;
        self.control_in_flight = Some(id);
        Ok(())
    }

    async fn send_poll(&mut self) -> Result<()> {
        let sid = self.sid.clone().unwrap_or_default();
        self.poll = self.c.fresh_id();
        let poll = json!({"sessionId": sid, "input": "", "stream": true, "yieldMs": POLL_MS});
        self.c.send_request(&self.poll, "shell.exec", poll).await?;
        Ok(())
    }

    /// Handles one frame; `Some(code)` once the command is over.
    async fn on_frame(&mut self, f: Value) -> Result<Option<ExitCode>> {
        if f["type"] != "res" {
            return Ok(None);
        }
        if self.control_in_flight.as_deref() == f["id"].as_str() {
            self.control_in_flight = None;
            let failed = f["ok"] != true || f["data"]["ok"] == false;
            if failed {
                // The command no longer takes input (it exited, or closed
                // its stdin): what it prints still comes through the polls.
                tracing::debug!(answer = %f, "a control call failed");
                self.controls.retain(|c| c.get("stdin").is_none());
            }
            self.send_control().await?;
            return Ok(None);
        }
        if f["id"].as_str() != Some(self.poll.as_str()) {
            return Ok(None);
        }
        if f["ok"] != true {
            let call_failed = gsv_kernel::client::ClientError::Remote {
                call: "shell.exec".into(),
                code: f["error"]["code"].as_i64().unwrap_or(0),
                message: f["error"]["message"].as_str().unwrap_or("").to_owned(),
            };
            return Err(explain(call_failed));
        }
        let d = &f["data"];
        let first = self.sid.is_none();
        if first && let Some(sid) = d["sessionId"].as_str() {
            self.sid = Some(sid.to_owned());
            // What waited for the id: stdin, a Ctrl-C.
            self.send_control().await?;
        }
        if d["truncated"] == true {
            eprintln!("gsv: (output over the kernel's cap: some was dropped)");
        }
        if let Err(e) = self.print(d) {
            return self.output_closed(e).await.map(Some);
        }
        match d["status"].as_str() {
            Some("running") => {
                self.send_poll().await?;
                Ok(None)
            }
            Some("completed") => {
                let code = d["exitCode"].as_i64().unwrap_or(i64::from(EXIT_LOST));
                if !self.interrupted {
                    self.report_timeout(code);
                }
                Ok(Some(exit_code(code)))
            }
            _ => {
                let error = failure_text(d);
                let printed = d["stderr"].as_str().is_some_and(|e| e.trim_end() == error);
                if !printed {
                    eprintln!("gsv: {error}");
                }
                if d.get("sessionId").is_none() {
                    // Nothing ran: an error of ours, not the command's.
                    bail!("{error}");
                }
                Ok(Some(match d["exitCode"].as_i64() {
                    Some(c) => exit_code(c),
                    None => ExitCode::from(EXIT_LOST),
                }))
            }
        }
    }

    /// An answer's `stdout`/`stderr` carry only what no earlier answer
    /// returned, so each is printed as it comes, stderr to ours. An answer
    /// without them (a failure before the command ran) has none to print.
    fn print(&self, d: &Value) -> std::io::Result<()> {
        if let Some(o) = d["stdout"].as_str().filter(|o| !o.is_empty()) {
            let mut out = std::io::stdout().lock();
            out.write_all(o.as_bytes())?;
            out.flush()?;
        }
        if let Some(e) = d["stderr"].as_str().filter(|e| !e.is_empty()) {
            // Best effort: a closed stderr is no reason to stop.
            let _ = std::io::stderr().lock().write_all(e.as_bytes());
        }
        Ok(())
    }

    /// Our stdout is gone: nobody sees the output any more. An owner stops
    /// the command (as a pipe reader's exit would); a watcher just leaves.
    async fn output_closed(&mut self, e: std::io::Error) -> Result<ExitCode> {
        if self.role == Role::Owner
            && let Some(sid) = self.sid.clone()
        {
            let _ = self
                .c
                .call(
                    "shell.exec",
                    json!({"sessionId": sid, "control": {"signal": "TERM"}}),
                )
                .await;
            let _ = writeln!(
                std::io::stderr(),
                "gsv: output closed ({e}); sent TERM to {sid}"
            );
        }
        Ok(ExitCode::from(OUTPUT_CLOSED))
    }

    /// Says on stderr that the command was stopped for its `--timeout`: it
    /// ended by TERM (143) or by the KILL after the grace (137) once the
    /// time we asked for had passed.
    fn report_timeout(&self, code: i64) {
        let Some((timeout, asked)) = self.deadline else {
            return;
        };
        if asked.elapsed() < timeout {
            return;
        }
        let how = match code {
            EXIT_TERM => "sent TERM",
            EXIT_KILL => "sent TERM, then KILL after the grace period",
            _ => return,
        };
        let sid = self.sid.as_deref().unwrap_or("the command");
        eprintln!(
            "gsv: {sid} timed out after {}; {how}",
            humantime::format_duration(timeout)
        );
    }
}

/// The error of a failed answer.
fn failure_text(d: &Value) -> String {
    d["error"]
        .as_str()
        .unwrap_or("the command failed")
        .to_owned()
}

/// The process exit code for a command's exit status: 0–255 as is,
/// anything else as [`EXIT_LOST`].
fn exit_code(code: i64) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(EXIT_LOST))
}

async fn recv_stdin(stdin: &mut Option<StdinChunks>) -> Option<String> {
    match stdin {
        Some(rx) => rx.recv().await.flatten(),
        None => std::future::pending().await,
    }
}

/// Reads our stdin on a plain thread (a blocked read must not keep the
/// runtime from ending when the command exits first) and hands it over as
/// UTF-8 text, a character split across two reads kept whole; `None` at
/// end of file.
fn forward_stdin() -> StdinChunks {
    let (tx, rx) = tokio::sync::mpsc::channel::<Option<String>>(4);
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        let mut utf8 = Utf8Stream::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match std::io::Read::read(&mut input, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = utf8.decode(&buf[..n]);
                    if !text.is_empty() && tx.blocking_send(Some(text)).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("gsv: reading stdin: {e}");
                    break;
                }
            }
        }
        let rest = utf8.finish();
        if !rest.is_empty() {
            let _ = tx.blocking_send(Some(rest));
        }
        let _ = tx.blocking_send(None);
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_timeout_is_seconds_and_units_are_read() {
        assert_eq!(parse_timeout("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("soon").unwrap_err().contains("soon"));
    }

    #[test]
    fn env_pairs_need_a_name() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("x").is_err());
    }
}
