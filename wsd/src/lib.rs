//! The workspace daemon: owns one workspace (a real directory plus a SQLite
//! index beside it) and serves it over Cap'n Proto RPC with a `sync` half
//! and a `shell` half. The library holds the container-side store
//! ([`store`]), the exec runner and its durable log ([`exec`]) and the RPC
//! server and client ([`rpc`]); the binary (`src/main.rs`) is the CLI.

pub mod daemon;
pub mod exec;
pub mod rpc;
pub mod store;
