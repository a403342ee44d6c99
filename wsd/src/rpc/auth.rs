//! Who may connect: the shared-secret token and the loopback rule.

use std::net::IpAddr;
use std::path::Path;

use subtle::ConstantTimeEq;
use wsd_sync::{ErrorCode, Hash};

use super::WireError;

/// The environment variable a token may come from.
pub const TOKEN_ENV: &str = "WSD_TOKEN";

/// The shared secret a peer must present to `Bootstrap.connect`. It comes
/// from a file or the environment, never from the command line (where any
/// local user could read it in the process list).
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from raw bytes; empty is `EINVAL` (it would admit anyone).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Token, WireError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(WireError::new(ErrorCode::Invalid, "the token is empty"));
        }
        Ok(Token(bytes))
    }

    /// Reads a token file; surrounding whitespace (a trailing newline) is
    /// not part of the token.
    pub fn from_file(path: &Path) -> Result<Token, WireError> {
        let bytes = std::fs::read(path).map_err(|e| {
            WireError::new(
                ErrorCode::Io,
                format!("reading token file {}: {e}", path.display()),
            )
        })?;
        Token::new(bytes.trim_ascii())
    }

    /// The token in [`TOKEN_ENV`], if set and non-empty.
    pub fn from_env() -> Option<Token> {
        let v = std::env::var_os(TOKEN_ENV)?;
        Token::new(v.as_encoded_bytes().trim_ascii()).ok()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Constant-time comparison. Both sides are hashed first so that the
    /// time taken does not reveal the token's length either.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let ours = Hash::of(&self.0);
        let theirs = Hash::of(presented);
        ours.as_bytes().ct_eq(theirs.as_bytes()).into()
    }
}

/// Where a connection comes from, as far as admission cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerOrigin {
    /// A TCP peer at this address.
    Tcp(IpAddr),
    /// A unix-socket peer: local by construction, gated by file permissions.
    Unix,
}

/// Decides whether a new connection may proceed to the bootstrap
/// capability. With a token anyone reachable may try (and must present it);
/// without one only this machine may connect, since nothing else would stop
/// a remote peer.
pub fn admit(origin: PeerOrigin, token_configured: bool) -> Result<(), WireError> {
    match origin {
        _ if token_configured => Ok(()),
        PeerOrigin::Unix => Ok(()),
        PeerOrigin::Tcp(ip) if ip.to_canonical().is_loopback() => Ok(()),
        PeerOrigin::Tcp(ip) => Err(WireError::new(
            ErrorCode::Auth,
            format!("{ip} is not a loopback address and the daemon has no token"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_token_only_loopback_and_unix_peers_are_admitted() {
        let ok = ["127.0.0.1", "127.8.9.1", "::1", "::ffff:127.0.0.1"];
        for ip in ok {
            assert!(
                admit(PeerOrigin::Tcp(ip.parse().unwrap()), false).is_ok(),
                "{ip}"
            );
        }
        for ip in [
            "10.0.0.2",
            "192.168.1.1",
            "::ffff:10.1.1.1",
            "2001:db8::1",
            "0.0.0.0",
        ] {
            let err = admit(PeerOrigin::Tcp(ip.parse().unwrap()), false).unwrap_err();
            assert_eq!(err.code, ErrorCode::Auth, "{ip}");
        }
        assert!(admit(PeerOrigin::Unix, false).is_ok());
    }

    #[test]
    fn with_a_token_any_peer_may_try() {
        assert!(admit(PeerOrigin::Tcp("10.0.0.2".parse().unwrap()), true).is_ok());
    }

    #[test]
    fn tokens_match_exactly() {
        let t = Token::new(b"s3cret".to_vec()).unwrap();
        assert!(t.matches(b"s3cret"));
        assert!(!t.matches(b"s3cre"));
        assert!(!t.matches(b"s3cret "));
        assert!(!t.matches(b""));
        assert!(Token::new(Vec::new()).is_err());
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn a_token_file_loses_its_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, b"abc\n").unwrap();
        assert!(Token::from_file(&p).unwrap().matches(b"abc"));
        std::fs::write(&p, b"\n").unwrap();
        assert_eq!(Token::from_file(&p).unwrap_err().code, ErrorCode::Invalid);
    }
}
