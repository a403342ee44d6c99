//! The daemon's health snapshot (`Workspace.status`).

use wsd_sync::ChangeCursor;

/// What `Workspace.status` reports: enough for a human to see what the
/// daemon serves and for a container probe to tell it is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonStatus {
    /// The daemon's package version.
    pub version: String,
    /// The workspace root, absolute.
    pub root: String,
    /// The store's latest rev.
    pub current_rev: u64,
    /// Milliseconds since the server started serving.
    pub uptime_ms: u64,
    /// Ids of the commands still running, sorted.
    pub live_execs: Vec<String>,
    /// The peers that connected since the daemon started, by name.
    pub peers: Vec<PeerStatus>,
}

/// One peer's watermarks as the daemon keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    pub peer: String,
    /// How far that peer acknowledged our changes (our rev space).
    pub push_cursor: ChangeCursor,
    /// How far we consumed that peer's changes (its rev space).
    pub fetch_cursor: ChangeCursor,
}
