//! Kernel integration tests: the real server on 127.0.0.1:0, real
//! WebSocket clients, real SQLite files in a temp dir per test.

mod adapters;
mod agents;
mod bodies;
mod chunk_store;
mod cli;
mod codemode;
mod devices;
mod exec;
mod fs;
mod fs_contract;
mod handshake;
mod harness;
mod ipc;
mod matrix;
// Synapse on loopback and Matrix people: the adapter crate's test support.
#[path = "../../../adapter-matrix/tests/support/mod.rs"]
mod matrix_support;
mod mcp;
mod netns;
mod node;
mod node_watch;
mod notification;
mod oauth;
mod proc;
mod pty;
mod repo;
mod sched;
mod snapshots;
mod watch;
mod workspace_calls;
mod workspaces;
