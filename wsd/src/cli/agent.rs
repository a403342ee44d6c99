//! `wsd sync --watch` as a local agent for one-shot pushes (git's
//! fsmonitor idea, one step further): while it runs, it listens on
//! `STATE/agent.sock`, and a `wsd push` of the same LOCAL_DIR to the same
//! remote asks it to push instead of opening the index and walking the
//! whole tree itself. The agent's store is watched, so its settle looks
//! only at what inotify reported (behind a cookie barrier, so every write
//! made before the request is seen); a no-op push then costs a process
//! start and one round trip on the socket.
//!
//! The agent answers only a push it would make the same way: same root,
//! same remote, same `.wsdignore` and remembered excludes (a push with
//! `--exclude`/`--no-exclude` or `--dry-run` never asks). Anything else,
//! or no agent, and the push walks as before. The socket is the user's
//! own (mode 0600, in the state directory).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// The agent's socket, in LOCAL_DIR's state directory.
pub(crate) const AGENT_SOCKET: &str = "agent.sock";

/// The longest request line the agent reads.
const MAX_REQUEST: u64 = 1 << 20;
/// How long the agent waits for a connected client's request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What a one-shot push asks: everything that decides what it would send.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct PushRequest {
    /// LOCAL_DIR, canonical.
    pub root: PathBuf,
    /// `--remote`.
    pub remote: String,
    /// `.wsdignore`'s patterns as the client read them.
    pub wsdignore: Vec<String>,
    /// The remembered excludes as the client read them.
    pub remembered: Vec<String>,
}

/// The agent's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    /// The push ran; its summary, as `--json` prints it.
    Pushed(serde_json::Value),
    /// Not a push the agent makes the same way, or its push failed: the
    /// client pushes by itself.
    Refused(String),
}

/// The agent's listening socket.
#[derive(Debug)]
pub(crate) struct Agent {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    /// The socket file's inode: removed at exit only if it is still ours
    /// (another agent may have replaced a socket it took for dead).
    ino: Option<u64>,
}

impl Agent {
    /// Listens on `STATE/agent.sock`. A socket file nobody answers on is a
    /// dead agent's and is replaced; one that answers belongs to another
    /// `sync --watch` of the same directory, and then this one serves none
    /// (`None`).
    pub(crate) fn bind(state: &Path) -> Result<Option<Agent>> {
        let path = state.join(AGENT_SOCKET);
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            tracing::warn!(socket = %path.display(),
                "another `wsd sync --watch` serves this directory's pushes");
            return Ok(None);
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", path.display()));
            }
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(&path)
            .with_context(|| format!("listening on {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("restricting {}", path.display()))?;
        let ino = std::fs::symlink_metadata(&path).ok().map(|m| m.ino());
        Ok(Some(Agent {
            listener,
            path,
            ino,
        }))
    }

    /// The next client. Cancel-safe (only the accept), so it can race the
    /// session's other wake-ups; read its request with [`read_request`].
    pub(crate) async fn accept(&self) -> Result<tokio::net::UnixStream> {
        let (conn, _) = self
            .listener
            .accept()
            .await
            .with_context(|| format!("accepting on {}", self.path.display()))?;
        Ok(conn)
    }
}

/// A connected client's request; one that sends no valid request in time
/// is answered `Refused` (`None`).
pub(crate) async fn read_request(conn: &mut tokio::net::UnixStream) -> Option<PushRequest> {
    let mut line = String::new();
    let read = tokio::time::timeout(
        REQUEST_TIMEOUT,
        tokio::io::BufReader::new((&mut *conn).take(MAX_REQUEST)).read_line(&mut line),
    )
    .await;
    match read.map(|r| r.map(|_| serde_json::from_str::<PushRequest>(&line))) {
        Ok(Ok(Ok(req))) => Some(req),
        other => {
            tracing::debug!(?other, "an agent client sent no valid request");
            let _ = answer(conn, &Reply::Refused("no valid request".into())).await;
            None
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .ok()
            .is_some_and(|m| Some(m.ino()) == self.ino);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Sends `reply` as one JSON line.
pub(crate) async fn answer(conn: &mut tokio::net::UnixStream, reply: &Reply) -> Result<()> {
    let mut line = serde_json::to_vec(reply)?;
    line.push(b'\n');
    conn.write_all(&line).await?;
    Ok(())
}

/// Asks the agent of the state directory `state` to push, if one runs.
/// `None` when there is no agent or it refused: the caller pushes itself.
pub(crate) fn ask_push(state: &Path, req: &PushRequest) -> Result<Option<serde_json::Value>> {
    let path = state.join(AGENT_SOCKET);
    let Ok(mut conn) = std::os::unix::net::UnixStream::connect(&path) else {
        return Ok(None);
    };
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    if conn.write_all(&line).is_err() {
        return Ok(None);
    }
    let mut reply = String::new();
    if BufReader::new(conn).read_line(&mut reply).is_err() || reply.is_empty() {
        // The agent went away (stopped mid-request): push directly; the
        // push is idempotent whether or not it got anywhere.
        return Ok(None);
    }
    match serde_json::from_str::<Reply>(&reply)
        .with_context(|| format!("reading the answer of {}", path.display()))?
    {
        Reply::Pushed(summary) => Ok(Some(summary)),
        Reply::Refused(why) => {
            tracing::debug!(%why, "the agent refused; pushing directly");
            Ok(None)
        }
    }
}
