//! The `mcp` domain (`sys.mcp.*`): a user's MCP servers. The rows
//! ([`store`], migration 70) are what was added; the live connections and
//! what each server offers ([`live`]) are memory, rebuilt on first use
//! after a restart; speaking MCP is [`client`] (rmcp, streamable HTTP).
//! A server that answers 401 is signed in to through the `oauth` domain:
//! it is `authenticating` with an `authUrl` until the flow's callback
//! stores its account, then connects with that account's bearer token.

pub mod calls;
pub mod client;
pub mod live;
pub mod store;

use crate::db::Migration;

/// This domain's table, listed in `domains::MIGRATIONS`; never edit a
/// released migration, add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 70,
    name: "mcp_servers",
    sql: store::MIGRATION,
}];

/// `sys.mcp.add` `name`: 1 to this many characters.
pub const MAX_NAME_CHARS: usize = 80;

/// Why a server URL is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("url '{0}' is not a valid URL")]
    Invalid(String),
    #[error("url '{0}' must use https (http only for localhost, 127.0.0.1 or ::1)")]
    InsecureHttp(String),
    #[error("url '{0}' must be http or https")]
    Scheme(String),
    #[error("url '{0}' must not carry credentials; use transport.headers")]
    Credentials(String),
}

/// Checks an MCP server URL: https, or http on loopback; no user info.
pub fn check_url(url: &str) -> Result<reqwest::Url, UrlError> {
    let u = reqwest::Url::parse(url).map_err(|_| UrlError::Invalid(url.to_owned()))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err(UrlError::Credentials(url.to_owned()));
    }
    match u.scheme() {
        "https" => Ok(u),
        "http" => {
            let loopback = match u.host() {
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                Some(url::Host::Ipv4(ip)) => ip == std::net::Ipv4Addr::LOCALHOST,
                Some(url::Host::Ipv6(ip)) => ip == std::net::Ipv6Addr::LOCALHOST,
                None => false,
            };
            if loopback {
                Ok(u)
            } else {
                Err(UrlError::InsecureHttp(url.to_owned()))
            }
        }
        _ => Err(UrlError::Scheme(url.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_is_accepted_only_on_loopback() {
        for ok in [
            "https://mcp.example.com/mcp",
            "http://localhost:3000/mcp",
            "http://127.0.0.1:1/mcp",
            "http://[::1]:8080/mcp",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        assert!(matches!(
            check_url("http://mcp.example.com/mcp"),
            Err(UrlError::InsecureHttp(_))
        ));
        assert!(matches!(
            check_url("http://127.0.0.2/mcp"),
            Err(UrlError::InsecureHttp(_))
        ));
        assert!(matches!(
            check_url("ftp://localhost/x"),
            Err(UrlError::Scheme(_))
        ));
        assert!(matches!(
            check_url("https://u:p@example.com/"),
            Err(UrlError::Credentials(_))
        ));
        assert!(matches!(check_url("not a url"), Err(UrlError::Invalid(_))));
    }
}
