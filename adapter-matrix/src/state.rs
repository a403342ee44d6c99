//! `--state DIR`: the bot's Matrix session (so a restart reuses its
//! device) and the last sync position (so messages sent while the adapter
//! was down are relayed after it). One JSON file, written whole and
//! renamed into place, readable by its owner only (it holds an access
//! token).

use std::io;
use std::path::{Path, PathBuf};

use matrix_sdk::authentication::matrix::MatrixSession;
use serde::{Deserialize, Serialize};

const FILE: &str = "matrix-session.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    /// The homeserver and user the session is for: another `--homeserver`
    /// or `--user` starts afresh.
    pub homeserver: String,
    pub user: String,
    pub session: MatrixSession,
    #[serde(default)]
    pub sync_token: Option<String>,
}

#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(StateDir {
            path: dir.join(FILE),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state; `None` when there is none or it cannot be read (it
    /// is only a cache of what a password login recreates).
    pub fn load(&self) -> Option<Saved> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the saved session");
                return None;
            }
        };
        match serde_json::from_str(&text) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "ignoring a malformed saved session");
                None
            }
        }
    }

    pub fn save(&self, saved: &Saved) -> io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let text = serde_json::to_vec_pretty(saved).map_err(io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }
}
