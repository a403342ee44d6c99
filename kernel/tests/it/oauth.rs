//! `sys.oauth.*`, `GET /oauth/callback` and MCP servers behind OAuth,
//! over a real WebSocket against a real MCP server that requires OAuth
//! and its real authorization server (`kernel/tests/mcp/oauth_server.py`,
//! the Python SDK's). The browser step is an HTTP client following the
//! authorization server's redirect to the kernel's callback.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::harness::{BOB_PW, TestKernel, err_of};
use crate::mcp::McpServer;
use crate::proc::Watcher;

/// The kernel's HTTP origin (`http://127.0.0.1:PORT`).
fn origin(k: &TestKernel) -> String {
    k.url
        .replace("ws://", "http://")
        .trim_end_matches("/ws")
        .to_owned()
}

/// The MCP server's origin (its authorization server's too).
fn server_origin(mcp: &McpServer) -> String {
    mcp.url.trim_end_matches("/mcp").to_owned()
}

fn query(url: &str) -> BTreeMap<String, String> {
    reqwest::Url::parse(url)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

/// What the browser does: follows the authorization server's redirect to
/// the kernel's callback; the final status, URL and page.
async fn browse(url: &str) -> (u16, String, String) {
    let res = reqwest::get(url).await.unwrap();
    let (status, at) = (res.status().as_u16(), res.url().to_string());
    (status, at, res.text().await.unwrap())
}

async fn stats(mcp: &McpServer) -> Value {
    reqwest::get(format!("{}/test/stats", server_origin(mcp)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn sealed_tokens(k: &TestKernel) -> Vec<String> {
    k.kernel
        .db()
        .call(|c| {
            let mut stmt = c.prepare("SELECT access_token FROM oauth_accounts")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<Result<Vec<String>, _>>()?)
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn an_mcp_server_behind_oauth_authenticates_then_becomes_ready() {
    let Some(mcp) = McpServer::start_script("oauth_server.py", &[]).await else {
        return;
    };
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let added = a
        .call("sys.mcp.add", json!({"name": "Guarded", "url": mcp.url}))
        .await;
    let server = &added["server"];
    assert_eq!(server["state"], "authenticating", "{added}");
    let server_id = server["serverId"].clone();
    let auth_url = server["authUrl"].as_str().unwrap().to_owned();
    assert!(
        auth_url.starts_with(&format!("{}/authorize?", server_origin(&mcp))),
        "{auth_url}"
    );
    let q = query(&auth_url);
    assert_eq!(q["response_type"], "code");
    assert_eq!(q["code_challenge_method"], "S256");
    assert_eq!(q["resource"], mcp.url);
    assert_eq!(q["redirect_uri"], format!("{}/oauth/callback", origin(&k)));
    assert_eq!(q["state"].len(), 43, "32 random bytes, base64url");
    // Until the sign-in, calling it says so.
    let f = a
        .request(
            "sys.mcp.call",
            json!({"serverId": server_id, "name": "whoami"}),
        )
        .await;
    let (code, msg) = err_of(&f);
    assert_eq!(code, 400);
    assert!(msg.contains("needs OAuth sign-in"), "{msg}");
    let pending = a
        .call("sys.oauth.list", json!({"includePending": true}))
        .await;
    assert_eq!(pending["accounts"], json!([]));
    let flow = &pending["flows"][0];
    assert_eq!(flow["kind"], "mcp-server");
    assert_eq!(flow["provider"], mcp.url);
    assert_eq!(flow["accountKey"], server_id);
    assert_eq!(
        flow["expiresAt"].as_i64().unwrap() - flow["createdAt"].as_i64().unwrap(),
        10 * 60 * 1000
    );
    // The browser step: the authorization server approves and redirects
    // to the kernel's callback.
    let (status, at, page) = browse(&auth_url).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        at.starts_with(&format!("{}/oauth/callback?", origin(&k))),
        "{at}"
    );
    assert!(page.contains("Signed in"), "{page}");
    let id = server_id.clone();
    a.signal("mcp.changed", move |p| {
        p["serverId"] == id && p["state"] == "ready"
    })
    .await;
    let listed = a.call("sys.mcp.list", json!({})).await;
    let s = &listed["servers"][0];
    assert_eq!(s["state"], "ready", "{listed}");
    assert_eq!(s["authUrl"], Value::Null);
    assert_eq!(s["tools"][0]["name"], "whoami");
    let r = a
        .call(
            "sys.mcp.call",
            json!({"serverId": server_id, "name": "whoami"}),
        )
        .await;
    assert_eq!(r["content"][0]["text"], "signed in", "{r}");
    // The account: listed without tokens, stored sealed.
    let listed = a
        .call("sys.oauth.list", json!({"includePending": true}))
        .await;
    assert_eq!(listed["flows"], json!([]), "the flow was used up");
    let account = &listed["accounts"][0];
    assert_eq!(account["kind"], "mcp-server");
    assert_eq!(account["provider"], mcp.url);
    assert_eq!(account["accountKey"], server_id);
    assert_eq!(account["tokenType"], "Bearer");
    let mut keys: Vec<&str> = account
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "accountId",
            "accountKey",
            "clientId",
            "createdAt",
            "expiresAt",
            "kind",
            "label",
            "lastUsedAt",
            "metadata",
            "provider",
            "resource",
            "scope",
            "tokenType",
            "uid",
            "updatedAt"
        ]
    );
    let token = stats(&mcp).await["lastAccessToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!listed.to_string().contains(&token));
    let sealed = sealed_tokens(&k).await;
    assert_eq!(sealed.len(), 1);
    assert!(!sealed[0].contains(&token), "stored sealed");
    let key = std::fs::metadata(k.kernel.config().data_dir.join("oauth.key")).unwrap();
    assert_eq!(key.len(), 32);
}

#[tokio::test]
async fn an_expired_token_is_refreshed_before_it_is_used() {
    // Tokens that live 20 s are inside the kernel's 30 s refresh margin:
    // every use refreshes first.
    let Some(mcp) =
        McpServer::start_script("oauth_server.py", &[("GSV_TEST_TOKEN_TTL", "20")]).await
    else {
        return;
    };
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let added = a
        .call("sys.mcp.add", json!({"name": "Guarded", "url": mcp.url}))
        .await;
    let server_id = added["server"]["serverId"].clone();
    let (status, _, page) = browse(added["server"]["authUrl"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{page}");
    let id = server_id.clone();
    a.signal("mcp.changed", move |p| {
        p["serverId"] == id && p["state"] == "ready"
    })
    .await;
    let first = stats(&mcp).await;
    assert_eq!(first["codes"], 1);
    assert!(first["refreshes"].as_u64().unwrap() >= 1, "{first}");
    let before = a.call("sys.oauth.list", json!({})).await["accounts"][0].clone();
    let r = a
        .call("sys.mcp.refresh", json!({"serverId": server_id}))
        .await;
    assert_eq!(r["server"]["state"], "ready", "{r}");
    let after_stats = stats(&mcp).await;
    assert!(
        after_stats["refreshes"].as_u64() > first["refreshes"].as_u64(),
        "{after_stats}"
    );
    assert_eq!(after_stats["codes"], 1, "no new sign-in");
    let after = a.call("sys.oauth.list", json!({})).await["accounts"][0].clone();
    assert_eq!(after["accountId"], before["accountId"]);
    assert!(after["expiresAt"].as_i64() >= before["expiresAt"].as_i64());
    let token = after_stats["lastAccessToken"].as_str().unwrap();
    assert!(!sealed_tokens(&k).await[0].contains(token));
}

#[tokio::test]
async fn a_generic_flow_stores_an_account_its_owner_alone_sees_and_forgets() {
    let Some(mcp) = McpServer::start_script("oauth_server.py", &[]).await else {
        return;
    };
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let redirect = format!("{}/oauth/callback", origin(&k));
    // The user registered gsv with the provider (here: dynamically).
    let client: Value = reqwest::Client::new()
        .post(format!("{}/register", server_origin(&mcp)))
        .json(&json!({"client_name": "gsv", "redirect_uris": [redirect],
                      "token_endpoint_auth_method": "none",
                      "grant_types": ["authorization_code", "refresh_token"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let client_id = client["client_id"].as_str().unwrap().to_owned();
    let started = a
        .call(
            "sys.oauth.start",
            json!({"kind": "generic", "provider": "test-as", "label": "Test AS",
                   "authorizationEndpoint": format!("{}/authorize", server_origin(&mcp)),
                   "tokenEndpoint": format!("{}/token", server_origin(&mcp)),
                   "clientId": client_id, "redirectUri": redirect,
                   "extraAuthParams": {"prompt": "consent"}}),
        )
        .await;
    let q = query(started["authorizationUrl"].as_str().unwrap());
    assert_eq!(q["client_id"], client_id);
    assert_eq!(q["prompt"], "consent");
    assert_eq!(q["code_challenge_method"], "S256");
    let flow = &started["flow"];
    assert_eq!(flow["kind"], "generic");
    assert_eq!(flow["accountKey"], "default");
    assert_eq!(flow["label"], "Test AS");
    // Bob sees none of Alice's flows.
    let mut b = Watcher::new(k.login("bob", BOB_PW).await);
    let bobs = b
        .call("sys.oauth.list", json!({"includePending": true}))
        .await;
    assert_eq!(bobs, json!({"accounts": [], "flows": []}));
    let (status, _, page) = browse(started["authorizationUrl"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{page}");
    let listed = a.call("sys.oauth.list", json!({})).await;
    let account = listed["accounts"][0].clone();
    assert_eq!(account["provider"], "test-as");
    assert_eq!(account["clientId"], client_id);
    assert!(listed.get("flows").is_none(), "{listed}");
    let account_id = account["accountId"].clone();
    // Another user's account: not found, not forgotten, not listed.
    let f = b
        .request("sys.oauth.forget", json!({"accountId": account_id}))
        .await;
    assert_eq!(f["data"], json!({"forgotten": false}), "{f}");
    let f = b
        .request("sys.oauth.list", json!({"uid": account["uid"]}))
        .await;
    assert_eq!(err_of(&f).0, 403);
    assert_eq!(
        a.call("sys.oauth.list", json!({})).await["accounts"][0]["accountId"],
        account_id
    );
    let gone = a
        .call("sys.oauth.forget", json!({"accountId": account_id}))
        .await;
    assert_eq!(gone, json!({"forgotten": true}));
    assert_eq!(
        a.call("sys.oauth.list", json!({})).await["accounts"],
        json!([])
    );
}

#[tokio::test]
async fn bad_flows_and_unknown_callbacks_are_refused_and_store_nothing() {
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let redirect = format!("{}/oauth/callback", origin(&k));
    let start = |patch: Value| {
        let mut args = json!({"kind": "generic", "provider": "p", "clientId": "c",
            "authorizationEndpoint": "https://as.example/authorize",
            "tokenEndpoint": "https://as.example/token", "redirectUri": redirect});
        for (key, v) in patch.as_object().unwrap() {
            args[key] = v.clone();
        }
        args
    };
    for (patch, names) in [
        (
            json!({"extraAuthParams": {"state": "mine"}}),
            "extraAuthParams.state",
        ),
        (
            json!({"extraAuthParams": {"code_challenge": "x"}}),
            "extraAuthParams.code_challenge",
        ),
        (
            json!({"redirectUri": format!("{}/elsewhere", origin(&k))}),
            "redirectUri",
        ),
        (
            json!({"authorizationEndpoint": "http://as.example/authorize"}),
            "authorizationEndpoint",
        ),
        (json!({"provider": " "}), "provider"),
    ] {
        let f = a.request("sys.oauth.start", start(patch)).await;
        let (code, msg) = err_of(&f);
        assert_eq!(code, 400, "{f}");
        assert!(msg.contains(names), "{names}: {msg}");
    }
    let f = a.request("sys.oauth.start", start(json!({"uid": 0}))).await;
    assert_eq!(err_of(&f).0, 403);
    let pending = a
        .call("sys.oauth.list", json!({"includePending": true}))
        .await;
    assert_eq!(pending, json!({"accounts": [], "flows": []}));
    // A real flow exists; a callback with another state is still 400.
    a.call("sys.oauth.start", start(json!({}))).await;
    for url in [
        format!("{}/oauth/callback?state=not-a-flow&code=abc", origin(&k)),
        format!("{}/oauth/callback?code=abc", origin(&k)),
    ] {
        let res = reqwest::get(&url).await.unwrap();
        assert_eq!(res.status().as_u16(), 400, "{url}");
    }
    let listed = a
        .call("sys.oauth.list", json!({"includePending": true}))
        .await;
    assert_eq!(listed["accounts"], json!([]));
    assert_eq!(listed["flows"].as_array().unwrap().len(), 1, "untouched");
    // The client metadata document names itself and the callback.
    let doc: Value = reqwest::get(format!("{}/.well-known/oauth-client/gsv.json", origin(&k)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        doc["client_id"],
        format!("{}/.well-known/oauth-client/gsv.json", origin(&k))
    );
    assert_eq!(doc["redirect_uris"], json!([redirect]));
}
