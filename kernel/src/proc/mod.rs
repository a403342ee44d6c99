//! Agent processes (issue 14), as data: the registry rows ([`store`]),
//! the active run of each process in memory ([`active`]), human approval
//! rules ([`hil`]) and the OpenAI-compatible model provider
//! ([`provider`]). Nothing here takes the kernel; the loop that drives a
//! run and the `proc.*` calls are `syscalls::proc`.
//!
//! In memory there is only what a restart may lose: which run is active
//! and how to abort it or answer its approval. Everything else is a row;
//! on start `syscalls::proc::run::recover` ends runs a dead kernel left
//! `running` and starts processes that still have queued messages.

pub mod active;
pub mod hil;
pub mod provider;
pub mod store;

pub use active::{Active, Procs};
