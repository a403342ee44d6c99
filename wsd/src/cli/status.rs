//! `wsd status`: a daemon's health snapshot, for humans and probes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use wsd::store::{StoreOptions, WorkspaceStore};
use wsd_client::{DaemonStatus, PeerStatus};
use wsd_sync::{ChangeCursor, Store, Watermarks};

use super::RemoteArgs;
use super::sync::{LocalExcludes, PEER_FILE, local_state};

/// The peer name the probe presents (it never syncs, so it never shows up
/// among the peers it reports).
const STATUS_PEER: &str = "wsd-status";

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// Print one JSON object instead of aligned text.
    #[arg(long)]
    json: bool,
    /// Give up (exit 1) if the daemon has not answered within this long,
    /// connecting included: a probe must not hang.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Also report this local directory's side: its peer name, how far it
    /// has pulled and pushed (from its own index) and its excludes.
    #[arg(value_name = "LOCAL_DIR")]
    local: Option<PathBuf>,
    /// LOCAL_DIR's index is kept here instead of LOCAL_DIR/.wsd.
    #[arg(long, value_name = "DIR", requires = "local")]
    state: Option<PathBuf>,
}

/// A local directory's side of its sync with the daemon.
struct LocalStatus {
    dir: PathBuf,
    /// Its peer name; none before its first transfer.
    peer: Option<String>,
    /// Its index's watermarks for this daemon; none before its first
    /// transfer.
    watermarks: Option<Watermarks>,
    excludes: LocalExcludes,
}

impl LocalStatus {
    /// Reads LOCAL_DIR's state without changing it: no index is created
    /// and nothing is settled.
    fn load(dir: &Path, state: Option<&Path>, remote: &str) -> Result<LocalStatus> {
        let excludes = LocalExcludes::load(dir, state)?;
        let state = local_state(dir, state);
        let peer = match std::fs::read_to_string(state.join(PEER_FILE)) {
            Ok(p) if !p.trim().is_empty() => Some(p.trim().to_owned()),
            _ => None,
        };
        let watermarks = if state.join(wsd::store::INDEX_FILE).exists() {
            let mut store = WorkspaceStore::open(
                dir,
                &state,
                StoreOptions {
                    watch: false,
                    auto_settle: false,
                    ..Default::default()
                },
            )
            .with_context(|| format!("opening the index of {}", dir.display()))?;
            Some(store.watermarks(remote)?)
        } else {
            None
        };
        Ok(LocalStatus {
            dir: dir.canonicalize().unwrap_or_else(|_| dir.to_owned()),
            peer,
            watermarks,
            excludes,
        })
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "dir": self.dir.display().to_string(),
            "peer": self.peer,
            "pulledThrough": self.watermarks.as_ref().map(|w| cursor_json(&w.fetch_cursor)),
            "pushedThrough": self.watermarks.as_ref().map(|w| cursor_json(&w.push_cursor)),
            "excludes": self.excludes.to_json(),
        })
    }

    fn to_text(&self, daemon_rev: u64) -> String {
        let mut out = format!(
            "local dir:   {} (peer {})\n",
            self.dir.display(),
            self.peer.as_deref().unwrap_or("none yet")
        );
        match &self.watermarks {
            Some(w) => out.push_str(&format!(
                "  pulled:    the daemon's revs through {} (it is at {daemon_rev})\n  \
                 pushed:    its own revs through {} (it is at {})\n",
                cursor_text(&w.fetch_cursor),
                cursor_text(&w.push_cursor),
                w.current_rev,
            )),
            None => out.push_str("  not synced yet\n"),
        }
        let lines = self.excludes.lines();
        if lines.is_empty() {
            out.push_str("  excludes:  none\n");
        }
        for (i, l) in lines.iter().enumerate() {
            let label = if i == 0 { "excludes:" } else { "" };
            out.push_str(&format!("  {label:<10} {l}\n"));
        }
        out
    }
}

pub async fn status(a: StatusArgs) -> Result<ExitCode> {
    let addr = a.remote.remote.clone();
    let local = a
        .local
        .as_deref()
        .map(|d| LocalStatus::load(d, a.state.as_deref(), &addr))
        .transpose()?;
    let probe = async {
        let c = a.remote.connect(STATUS_PEER).await?;
        c.status()
            .await
            .with_context(|| format!("status of {addr}"))
    };
    let s = tokio::time::timeout(a.timeout, probe).await.map_err(|_| {
        anyhow::anyhow!(
            "{addr} did not answer within {}",
            humantime::format_duration(a.timeout)
        )
    })??;
    if a.json {
        let mut v = to_json(&s);
        if let Some(l) = &local {
            v["local"] = l.to_json();
        }
        println!("{v}");
    } else {
        print!("{}", to_text(&s));
        if let Some(l) = &local {
            print!("{}", l.to_text(s.current_rev));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn cursor_json(c: &ChangeCursor) -> serde_json::Value {
    serde_json::json!({"rev": c.rev, "path": c.path.as_ref().map(|p| p.as_str())})
}

fn cursor_text(c: &ChangeCursor) -> String {
    match &c.path {
        None => c.rev.to_string(),
        Some(p) => format!("{} (after {})", c.rev, p.as_str()),
    }
}

/// A peer as the daemon knows it: how far it has pushed, which is the
/// daemon's fetch cursor for it (in the peer's own rev space). How far a
/// peer has pulled is not known here: a pull moves only the peer's own
/// cursor (`wsd status LOCAL_DIR` shows it). The daemon's push cursor for
/// a peer stays at zero, since a daemon never pushes; it is not shown.
fn peer_json(p: &PeerStatus) -> serde_json::Value {
    serde_json::json!({
        "peer": p.peer,
        "pushedThrough": cursor_json(&p.fetch_cursor),
    })
}

fn to_json(s: &DaemonStatus) -> serde_json::Value {
    serde_json::json!({
        "healthy": true,
        "version": s.version,
        "root": s.root,
        "currentRev": s.current_rev,
        "uptimeMs": s.uptime_ms,
        "liveExecs": s.live_execs,
        "peers": s.peers.iter().map(peer_json).collect::<Vec<_>>(),
    })
}

fn to_text(s: &DaemonStatus) -> String {
    // Whole seconds: milliseconds of uptime are noise to a reader.
    let uptime = humantime::format_duration(Duration::from_secs(s.uptime_ms / 1000));
    let mut out = format!(
        "version:     {}\nroot:        {}\ncurrent rev: {}\nuptime:      {uptime}\nlive execs:  {}\n",
        s.version,
        s.root,
        s.current_rev,
        if s.live_execs.is_empty() {
            "none".to_owned()
        } else {
            format!("{} ({})", s.live_execs.len(), s.live_execs.join(", "))
        },
    );
    if s.peers.is_empty() {
        out.push_str("peers:       none\n");
    }
    // As in `peer_json`: only what the daemon knows, from the peer's side.
    for p in &s.peers {
        out.push_str(&format!(
            "peer {}: pushed its revs through {}\n",
            p.peer,
            cursor_text(&p.fetch_cursor)
        ));
    }
    out
}
