//! The one table of frame-level failures: every handler error is a
//! [`KernelError`] variant, and [`KernelError::code`] maps each variant to
//! exactly one wire code (reference §3.10). Operation failures (a missing
//! file, a bad edit) are not errors here: handlers return them as
//! `ok:true, data:{ok:false, error}` (see `syscalls::fs`).

use serde_json::{Value, json};

/// A frame-level failure: sent as `{type:"res", ok:false, error:{code, message}}`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    #[error("Malformed JSON")]
    MalformedJson,
    #[error("Invalid frame: {0}")]
    InvalidFrame(&'static str),
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
    #[error("Too many connections: {0}")]
    Overloaded(&'static str),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
    /// A routed call's device did not answer within the route's TTL.
    #[error("Syscall {call} timed out (device: {device})")]
    DeviceTimeout { call: String, device: String },
    /// A device answered with a frame the kernel cannot relay.
    #[error("Invalid response from device {device}: {reason}")]
    BadDeviceResponse { device: String, reason: String },
    /// A device's own frame-level failure, relayed with its code.
    #[error("{message}")]
    Device { code: i64, message: String },
}

impl KernelError {
    /// The wire code of this failure; one code per variant.
    pub fn code(&self) -> i64 {
        use KernelError::*;
        match self {
            MalformedJson | InvalidFrame(_) | InvalidArgs { .. } | BadRequest(_) => 400,
            UnsupportedProtocol { .. } => 102,
            InvalidClient(_) => 103,
            AuthFailed(_) => 401,
            NotConnected | PermissionDenied(_) | AccessDenied { .. } => 403,
            UnknownSyscall(_) | UnknownSession(_) => 404,
            AlreadyConnected | DuplicateRequest(_) | AlreadyInitialized => 409,
            SetupRequired => 425,
            Cancelled(_) => 499,
            Internal(_) => 500,
            Overloaded(_) | Unavailable(_) => 503,
            DeviceTimeout { .. } => 504,
            BadDeviceResponse { .. } => 502,
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
    pub fn to_wire(&self) -> Value {
        let mut e = json!({"code": self.code(), "message": self.to_string()});
        if let Some(d) = self.details() {
            e["details"] = d;
        }
        e
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
