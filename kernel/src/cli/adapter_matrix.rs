//! `gsv adapter matrix`: runs the Matrix adapter ([`gsv_adapter_matrix`])
//! until SIGTERM or Ctrl-C. (The kernel-side `gsv adapter connect|...`
//! calls are in [`super::adapter`].)

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// The kernel's WebSocket address, e.g. ws://127.0.0.1:8787/ws.
    #[arg(long, value_name = "URL")]
    kernel: String,
    /// A file holding a service token (`gsv call sys.token.create
    /// '{"kind":"service"}'` makes one).
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// The homeserver's base URL, e.g. https://matrix.example.org.
    #[arg(long, value_name = "URL")]
    homeserver: String,
    /// A file holding the bot account's password.
    #[arg(long, value_name = "FILE")]
    password_file: PathBuf,
    /// Where the bot keeps its Matrix session and sync position, so that a
    /// restart reuses its device and relays what was said meanwhile.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
}

/// `user`: the global `--user`, here the bot's Matrix id.
pub async fn run(a: MatrixArgs, user: Option<String>) -> Result<ExitCode> {
    let Some(user) = user.filter(|u| u.starts_with('@')) else {
        bail!("gsv adapter matrix needs --user @bot:SERVER, the bot's Matrix id");
    };
    let token = read_secret(&a.token_file, "--token-file")?;
    let password = read_secret(&a.password_file, "--password-file")?;
    let mut config = gsv_adapter_matrix::Config::new(a.kernel, token, a.homeserver, user, password);
    config.state_dir = a.state;
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        super::serve::shutdown_signal().await;
        s.cancel();
    });
    gsv_adapter_matrix::run(config, stop).await?;
    Ok(ExitCode::SUCCESS)
}

/// A file's content without its trailing newline; empty is an error.
fn read_secret(path: &Path, flag: &str) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{flag} {}: cannot read it", path.display()))?;
    let secret = text.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        bail!("{flag} {}: the file is empty", path.display());
    }
    Ok(secret.to_owned())
}
