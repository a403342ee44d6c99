//! The hub topology in a test: a `Dofs` authority store in this process
//! pushing into and pulling from a daemon over the RPC client, with
//! reconnection (and `reconcile`) after the daemon restarted.

use std::collections::HashSet;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wsd_client::client::{self, Client};
use wsd_dofs::{Dofs, WriteOptions};
use wsd_sync::driver::{self, SyncOptions, SyncReport};
use wsd_sync::{IgnoreRules, SyncError, SyncPath};

/// The name the authority keeps the daemon's watermarks under.
pub const REMOTE: &str = "wsd";
/// The peer name the authority presents to the daemon.
pub const PEER: &str = "authority";

/// Runs `fut` on a current-thread runtime inside a `LocalSet` (the RPC
/// client is `!Send`).
pub fn block_on_local<F: Future>(fut: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, fut)
}

pub fn p(s: &str) -> SyncPath {
    SyncPath::new(s).unwrap()
}

/// The authority: a dofs store, the daemon's address, a connection made on
/// demand, and the SHA-256 of every file content it ever wrote (to tell a
/// complete version from a torn one).
#[derive(Debug)]
pub struct Hub {
    pub dofs: Dofs,
    pub addr: String,
    client: Option<Client>,
    pub written: HashSet<[u8; 32]>,
}

impl Hub {
    pub fn open(db: &Path, addr: &str) -> Hub {
        Hub {
            dofs: Dofs::open(db).expect("open dofs"),
            addr: addr.to_owned(),
            client: None,
            written: HashSet::new(),
        }
    }

    /// Writes a file on the authority (parents created) and remembers its
    /// content as a legitimate version.
    pub fn put(&mut self, path: &str, bytes: &[u8], mode: u32) {
        self.written.insert(Sha256::digest(bytes).into());
        let opts = WriteOptions {
            mode: Some(mode),
            create_parents: true,
            ..WriteOptions::default()
        };
        self.dofs.write_file_with(&p(path), bytes, opts).unwrap();
    }

    /// The live connection, dialled and reconciled when there is none.
    pub async fn client(&mut self) -> Result<Client, SyncError> {
        if let Some(c) = &self.client
            && c.is_connected()
        {
            return Ok(c.clone());
        }
        self.client = None;
        let mut c = client::connect(&self.addr, None, PEER).await?;
        driver::reconcile(&mut self.dofs, &mut c, REMOTE).await?;
        self.client = Some(c.clone());
        Ok(c)
    }

    /// Forgets the connection (after the daemon was killed).
    pub fn disconnect(&mut self) {
        self.client = None;
    }

    pub async fn push(&mut self) -> Result<SyncReport, SyncError> {
        let mut c = self.client().await?;
        let ignore = IgnoreRules::none();
        let opts = SyncOptions {
            remote_name: REMOTE,
            ignore: &ignore,
        };
        driver::push(&mut self.dofs, &mut c, &opts, |_| {}).await
    }

    pub async fn pull(&mut self) -> Result<SyncReport, SyncError> {
        let mut c = self.client().await?;
        let ignore = IgnoreRules::none();
        let opts = SyncOptions {
            remote_name: REMOTE,
            ignore: &ignore,
        };
        driver::pull(&mut self.dofs, &mut c, &opts, |_| {}).await
    }

    /// Pull then push until neither moves an entry. A lost connection
    /// (the daemon restarting) is retried for a while; any other error is
    /// returned.
    pub async fn converge(&mut self) -> Result<usize, SyncError> {
        let mut rounds = 0;
        let mut retries = 0;
        loop {
            rounds += 1;
            let r = async {
                let a = self.pull().await?.entries;
                let b = self.push().await?.entries;
                Ok::<_, SyncError>(a + b)
            }
            .await;
            match r {
                Ok(0) if rounds > 1 => return Ok(rounds),
                Ok(_) => {}
                Err(e) if e.code() == wsd_sync::ErrorCode::Shutdown && retries < 50 => {
                    retries += 1;
                    self.disconnect();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
            assert!(rounds < 20, "no convergence after 20 rounds");
        }
    }

    /// [`Hub::converge`], then asserts that the authority and the daemon's
    /// tree at `served` are equal and the authority is intact; `what`
    /// names the scenario in a failure.
    pub async fn converge_and_compare(&mut self, served: &Path, what: &str) {
        self.converge()
            .await
            .unwrap_or_else(|e| panic!("{what}: no convergence: {e}"));
        let (a, b) = (crate::dofs_digest(&self.dofs), crate::tree_digest(served));
        assert!(
            a == b,
            "{what}: trees differ after convergence:\n{}",
            crate::digest_diff(&a, &b, 20).join("\n")
        );
        self.dofs.check_integrity().unwrap();
    }
}

/// `wsd::daemon::run` on its own thread in this process (so a test can arm
/// the store's fault-injection points); stopped on drop.
#[derive(Debug)]
pub struct InProcessDaemon {
    pub addr: String,
    _daemon: wsd::daemon::Background,
}

impl InProcessDaemon {
    pub fn start(root: &Path, state: &Path) -> InProcessDaemon {
        InProcessDaemon::start_with(root, state, None)
    }

    /// [`InProcessDaemon::start`] pruning tombstones every `prune_every`.
    pub fn start_with(root: &Path, state: &Path, prune_every: Option<Duration>) -> InProcessDaemon {
        std::fs::create_dir_all(root).unwrap();
        let mut config =
            wsd::daemon::DaemonConfig::local(root.canonicalize().unwrap(), state.to_owned());
        config.prune_every = prune_every;
        let daemon = wsd::daemon::Background::start(config).expect("in-process daemon");
        InProcessDaemon {
            addr: daemon.addr().to_owned(),
            _daemon: daemon,
        }
    }
}
