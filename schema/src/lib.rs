//! The Cap'n Proto schema of the wsd wire (`workspace.capnp`) and its
//! generated Rust code, committed so a build needs only the Rust toolchain.
//!
//! No logic lives here: conversion to and from the domain types of
//! `wsd_sync` happens in one place, `wsd::rpc::convert`. Regenerate with
//! `schema/regen.sh`; `tests/regenerate.rs` fails when the committed code is
//! stale.

/// Code generated from `workspace.capnp`. It is pulled in with `include!`
/// (not `mod`) so `cargo fmt` leaves it exactly as capnpc wrote it and the
/// regeneration check can compare it byte for byte.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    rust_2018_idioms,
    unused
)]
pub mod workspace_capnp {
    include!("workspace_capnp.rs");
}
