//! The Cap'n Proto RPC server and client.
