//! The Cap'n Proto RPC server and client of `schema/workspace.capnp`.
//!
//! Server: [`serve`] runs on a current-thread tokio runtime inside a
//! [`tokio::task::LocalSet`] (capnp-rpc is `!Send`), accepts on TCP and
//! unix-socket [`Listener`]s, admits peers ([`admit`], [`Token`]), and serves
//! a generic [`wsd_sync::Store`] that lives on its own thread (one writer,
//! calls in arrival order) plus an optional [`ExecBackend`] for the shell
//! half. Client: [`client::connect`] gives a [`client::Client`] implementing
//! [`wsd_sync::Remote`], so the sync driver runs against a remote daemon;
//! [`client::ReconnectingClient`] re-dials after a lost connection.
//!
//! Generated capnp types stay inside this module: [`convert`] is the only
//! place that maps them to and from domain types. Every error that crosses
//! the wire carries one [`wsd_sync::ErrorCode`] ([`WireError`]).

mod auth;
pub mod client;
mod convert;
mod error;
mod exec_backend;
#[doc(hidden)]
pub mod fuzzing;
mod server;
mod server_shell;
mod server_sync;
mod store_thread;
mod stream;
mod transport;

#[cfg(test)]
mod tests;

pub use auth::{PeerOrigin, TOKEN_ENV, Token, admit};
pub use error::WireError;
pub use exec_backend::{
    ExecBackend, ExecEvent, ExecEventKind, ExecEvents, ExecRequest, ExecSignal, ResumeFrom,
};
pub use server::{Backend, Listener, ServeError, ServerConfig, serve};
pub use store_thread::StoreCaller;
pub use wsd_schema::workspace_capnp::PROTOCOL_VERSION;

/// The default TCP port of `wsd serve`.
pub const DEFAULT_PORT: u16 = 45678;

/// Limits of the RPC layer, on top of the protocol limits in
/// [`wsd_sync::limits`]. Over any of them a call fails with `ELIMIT` naming
/// the limit and the connection stays usable.
pub mod limits {
    /// Most entries one `ChangeIterator.next` may ask for (the same bound as
    /// a push batch, so one message stays well under the size limit).
    pub const MAX_CHANGES_PER_NEXT: usize = wsd_sync::limits::MAX_PUSH_ENTRIES;
    /// Object bytes a sender puts in one `ObjectSink.write`: large enough to
    /// amortise the per-call cost (capnp streaming reached 1.5–1.7 GB/s
    /// with 64 KiB writes on the reference machine), small enough that the
    /// stream window keeps only a few MiB in flight.
    pub const OBJECT_WRITE_BYTES: usize = 1024 * 1024;
    /// Bytes of streaming calls (`ObjectSink.write`) a client keeps in
    /// flight per stream before it waits for acknowledgements (the server's
    /// streams keep capnp-rpc's default). capnp-rpc's
    /// default (64 KiB, plus one message) let a push upload only about one
    /// 1 MiB write ahead of the receiver's store thread, so the upload of
    /// the next batch stalled while the previous batch was applied. 8 MiB
    /// holds two push batches (4 MiB of objects each).
    pub const STREAM_WINDOW_BYTES: usize = 8 * 1024 * 1024;
    /// Most object bytes a receiving sink accepts in one `write` (a sender
    /// may overshoot [`OBJECT_WRITE_BYTES`] by one object).
    pub const MAX_OBJECT_WRITE_BYTES: usize = 4 * 1024 * 1024;
    /// Largest Cap'n Proto message either side reads. It bounds the memory
    /// one call can pin: a push of 4096 entries, 16384 hashes or a 4 MiB
    /// object write are each far below it; a single file entry of about
    /// 40 GiB (700k chunks) is the largest that fits.
    pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;
    /// Default bound on calls a connection may have in flight at once
    /// (calls on iterators and sinks included). With
    /// [`MAX_MESSAGE_BYTES`] it bounds a connection's memory.
    pub const DEFAULT_MAX_IN_FLIGHT_CALLS: usize = 128;
    /// Default bound on concurrent connections.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
    /// Capacity of the queue in front of the store thread. Calls beyond it
    /// wait on the event loop (they do not block it) until the store thread
    /// catches up; 64 keeps the thread busy while several connections
    /// pipeline calls, and bounds the work accepted but not yet done.
    pub const STORE_QUEUE_CAPACITY: usize = 64;
    /// Longest `peer` name in `Bootstrap.connect`, in bytes.
    pub const MAX_PEER_NAME_BYTES: usize = 255;
    /// Events a client buffers per exec stream before it stops
    /// acknowledging `ExecEventSink.event` (which in turn slows the runner).
    pub const CLIENT_EXEC_EVENT_BUFFER: usize = 16;
}
