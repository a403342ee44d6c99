//! The Matrix adapter of the gsv kernel (`gsv adapter matrix`).
//!
//! It logs in to a homeserver as a bot account, syncs, and relays every
//! text message that reaches the bot (DMs, rooms, threads, replies) to the
//! kernel as `adapter.inbound`; it answers the kernel's `adapter.send` by
//! posting to the room (in the thread, as a reply, when asked) and
//! `adapter.connect|disconnect|status` by resuming, pausing and reporting
//! its sync. The kernel side is a WebSocket connection as
//! `role:"service"`, `client.channel:"matrix"` ([`kernel`]); the wire types
//! are [`gsv_protocol::adapter`].
//!
//! Both connections reconnect with backoff and every network wait has a
//! deadline. No end-to-end encryption: the bot reads unencrypted rooms
//! only. With `--state DIR` the bot keeps its Matrix session and sync
//! position there (so a restart neither creates a new device nor loses
//! the messages sent meanwhile); without it, each start logs in afresh
//! and relays only what arrives after it.

pub mod kernel;
pub mod matrix;
mod state;

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use gsv_protocol::adapter::AccountStatus;

pub use matrix::MatrixBot;

/// The adapter's name on the kernel (`client.channel`, `adapter`).
pub const ADAPTER: &str = "matrix";

/// Messages waiting for the kernel while it is unreachable; the Matrix
/// sync pauses when this is full.
const INBOUND_QUEUE: usize = 256;

/// What `gsv adapter matrix` is given.
#[derive(Debug, Clone)]
pub struct Config {
    /// `ws://HOST:PORT/ws`.
    pub kernel_url: String,
    /// The raw service token.
    pub service_token: String,
    /// The homeserver's base URL (`https://matrix.example.org`).
    pub homeserver: String,
    /// The bot's Matrix id (`@bot:example.org`).
    pub user: String,
    pub password: String,
    /// Where the session and sync position are kept.
    pub state_dir: Option<PathBuf>,
    /// How long one `/sync` long-poll waits for news.
    pub sync_timeout: Duration,
    /// First and longest wait between reconnects (both connections).
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl Config {
    pub fn new(
        kernel_url: String,
        service_token: String,
        homeserver: String,
        user: String,
        password: String,
    ) -> Self {
        Config {
            kernel_url,
            service_token,
            homeserver,
            user,
            password,
            state_dir: None,
            sync_timeout: Duration::from_secs(30),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// Why the adapter stopped for good (everything else is retried).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdapterError {
    #[error("--user {user}: not a Matrix user id (@name:server): {reason}")]
    BadUser { user: String, reason: String },
    #[error("--homeserver {url}: {reason}")]
    BadHomeserver { url: String, reason: String },
    #[error("the homeserver refused the login of {user}: {reason}")]
    LoginRefused { user: String, reason: String },
    #[error("the state directory {path}: {source}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel at {url} refused the adapter ({code}): {message}")]
    KernelRefused {
        url: String,
        code: i64,
        message: String,
    },
}

/// Runs the adapter until `stop` fires or something fails for good (a bad
/// password, a refused service token).
pub async fn run(config: Config, stop: CancellationToken) -> Result<(), AdapterError> {
    // The workspace's TLS provider; reqwest would otherwise pick its own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bot = tokio::select! {
        () = stop.cancelled() => return Ok(()),
        b = MatrixBot::login(&config) => b?,
    };
    let (status_tx, status_rx) = watch::channel(bot.status(false, None));
    let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
    let (enabled_tx, enabled_rx) = watch::channel(true);
    let sync = {
        let (bot, stop) = (bot.clone(), stop.clone());
        let config = config.clone();
        tokio::spawn(async move {
            bot.sync_loop(&config, inbound_tx, status_tx, enabled_rx, stop)
                .await
        })
    };
    let link = kernel::Link::new(&config, bot, enabled_tx, status_rx);
    let r = link.run(inbound_rx, stop.clone()).await;
    stop.cancel();
    let _ = sync.await;
    r
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A status with the account's id filled in.
fn status(account_id: &str, connected: bool, error: Option<String>) -> AccountStatus {
    AccountStatus {
        account_id: account_id.to_owned(),
        connected,
        authenticated: true,
        mode: Some("bot".into()),
        last_activity: Some(now_ms()),
        error,
        extra: None,
    }
}
