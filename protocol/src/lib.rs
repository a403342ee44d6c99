//! The gsv kernel's wire contract, shared by the kernel (`gsv-kernel`),
//! the device driver (`gsv-node`) and clients: the JSON frames on the
//! WebSocket ([`frames`]), the wire error codes ([`error`]), and the
//! protocol version. It holds no I/O: no async runtime, no database, no
//! HTTP.

pub mod error;
pub mod frames;
pub mod watch;

pub use error::{FrameError, WireError};

/// The protocol version this kernel speaks (`sys.connect` `protocol`).
pub const PROTOCOL: i64 = 2;
