//! `gsv sched list|add|rm|run`, `gsv notify` and `gsv notifications`:
//! thin clients of `sched.*` and `notification.*`. Tables are
//! tab-separated lines; `--json` prints the call's data instead.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};

#[derive(Debug, Subcommand)]
pub enum SchedAction {
    /// Print your schedules: id, enabled, next run, last status, runs,
    /// name, expression (tab-separated).
    List {
        /// Disabled ones too.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Add a schedule and print its id. One of --at/--after/--every/--cron,
    /// and --prompt (spawns a `cron` process) or --pid with --message.
    Add(Box<AddArgs>),
    /// Remove a schedule.
    Rm { id: String },
    /// Run what is due now, or schedule ID (`--force`: even if not due;
    /// its next run stays). Prints id, status, summary or error.
    Run {
        id: Option<String>,
        #[arg(long, requires = "id")]
        force: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct AddArgs {
    name: String,
    /// Once, at this time: RFC 3339 (`2026-12-01T09:00:00Z`) or epoch ms.
    #[arg(long, group = "when")]
    at: Option<String>,
    /// Once, this long from now (`90s`, `5m`, `1h`).
    #[arg(long, group = "when")]
    after: Option<String>,
    /// Repeatedly, this often (`30s`, `1h`; at least 1 s).
    #[arg(long, group = "when")]
    every: Option<String>,
    /// A five-field cron expression (`"0 9 * * 1-5"`).
    #[arg(long, group = "when")]
    cron: Option<String>,
    /// The cron zone (default: config/server/timezone, else UTC).
    #[arg(long, requires = "cron")]
    tz: Option<String>,
    /// Spawn a process with this first message.
    #[arg(long, conflicts_with = "pid")]
    prompt: Option<String>,
    /// The spawned process's profile (default `cron`).
    #[arg(long, requires = "prompt")]
    profile: Option<String>,
    /// The spawned process's label (default: the schedule's name).
    #[arg(long, requires = "prompt")]
    label: Option<String>,
    /// Send --message to this process instead.
    #[arg(long, requires = "message")]
    pid: Option<String>,
    #[arg(long, requires = "pid")]
    message: Option<String>,
    #[arg(long, requires = "pid")]
    conversation: Option<String>,
    #[arg(long)]
    description: Option<String>,
    /// Add it disabled.
    #[arg(long)]
    disabled: bool,
    /// Print the whole record.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct NotifyArgs {
    title: String,
    #[arg(long)]
    body: Option<String>,
    /// info, success, warning or error.
    #[arg(long)]
    level: Option<String>,
    /// How long it lives unread (`10m`, `2d`; 1 s to 90 d, default 30 d).
    #[arg(long)]
    ttl: Option<String>,
    /// Print the whole record instead of its id.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct NotificationsArgs {
    /// Unread ones only.
    #[arg(long)]
    unread: bool,
    /// Dismissed ones too.
    #[arg(long)]
    dismissed: bool,
    /// At most this many (1 to 500, default 100).
    #[arg(long)]
    limit: Option<u32>,
    /// Mark this notification read instead of listing.
    #[arg(long, value_name = "ID", conflicts_with = "dismiss")]
    read: Option<String>,
    /// Dismiss this notification instead of listing.
    #[arg(long, value_name = "ID")]
    dismiss: Option<String>,
    #[arg(long)]
    json: bool,
}

fn millis(d: &str, flag: &str) -> Result<i64> {
    let d = humantime::parse_duration(d).with_context(|| format!("{flag}: not a duration"))?;
    Ok(d.as_millis() as i64)
}

fn instant(s: &str) -> Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .context("--at: RFC 3339 time or epoch milliseconds")
}

fn time(ms: &Value) -> String {
    ms.as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || "-".into(),
            |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        )
}

fn expression_text(e: &Value) -> String {
    match e["kind"].as_str().unwrap_or("") {
        "at" => format!("at {}", time(&e["atMs"])),
        "after" => format!("after {}ms", e["afterMs"]),
        "every" => format!("every {}ms", e["everyMs"]),
        "cron" => format!(
            "cron {} {}",
            e["expr"].as_str().unwrap_or(""),
            e["timezone"].as_str().unwrap_or("")
        ),
        k => k.to_owned(),
    }
}

fn print_json(v: &Value) -> Result<()> {
    super::out(&format!("{}\n", serde_json::to_string_pretty(v)?))
}

pub async fn sched(c: &mut GsvClient, action: SchedAction) -> Result<bool> {
    match action {
        SchedAction::List { all, json } => {
            let d = c
                .call(
                    "sched.list",
                    json!({"includeDisabled": all, "limit": super::MAX_PAGE}),
                )
                .await?;
            if json {
                return print_json(&d).map(|()| true);
            }
            let mut text = String::new();
            for s in d["schedules"].as_array().into_iter().flatten() {
                let st = &s["state"];
                text.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                    s["id"].as_str().unwrap_or(""),
                    if s["enabled"] == true { "on" } else { "off" },
                    time(&st["nextRunAtMs"]),
                    st["lastStatus"].as_str().unwrap_or("-"),
                    st["runCount"],
                    s["name"].as_str().unwrap_or(""),
                    expression_text(&s["expression"]),
                ));
            }
            super::out(&text)?;
            Ok(true)
        }
        SchedAction::Add(a) => {
            let expression = match (&a.at, &a.after, &a.every, &a.cron) {
                (Some(at), ..) => json!({"kind": "at", "atMs": instant(at)?}),
                (_, Some(d), ..) => json!({"kind": "after", "afterMs": millis(d, "--after")?}),
                (_, _, Some(d), _) => json!({"kind": "every", "everyMs": millis(d, "--every")?}),
                (.., Some(expr)) => json!({"kind": "cron", "expr": expr, "timezone": a.tz}),
                _ => bail!("say when: --at, --after, --every or --cron"),
            };
            let target = match (&a.prompt, &a.pid) {
                (Some(p), _) => {
                    json!({"kind": "process.spawn", "prompt": p, "profile": a.profile, "label": a.label})
                }
                (_, Some(pid)) => json!({"kind": "process.event", "pid": pid,
                    "message": a.message, "conversationId": a.conversation}),
                _ => bail!("say what: --prompt, or --pid with --message"),
            };
            let d = c
                .call(
                    "sched.add",
                    json!({"name": a.name, "description": a.description, "enabled": !a.disabled,
                           "expression": strip_nulls(expression), "target": strip_nulls(target)}),
                )
                .await?;
            if a.json {
                print_json(&d["schedule"])?;
            } else {
                super::out(&format!("{}\n", d["schedule"]["id"].as_str().unwrap_or("")))?;
            }
            Ok(true)
        }
        SchedAction::Rm { id } => {
            let d = c.call("sched.remove", json!({"id": id})).await?;
            if d["removed"] != true {
                eprintln!("no schedule {id}");
                return Ok(false);
            }
            Ok(true)
        }
        SchedAction::Run { id, force, json } => {
            let mode = if force { "force" } else { "due" };
            let d = c.call("sched.run", json!({"id": id, "mode": mode})).await?;
            if json {
                print_json(&d)?;
            } else {
                let mut text = String::new();
                for r in d["results"].as_array().into_iter().flatten() {
                    text.push_str(&format!(
                        "{}\t{}\t{}\n",
                        r["scheduleId"].as_str().unwrap_or(""),
                        r["status"].as_str().unwrap_or(""),
                        r["summary"].as_str().or(r["error"].as_str()).unwrap_or("")
                    ));
                }
                super::out(&text)?;
            }
            let failed = d["results"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["status"] == "error");
            Ok(!failed)
        }
    }
}

/// The target and expression leave out flags that were not given.
fn strip_nulls(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.retain(|_, x| !x.is_null());
    }
    v
}

pub async fn notify(c: &mut GsvClient, a: NotifyArgs) -> Result<bool> {
    let ttl = a.ttl.as_deref().map(|t| millis(t, "--ttl")).transpose()?;
    let d = c
        .call(
            "notification.create",
            strip_nulls(json!({"title": a.title, "body": a.body, "level": a.level, "ttlMs": ttl})),
        )
        .await?;
    if a.json {
        print_json(&d["notification"])?;
    } else {
        super::out(&format!(
            "{}\n",
            d["notification"]["notificationId"].as_str().unwrap_or("")
        ))?;
    }
    Ok(true)
}

pub async fn notifications(c: &mut GsvClient, a: NotificationsArgs) -> Result<bool> {
    let marked = match (&a.read, &a.dismiss) {
        (Some(id), _) => Some(("notification.mark_read", id)),
        (_, Some(id)) => Some(("notification.dismiss", id)),
        _ => None,
    };
    if let Some((call, id)) = marked {
        let d = c.call(call, json!({"notificationId": id})).await?;
        if d["notification"].is_null() {
            eprintln!("no notification {id}");
            return Ok(false);
        }
        if a.json {
            print_json(&d["notification"])?;
        }
        return Ok(true);
    }
    let d = c
        .call(
            "notification.list",
            strip_nulls(
                json!({"includeRead": !a.unread, "includeDismissed": a.dismissed,
                               "limit": a.limit}),
            ),
        )
        .await?;
    if a.json {
        return print_json(&d).map(|()| true);
    }
    let mut text = String::new();
    for n in d["notifications"].as_array().into_iter().flatten() {
        let state = if !n["dismissedAt"].is_null() {
            "dismissed"
        } else if !n["readAt"].is_null() {
            "read"
        } else {
            "unread"
        };
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            n["notificationId"].as_str().unwrap_or(""),
            time(&n["createdAt"]),
            n["level"].as_str().unwrap_or(""),
            state,
            n["title"].as_str().unwrap_or("")
        ));
    }
    super::out(&text)?;
    Ok(true)
}
