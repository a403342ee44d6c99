//! The live side of each added server: its connection state, what it
//! offered when discovered, and the session to call it on. Memory only:
//! after a restart a server is `not-connected` until first used.

use std::collections::HashMap;
use std::sync::Mutex;

use gsv_protocol::mcp::{McpConnectionState, McpServerSummary};
use rmcp::service::{Peer, RoleClient};

use super::client::{Discovered, Session};
use super::store::ServerRow;

struct Live {
    state: McpConnectionState,
    /// Where the owner signs in, while `authenticating`.
    auth_url: Option<String>,
    error: Option<String>,
    discovered: Discovered,
    session: Option<Session>,
}

/// Live servers by server id.
#[derive(Default)]
pub struct McpServers {
    live: Mutex<HashMap<String, Live>>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let live = self.live.lock().unwrap();
        let states: HashMap<&String, McpConnectionState> =
            live.iter().map(|(id, l)| (id, l.state)).collect();
        f.debug_struct("McpServers").field("live", &states).finish()
    }
}

impl McpServers {
    /// The row as `sys.mcp.list` shows it.
    pub fn summary(&self, row: &ServerRow) -> McpServerSummary {
        let live = self.live.lock().unwrap();
        let (state, auth_url, error, d) = match live.get(&row.server_id) {
            Some(l) => (
                l.state,
                l.auth_url.clone(),
                l.error.clone(),
                l.discovered.clone(),
            ),
            None => (
                McpConnectionState::NotConnected,
                None,
                None,
                Discovered::default(),
            ),
        };
        McpServerSummary {
            server_id: row.server_id.clone(),
            uid: row.uid,
            name: row.name.clone(),
            url: row.url.clone(),
            transport: row.transport,
            state,
            auth_url,
            error,
            instructions: d.instructions,
            capabilities: d.capabilities,
            tools: d.tools,
            resource_count: d.resource_count,
            prompt_count: d.prompt_count,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }

    pub fn state(&self, server_id: &str) -> McpConnectionState {
        self.live
            .lock()
            .unwrap()
            .get(server_id)
            .map_or(McpConnectionState::NotConnected, |l| l.state)
    }

    /// The session to call a ready server on.
    pub fn peer(&self, server_id: &str) -> Option<Peer<RoleClient>> {
        let live = self.live.lock().unwrap();
        let l = live.get(server_id)?;
        (l.state == McpConnectionState::Ready)
            .then(|| l.session.as_ref().map(|s| s.peer().clone()))
            .flatten()
    }

    pub fn connecting(&self, server_id: &str) {
        let old = self.replace(
            server_id,
            Live {
                state: McpConnectionState::Connecting,
                auth_url: None,
                error: None,
                discovered: Discovered::default(),
                session: None,
            },
        );
        drop(old);
    }

    pub fn ready(&self, server_id: &str, session: Session, discovered: Discovered) {
        let old = self.replace(
            server_id,
            Live {
                state: McpConnectionState::Ready,
                auth_url: None,
                error: None,
                discovered,
                session: Some(session),
            },
        );
        drop(old);
    }

    pub fn failed(&self, server_id: &str, error: String) {
        let old = self.replace(
            server_id,
            Live {
                state: McpConnectionState::Failed,
                auth_url: None,
                error: Some(error),
                discovered: Discovered::default(),
                session: None,
            },
        );
        drop(old);
    }

    /// The server needs its owner to sign in at `auth_url`.
    pub fn authenticating(&self, server_id: &str, auth_url: String) {
        let old = self.replace(
            server_id,
            Live {
                state: McpConnectionState::Authenticating,
                auth_url: Some(auth_url),
                error: None,
                discovered: Discovered::default(),
                session: None,
            },
        );
        drop(old);
    }

    /// The sign-in URL of a server that is `authenticating`.
    pub fn auth_url(&self, server_id: &str) -> Option<String> {
        self.live
            .lock()
            .unwrap()
            .get(server_id)
            .and_then(|l| l.auth_url.clone())
    }

    /// Forgets the server; its session closes when dropped.
    pub fn remove(&self, server_id: &str) {
        let old = self.live.lock().unwrap().remove(server_id);
        drop(old);
    }

    /// Puts `new` in place and hands back the old entry, so that its
    /// session is dropped outside the lock.
    fn replace(&self, server_id: &str, new: Live) -> Option<Live> {
        self.live.lock().unwrap().insert(server_id.to_owned(), new)
    }
}
