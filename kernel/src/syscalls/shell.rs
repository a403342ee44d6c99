//! `shell.exec` on a workspace, and the workspace's wsd backend.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::error::KernelError;
use crate::workspace::Backend;

/// How long a starting local wsd gets to open its socket.
const WSD_START_DEADLINE: Duration = Duration::from_secs(10);
/// Longest wait between restarts of a local wsd that keeps dying.
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(5);

/// A workspace's wsd backend, owned under the workspace's bracket lock.
#[derive(Debug)]
pub struct BackendState {
    dir: PathBuf,
    backend: Backend,
    child: Option<tokio::process::Child>,
    /// Consecutive starts that did not stay up; drives the backoff.
    restarts: u32,
    last_start: Option<Instant>,
}

/// Where to reach a running wsd.
#[derive(Debug, Clone)]
pub struct WsdAddress {
    /// `unix:/path` or `host:port`.
    pub endpoint: String,
    pub token_file: PathBuf,
    /// True when the local child was (re)started by this call.
    pub started: bool,
}

impl BackendState {
    pub fn new(dir: &Path, backend: Backend) -> BackendState {
        BackendState {
            dir: dir.to_owned(),
            backend,
            child: None,
            restarts: 0,
            last_start: None,
        }
    }

    /// The local child's socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("wsd.sock")
    }

    /// The process id of the local child, if running.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// The address of the wsd, starting (or restarting) the local child if
    /// it is not running.
    pub async fn ensure_running(&mut self, wsd_bin: &Path) -> Result<WsdAddress, KernelError> {
        match &self.backend {
            Backend::Remote {
                address,
                token_file,
            } => Ok(WsdAddress {
                endpoint: address.clone(),
                token_file: token_file.clone(),
                started: false,
            }),
            Backend::Local => {
                let alive = match self.child.as_mut() {
                    Some(c) => matches!(c.try_wait(), Ok(None)),
                    None => false,
                };
                let token_file = self.dir.join("wsd.token");
                let endpoint = format!("unix:{}", self.socket_path().display());
                if alive {
                    return Ok(WsdAddress {
                        endpoint,
                        token_file,
                        started: false,
                    });
                }
                self.start(wsd_bin, &token_file).await?;
                Ok(WsdAddress {
                    endpoint,
                    token_file,
                    started: true,
                })
            }
        }
    }

    async fn start(&mut self, wsd_bin: &Path, token_file: &Path) -> Result<(), KernelError> {
        if let Some(prev) = self.last_start
            && prev.elapsed() < Duration::from_secs(30)
        {
            self.restarts += 1;
            let backoff =
                Duration::from_millis(100u64 << self.restarts.min(6)).min(MAX_RESTART_BACKOFF);
            tracing::warn!(dir = %self.dir.display(), restarts = self.restarts, ?backoff, "local wsd died; restarting");
            tokio::time::sleep(backoff).await;
        } else {
            self.restarts = 0;
        }
        let dir = self.dir.clone();
        let tf = token_file.to_owned();
        tokio::task::spawn_blocking(move || write_token_file(&dir, &tf))
            .await
            .map_err(|e| KernelError::internal("writing a wsd token", e))??;
        let sock = self.socket_path();
        let _ = std::fs::remove_file(&sock);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("wsd.log"))
            .map_err(|e| KernelError::internal("opening wsd.log", e))?;
        let child = tokio::process::Command::new(wsd_bin)
            .arg("serve")
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--state")
            .arg(self.dir.join("state"))
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--token-file")
            .arg(token_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                KernelError::Unavailable(format!("cannot start {}: {e}", wsd_bin.display()))
            })?;
        self.child = Some(child);
        self.last_start = Some(Instant::now());
        let deadline = Instant::now() + WSD_START_DEADLINE;
        loop {
            if tokio::net::UnixStream::connect(&sock).await.is_ok() {
                tracing::info!(dir = %self.dir.display(), "local wsd started");
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(KernelError::Unavailable(format!(
                    "wsd for {} exited at start ({status}); see {}",
                    self.dir.display(),
                    self.dir.join("wsd.log").display()
                )));
            }
            if Instant::now() > deadline {
                self.stop().await;
                return Err(KernelError::Unavailable(format!(
                    "wsd for {} did not open {} within {WSD_START_DEADLINE:?}",
                    self.dir.display(),
                    sock.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the local child, if any.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
        }
    }
}

/// Creates the token file (mode 0600) once; an existing one is kept so a
/// restarted child accepts the same token.
fn write_token_file(dir: &Path, path: &Path) -> Result<(), KernelError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).map_err(|e| KernelError::internal("workspace dir", e))?;
    if path.exists() {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| KernelError::internal(&format!("creating {}", path.display()), e))?;
    f.write_all(crate::accounts::random_hex(32).as_bytes())
        .map_err(|e| KernelError::internal(&format!("writing {}", path.display()), e))
}
