//! The gateway kernel (`gsv`): serves users, drivers and services over
//! WebSocket JSON frames (`GET /ws`), keeps accounts, tokens and config in
//! one SQLite database, serves `fs.*` natively from dofs stores (a system
//! store for `/home`, `/etc`, … and one per workspace under
//! `/workspaces/<id>`), and runs commands in workspaces through a `wsd`
//! backend. [`node`] holds the device-side tools (what a driver answers
//! `fs.*`/`shell.exec` with). The contract is `shared/design/kernel.md`.
//!
//! It deliberately does not (yet): route calls to devices (issue 13; the
//! `target` seam is in [`dispatch`]), accept binary
//! bodies, or talk capnp itself (the wsd side goes through `wsd-client`).

pub mod accounts;
pub mod caps;
pub mod client;
pub mod db;
pub mod dispatch;
pub mod error;
pub mod frames;
pub mod kernel;
pub mod node;
pub mod proc;
pub mod server;
pub mod session;
pub mod syscalls;
pub mod vfs;
pub mod workspace;

pub use error::KernelError;
pub use kernel::{Kernel, KernelConfig};
