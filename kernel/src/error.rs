//! The one table of frame-level failures: every handler error is a
//! [`KernelError`] variant, and [`KernelError::code`] maps each variant to
//! exactly one wire code (reference §3.10). Operation failures (a missing
//! file, a bad edit) are not errors here: handlers return them as
//! `ok:true, data:{ok:false, error}` (see `domains::fs`).

use gsv_protocol::error::code;
use gsv_protocol::{FrameError, WireError};
use serde_json::{Value, json};

/// A frame-level failure: sent as `{type:"res", ok:false, error:{code, message}}`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A text message that is not a well-formed frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("Unsupported protocol version: {got} (this kernel speaks {want})")]
    UnsupportedProtocol { got: i64, want: i64 },
    /// Bad `client`/`driver` fields of `sys.connect`.
    #[error("{0}")]
    InvalidClient(String),
    #[error("{0}")]
    AuthFailed(String),
    #[error("Must call sys.connect first")]
    NotConnected,
    #[error("Permission denied: {0}")]
    PermissionDenied(String),
    #[error("Access denied to {kind}: {id}")]
    AccessDenied { kind: &'static str, id: String },
    /// Something that does not exist (for anyone: its ids are random, so
    /// saying so tells a prober nothing it could have guessed), or that does
    /// not exist for the caller (another user's MCP server looks the same).
    #[error("{kind} not found: {id}")]
    NotFound { kind: &'static str, id: String },
    #[error("Unknown syscall: {0}")]
    UnknownSyscall(String),
    #[error("Unknown shell session: {0}")]
    UnknownSession(String),
    #[error("Already connected")]
    AlreadyConnected,
    #[error("Duplicate request: {0}")]
    DuplicateRequest(String),
    #[error("System already initialized")]
    AlreadyInitialized,
    #[error("Setup required")]
    SetupRequired,
    #[error("{0}")]
    Cancelled(String),
    #[error("Invalid arguments for {call}: {reason}")]
    InvalidArgs { call: String, reason: String },
    #[error("{0}")]
    BadRequest(String),
    /// A named thing (a repository's ref, commit or path) does not exist;
    /// the message names it.
    #[error("{0}")]
    Missing(String),
    /// A compare-and-swap lost: the state moved since the caller looked.
    #[error("{0}")]
    Conflict(String),
    /// A peer the kernel fetched from (an import's upstream) failed.
    #[error("{0}")]
    Upstream(String),
    #[error("Too many connections: {0}")]
    Overloaded(&'static str),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
    /// A routed call's device did not answer within the route's TTL.
    #[error("Syscall {call} timed out (device: {device})")]
    DeviceTimeout { call: String, device: String },
    /// A call forwarded to an adapter got no answer within its TTL
    /// (`gsv serve --adapter-timeout`).
    #[error("Syscall {call} timed out (adapter: {adapter})")]
    AdapterTimeout { call: String, adapter: String },
    /// A device answered with a frame the kernel cannot relay.
    #[error("Invalid response from device {device}: {reason}")]
    BadDeviceResponse { device: String, reason: String },
    /// A device's own frame-level failure, relayed with its code.
    #[error("{message}")]
    Device { code: i64, message: String },
}

impl KernelError {
    /// `call`'s arguments are refused for `reason` (which names the
    /// argument).
    pub fn invalid_args(call: &str, reason: impl Into<String>) -> KernelError {
        KernelError::InvalidArgs {
            call: call.to_owned(),
            reason: reason.into(),
        }
    }

    /// The wire code of this failure; one code per variant.
    pub fn code(&self) -> i64 {
        use KernelError::*;
        match self {
            Frame(e) => e.code(),
            InvalidArgs { .. } | BadRequest(_) => code::BAD_REQUEST,
            UnsupportedProtocol { .. } => code::UNSUPPORTED_PROTOCOL,
            InvalidClient(_) => code::INVALID_CLIENT,
            AuthFailed(_) => code::AUTH_FAILED,
            NotConnected | PermissionDenied(_) | AccessDenied { .. } => code::FORBIDDEN,
            UnknownSyscall(_) | UnknownSession(_) | NotFound { .. } | Missing(_) => code::NOT_FOUND,
            AlreadyConnected | DuplicateRequest(_) | AlreadyInitialized | Conflict(_) => {
                code::CONFLICT
            }
            SetupRequired => code::SETUP_REQUIRED,
            Cancelled(_) => code::CANCELLED,
            Internal(_) => code::INTERNAL,
            Overloaded(_) | Unavailable(_) => code::UNAVAILABLE,
            DeviceTimeout { .. } | AdapterTimeout { .. } => code::GATEWAY_TIMEOUT,
            BadDeviceResponse { .. } | Upstream(_) => code::BAD_GATEWAY,
            Device { code, .. } => *code,
        }
    }

    /// Extra machine-readable details sent beside the message.
    pub fn details(&self) -> Option<Value> {
        match self {
            KernelError::SetupRequired => Some(json!({"setupMode": true, "next": "sys.setup"})),
            _ => None,
        }
    }

    /// The `error` object of an `ok:false` response.
    pub fn to_wire(&self) -> WireError {
        WireError {
            code: self.code(),
            message: self.to_string(),
            details: self.details(),
        }
    }

    pub(crate) fn internal(context: &str, e: impl std::fmt::Display) -> KernelError {
        tracing::error!(%context, error = %e, "internal error");
        KernelError::Internal(format!("{context}: {e}"))
    }
}

impl From<rusqlite::Error> for KernelError {
    fn from(e: rusqlite::Error) -> Self {
        KernelError::internal("kernel database", e)
    }
}

impl From<&KernelError> for WireError {
    fn from(e: &KernelError) -> Self {
        e.to_wire()
    }
}

impl From<KernelError> for WireError {
    fn from(e: KernelError) -> Self {
        e.to_wire()
    }
}
