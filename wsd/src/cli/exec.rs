//! `wsd exec`, `attach` and `kill`: the shell half from the command line.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use backon::{ExponentialBuilder, Retryable};
use clap::Args;
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use wsd::rpc::{ExecEventKind, ExecRequest, ExecSignal, ResumeFrom, WireError};
use wsd_client::client::{self, Client, ExecStream};
use wsd_sync::ErrorCode;

use super::RemoteArgs;

/// The peer name exec clients present (exec state is not per peer).
const EXEC_PEER: &str = "wsd-cli";

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// Working directory, relative to the workspace root (it may not leave
    /// the workspace).
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,
    /// Extra environment for the command (repeatable).
    #[arg(short = 'e', long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// The exec id (default: a fresh one). A live id is refused.
    #[arg(long)]
    id: Option<String>,
    /// Stop the command after this long: TERM to its process group, KILL
    /// after the daemon's grace; we say so on stderr and exit 143 (128+15,
    /// as for any command TERM killed). DURATION has a unit: `500ms`,
    /// `30s`, `5m`, `1h 30m`; a bare number is seconds (`30` = `30s`).
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    timeout: Option<Duration>,
    #[command(flatten)]
    reattach: ReattachArgs,
    /// Print the id and return; the command keeps running (`wsd attach`).
    #[arg(long)]
    detach: bool,
    /// Stream this program's stdin to the command until end of file.
    /// Without it the command's stdin is closed (it reads end of file).
    #[arg(
        short = 'i',
        long = "interactive",
        visible_alias = "stdin",
        conflicts_with = "detach"
    )]
    interactive: bool,
    /// The command. Two or more words are run as that exact argv (each word
    /// shell-quoted); a single word is a shell command line run by
    /// `/bin/sh -c` (so `'make && ./run'` works).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The protocol's command line (a `/bin/sh -c` string) for the words after
/// `--`: one word is already a command line; several are an argv, quoted
/// word by word so the shell hands the program exactly those words.
pub(crate) fn command_line(words: &[String]) -> Result<String> {
    match words {
        [one] => Ok(one.clone()),
        many => shlex::try_join(many.iter().map(String::as_str))
            .map_err(|e| anyhow::anyhow!("the command cannot be quoted for the shell: {e}")),
    }
}

/// A timeout: a `humantime` duration such as `30s` or `500ms`; a bare
/// number is seconds, as for timeout(1) (never milliseconds: `30` meaning
/// 30 ms killed commands before they started). Zero is refused: on the
/// wire it means "no timeout".
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

/// How long a stream keeps trying to re-attach after losing the daemon.
#[derive(Debug, Args, Clone, Copy)]
pub struct ReattachArgs {
    /// After losing the daemon, keep trying to re-attach for this long (a
    /// restart included), then give up with exit 255.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    reattach_for: Duration,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The exec id.
    id: String,
    /// Only events after this seq.
    #[arg(long, value_name = "N", conflicts_with = "tail")]
    after: Option<u64>,
    /// Only events from now on.
    #[arg(long)]
    tail: bool,
    #[command(flatten)]
    reattach: ReattachArgs,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The exec id.
    id: String,
    /// TERM, KILL, INT or HUP.
    #[arg(long, default_value = "TERM", value_parser = parse_signal)]
    signal: ExecSignal,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not K=V")),
    }
}

fn parse_signal(s: &str) -> Result<ExecSignal, String> {
    s.parse::<ExecSignal>().map_err(|e| e.message)
}

async fn connect(r: &RemoteArgs) -> Result<Client> {
    r.connect(EXEC_PEER).await
}

/// Our exit code when the daemon lost the command (it stopped or crashed
/// while the command ran, so no exit status exists), or for any status
/// outside 0–255.
pub(crate) const EXIT_LOST: u8 = 255;

/// The process exit code for a command's exit status: 0–255 as is (the
/// daemon already reports a signal N as 128+N), anything else (a lost exec,
/// a negative status) as [`EXIT_LOST`].
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(EXIT_LOST))
}

/// Exit code after a second Ctrl-C detached us (the shell's code for SIGINT).
const DETACHED_BY_INTERRUPT: u8 = 130;

/// Exit code when our own stdout or stderr went away (the shell's code for
/// SIGPIPE).
const OUTPUT_CLOSED: u8 = 141;

/// Who is streaming: the `wsd exec` that started the command owns it (a
/// Ctrl-C or a closed stdout stops it); `wsd attach` only watches (either
/// detaches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Owner,
    Watcher,
}

/// Copies events to stdout/stderr until the exit event and returns the
/// command's exit code.
///
/// For an owner, Ctrl-C sends TERM to the remote command once and keeps
/// streaming until it exits (the daemon escalates to KILL after its grace);
/// a second Ctrl-C detaches. A watcher detaches at the first Ctrl-C. A lost
/// connection (a daemon restart included) re-attaches after the last seq
/// seen, for up to `reattach_for`; then we exit [`EXIT_LOST`]. If our stdout closes, an owner sends
/// TERM to the command (as a pipe reader's exit would) and a watcher
/// detaches.
async fn stream(
    remote: &RemoteArgs,
    mut client: Client,
    mut events: ExecStream,
    how: &Streaming,
    interrupts: &mut tokio::signal::unix::Signal,
) -> Result<ExitCode> {
    let Streaming {
        from,
        role,
        reattach_for,
        deadline,
    } = *how;
    let id = events.id().to_owned();
    let mut last_seq: Option<u64> = None;
    let mut interrupted = false;
    loop {
        let next = tokio::select! {
            n = events.next() => n,
            _ = interrupts.recv() => {
                if role == Role::Watcher {
                    eprintln!("wsd: detached from {id}; it keeps running");
                    return Ok(ExitCode::from(DETACHED_BY_INTERRUPT));
                }
                if interrupted {
                    eprintln!("wsd: interrupted again; detached from {id}");
                    return Ok(ExitCode::from(DETACHED_BY_INTERRUPT));
                }
                interrupted = true;
                eprintln!("wsd: interrupted; sending TERM to {id} (Ctrl-C again to detach)");
                client.kill_exec(&id, ExecSignal::Term).await.with_context(|| format!("killing {id}"))?;
                continue;
            }
        };
        match next {
            Ok(Some(e)) => {
                last_seq = Some(e.seq);
                let written = match e.kind {
                    ExecEventKind::Stdout(b) => {
                        let mut out = std::io::stdout().lock();
                        out.write_all(&b).and_then(|()| out.flush())
                    }
                    ExecEventKind::Stderr(b) => std::io::stderr().lock().write_all(&b),
                    ExecEventKind::Exit(code) => {
                        if !interrupted {
                            report_timeout(&id, code, deadline);
                        }
                        return Ok(exit_code(code));
                    }
                };
                if let Err(e) = written {
                    return output_closed(&client, &id, role, e).await;
                }
            }
            // `--tail` (or `--after N` at or past the exit) on an exec that
            // had already exited: nothing is left to show, but its exit code
            // is still worth reporting.
            Ok(None) if last_seq.is_none() && from != ResumeFrom::Start => {
                let code = finished_exit_code(&client, &id).await?;
                eprintln!("wsd: {id} had already exited with code {code}");
                return Ok(exit_code(code));
            }
            Ok(None) => bail!("{id}: the event stream ended without an exit event"),
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "connection lost; re-attaching to {id}");
                let resume = last_seq.map_or(from, ResumeFrom::After);
                tokio::select! {
                    r = reattach(remote, &id, resume, reattach_for) => match r {
                        Ok(r) => (client, events) = r,
                        Err(e) => return Ok(lost_daemon(&id, &e)),
                    },
                    _ = interrupts.recv() => {
                        eprintln!("wsd: interrupted while re-attaching to {id}");
                        return Ok(ExitCode::from(DETACHED_BY_INTERRUPT));
                    }
                }
            }
            Err(e) => return Err(e).with_context(|| format!("{id}: streaming events")),
        }
    }
}

/// How [`stream`] follows an exec.
#[derive(Debug, Clone, Copy)]
struct Streaming {
    from: ResumeFrom,
    role: Role,
    reattach_for: Duration,
    /// The `--timeout` we asked for and when we asked: an exit by TERM or
    /// KILL after it is the daemon's timeout kill, which we report.
    deadline: Option<(Duration, Instant)>,
}

/// Says on stderr that the daemon stopped the command for its timeout:
/// its exit by TERM (143) or by the KILL that follows the grace (137) came
/// after the timeout we asked for had passed (the daemon's clock started
/// after ours, so it cannot have passed later).
fn report_timeout(id: &str, code: i32, deadline: Option<(Duration, Instant)>) {
    let Some((timeout, asked)) = deadline else {
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
    eprintln!(
        "wsd: exec {id}: timed out after {}; {how}",
        humantime::format_duration(timeout)
    );
}

/// 128 + the signal number: how a command TERM or KILL ended exits.
const EXIT_TERM: i32 = 128 + Signal::SIGTERM as i32;
const EXIT_KILL: i32 = 128 + Signal::SIGKILL as i32;

/// Our stdout (or stderr) is gone: nobody can see the output any more.
async fn output_closed(
    client: &Client,
    id: &str,
    role: Role,
    error: std::io::Error,
) -> Result<ExitCode> {
    if role == Role::Owner {
        // Best effort: the connection may be gone too.
        let _ = client.kill_exec(id, ExecSignal::Term).await;
        let _ = writeln!(
            std::io::stderr(),
            "wsd: output closed ({error}); sent TERM to {id}"
        );
    }
    Ok(ExitCode::from(OUTPUT_CLOSED))
}

/// Dials again and re-attaches at `from`, retrying with backoff (50 ms
/// doubling to 1 s) while the daemon is unreachable or restarting, for up to
/// `reattach_for` of waiting.
async fn reattach(
    remote: &RemoteArgs,
    id: &str,
    from: ResumeFrom,
    reattach_for: Duration,
) -> Result<(Client, ExecStream)> {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .without_max_times()
        .with_total_delay(Some(reattach_for));
    (|| async {
        let client = client::connect(&remote.remote, remote.token()?, EXEC_PEER).await?;
        let events = client.get_exec(id, from).await?;
        anyhow::Ok((client, events))
    })
    .retry(backoff)
    // Only a daemon that is away is worth waiting for; an answer such as
    // ENOENT is final.
    .when(|e| {
        e.downcast_ref::<WireError>()
            .is_some_and(|w| w.is_retryable() || w.code == ErrorCode::Io)
    })
    .notify(|e, after| tracing::debug!(error = %e, ?after, "re-attaching failed; retrying"))
    .await
    .with_context(|| format!("re-attaching to {id}"))
}

/// The exit code of a finished exec, read from the end of its log without
/// printing its output. The retained events are a suffix of the log that
/// always holds the exit event; resuming below them is `ELOG_TRUNCATED` and
/// at or past the exit an empty stream, so a search finds a resume point
/// inside them.
async fn finished_exit_code(client: &Client, id: &str) -> Result<i32> {
    // `below`: a resume point known to be truncated; `past`: known to be at
    // or past the exit.
    let (mut below, mut past): (Option<u64>, Option<u64>) = (None, None);
    let mut probe = 0u64;
    loop {
        match client.get_exec(id, ResumeFrom::After(probe)).await {
            Err(e) if e.code == ErrorCode::LogTruncated => below = Some(probe),
            Err(e) => return Err(e).with_context(|| format!("reading the exit of {id}")),
            Ok(mut s) => {
                let mut any = false;
                while let Some(e) = s.next().await? {
                    any = true;
                    if let ExecEventKind::Exit(code) = e.kind {
                        return Ok(code);
                    }
                }
                if any {
                    bail!("{id}: the log ended without an exit event");
                }
                past = Some(probe);
            }
        }
        probe = match (below, past) {
            (Some(b), None) => b.saturating_mul(2).max(1),
            (b, Some(p)) => {
                let b = b.unwrap_or(0);
                if p <= b + 1 || past == Some(0) {
                    bail!("{id}: no exit event found in its log");
                }
                b + (p - b) / 2
            }
            (None, None) => unreachable!("a probe either failed or succeeded"),
        };
    }
}

/// SIGINT (Ctrl-C) as a stream, registered before anything is sent: a
/// Ctrl-C that comes while the exec call is in flight still reaches the
/// command once its id is known, and one that comes while a kill is being
/// sent is not lost (a fresh `ctrl_c()` per wait would miss it).
fn interrupts() -> Result<tokio::signal::unix::Signal> {
    signal(SignalKind::interrupt()).context("listening for SIGINT")
}

pub async fn exec(a: ExecArgs) -> Result<ExitCode> {
    let mut interrupts = interrupts()?;
    let mut client = connect(&a.remote).await?;
    // Named here, in the daemon's own format, rather than by the daemon: a
    // connection lost before the answer arrives may have started the
    // command, and re-attaching needs its id.
    let id =
        a.id.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let request = ExecRequest {
        command: command_line(&a.command)?,
        cwd: a.cwd,
        id: Some(id.clone()),
        env: a.env,
        stdin: None,
        // At least 1 ms: 0 means "no timeout" on the wire.
        timeout_ms: a
            .timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)),
        stdin_open: a.interactive,
    };
    let asked = Instant::now();
    let events = match client.exec(&request).await {
        Ok(events) => events,
        // Whether the command started is unknown: look for it as a lost
        // connection during the stream would (its stdin, if forwarded, is
        // lost with the connection).
        Err(e) if e.is_retryable() && !a.detach => {
            tracing::warn!(error = %e, "connection lost before the exec's answer; re-attaching to {id}");
            match reattach(&a.remote, &id, ResumeFrom::Start, a.reattach.reattach_for).await {
                Ok((c, events)) => {
                    client = c;
                    events
                }
                Err(e) => return Ok(lost_daemon(&id, &e)),
            }
        }
        Err(e) => return Err(e).context("exec"),
    };
    if a.interactive {
        forward_stdin(client.clone(), events.id().to_owned());
    }
    if a.detach {
        println!("{}", events.id());
        return Ok(ExitCode::SUCCESS);
    }
    let how = Streaming {
        from: ResumeFrom::Start,
        role: Role::Owner,
        reattach_for: a.reattach.reattach_for,
        deadline: a.timeout.map(|t| (t, asked)),
    };
    stream(&a.remote, client, events, &how, &mut interrupts).await
}

/// Says the daemon could not be reached again and what that leaves
/// unknown; [`EXIT_LOST`].
fn lost_daemon(id: &str, e: &anyhow::Error) -> ExitCode {
    eprintln!(
        "wsd: lost the daemon while {id} ran: {}; its exit status is unknown",
        super::render_error(e)
    );
    ExitCode::from(EXIT_LOST)
}

/// Copies this program's stdin to exec `id` with `writeStdin`, then
/// closes it. A plain thread reads (a blocked read must not keep the
/// runtime from shutting down when the command exits first); a local task
/// sends. Stops quietly once the command no longer takes input; a
/// reconnect of the event stream does not resume it.
fn forward_stdin(client: Client, id: String) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match std::io::Read::read(&mut input, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("wsd: reading stdin: {e}");
                    return;
                }
            }
        }
    });
    tokio::task::spawn_local(async move {
        while let Some(chunk) = rx.recv().await {
            if let Err(e) = client.write_stdin(&id, &chunk).await {
                tracing::debug!(error = %e, "the command takes no more input");
                return;
            }
        }
        if let Err(e) = client.close_stdin(&id).await {
            tracing::debug!(error = %e, "closing the command's stdin");
        }
    });
}

pub async fn attach(a: AttachArgs) -> Result<ExitCode> {
    let mut interrupts = interrupts()?;
    let client = connect(&a.remote).await?;
    let from = match (a.after, a.tail) {
        (_, true) => ResumeFrom::Tail,
        (Some(n), false) => ResumeFrom::After(n),
        (None, false) => ResumeFrom::Start,
    };
    let events = client
        .get_exec(&a.id, from)
        .await
        .with_context(|| format!("attaching to {}", a.id))?;
    let how = Streaming {
        from,
        role: Role::Watcher,
        reattach_for: a.reattach.reattach_for,
        deadline: None,
    };
    stream(&a.remote, client, events, &how, &mut interrupts).await
}

pub async fn kill(a: KillArgs) -> Result<ExitCode> {
    let client = connect(&a.remote).await?;
    client
        .kill_exec(&a.id, a.signal)
        .await
        .with_context(|| format!("killing {}", a.id))?;
    Ok(ExitCode::SUCCESS)
}
