//! What a client needs to sign in to an MCP server that answered 401:
//! its protected resource metadata (RFC 9728) names the authorization
//! server, whose metadata (RFC 8414) gives the endpoints, and dynamic
//! client registration (RFC 7591) a client id for this kernel's redirect
//! URI. A server without resource metadata is its own authorization
//! server (the MCP 2025-03 fallback).

use serde::Deserialize;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("no OAuth authorization server metadata found for {0}")]
    NoMetadata(String),
    #[error("the authorization server of {0} offers no client registration")]
    NoRegistration(String),
}

/// The endpoints and resource of one MCP server's sign-in.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthServer {
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub registration_endpoint: Option<String>,
    /// RFC 8707 `resource`: the MCP server as its metadata names it.
    pub resource: String,
    pub scope: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ResourceMetadata {
    resource: Option<String>,
    #[serde(default)]
    authorization_servers: Vec<String>,
    #[serde(default)]
    scopes_supported: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct ServerMetadata {
    authorization_endpoint: String,
    token_endpoint: String,
    registration_endpoint: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Registered {
    client_id: String,
}

/// `https://host/.well-known/<name><path>`: RFC 8414/9728 put the
/// well-known segment between the host and the path.
fn well_known(base: &reqwest::Url, name: &str, with_path: bool) -> String {
    let path = base.path().trim_end_matches('/');
    let mut u = base.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.set_path(&format!(
        "/.well-known/{name}{}",
        if with_path { path } else { "" }
    ));
    u.to_string()
}

async fn get_json<T: for<'de> Deserialize<'de>>(
    http: &reqwest::Client,
    url: &str,
) -> Result<Option<T>, DiscoveryError> {
    let fetch = |reason: String| DiscoveryError::Fetch {
        url: url.to_owned(),
        reason,
    };
    let res = http
        .get(url)
        .send()
        .await
        .map_err(|e| fetch(e.to_string()))?;
    if !res.status().is_success() {
        return Ok(None);
    }
    res.json::<T>()
        .await
        .map(Some)
        .map_err(|e| fetch(e.to_string()))
}

/// Finds the authorization server of the MCP server at `url`.
pub async fn discover(http: &reqwest::Client, url: &str) -> Result<AuthServer, DiscoveryError> {
    let base = reqwest::Url::parse(url).map_err(|e| DiscoveryError::Fetch {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    let mut resource_meta = None;
    for with_path in [true, false] {
        let u = well_known(&base, "oauth-protected-resource", with_path);
        if let Some(m) = get_json::<ResourceMetadata>(http, &u).await? {
            resource_meta = Some(m);
            break;
        }
    }
    let (issuer, resource, scope) = match resource_meta {
        Some(m) => (
            m.authorization_servers
                .first()
                .cloned()
                .unwrap_or_else(|| base.origin().ascii_serialization()),
            m.resource.unwrap_or_else(|| url.to_owned()),
            (!m.scopes_supported.is_empty()).then(|| m.scopes_supported.join(" ")),
        ),
        None => (base.origin().ascii_serialization(), url.to_owned(), None),
    };
    let issuer_url = reqwest::Url::parse(&issuer).map_err(|e| DiscoveryError::Fetch {
        url: issuer.clone(),
        reason: e.to_string(),
    })?;
    for (name, with_path) in [
        ("oauth-authorization-server", true),
        ("oauth-authorization-server", false),
        ("openid-configuration", true),
    ] {
        let u = well_known(&issuer_url, name, with_path);
        if let Some(m) = get_json::<ServerMetadata>(http, &u).await? {
            return Ok(AuthServer {
                authorization_endpoint: m.authorization_endpoint,
                token_endpoint: m.token_endpoint,
                registration_endpoint: m.registration_endpoint,
                resource,
                scope,
            });
        }
    }
    Err(DiscoveryError::NoMetadata(url.to_owned()))
}

/// Registers this kernel as a public client (PKCE, no secret) for
/// `redirect_uri`; the client id.
pub async fn register(
    http: &reqwest::Client,
    server: &AuthServer,
    redirect_uri: &str,
) -> Result<String, DiscoveryError> {
    let Some(endpoint) = &server.registration_endpoint else {
        return Err(DiscoveryError::NoRegistration(server.resource.clone()));
    };
    let fetch = |reason: String| DiscoveryError::Fetch {
        url: endpoint.clone(),
        reason,
    };
    let mut body = json!({
        "client_name": "gsv",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    });
    if let Some(s) = &server.scope {
        body["scope"] = json!(s);
    }
    let res = http
        .post(endpoint)
        .json(&body)
        .send()
        .await
        .map_err(|e| fetch(e.to_string()))?;
    if !res.status().is_success() {
        let status = res.status();
        let text = res.text().await.unwrap_or_default();
        return Err(fetch(format!(
            "registration refused ({status}): {}",
            &text[..text.len().min(200)]
        )));
    }
    let r: Registered = res.json().await.map_err(|e| fetch(e.to_string()))?;
    Ok(r.client_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_urls_go_between_host_and_path() {
        let u = reqwest::Url::parse("http://127.0.0.1:9/mcp?x=1").unwrap();
        assert_eq!(
            well_known(&u, "oauth-protected-resource", true),
            "http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            well_known(&u, "oauth-authorization-server", false),
            "http://127.0.0.1:9/.well-known/oauth-authorization-server"
        );
        let root = reqwest::Url::parse("https://as.example/").unwrap();
        assert_eq!(
            well_known(&root, "oauth-authorization-server", true),
            "https://as.example/.well-known/oauth-authorization-server"
        );
    }
}
