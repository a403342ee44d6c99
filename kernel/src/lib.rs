//! The gateway kernel (not built yet; see `shared/design/kernel.md`). It will
//! serve clients over WebSocket JSON frames, keep one `wsd-dofs` store per
//! workspace and drive `wsd` through its RPC client.

pub mod node;
