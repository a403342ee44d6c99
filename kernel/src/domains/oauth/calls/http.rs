//! The OAuth domain's HTTP face: `GET /oauth/callback`, where a browser
//! lands after the authorization server (the flow completes, and an MCP
//! server waiting on it connects), and the client metadata document.
//! Apart from the `sys.oauth.*` calls because it is what tells the MCP
//! domain, which itself asks the calls for tokens.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use gsv_protocol::oauth::OAuthAccountSummary;
use serde_json::{Map, Value, json};

use super::{state_hash, timer_id};
use crate::db::now_ms;
use crate::domains::accounts;
use crate::domains::oauth::client::{self, Endpoints};
use crate::domains::oauth::store::{self, AccountRow, FlowRow};
use crate::domains::oauth::{CALLBACK_PATH, CLIENT_METADATA_PATH};
use crate::domains::timers::table as timers;
use crate::kernel::Kernel;

/// The page a browser lands on after the authorization server.
fn page(status: StatusCode, title: &str, detail: &str) -> Response {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    (
        status,
        Html(format!(
            "<!doctype html><title>gsv: {t}</title><h1>{t}</h1><p>{d}</p>",
            t = escape(title),
            d = escape(detail)
        )),
    )
        .into_response()
}

/// `GET /oauth/callback?state=…&code=…`: the flow named by `state` (used
/// once) exchanges `code` for tokens and stores the account; an MCP
/// server waiting on it connects. An unknown or expired state is 400 and
/// changes nothing.
pub async fn callback(
    State(k): State<Arc<Kernel>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(state) = q.get("state").filter(|s| !s.is_empty()) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "The callback has no state.",
        );
    };
    let hash = state_hash(state);
    let flow = match k.db.call(move |c| store::take_flow(c, &hash)).await {
        Ok(Some(f)) => f,
        Ok(None) => {
            return page(
                StatusCode::BAD_REQUEST,
                "Sign-in failed",
                "Unknown or expired OAuth state: start the sign-in again.",
            );
        }
        Err(e) => {
            return page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Sign-in failed",
                &e.to_string(),
            );
        }
    };
    let id = flow.summary.flow_id.clone();
    if let Err(e) = k.db.call(move |c| timers::cancel(c, &timer_id(&id))).await {
        tracing::warn!(error = %e, "cancelling a used OAuth flow's expiry");
    }
    match complete(&k, &flow, &q).await {
        Ok(account) => {
            tracing::info!(account = %account.account_id, uid = account.uid,
                           provider = %account.provider, "OAuth account signed in");
            if let Some(server_id) = &flow.mcp_server_id {
                crate::domains::mcp::calls::signed_in(&k, flow.summary.uid, server_id).await;
            }
            page(
                StatusCode::OK,
                "Signed in",
                &format!(
                    "{} is connected. You can close this window.",
                    account.provider
                ),
            )
        }
        Err((status, why)) => {
            if let Some(server_id) = &flow.mcp_server_id {
                crate::domains::mcp::calls::sign_in_failed(&k, flow.summary.uid, server_id, &why);
            }
            page(status, "Sign-in failed", &why)
        }
    }
}

/// Exchanges the callback's code and stores the account.
async fn complete(
    k: &Arc<Kernel>,
    flow: &FlowRow,
    q: &HashMap<String, String>,
) -> Result<OAuthAccountSummary, (StatusCode, String)> {
    if let Some(error) = q.get("error") {
        let detail = q
            .get("error_description")
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        return Err((
            StatusCode::BAD_REQUEST,
            format!("the authorization server refused ({error}{detail})"),
        ));
    }
    let Some(code) = q.get("code").filter(|c| !c.is_empty()) else {
        return Err((StatusCode::BAD_REQUEST, "the callback has no code".into()));
    };
    let f = &flow.summary;
    let verifier = k
        .oauth
        .seal
        .open(&flow.pkce_verifier)
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let endpoints = Endpoints {
        authorization: &f.authorization_endpoint,
        token: &f.token_endpoint,
        client_id: &f.client_id,
        redirect_uri: &f.redirect_uri,
    };
    let granted = client::exchange_code(
        &k.oauth.http,
        &endpoints,
        code,
        &verifier,
        f.resource.as_deref(),
    )
    .await
    .map_err(|e| (StatusCode::BAD_GATEWAY, e.to_string()))?;
    let now = now_ms();
    let mut metadata = Map::new();
    metadata.insert(
        "authorizationEndpoint".into(),
        json!(f.authorization_endpoint),
    );
    metadata.insert("redirectUri".into(), json!(f.redirect_uri));
    if let Some(server) = &flow.mcp_server_id {
        metadata.insert("mcpServerId".into(), json!(server));
    }
    let row = AccountRow {
        summary: OAuthAccountSummary {
            account_id: format!("oauth_{}", accounts::random_hex(12)),
            uid: f.uid,
            kind: f.kind,
            provider: f.provider.clone(),
            account_key: f.account_key.clone(),
            label: f.label.clone(),
            scope: granted.scope.clone().or_else(|| f.scope.clone()),
            resource: f.resource.clone(),
            client_id: f.client_id.clone(),
            token_type: granted.token_type.clone(),
            expires_at: granted.expires_at,
            created_at: now,
            updated_at: now,
            last_used_at: None,
            metadata,
        },
        token_endpoint: f.token_endpoint.clone(),
        access_token: k.oauth.seal.seal(&granted.access_token),
        refresh_token: granted
            .refresh_token
            .as_deref()
            .map(|t| k.oauth.seal.seal(t)),
    };
    let stored =
        k.db.call(move |c| store::upsert_account(c, &row))
            .await
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(stored.summary)
}

/// `GET /.well-known/oauth-client/gsv.json`: this kernel as an OAuth
/// client, for authorization servers that take a metadata URL as
/// `client_id` (the document names itself as its `client_id`).
pub async fn client_metadata(State(k): State<Arc<Kernel>>) -> Response {
    let Some(origin) = k.oauth.origin() else {
        return (StatusCode::NOT_FOUND, "no public URL configured").into_response();
    };
    axum::Json(client_metadata_document(origin)).into_response()
}

fn client_metadata_document(origin: &str) -> Value {
    json!({
        "client_id": format!("{origin}{CLIENT_METADATA_PATH}"),
        "client_name": "gsv",
        "client_uri": origin,
        "redirect_uris": [format!("{origin}{CALLBACK_PATH}")],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_metadata_document_names_itself_and_the_callback() {
        let d = client_metadata_document("https://gsv.example");
        assert_eq!(
            d["client_id"],
            "https://gsv.example/.well-known/oauth-client/gsv.json"
        );
        assert_eq!(
            d["redirect_uris"],
            json!(["https://gsv.example/oauth/callback"])
        );
        assert_eq!(d["token_endpoint_auth_method"], "none");
    }
}
