//! The gateway kernel (`gsv`): serves users, drivers and services over
//! WebSocket JSON frames (`GET /ws`), keeps accounts, tokens and config in
//! one SQLite database, serves `fs.*` natively from dofs stores (a system
//! store for `/home`, `/etc`, … and one per workspace under
//! `/workspaces/<id>`), and runs commands in workspaces through a `wsd`
//! backend. The contract is `shared/design/kernel.md`; the wire shapes are
//! `gsv-protocol`.
//!
//! Calls with `target: <deviceId>` are routed to a device's driver
//! connection ([`routing`]); `gsv node` (the `gsv-node` crate) is such a
//! driver.
//!
//! Each syscall domain ([`domains`]) owns its state, its migrations and
//! its calls; `domains/mod.rs` is where they are all wired. Agent
//! processes ([`domains::proc`]) turn model tool calls into the same
//! syscalls, dispatched through the same capability and routing path.
//!
//! State ([`kernel::Kernel`] and everything it holds) sits below the
//! operations that take it; [`boot`] wires the two (kernel/DESIGN.md,
//! "Layers in the code", lists the layers).
//!
//! It deliberately does not (yet): accept binary
//! bodies, or talk capnp itself (the wsd side goes through `wsd-client`).

pub mod body;
pub mod boot;
pub mod caps;
pub mod client;
pub mod db;
pub mod dispatch;
pub mod domains;
pub mod error;
pub mod kernel;
pub mod routing;
pub mod server;
pub mod session;

pub use domains::snapshot::mirror::ChunkStoreConfig;
pub use error::KernelError;
pub use kernel::{Kernel, KernelConfig};
