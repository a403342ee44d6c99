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
mod mcp;
mod netns;
mod node;
mod notification;
mod oauth;
mod proc;
mod pty;
mod repo;
mod sched;
mod snapshots;
mod watch;
mod workspaces;
