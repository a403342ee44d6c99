//! Who is on a connection ([`Session`]) and the pool of live connections.
//!
//! The pool owns every live socket's outbound sender by connection id, so
//! that routing (issue 13: requests to a device's driver connection) and
//! "replaced by newer connection" reach other sockets through one place.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::domains::accounts::ProcessIdentity;
use crate::error::KernelError;

/// A client role (`sys.connect` `client.role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Driver,
    Service,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Driver => "driver",
            Role::Service => "service",
        }
    }
}

/// An authenticated connection's identity, passed to every handler.
#[derive(Debug, Clone)]
pub struct Session {
    pub connection_id: String,
    pub role: Role,
    pub identity: ProcessIdentity,
    pub capabilities: Vec<String>,
    pub client_id: String,
    pub peer: SocketAddr,
    /// A driver's device id and its `implements` patterns.
    pub device: Option<(String, Vec<String>)>,
    /// A service's `client.channel` (lowercased): the adapter it is.
    pub channel: Option<String>,
}

/// The connection id of the session a process's calls run as.
pub fn process_connection_id(pid: &str) -> String {
    format!("process:{pid}")
}

impl Session {
    /// The uid a call acts on: the caller's own unless root names
    /// another; anyone else naming another uid is refused.
    pub fn acting_uid(&self, uid: Option<i64>) -> Result<i64, KernelError> {
        match uid {
            Some(u) if u != self.identity.uid && !self.identity.is_root() => {
                Err(KernelError::PermissionDenied(format!("uid {u}")))
            }
            Some(u) => Ok(u),
            None => Ok(self.identity.uid),
        }
    }

    /// Whether this is a process's session (its tool calls, CodeMode)
    /// rather than a socket's.
    pub fn is_process(&self) -> bool {
        self.connection_id.starts_with("process:")
    }
}

/// What goes out on a socket: a text frame or a close with a code.
#[derive(Debug, Clone)]
pub enum Outgoing {
    Text(String),
    Close(u16, String),
}

/// One live connection as the pool sees it.
#[derive(Debug)]
struct Live {
    tx: mpsc::Sender<Outgoing>,
    /// Cancelling it makes the connection's reader stop.
    closed: CancellationToken,
    /// `(uid, role, client id)` once connected.
    key: Option<(i64, Role, String)>,
}

/// Live sockets by connection id.
#[derive(Debug, Default)]
pub struct ConnectionPool {
    live: Mutex<HashMap<String, Live>>,
}

impl ConnectionPool {
    pub fn add(&self, id: &str, tx: mpsc::Sender<Outgoing>, closed: CancellationToken) {
        self.live.lock().unwrap().insert(
            id.to_owned(),
            Live {
                tx,
                closed,
                key: None,
            },
        );
    }

    pub fn remove(&self, id: &str) {
        self.live.lock().unwrap().remove(id);
    }

    /// Marks `id` connected as `key` and closes any older connection with
    /// the same `(uid, role, client id)` ("Replaced by newer connection").
    pub fn connected(&self, id: &str, key: (i64, Role, String)) {
        let mut live = self.live.lock().unwrap();
        let older: Vec<String> = live
            .iter()
            .filter(|(cid, l)| cid.as_str() != id && l.key.as_ref() == Some(&key))
            .map(|(cid, _)| cid.clone())
            .collect();
        for cid in older {
            if let Some(l) = live.remove(&cid) {
                // A full queue means the peer is not reading; closing the
                // reader still ends the connection.
                let _ =
                    l.tx.try_send(Outgoing::Close(1000, "Replaced by newer connection".into()));
                l.closed.cancel();
            }
        }
        if let Some(l) = live.get_mut(id) {
            l.key = Some(key);
        }
    }

    /// Sends a signal to every live `role` socket of `uid`. A socket whose
    /// queue is full misses it rather than stalling the sender.
    pub fn signal_user(&self, uid: i64, role: Role, signal: &str, payload: serde_json::Value) {
        let text = gsv_protocol::frames::Outbound::Sig {
            signal: signal.to_owned(),
            payload,
            seq: None,
        }
        .to_text();
        let live = self.live.lock().unwrap();
        for l in live.values() {
            if matches!(&l.key, Some((u, r, _)) if *u == uid && *r == role) {
                let _ = l.tx.try_send(Outgoing::Text(text.clone()));
            }
        }
    }

    /// Sends a signal to every live socket of `role` (adapters' service
    /// sockets get `adapter.status`); a full queue misses it.
    pub fn signal_role(&self, role: Role, signal: &str, payload: serde_json::Value) {
        let text = gsv_protocol::frames::Outbound::Sig {
            signal: signal.to_owned(),
            payload,
            seq: None,
        }
        .to_text();
        let live = self.live.lock().unwrap();
        for l in live.values() {
            if matches!(&l.key, Some((_, r, _)) if *r == role) {
                let _ = l.tx.try_send(Outgoing::Text(text.clone()));
            }
        }
    }

    /// Sends a signal to connection `id` alone; hands the payload back
    /// when that connection is gone. A full queue drops the signal, as
    /// [`Self::signal_user`] does: handing it to the owner's other sockets
    /// would show them one stray signal of a run they never saw start.
    pub fn signal_connection(
        &self,
        id: &str,
        signal: &str,
        payload: serde_json::Value,
    ) -> Result<(), serde_json::Value> {
        let live = self.live.lock().unwrap();
        let Some(l) = live.get(id) else {
            return Err(payload);
        };
        let text = gsv_protocol::frames::Outbound::Sig {
            signal: signal.to_owned(),
            payload: payload.clone(),
            seq: None,
        }
        .to_text();
        match l.tx.try_send(Outgoing::Text(text)) {
            Err(mpsc::error::TrySendError::Closed(_)) => Err(payload),
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(connection = %id, %signal, "signal dropped: the socket is not reading");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Connection `id`'s outbound queue, for senders that must notice a
    /// full one themselves (a watch pauses instead of dropping).
    pub fn sender(&self, id: &str) -> Option<mpsc::Sender<Outgoing>> {
        self.live.lock().unwrap().get(id).map(|l| l.tx.clone())
    }

    pub fn len(&self) -> usize {
        self.live.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
