//! The `oauth` domain (`sys.oauth.*`): authorization-code flows with
//! PKCE S256 on the `oauth2` crate ([`client`]), their pending rows and
//! the accounts they leave ([`store`], migration 120), tokens sealed
//! with a key of the data directory ([`seal`]), and the discovery an MCP
//! server that answers 401 needs ([`discovery`]: RFC 9728, RFC 8414,
//! RFC 7591). `GET /oauth/callback` and the client metadata document
//! are served by the kernel's HTTP server (`calls`).

pub mod calls;
pub mod client;
pub mod discovery;
pub mod seal;
pub mod store;

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::db::Migration;
use crate::error::KernelError;

/// This domain's tables, listed in `domains::MIGRATIONS`; never edit a
/// released migration, add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 120,
    name: "oauth",
    sql: store::MIGRATION,
}];

/// How long a started flow waits for its callback (seed 000: 10 min).
pub const FLOW_TTL_MS: i64 = 10 * 60 * 1000;
/// An access token this close to its expiry is refreshed before use.
pub const REFRESH_MARGIN_MS: i64 = 30 * 1000;
/// The callback path on the kernel's HTTP server.
pub const CALLBACK_PATH: &str = "/oauth/callback";
/// The client metadata document's path.
pub const CLIENT_METADATA_PATH: &str = "/.well-known/oauth-client/gsv.json";
/// The timer kind of a flow's expiry (`oauth-flow:<id>`).
pub const TIMER_KIND: &str = "oauth-flow";
/// `accountKey` when absent.
pub const DEFAULT_ACCOUNT_KEY: &str = "default";
/// Token endpoint and discovery requests take at most this long.
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Authorization URL parameters the flow sets itself; `extraAuthParams`
/// may not name them.
pub const RESERVED_AUTH_PARAMS: &[&str] = &[
    "response_type",
    "client_id",
    "redirect_uri",
    "scope",
    "state",
    "code_challenge",
    "code_challenge_method",
    "resource",
];

/// What the domain keeps in memory: the token seal, the HTTP client its
/// requests share (redirects off: a token endpoint must not bounce a
/// code elsewhere) and this kernel's public origin.
#[derive(Debug)]
pub struct OAuth {
    pub seal: seal::TokenSeal,
    pub http: reqwest::Client,
    /// `--public-url`, else the address the server bound (set at serve).
    origin: OnceLock<String>,
}

impl OAuth {
    /// The state of a kernel whose data directory is `dir`, with
    /// `public_url` when one was configured.
    pub fn open(dir: &Path, public_url: Option<&str>) -> Result<OAuth, KernelError> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(HTTP_TIMEOUT)
            .build()
            .map_err(|e| KernelError::internal("building the OAuth HTTP client", e))?;
        let origin = OnceLock::new();
        if let Some(u) = public_url {
            let _ = origin.set(u.trim_end_matches('/').to_owned());
        }
        Ok(OAuth {
            seal: seal::TokenSeal::open_or_create(dir)?,
            http,
            origin,
        })
    }

    /// Records the server's bound origin, unless a public URL was given.
    pub fn set_bound_origin(&self, origin: String) {
        let _ = self.origin.set(origin);
    }

    /// This kernel's public origin, if known.
    pub fn origin(&self) -> Option<&str> {
        self.origin.get().map(String::as_str)
    }
}

/// Why a URL argument is refused: https, or http on loopback, no
/// credentials (the MCP rule, one definition).
pub fn check_url(arg: &str, url: &str) -> Result<reqwest::Url, KernelError> {
    crate::domains::mcp::check_url(url).map_err(|e| KernelError::InvalidArgs {
        call: "sys.oauth.start".into(),
        reason: format!("{arg}: {e}"),
    })
}
