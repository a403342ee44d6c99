//! Agent processes (issue 14): the registry rows ([`store`]), the loop as
//! one tokio task per active run ([`run`]), human approval ([`hil`]) and
//! the OpenAI-compatible model provider ([`provider`]).
//!
//! In memory there is only what a restart may lose: which run is active
//! and how to abort it or answer its approval. Everything else is a row;
//! on start [`run::recover`] ends runs a dead kernel left `running` and starts
//! processes that still have queued messages.

pub mod active;
pub mod hil;
pub mod provider;
pub mod run;
pub mod signal;
pub mod store;

pub use active::{Active, Procs};
