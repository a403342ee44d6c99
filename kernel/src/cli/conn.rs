//! Where the kernel is and who we are: the global flags, their
//! environment variables and the client config file `gsv login` writes;
//! connecting with them, and errors that name the command to run next.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use gsv_kernel::client::{ClientError, Credentials, GsvClient};
use gsv_protocol::error::code;
use serde::{Deserialize, Serialize};

/// The kernel address when neither a flag, the environment nor the config
/// file names one (`gsv serve`'s default listen address).
pub const DEFAULT_URL: &str = "ws://127.0.0.1:8787/ws";

/// Flags every command takes, before or after its name.
#[derive(Debug, Args)]
pub struct ConnArgs {
    /// The kernel's WebSocket address [default: ws://127.0.0.1:8787/ws].
    #[arg(long, global = true, env = "GSV_URL", value_name = "URL")]
    pub url: Option<String>,
    /// The account to log in as (not needed with a token: it names its
    /// account).
    #[arg(long, global = true, env = "GSV_USER", value_name = "NAME")]
    pub user: Option<String>,
    /// A user token (`gsv login` or `gsv token create`); wins over a
    /// password.
    #[arg(
        long,
        global = true,
        env = "GSV_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// The account's password.
    #[arg(
        long,
        global = true,
        env = "GSV_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub password: Option<String>,
}

/// Shown under every command that connects, so the file is discoverable.
pub const CONFIG_HELP: &str = "Each of --url, --user and --token/--password \
falls back to its environment variable, then to the config file \
~/.config/gsv/config.json (under $XDG_CONFIG_HOME if set) that `gsv login` \
writes: {\"url\": …, \"username\": …, \"token\": …}.";

/// The client config file's contents.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ClientConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Read for older files; `gsv login` never writes a password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl ClientConfig {
    /// `~/.config/gsv/config.json` (under `$XDG_CONFIG_HOME` if set).
    pub fn path() -> Result<PathBuf> {
        Ok(dirs::config_dir()
            .context("no per-user config directory on this platform: set XDG_CONFIG_HOME")?
            .join("gsv")
            .join("config.json"))
    }

    /// The file, or an empty config when there is none. A file that is not
    /// valid JSON is an error naming it (silently ignoring it would log in
    /// as nobody and blame the kernel).
    pub fn load() -> Result<ClientConfig> {
        let Ok(path) = ClientConfig::path() else {
            return Ok(ClientConfig::default());
        };
        match std::fs::read_to_string(&path) {
            Ok(s) => serde_json::from_str(&s).with_context(|| {
                format!(
                    "{} is not a gsv client config: fix it or run `gsv login` to rewrite it",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ClientConfig::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the file, readable by its owner only (it holds a token).
    pub fn save(&self) -> Result<PathBuf> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = ClientConfig::path()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(serde_json::to_string_pretty(self)?.as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

/// Flags, else environment, else the config file.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub url: String,
    pub user: Option<String>,
    pub creds: Option<Credentials>,
}

impl ConnArgs {
    pub fn resolve(&self) -> Result<Resolved> {
        let file = ClientConfig::load()?;
        let url = self
            .url
            .clone()
            .or(file.url)
            .unwrap_or_else(|| DEFAULT_URL.into());
        let user = self.user.clone().or(file.username);
        let creds = match (&self.token, &self.password) {
            (Some(t), _) => Some(Credentials::Token(t.clone())),
            (None, Some(p)) => Some(Credentials::Password(p.clone())),
            (None, None) => file
                .token
                .map(Credentials::Token)
                .or(file.password.map(Credentials::Password)),
        };
        Ok(Resolved { url, user, creds })
    }
}

/// A fresh client id for this one command: the kernel replaces an older
/// connection with the same `(user, role, client id)`, so a shared id
/// would let a second `gsv` command knock the first one off.
pub fn fresh_client_id() -> String {
    format!("gsv-cli-{}", uuid::Uuid::new_v4().simple())
}

/// Opens the socket, with a hint when nobody answers.
pub async fn dial(url: &str) -> Result<GsvClient> {
    GsvClient::connect(url).await.map_err(|e| {
        anyhow!(e).context(format!(
            "no kernel at {url}: start one with `gsv serve`, or give its address with --url \
             (or `gsv login --url URL`)"
        ))
    })
}

/// Connects and logs in.
pub async fn connect(conn: &ConnArgs) -> Result<GsvClient> {
    connect_resolved(&conn.resolve()?).await
}

pub async fn connect_resolved(r: &Resolved) -> Result<GsvClient> {
    let creds = r.creds.clone().ok_or_else(|| {
        anyhow!(
            "not logged in: run `gsv login` (or pass --token / --password, or set GSV_TOKEN / \
             GSV_PASSWORD)"
        )
    })?;
    if matches!(creds, Credentials::Password(_)) && r.user.is_none() {
        return Err(anyhow!(
            "a password needs a username: pass --user NAME (or set GSV_USER), or run `gsv login`"
        ));
    }
    let mut c = dial(&r.url).await?;
    c.login_as(&fresh_client_id(), r.user.as_deref(), &creds)
        .await
        .map_err(explain)?;
    Ok(c)
}

/// A client error with the next command to run, when there is one.
pub fn explain(e: ClientError) -> anyhow::Error {
    let hint = match &e {
        ClientError::Remote { code: c, .. } if *c == code::SETUP_REQUIRED => {
            Some("the kernel is not set up yet: run `gsv setup`".to_owned())
        }
        ClientError::Remote { call, code: c, .. }
            if *c == code::AUTH_FAILED && call == "sys.connect" =>
        {
            Some("wrong user or credentials: run `gsv login` to log in again".to_owned())
        }
        _ => None,
    };
    match hint {
        Some(h) => anyhow!(e).context(h),
        None => anyhow!(e),
    }
}
