//! A real Synapse homeserver on loopback for one test: its own config,
//! SQLite database and signing key in a temp dir, no federation, rate
//! limits out of the way, registration only through the shared-secret
//! admin API. Killed (and reaped) on drop.
//!
//! Synapse is the Python package `matrix-synapse`: `GSV_SYNAPSE_PYTHON`
//! names the interpreter that has it (`.ci/run` makes a venv), else
//! `python3` is tried. Without it the tests skip, unless
//! `GSV_REQUIRE_SYNAPSE=1`, which makes them fail.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore as _;
use serde_json::{Value, json};
use sha1::Sha1;

/// Synapse's first start creates its database: slow on a busy 2-core box.
const READY_DEADLINE: Duration = Duration::from_secs(240);
pub const SERVER_NAME: &str = "localhost";

#[derive(Debug)]
pub struct Synapse {
    child: Child,
    dir: tempfile::TempDir,
    pub url: String,
    secret: String,
    http: reqwest::Client,
}

/// The interpreter with `synapse` importable, or `None` (skip) when there
/// is none and it is not required.
fn python() -> Option<PathBuf> {
    let required = std::env::var("GSV_REQUIRE_SYNAPSE").is_ok_and(|v| v == "1");
    let candidate = std::env::var_os("GSV_SYNAPSE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let has_synapse = Command::new(&candidate)
        .args(["-c", "import synapse"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_synapse {
        return Some(candidate);
    }
    assert!(
        !required,
        "GSV_REQUIRE_SYNAPSE=1 but {} cannot import synapse (pip install matrix-synapse, \
         or set GSV_SYNAPSE_PYTHON)",
        candidate.display()
    );
    eprintln!(
        "skipping: no Synapse ({} cannot import synapse; set GSV_SYNAPSE_PYTHON)",
        candidate.display()
    );
    None
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

impl Synapse {
    /// Starts Synapse and waits until it answers; `None` when Synapse is
    /// not installed (and not required).
    pub async fn start() -> Option<Synapse> {
        let python = python()?;
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let secret = random_token();
        let d = dir.path();
        let mut seed = [0u8; 32];
        rand::rng().fill_bytes(&mut seed);
        let seed = base64::engine::general_purpose::STANDARD_NO_PAD.encode(seed);
        std::fs::write(d.join("signing.key"), format!("ed25519 a_test {seed}\n")).unwrap();
        let limit = "{per_second: 10000, burst_count: 10000}";
        let config = format!(
            r#"server_name: "{SERVER_NAME}"
pid_file: "{dir}/homeserver.pid"
listeners:
  - port: {port}
    bind_addresses: ["127.0.0.1"]
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: "{dir}/homeserver.db"
media_store_path: "{dir}/media"
signing_key_path: "{dir}/signing.key"
registration_shared_secret: "{secret}"
macaroon_secret_key: "{macaroon}"
form_secret: "{form}"
report_stats: false
enable_registration: false
trusted_key_servers: []
suppress_key_server_warning: true
federation_domain_whitelist: []
presence:
  enabled: false
rc_message: {limit}
rc_login:
  address: {limit}
  account: {limit}
  failed_attempts: {limit}
rc_registration: {limit}
rc_joins:
  local: {limit}
  remote: {limit}
rc_invites:
  per_room: {limit}
  per_user: {limit}
  per_issuer: {limit}
"#,
            dir = d.display(),
            macaroon = random_token(),
            form = random_token(),
        );
        let config_path = d.join("homeserver.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(d.join("synapse.log")).unwrap();
        let child = Command::new(&python)
            .args(["-m", "synapse.app.homeserver", "-c"])
            .arg(&config_path)
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting synapse");
        let mut s = Synapse {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
            secret,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        s.wait_ready().await;
        Some(s)
    }

    async fn wait_ready(&mut self) {
        let started = Instant::now();
        let versions = format!("{}/_matrix/client/versions", self.url);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "synapse exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(r) = self.http.get(&versions).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(
                started.elapsed() < READY_DEADLINE,
                "synapse not ready within {READY_DEADLINE:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("synapse.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Registers `username` through the shared-secret admin API (HMAC-SHA1
    /// of nonce, user, password and admin flag); returns its user id.
    pub async fn register(&self, username: &str, password: &str) -> String {
        let endpoint = format!("{}/_synapse/admin/v1/register", self.url);
        let nonce: Value = self
            .http
            .get(&endpoint)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let nonce = nonce["nonce"].as_str().unwrap().to_owned();
        let mut mac = Hmac::<Sha1>::new_from_slice(self.secret.as_bytes()).unwrap();
        for (i, part) in [nonce.as_str(), username, password, "notadmin"]
            .iter()
            .enumerate()
        {
            if i > 0 {
                mac.update(b"\0");
            }
            mac.update(part.as_bytes());
        }
        let body = json!({
            "nonce": nonce,
            "username": username,
            "password": password,
            "admin": false,
            "mac": hex::encode(mac.finalize().into_bytes()),
        });
        let r = self.http.post(&endpoint).json(&body).send().await.unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert!(status.is_success(), "registering {username}: {status} {v}");
        v["user_id"].as_str().unwrap().to_owned()
    }
}

impl Drop for Synapse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
