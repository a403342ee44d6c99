//! The cross-crate scenarios, linked once: each module is one area (see
//! its own `//!`). `faults.rs` stays its own binary because it arms the
//! store's process-global fault-injection points, which must not fire
//! under the other scenarios' in-process stores.

mod agent;
mod client_crash;
mod conflicts;
mod crash;
mod daemon;
mod exec;
mod hostile_rpc;
mod parsers;
mod prune;
mod state_loss;
