//! The flow's OAuth 2.0 requests on the `oauth2` crate: the authorization
//! URL (code flow, PKCE S256, `resource` per RFC 8707), the code exchange
//! and the refresh. Nothing here knows rows or users.

use std::collections::BTreeMap;

use oauth2::basic::BasicClient;
use oauth2::{
    AuthUrl, AuthorizationCode, ClientId, CsrfToken, PkceCodeChallenge, PkceCodeVerifier,
    RedirectUrl, RefreshToken, Scope, TokenResponse, TokenUrl,
};

use crate::db::now_ms;

/// The endpoints and client one flow or account speaks with.
#[derive(Debug, Clone)]
pub struct Endpoints<'a> {
    pub authorization: &'a str,
    pub token: &'a str,
    pub client_id: &'a str,
    pub redirect_uri: &'a str,
}

/// Tokens a token endpoint granted.
#[derive(Debug, Clone, PartialEq)]
pub struct Granted {
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub token_type: String,
    /// Milliseconds since the epoch, when the server said.
    pub expires_at: Option<i64>,
    pub scope: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum OAuthClientError {
    #[error("{what} '{url}' is not a valid URL")]
    Url { what: &'static str, url: String },
    #[error("the token endpoint refused: {0}")]
    Token(String),
}

type Client = BasicClient<
    oauth2::EndpointSet,
    oauth2::EndpointNotSet,
    oauth2::EndpointNotSet,
    oauth2::EndpointNotSet,
    oauth2::EndpointSet,
>;

fn client(e: &Endpoints<'_>) -> Result<Client, OAuthClientError> {
    let url = |what: &'static str, url: &str| OAuthClientError::Url {
        what,
        url: url.to_owned(),
    };
    Ok(BasicClient::new(ClientId::new(e.client_id.to_owned()))
        .set_auth_uri(
            AuthUrl::new(e.authorization.to_owned())
                .map_err(|_| url("authorizationEndpoint", e.authorization))?,
        )
        .set_token_uri(
            TokenUrl::new(e.token.to_owned()).map_err(|_| url("tokenEndpoint", e.token))?,
        )
        .set_redirect_uri(
            RedirectUrl::new(e.redirect_uri.to_owned())
                .map_err(|_| url("redirectUri", e.redirect_uri))?,
        ))
}

/// The authorization URL of a new flow with `state`, and the PKCE
/// verifier its callback needs.
pub fn authorization_url(
    e: &Endpoints<'_>,
    state: &str,
    scope: Option<&str>,
    resource: Option<&str>,
    extra: &BTreeMap<String, String>,
) -> Result<(String, String), OAuthClientError> {
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let c = client(e)?;
    let mut req = c
        .authorize_url(|| CsrfToken::new(state.to_owned()))
        .set_pkce_challenge(challenge);
    for s in scope.unwrap_or("").split_whitespace() {
        req = req.add_scope(Scope::new(s.to_owned()));
    }
    if let Some(r) = resource {
        req = req.add_extra_param("resource", r);
    }
    for (k, v) in extra {
        req = req.add_extra_param(k, v);
    }
    let (url, _) = req.url();
    Ok((url.to_string(), verifier.secret().clone()))
}

fn granted<T: TokenResponse>(t: &T) -> Granted {
    Granted {
        access_token: t.access_token().secret().clone(),
        refresh_token: t.refresh_token().map(|r| r.secret().clone()),
        // `bearer` as RFC 6750 spells it in headers: `Bearer`.
        token_type: "Bearer".to_owned(),
        expires_at: t
            .expires_in()
            .map(|d| now_ms() + d.as_millis().min(i64::MAX as u128) as i64),
        scope: t
            .scopes()
            .map(|s| s.iter().map(|x| x.as_str()).collect::<Vec<_>>().join(" ")),
    }
}

/// Exchanges an authorization code (with its PKCE verifier).
pub async fn exchange_code(
    http: &reqwest::Client,
    e: &Endpoints<'_>,
    code: &str,
    verifier: &str,
    resource: Option<&str>,
) -> Result<Granted, OAuthClientError> {
    let c = client(e)?;
    let mut req = c
        .exchange_code(AuthorizationCode::new(code.to_owned()))
        .set_pkce_verifier(PkceCodeVerifier::new(verifier.to_owned()));
    if let Some(r) = resource {
        req = req.add_extra_param("resource", r);
    }
    let t = req
        .request_async(http)
        .await
        .map_err(|err| OAuthClientError::Token(describe(&err)))?;
    Ok(granted(&t))
}

/// Trades a refresh token for new tokens.
pub async fn refresh(
    http: &reqwest::Client,
    e: &Endpoints<'_>,
    refresh_token: &str,
    resource: Option<&str>,
) -> Result<Granted, OAuthClientError> {
    let c = client(e)?;
    let rt = RefreshToken::new(refresh_token.to_owned());
    let mut req = c.exchange_refresh_token(&rt);
    if let Some(r) = resource {
        req = req.add_extra_param("resource", r);
    }
    let t = req
        .request_async(http)
        .await
        .map_err(|err| OAuthClientError::Token(describe(&err)))?;
    Ok(granted(&t))
}

/// The server's `error` and description when it sent them.
fn describe<RE: std::error::Error + 'static, T: oauth2::ErrorResponse + std::fmt::Display>(
    e: &oauth2::RequestTokenError<RE, T>,
) -> String {
    match e {
        oauth2::RequestTokenError::ServerResponse(r) => r.to_string(),
        oauth2::RequestTokenError::Request(r) => format!("request failed: {r}"),
        oauth2::RequestTokenError::Parse(p, body) => format!(
            "unreadable answer ({p}): {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ),
        oauth2::RequestTokenError::Other(o) => o.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authorization_url_carries_pkce_s256_state_scope_resource_and_extras() {
        let e = Endpoints {
            authorization: "https://as.example/authorize",
            token: "https://as.example/token",
            client_id: "gsv-client",
            redirect_uri: "https://gsv.example/oauth/callback",
        };
        let extra = BTreeMap::from([("prompt".to_owned(), "consent".to_owned())]);
        let (url, verifier) = authorization_url(
            &e,
            "st4te",
            Some("read write"),
            Some("https://mcp.example/mcp"),
            &extra,
        )
        .unwrap();
        let u = reqwest::Url::parse(&url).unwrap();
        let q: BTreeMap<String, String> = u.query_pairs().into_owned().collect();
        assert_eq!(q["response_type"], "code");
        assert_eq!(q["client_id"], "gsv-client");
        assert_eq!(q["state"], "st4te");
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["scope"], "read write");
        assert_eq!(q["resource"], "https://mcp.example/mcp");
        assert_eq!(q["prompt"], "consent");
        assert_eq!(q["redirect_uri"], "https://gsv.example/oauth/callback");
        assert!(verifier.len() >= 43, "{verifier}");
        assert!(!url.contains(&verifier));
    }
}
