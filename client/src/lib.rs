//! The client library of the wsd daemon (`schema/workspace.capnp`).
//!
//! Two faces over the same wire code:
//!
//! - [`WsdHandle`]: a `Send + Sync` handle for ordinary multi-threaded
//!   tokio programs (the gateway kernel). Each connection gets a dedicated
//!   thread running a current-thread runtime and a `LocalSet`, because
//!   capnp-rpc's futures are `!Send`; the handle sends it jobs over a
//!   channel and gets answers back on oneshots. It re-dials with backoff
//!   after a lost connection and runs the push/pull drivers against a
//!   caller's [`wsd_sync::Store`].
//! - [`client::Client`]: the connection itself, for code that already runs
//!   inside a `LocalSet` (the `wsd` CLI, tests). It implements
//!   [`wsd_sync::Remote`], so the sync driver runs against a daemon.
//!
//! It also holds the wire edge the daemon's server shares: [`convert`] (the
//! only place generated capnp types meet domain types), the transport and
//! stream window, the wire [`limits`], the exec types ([`ExecRequest`],
//! [`ExecEvent`], [`ResumeFrom`], [`Signal`]) and the one error type
//! ([`WsdError`], carrying a [`wsd_sync::ErrorCode`]).
//!
//! It deliberately has no CLI, progress-bar or file-watcher dependencies
//! (`.ci/check-deps` keeps clap, indicatif and notify out) and no store of
//! its own: the caller brings one.

pub mod client;
#[doc(hidden)]
pub mod convert;
mod error;
mod exec;
mod handle;
pub mod limits;
mod options;
mod status;
#[doc(hidden)]
pub mod stream;
#[doc(hidden)]
pub mod transport;

pub use error::WsdError;
pub use exec::{ExecEvent, ExecEventKind, ExecRequest, PtyRequest, ResumeFrom, Signal};
pub use handle::{AppliedEntry, ExecEvents, PullReport, PushReport, WsdHandle};
pub use options::{
    ClientOptions, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT,
    Endpoint,
};
pub use status::{DaemonStatus, PeerStatus};
pub use wsd_schema::workspace_capnp::PROTOCOL_VERSION;
pub use wsd_sync::{ErrorCode, Watermarks};

#[cfg(test)]
mod tests;
