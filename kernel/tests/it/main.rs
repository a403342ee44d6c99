//! Kernel integration tests: the real server on 127.0.0.1:0, real
//! WebSocket clients, real SQLite files in a temp dir per test.

mod agents;
mod bodies;
mod cli;
mod devices;
mod exec;
mod fs;
mod handshake;
mod harness;
mod node;
mod notification;
mod proc;
mod sched;
mod workspaces;
