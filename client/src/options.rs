//! Where a daemon listens ([`Endpoint`]) and how to talk to it
//! ([`ClientOptions`]: credentials, peer name, deadlines).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use wsd_sync::ErrorCode;

use crate::WsdError;

/// Default [`ClientOptions::connect_timeout`]: a TCP or unix-socket dial.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ClientOptions::handshake_timeout`]: `Bootstrap.connect`
/// (version check, token, peer name) after the dial.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ClientOptions::call_timeout`]. A push batch (4096 entries,
/// about 4 MiB of objects) is applied by the daemon in one call; a slow
/// disk takes seconds for it, not a minute.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A daemon's address: `"host:port"` (TCP) or `"unix:/path"` (a unix
/// socket).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

impl FromStr for Endpoint {
    type Err = WsdError;

    /// `EINVAL` naming the address for an empty string, an empty socket
    /// path, or a TCP address without a port.
    fn from_str(s: &str) -> Result<Endpoint, WsdError> {
        let invalid = |why: &str| {
            WsdError::new(ErrorCode::Invalid, format!("address {s:?}: {why}")).with_subject(s)
        };
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(invalid("empty unix socket path"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        match s.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(Endpoint::Tcp(s.to_owned()))
            }
            _ => Err(invalid("expected host:port or unix:/path")),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(addr) => f.write_str(addr),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// How a client connects. Every wait has a deadline: the dial
/// (`connect_timeout`), the handshake (`handshake_timeout`), and each call
/// (`call_timeout`, an idle-progress deadline: one RPC round trip of a push
/// or pull, or one unary call, must answer within it; an exec's event
/// stream has none, since a command may be silent for as long as it likes).
/// A deadline that passes fails with `ETIMEDOUT` naming the address and
/// the phase, and drops the connection.
#[derive(Clone)]
pub struct ClientOptions {
    /// `None` sends an empty token, which only a daemon without a token
    /// accepts.
    pub token: Option<Vec<u8>>,
    /// The name the daemon keeps our watermarks under: use the same one
    /// every time. Default `"wsd-client"`.
    pub peer: String,
    /// Default [`DEFAULT_CONNECT_TIMEOUT`] (10 s).
    pub connect_timeout: Duration,
    /// Default [`DEFAULT_HANDSHAKE_TIMEOUT`] (10 s).
    pub handshake_timeout: Duration,
    /// Default [`DEFAULT_CALL_TIMEOUT`] (60 s).
    pub call_timeout: Duration,
    /// The name the *local* store keeps this daemon's watermarks under
    /// when a [`crate::WsdHandle`] pushes or pulls. `None` (the default):
    /// the endpoint's text. Set it when one workspace may be reached at
    /// different addresses, so its watermarks follow the workspace.
    pub remote_name: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            token: None,
            peer: "wsd-client".to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            remote_name: None,
        }
    }
}

impl std::fmt::Debug for ClientOptions {
    // The token is a secret: never in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("peer", &self.peer)
            .field("connect_timeout", &self.connect_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("remote_name", &self.remote_name)
            .finish()
    }
}

/// `what` timed out after `after`, as the error every deadline gives.
pub(crate) fn timed_out(endpoint: &str, what: &str, after: Duration) -> WsdError {
    WsdError::new(
        ErrorCode::Timeout,
        format!("{what} with {endpoint} timed out after {}", seconds(after)),
    )
    .with_subject(endpoint)
}

/// `10 s`, `1.5 s`, `250 ms`: a duration as a person reads it.
fn seconds(d: Duration) -> String {
    if d.as_millis() < 1000 {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_print_back() {
        for s in [
            "127.0.0.1:7000",
            "localhost:1",
            "[::1]:45678",
            "unix:/tmp/w.sock",
        ] {
            let e: Endpoint = s.parse().unwrap();
            assert_eq!(e.to_string(), s);
        }
        assert_eq!(
            "unix:/a/b".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/a/b".into())
        );
    }

    #[test]
    fn a_malformed_address_is_einval_naming_it() {
        for s in ["", "nohost", ":80", "host:", "host:99999", "unix:"] {
            let e = s.parse::<Endpoint>().unwrap_err();
            assert_eq!(e.code, ErrorCode::Invalid, "{s:?}");
            assert_eq!(e.subject.as_deref(), Some(s));
        }
    }

    #[test]
    fn a_timeout_names_the_phase_the_address_and_the_deadline() {
        let e = timed_out("10.0.0.5:7000", "handshake", Duration::from_secs(10));
        assert_eq!(e.code, ErrorCode::Timeout);
        assert_eq!(
            e.message,
            "handshake with 10.0.0.5:7000 timed out after 10 s"
        );
        assert_eq!(e.subject.as_deref(), Some("10.0.0.5:7000"));
    }
}
