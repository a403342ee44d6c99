//! The Cap'n Proto RPC server and client of `schema/workspace.capnp`.
//!
//! Server: [`serve`] runs on a current-thread tokio runtime inside a
//! [`tokio::task::LocalSet`] (capnp-rpc is `!Send`), accepts on TCP and
//! unix-socket [`Listener`]s, admits peers ([`admit`], [`Token`]), and serves
//! a generic [`wsd_sync::Store`] that lives on its own thread (one writer,
//! calls in arrival order) plus an optional [`ExecBackend`] for the shell
//! half. The client, and the wire edge both sides share (conversion,
//! transport, errors, exec types), live in the `wsd-client` crate.
//!
//! Generated capnp types stay inside the server's capability impls and
//! `wsd_client::convert`, the only place that maps them to and from domain
//! types. Every error that crosses the wire carries one
//! [`wsd_sync::ErrorCode`] ([`WireError`], an alias of
//! [`wsd_client::WsdError`]).

mod auth;
mod conn;
mod exec_backend;
#[doc(hidden)]
pub mod fuzzing;
mod server;
mod server_shell;
mod server_sync;
mod store_thread;

// The wire edge (conversion, transport, stream window) is the client
// crate's: one conversion module for both sides.
use wsd_client::{convert, stream, transport};

#[cfg(test)]
mod tests;

pub use auth::{PeerOrigin, TOKEN_ENV, Token, admit};
pub use exec_backend::{ExecBackend, ExecEvents};
pub use server::{Backend, Listener, ServeError, ServerConfig, serve};
pub use store_thread::StoreCaller;
pub use wsd_client::WsdError as WireError;
pub use wsd_client::{
    ExecEvent, ExecEventKind, ExecRequest, PROTOCOL_VERSION, PtyRequest, ResumeFrom,
    Signal as ExecSignal,
};

/// The default TCP port of `wsd serve`.
pub const DEFAULT_PORT: u16 = 45678;

/// Limits of the RPC layer: the wire limits both sides share
/// ([`wsd_client::limits`]) and the server's own bounds.
pub mod limits {
    pub use wsd_client::limits::*;

    /// Default bound on calls a connection may have in flight at once
    /// (calls on iterators and sinks included). With
    /// [`MAX_MESSAGE_BYTES`] it bounds a connection's memory.
    pub const DEFAULT_MAX_IN_FLIGHT_CALLS: usize = 128;
    /// Default bound on concurrent authenticated connections (those that
    /// completed `Bootstrap.connect`).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
    /// Default bound on connections that have not completed
    /// `Bootstrap.connect`; a new one beyond it drops the oldest. Small:
    /// a legitimate peer leaves this state within one round trip.
    pub const DEFAULT_MAX_UNAUTHENTICATED: usize = 16;
    /// Default time a new connection has to complete `Bootstrap.connect`.
    pub const DEFAULT_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    /// Capacity of the queue in front of the store thread. Calls beyond it
    /// wait on the event loop (they do not block it) until the store thread
    /// catches up; 64 keeps the thread busy while several connections
    /// pipeline calls, and bounds the work accepted but not yet done.
    pub const STORE_QUEUE_CAPACITY: usize = 64;
}
