//! `wsd status`: a daemon's health snapshot, for humans and probes.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use wsd_client::{DaemonStatus, PeerStatus};
use wsd_sync::ChangeCursor;

use super::RemoteArgs;

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
}

pub async fn status(a: StatusArgs) -> Result<ExitCode> {
    let addr = a.remote.remote.clone();
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
        println!("{}", to_json(&s));
    } else {
        print!("{}", to_text(&s));
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

fn peer_json(p: &PeerStatus) -> serde_json::Value {
    serde_json::json!({
        "peer": p.peer,
        "pushCursor": cursor_json(&p.push_cursor),
        "fetchCursor": cursor_json(&p.fetch_cursor),
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
    // The cursors are the daemon's: its push cursor is how far the peer
    // has fetched the daemon's revs, its fetch cursor how far it has taken
    // in the peer's own revs (what the peer pushed). Say it from the
    // peer's side, which is how a reader thinks of it.
    for p in &s.peers {
        out.push_str(&format!(
            "peer {}: has fetched our revs through {}, has pushed its revs through {}\n",
            p.peer,
            cursor_text(&p.push_cursor),
            cursor_text(&p.fetch_cursor)
        ));
    }
    out
}
