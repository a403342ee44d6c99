//! `gsv oauth list|forget`: thin clients of `sys.oauth.list` and
//! `sys.oauth.forget`. Tables are tab-separated lines; `--json` prints the
//! call's data instead. Tokens are never shown (no call returns them).

use anyhow::Result;
use clap::Subcommand;
use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};

#[derive(Debug, Subcommand)]
pub enum OAuthAction {
    /// Print your OAuth accounts, one line each: `account`, id, kind,
    /// provider, account key, token expiry, label (tab-separated).
    List {
        /// Also sign-ins still waiting for their callback, as `flow` lines
        /// (id, kind, provider, account key, expiry, label).
        #[arg(long)]
        pending: bool,
        /// Root only: another user's (all users' when root omits it).
        #[arg(long)]
        uid: Option<i64>,
        #[arg(long)]
        json: bool,
    },
    /// Delete an OAuth account (its tokens go with it). Fails when no
    /// account of yours has that id.
    Forget { account_id: String },
}

fn time(ms: &Value) -> String {
    ms.as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || "-".into(),
            |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        )
}

fn line(tag: &str, id: &Value, r: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    format!(
        "{tag}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        s(id),
        s(&r["kind"]),
        s(&r["provider"]),
        s(&r["accountKey"]),
        time(&r["expiresAt"]),
        s(&r["label"]),
    )
}

/// The lines `gsv oauth list` prints for `sys.oauth.list`'s data.
fn table(d: &Value) -> String {
    let mut text = String::new();
    for a in d["accounts"].as_array().into_iter().flatten() {
        text.push_str(&line("account", &a["accountId"], a));
    }
    for f in d["flows"].as_array().into_iter().flatten() {
        text.push_str(&line("flow", &f["flowId"], f));
    }
    text
}

pub async fn oauth(c: &mut GsvClient, action: OAuthAction) -> Result<bool> {
    match action {
        OAuthAction::List { pending, uid, json } => {
            let mut args = json!({"includePending": pending});
            if let Some(u) = uid {
                args["uid"] = json!(u);
            }
            let d = c.call("sys.oauth.list", args).await?;
            if json {
                super::out(&format!("{}\n", serde_json::to_string_pretty(&d)?))?;
            } else {
                super::out(&table(&d))?;
            }
            Ok(true)
        }
        OAuthAction::Forget { account_id } => {
            let d = c
                .call("sys.oauth.forget", json!({"accountId": account_id}))
                .await?;
            if d["forgotten"] == true {
                super::out(&format!("forgotten\t{account_id}\n"))?;
                Ok(true)
            } else {
                eprintln!("gsv: no OAuth account of yours is {account_id}");
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_and_pending_flows_print_as_tagged_lines() {
        let d = json!({
            "accounts": [{"accountId": "oauth_1", "kind": "generic", "provider": "p",
                          "accountKey": "default", "expiresAt": 0, "label": null}],
            "flows": [{"flowId": "oauthflow_2", "kind": "mcp-server", "provider": "http://x/mcp",
                       "accountKey": "mcp_1", "expiresAt": null, "label": "X"}],
        });
        assert_eq!(
            table(&d),
            "account\toauth_1\tgeneric\tp\tdefault\t1970-01-01T00:00:00Z\t-\n\
             flow\toauthflow_2\tmcp-server\thttp://x/mcp\tmcp_1\t-\tX\n"
        );
    }
}
