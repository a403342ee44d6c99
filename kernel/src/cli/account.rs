//! The first run, one command each: `gsv setup`, `gsv login`,
//! `gsv config get|set` and `gsv token create`.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};
use gsv_kernel::client::{Credentials, GsvClient};
use serde_json::{Value, json};

use super::conn::{ClientConfig, ConnArgs, connect_resolved, dial, explain, fresh_client_id};

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Root's password; without it root stays locked (log in as the first
    /// user, who can do everything a user can).
    #[arg(long, env = "GSV_ROOT_PASSWORD", hide_env_values = true)]
    root_password: Option<String>,
    /// The model agent processes use (`config/ai/model`), e.g. `qwen2.5:7b`.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// An OpenAI-compatible server's base URL (`config/ai/base_url`), e.g.
    /// `http://127.0.0.1:11434/v1` for Ollama.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Its API key (`config/ai/api_key`), if it wants one.
    #[arg(long, env = "GSV_AI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Only set up: do not log in and write the client config.
    #[arg(long)]
    no_login: bool,
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// A label for the token `gsv login` creates (shown by
    /// `sys.token.list`).
    #[arg(long, default_value = "gsv login")]
    label: String,
}

#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Set KEY to VALUE. A dotted KEY (`ai.model`, `ai.base_url`,
    /// `ai.api_key`) is your own setting (`users/<uid>/ai/model`), or with
    /// `--system` everyone's default (`config/ai/model`, root only); a KEY
    /// with `/` is used as it is.
    Set {
        key: String,
        value: String,
        /// The kernel-wide default instead of your own (root only).
        #[arg(long)]
        system: bool,
    },
    /// Print the entries you may see, one a line: key, value
    /// (tab-separated). A dotted KEY shows your own and the kernel-wide
    /// one.
    Get { key: Option<String> },
}

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Create a token. With `--node DEVICE`: a node token bound to DEVICE,
    /// written to a file for `gsv node --token-file`; with `--service`: a
    /// chat adapter's token (role service), written to a file; without: a
    /// user token for `gsv login --token`, printed.
    Create {
        /// The device the node token is for.
        #[arg(long, value_name = "DEVICE", conflicts_with = "service")]
        node: Option<String>,
        /// A service token, for a chat adapter's `--token-file`.
        #[arg(long)]
        service: bool,
        /// Where to write a node or service token [default: ./DEVICE.token,
        /// ./service.token].
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// A label (shown by `sys.token.list`).
        #[arg(long)]
        label: Option<String>,
    },
}

/// Asks on the terminal; `None` when stdin is not one (a script must pass
/// the flag).
fn ask(question: &str) -> Result<Option<String>> {
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    eprint!("{question}");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading stdin")?;
    Ok(Some(line.trim().to_owned()).filter(|l| !l.is_empty()))
}

/// Asks for a password without echo; `None` when stdin is not a terminal.
fn ask_password(question: &str, confirm: bool) -> Result<Option<String>> {
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    let pw = rpassword::prompt_password(question).context("reading the password")?;
    if confirm && rpassword::prompt_password("Again: ").context("reading the password")? != pw {
        bail!("the two passwords differ");
    }
    Ok(Some(pw))
}

pub async fn setup(conn: &ConnArgs, a: SetupArgs) -> Result<ExitCode> {
    let r = conn.resolve()?;
    let user = match conn.user.clone() {
        Some(u) => u,
        None => ask("Username for the first account: ")?
            .ok_or_else(|| anyhow!("give the first account's name with --user NAME"))?,
    };
    let password = match conn.password.clone() {
        Some(p) => p,
        None => ask_password(&format!("Password for {user}: "), true)?.ok_or_else(|| {
            anyhow!("give the first account's password with --password (or GSV_PASSWORD)")
        })?,
    };
    let model = match a.model {
        Some(m) => Some(m),
        None => ask("Model for agents (Enter to skip; `gsv config set ai.model` later): ")?,
    };
    let base_url = match (&model, a.base_url) {
        (_, Some(u)) => Some(u),
        (Some(_), None) => {
            ask("Its OpenAI-compatible base URL (e.g. http://127.0.0.1:11434/v1): ")?
        }
        (None, None) => None,
    };
    let mut args = json!({"username": user, "password": password});
    if let Some(rp) = a.root_password {
        args["rootPassword"] = json!(rp);
    }
    let ai: serde_json::Map<String, Value> = [
        ("model", model.clone()),
        ("baseUrl", base_url),
        ("apiKey", a.api_key),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k.to_owned(), json!(v))))
    .collect();
    if !ai.is_empty() {
        args["ai"] = Value::Object(ai);
    }
    let mut c = dial(&r.url).await?;
    c.call("sys.setup", args).await.map_err(|e| {
        let already = matches!(&e, gsv_kernel::client::ClientError::Remote { code, .. }
            if *code == gsv_protocol::error::code::CONFLICT);
        if already {
            anyhow!(e).context("this kernel is set up already: log in with `gsv login`")
        } else {
            explain(e)
        }
    })?;
    c.close().await;
    eprintln!("gsv: set up {} with the account {user}", r.url);
    if !a.no_login {
        let path = log_in_and_save(
            &r.url,
            Some(&user),
            &Credentials::Password(password),
            "gsv setup",
        )
        .await?;
        eprintln!("gsv: logged in as {user}; wrote {}", path.display());
    }
    if model.is_none() {
        eprintln!(
            "gsv: no model yet: `gsv config set ai.model NAME` and `gsv config set ai.base_url URL` \
             before `gsv chat`"
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn login(conn: &ConnArgs, a: LoginArgs) -> Result<ExitCode> {
    let r = conn.resolve()?;
    // Credentials from the flags or the environment, else asked for; the
    // file's own are what is being replaced.
    let creds = match (&conn.token, &conn.password) {
        (Some(t), _) => Credentials::Token(t.clone()),
        (None, Some(p)) => Credentials::Password(p.clone()),
        (None, None) => {
            let user = r.user.clone().ok_or_else(|| {
                anyhow!(
                    "give --user NAME and --password, or --token TOKEN (from `gsv token create`)"
                )
            })?;
            Credentials::Password(
                ask_password(&format!("Password for {user}: "), false)?.ok_or_else(|| {
                    anyhow!("give --password (or GSV_PASSWORD), or --token TOKEN")
                })?,
            )
        }
    };
    let user = match creds {
        // A token names its account.
        Credentials::Token(_) => conn.user.clone(),
        Credentials::Password(_) => r.user.clone(),
    };
    let path = log_in_and_save(&r.url, user.as_deref(), &creds, &a.label).await?;
    let saved = ClientConfig::load()?;
    eprintln!(
        "gsv: logged in as {} at {}; wrote {}",
        saved.username.as_deref().unwrap_or("?"),
        r.url,
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Logs in and writes the client config: the URL, the account and a
/// token (a password is traded for a new user token, never stored).
async fn log_in_and_save(
    url: &str,
    user: Option<&str>,
    creds: &Credentials,
    label: &str,
) -> Result<PathBuf> {
    if matches!(creds, Credentials::Password(_)) && user.is_none() {
        bail!("a password needs a username: pass --user NAME");
    }
    let mut c = dial(url).await?;
    let hello = c
        .login_as(&fresh_client_id(), user, creds)
        .await
        .map_err(explain)?;
    let username = hello["identity"]["process"]["username"]
        .as_str()
        .map(str::to_owned)
        .or(user.map(str::to_owned));
    let token = match creds {
        Credentials::Token(t) => t.clone(),
        Credentials::Password(_) => {
            let d = c
                .call("sys.token.create", json!({"kind": "user", "label": label}))
                .await
                .map_err(explain)?;
            d["token"]["token"]
                .as_str()
                .context("sys.token.create answered without a token")?
                .to_owned()
        }
    };
    c.close().await;
    ClientConfig {
        url: Some(url.to_owned()),
        username,
        token: Some(token),
        password: None,
    }
    .save()
}

/// Connects as the resolved user and returns the client and the uid.
async fn connect_with_uid(conn: &ConnArgs) -> Result<(GsvClient, i64)> {
    let r = conn.resolve()?;
    let creds = r
        .creds
        .clone()
        .ok_or_else(|| anyhow!("not logged in: run `gsv login`"))?;
    let mut c = dial(&r.url).await?;
    let hello = c
        .login_as(&fresh_client_id(), r.user.as_deref(), &creds)
        .await
        .map_err(explain)?;
    let uid = hello["identity"]["process"]["uid"]
        .as_i64()
        .context("sys.connect answered without a uid")?;
    Ok((c, uid))
}

/// The kernel's key for a CLI key: as it is with a `/`; else dots become
/// slashes under `users/<uid>/` (own) or `config/` (system).
fn config_key(key: &str, uid: i64, system: bool) -> String {
    if key.contains('/') {
        return key.to_owned();
    }
    let path = key.replace('.', "/");
    if system {
        format!("config/{path}")
    } else {
        format!("users/{uid}/{path}")
    }
}

pub async fn config(conn: &ConnArgs, action: ConfigAction) -> Result<ExitCode> {
    let (mut c, uid) = connect_with_uid(conn).await?;
    let code = match action {
        ConfigAction::Set { key, value, system } => {
            let key = config_key(&key, uid, system);
            c.call("sys.config.set", json!({"key": key, "value": value}))
                .await
                .map_err(|e| match &e {
                    gsv_kernel::client::ClientError::Remote { code, .. }
                        if *code == gsv_protocol::error::code::FORBIDDEN =>
                    {
                        anyhow!(e).context(format!(
                            "you may not set {key}: your own settings are `ai.*` (users/{uid}/ai/…); \
                             kernel-wide ones (--system) need root"
                        ))
                    }
                    _ => explain(e),
                })?;
            ExitCode::SUCCESS
        }
        ConfigAction::Get { key } => {
            let keys = match &key {
                None => vec![None],
                Some(k) if k.contains('/') => vec![Some(k.clone())],
                Some(k) => vec![
                    Some(config_key(k, uid, false)),
                    Some(config_key(k, uid, true)),
                ],
            };
            let mut any = false;
            for key in keys {
                let d = c
                    .call("sys.config.get", json!({"key": key}))
                    .await
                    .map_err(explain)?;
                for e in d["entries"].as_array().into_iter().flatten() {
                    any = true;
                    println!(
                        "{}\t{}",
                        e["key"].as_str().unwrap_or(""),
                        e["value"].as_str().unwrap_or("")
                    );
                }
            }
            if any || key.is_none() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    };
    c.close().await;
    Ok(code)
}

pub async fn token(conn: &ConnArgs, action: TokenAction) -> Result<ExitCode> {
    let TokenAction::Create {
        node,
        service,
        out,
        label,
    } = action;
    if out.is_some() && node.is_none() && !service {
        bail!("--out is for a node (--node) or service (--service) token");
    }
    let r = conn.resolve()?;
    let mut c = connect_resolved(&r).await?;
    let args = match &node {
        Some(device) => json!({"kind": "node", "allowedRole": "driver",
                               "allowedDeviceId": device, "label": label}),
        None if service => json!({"kind": "service", "label": label}),
        None => json!({"kind": "user", "label": label}),
    };
    let d = c.call("sys.token.create", args).await.map_err(explain)?;
    c.close().await;
    let token = d["token"]["token"]
        .as_str()
        .context("sys.token.create answered without a token")?;
    if service {
        let path = out.unwrap_or_else(|| PathBuf::from("service.token"));
        write_private(&path, token)?;
        eprintln!(
            "gsv: wrote the service token to {}; an adapter connects with it as role \
             service (e.g. `gsv adapter matrix --token-file {}`)",
            path.display(),
            path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(device) = node else {
        println!("{token}");
        return Ok(ExitCode::SUCCESS);
    };
    let path = out.unwrap_or_else(|| PathBuf::from(format!("{device}.token")));
    write_private(&path, token)?;
    eprintln!(
        "gsv: wrote the node token for {device} to {}; next, on that device:\n  \
         gsv node --kernel {} --device-id {device} --token-file {} --root DIR",
        path.display(),
        r.url,
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes a secret readable by its owner only.
fn write_private(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    // An existing file keeps its mode on open: make it private too.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| f.write_all(format!("{text}\n").as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_are_your_own_or_with_system_everyones() {
        assert_eq!(config_key("ai.model", 1000, false), "users/1000/ai/model");
        assert_eq!(config_key("ai.base_url", 1000, true), "config/ai/base_url");
        assert_eq!(config_key("config/shell/x", 1000, false), "config/shell/x");
    }
}
