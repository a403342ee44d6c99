//! `gsv adapter connect|disconnect|status` and `gsv auth link|link-list|
//! unlink`: the reference CLI's commands of the same names, with its
//! flags and its output lines; `gsv adapter matrix` runs an adapter
//! ([`super::adapter_matrix`]).

use anyhow::{Result, bail};
use clap::Subcommand;
use gsv_kernel::client::GsvClient;
use gsv_protocol::OpResult;
use gsv_protocol::adapter::{ConnectChallenge, ConnectResult, DisconnectResult, StatusResult};
use gsv_protocol::link::{LinkResult, ListResult, UnlinkResult};
use serde_json::{Value, json};

use super::conn::explain;

#[derive(Debug, Subcommand)]
pub enum AdapterAction {
    /// Run the Matrix adapter: log in as the bot (the global `--user
    /// @bot:SERVER`), relay its DMs and room messages to the kernel
    /// (`adapter.inbound`) and post what the kernel sends
    /// (`adapter.send`), until SIGTERM or Ctrl-C.
    Matrix(super::adapter_matrix::MatrixArgs),
    #[command(flatten)]
    Call(AdapterCall),
}

/// The calls a user makes on a connected adapter (`adapter.*`).
#[derive(Debug, Subcommand)]
pub enum AdapterCall {
    /// Connect (start) an adapter account.
    Connect {
        /// The adapter (e.g. matrix).
        #[arg(long)]
        adapter: String,
        #[arg(long = "account-id", default_value = "default")]
        account_id: String,
        /// Adapter-specific config, a JSON object.
        #[arg(long = "config-json")]
        config_json: Option<String>,
    },
    /// Disconnect (stop) an adapter account.
    Disconnect {
        #[arg(long)]
        adapter: String,
        #[arg(long = "account-id", default_value = "default")]
        account_id: String,
    },
    /// Show an adapter's accounts: connected, authenticated, mode, last
    /// activity, error.
    Status {
        #[arg(long)]
        adapter: String,
        #[arg(long = "account-id")]
        account_id: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuthAction {
    /// Link a chat identity to your account: the one-time CODE an adapter
    /// posted in a direct message, or (your own, or root's for any uid)
    /// --adapter/--account-id/--actor-id.
    Link {
        /// The one-time code (e.g. ABCD-EFGH).
        code: Option<String>,
        #[arg(long)]
        adapter: Option<String>,
        #[arg(long = "account-id")]
        account_id: Option<String>,
        #[arg(long = "actor-id")]
        actor_id: Option<String>,
        /// The account to link to (root only for another uid).
        #[arg(long)]
        uid: Option<i64>,
    },
    /// List linked chat identities (yours; root: all or --uid's).
    LinkList {
        #[arg(long)]
        uid: Option<i64>,
    },
    /// Remove a link.
    Unlink {
        #[arg(long)]
        adapter: String,
        #[arg(long = "account-id")]
        account_id: String,
        #[arg(long = "actor-id")]
        actor_id: String,
    },
}

pub async fn adapter(c: &mut GsvClient, action: AdapterCall) -> Result<bool> {
    match action {
        AdapterCall::Connect {
            adapter,
            account_id,
            config_json,
        } => {
            let config = match config_json {
                None => json!({}),
                Some(raw) => match serde_json::from_str::<Value>(&raw) {
                    Ok(v) if v.is_object() => v,
                    Ok(_) => bail!("--config-json must be a JSON object"),
                    Err(e) => bail!("--config-json must be valid JSON: {e}"),
                },
            };
            let d = c
                .call(
                    "adapter.connect",
                    json!({"adapter": adapter, "accountId": account_id, "config": config}),
                )
                .await
                .map_err(explain)?;
            match serde_json::from_value::<ConnectResult>(d)? {
                ConnectResult::Connected(done) => {
                    let r = done.result;
                    println!(
                        "Adapter {}:{} connected={} authenticated={}",
                        r.adapter, r.account_id, r.connected, r.authenticated
                    );
                    if let Some(m) = r.message.filter(|m| !m.trim().is_empty()) {
                        println!("message: {m}");
                    }
                    if let Some(ch) = &r.challenge {
                        print_challenge(ch);
                    }
                    Ok(true)
                }
                ConnectResult::Failed(f) => {
                    if let Some(ch) = &f.challenge {
                        print_challenge(ch);
                    }
                    eprintln!("error: {}", f.error);
                    Ok(false)
                }
            }
        }
        AdapterCall::Disconnect {
            adapter,
            account_id,
        } => {
            let d = c
                .call(
                    "adapter.disconnect",
                    json!({"adapter": adapter, "accountId": account_id}),
                )
                .await
                .map_err(explain)?;
            match serde_json::from_value::<DisconnectResult>(d)? {
                OpResult::Done(done) => {
                    let r = done.result;
                    println!("Disconnected adapter {}:{}", r.adapter, r.account_id);
                    if let Some(m) = r.message.filter(|m| !m.trim().is_empty()) {
                        println!("message: {m}");
                    }
                    Ok(true)
                }
                OpResult::Failed(f) => {
                    eprintln!("error: {}", f.error);
                    Ok(false)
                }
            }
        }
        AdapterCall::Status {
            adapter,
            account_id,
        } => {
            let mut args = json!({"adapter": adapter});
            if let Some(a) = account_id {
                args["accountId"] = json!(a);
            }
            let d = c.call("adapter.status", args).await.map_err(explain)?;
            let r: StatusResult = serde_json::from_value(d)?;
            if r.accounts.is_empty() {
                println!("adapter={} (no accounts)", r.adapter);
            }
            for a in &r.accounts {
                println!(
                    "{}:{} connected={} authenticated={} mode={} last_activity={} error={}",
                    r.adapter,
                    a.account_id,
                    a.connected,
                    a.authenticated,
                    a.mode.as_deref().unwrap_or("-"),
                    a.last_activity.map_or_else(|| "-".into(), format_ms),
                    a.error.as_deref().unwrap_or("-"),
                );
            }
            Ok(true)
        }
    }
}

/// A connect challenge: what to do, never its data (it may be a
/// credential).
fn print_challenge(ch: &ConnectChallenge) {
    println!("challenge.type: {}", ch.kind);
    if let Some(m) = &ch.message {
        println!("challenge.message: {m}");
    }
    if let Some(at) = ch.expires_at {
        println!("challenge.expires: {}", format_ms(at));
    }
    if ch.data.is_some() {
        println!("challenge.data: available (hidden)");
    }
}

pub async fn auth(c: &mut GsvClient, action: AuthAction) -> Result<bool> {
    match action {
        AuthAction::Link {
            code,
            adapter,
            account_id,
            actor_id,
            uid,
        } => {
            let manual =
                adapter.is_some() || account_id.is_some() || actor_id.is_some() || uid.is_some();
            let (call, args) = match (code, manual) {
                (Some(_), true) => {
                    bail!("auth link: either a one-time CODE or --adapter/--account-id/--actor-id")
                }
                (Some(code), false) => ("sys.link.consume", json!({"code": code})),
                (None, _) => {
                    let (Some(adapter), Some(account_id), Some(actor_id)) =
                        (adapter, account_id, actor_id)
                    else {
                        bail!("auth link needs a CODE, or --adapter, --account-id and --actor-id");
                    };
                    let mut a =
                        json!({"adapter": adapter, "accountId": account_id, "actorId": actor_id});
                    if let Some(uid) = uid {
                        a["uid"] = json!(uid);
                    }
                    ("sys.link", a)
                }
            };
            let d = c.call(call, args).await.map_err(explain)?;
            let r: LinkResult = serde_json::from_value(d)?;
            match (r.linked, r.link) {
                (true, Some(l)) => println!(
                    "Linked {}:{}:{} -> uid {}",
                    l.adapter, l.account_id, l.actor_id, l.uid
                ),
                (true, None) => println!("linked"),
                (false, _) => println!("not linked"),
            }
            Ok(r.linked)
        }
        AuthAction::LinkList { uid } => {
            let args = uid.map_or_else(|| json!({}), |u| json!({"uid": u}));
            let d = c.call("sys.link.list", args).await.map_err(explain)?;
            let r: ListResult = serde_json::from_value(d)?;
            if r.links.is_empty() {
                println!("(no links)");
            }
            for l in &r.links {
                println!(
                    "{}:{}:{} -> uid={} created={} linked_by={}",
                    l.adapter,
                    l.account_id,
                    l.actor_id,
                    l.uid,
                    format_ms(l.created_at),
                    l.linked_by_uid
                );
            }
            Ok(true)
        }
        AuthAction::Unlink {
            adapter,
            account_id,
            actor_id,
        } => {
            let d = c
                .call(
                    "sys.unlink",
                    json!({"adapter": adapter, "accountId": account_id, "actorId": actor_id}),
                )
                .await
                .map_err(explain)?;
            let r: UnlinkResult = serde_json::from_value(d)?;
            println!("{}", if r.removed { "unlinked" } else { "not found" });
            Ok(r.removed)
        }
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC), as the reference prints.
fn format_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| ms.to_string())
}
