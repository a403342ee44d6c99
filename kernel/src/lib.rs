//! The gateway kernel (`gsv`): serves users, drivers and services over
//! WebSocket JSON frames (`GET /ws`), keeps accounts, tokens and config in
//! one SQLite database, serves `fs.*` natively from dofs stores (a system
//! store for `/home`, `/etc`, … and one per workspace under
//! `/workspaces/<id>`), and runs commands in workspaces through a `wsd`
//! backend. [`node`] holds the device-side tools (what a driver answers
//! `fs.*`/`shell.exec` with). The contract is `shared/design/kernel.md`.
//!
//! Calls with `target: <deviceId>` are routed to a device's driver
//! connection ([`routing`]); `gsv node` is such a driver ([`driver`]).
//!
//! Agent processes ([`proc`], driven by [`syscalls::proc`]) turn model
//! tool calls into the same syscalls, dispatched through the same
//! capability and routing path.
//!
//! State ([`kernel::Kernel`] and everything it holds) sits below the
//! operations that take it; [`boot`] wires the two (ARCHITECTURE.md,
//! "kernel", lists the layers).
//!
//! It deliberately does not (yet): accept binary
//! bodies, or talk capnp itself (the wsd side goes through `wsd-client`).

pub mod accounts;
pub mod body;
pub mod boot;
pub mod caps;
pub mod client;
pub mod db;
pub mod dispatch;
pub mod error;
pub mod kernel;
pub mod proc;
pub mod routing;
pub mod server;
pub mod session;
pub mod syscalls;
pub mod vfs;
pub mod workspace;

pub use error::KernelError;
pub use kernel::{Kernel, KernelConfig};
