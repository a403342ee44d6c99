//! Wire error codes (reference §3.10) and the `error` object of an
//! `ok:false` response. The kernel maps each of its failures to one of
//! these codes (`KernelError::code`); drivers and clients use the same
//! numbers.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The frame-level codes, by name.
pub mod code {
    /// `sys.connect` asked for a protocol version this kernel does not speak.
    pub const UNSUPPORTED_PROTOCOL: i64 = 102;
    /// Bad `client`/`driver` fields of `sys.connect`.
    pub const INVALID_CLIENT: i64 = 103;
    /// Malformed JSON, a frame missing its fields, bad arguments.
    pub const BAD_REQUEST: i64 = 400;
    pub const AUTH_FAILED: i64 = 401;
    pub const FORBIDDEN: i64 = 403;
    pub const NOT_FOUND: i64 = 404;
    pub const CONFLICT: i64 = 409;
    pub const SETUP_REQUIRED: i64 = 425;
    /// The request was cancelled (`request.cancel`, a dropped connection).
    pub const CANCELLED: i64 = 499;
    pub const INTERNAL: i64 = 500;
    /// A device answered with a frame the kernel cannot relay.
    pub const BAD_GATEWAY: i64 = 502;
    pub const UNAVAILABLE: i64 = 503;
    /// A routed call's device did not answer in time.
    pub const GATEWAY_TIMEOUT: i64 = 504;
}

/// The `error` object of an `ok:false` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// An inbound text message that is not a well-formed frame; answered with
/// id `"?"` and code 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("Malformed JSON")]
    MalformedJson,
    #[error("Invalid frame: {0}")]
    InvalidFrame(&'static str),
}

impl FrameError {
    /// Its wire code (both are 400).
    pub fn code(&self) -> i64 {
        code::BAD_REQUEST
    }
}

impl From<&FrameError> for WireError {
    fn from(e: &FrameError) -> Self {
        WireError {
            code: e.code(),
            message: e.to_string(),
            details: None,
        }
    }
}

impl From<FrameError> for WireError {
    fn from(e: FrameError) -> Self {
        WireError::from(&e)
    }
}
