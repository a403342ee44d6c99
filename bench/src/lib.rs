//! Shared helpers for the criterion benches in `benches/` and the
//! side-by-side harness `bench/compare` (a script). Outside the default
//! build: `cargo bench -p wsd-bench`.
//!
//! The benches build their own deterministic trees (no dependency on
//! `make-tree.py`), run a real daemon (`wsd::daemon::run`) on its own thread
//! with its own runtime, as a separate process would, and drive it with the
//! CLI's building blocks: a local [`WorkspaceStore`], the RPC client and the
//! sync driver.

pub mod gateway;

use std::path::{Path, PathBuf};

use tempfile::TempDir;
use wsd::store::{StoreOptions, WorkspaceStore};
use wsd_client::client::{self, Client};
use wsd_sync::IgnoreRules;
use wsd_sync::driver::{self, SyncOptions, SyncReport};

/// Deterministic incompressible bytes (xorshift), so every run and every
/// tool sees the same input.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Deterministic source-like text (words and indentation), `len` bytes.
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "fn", "let", "mut", "struct", "impl", "pub", "use", "match", "return", "self", "async",
        "await", "Result", "Option", "Some", "None", "String", "Vec", "u64", "import", "export",
        "const", "function", "class", "value", "index", "buffer", "stream", "chunk", "hash",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(len + 64);
    while out.len() < len {
        for _ in 0..next() % 4 {
            out.extend_from_slice(b"    ");
        }
        for i in 0..2 + next() % 10 {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(WORDS[(next() % WORDS.len() as u64) as usize].as_bytes());
        }
        out.push(b'\n');
    }
    out.truncate(len);
    out
}

/// The shape of a synthetic tree: `files` small text files (1-8 KiB, median
/// about 2 KiB like `make-tree.py src`) spread over `dirs` directories, plus
/// `big` incompressible files of `big_size` bytes.
#[derive(Clone, Copy, Debug)]
pub struct TreeSpec {
    pub files: usize,
    pub dirs: usize,
    pub big: usize,
    pub big_size: usize,
}

impl TreeSpec {
    /// 2,000 small files in 80 directories plus two 8 MiB files: about
    /// 21 MiB, big enough to show per-file and per-byte costs, small enough
    /// for criterion to repeat.
    pub const BENCH: TreeSpec = TreeSpec {
        files: 2000,
        dirs: 80,
        big: 2,
        big_size: 8 * 1024 * 1024,
    };

    /// Relative path of small file `i`.
    pub fn small_path(&self, i: usize) -> String {
        let d = i % self.dirs;
        format!("d{:02}/s{:02}/f{i:05}.rs", d / 10, d % 10)
    }

    /// Relative path of big file `i`.
    pub fn big_path(&self, i: usize) -> String {
        format!("blobs/big{i}.bin")
    }

    /// Total bytes of content.
    pub fn bytes(&self) -> u64 {
        (0..self.files).map(|i| small_size(i) as u64).sum::<u64>()
            + (self.big * self.big_size) as u64
    }

    /// Files plus directories (what a push sends as entries).
    pub fn entries(&self) -> usize {
        let top = self.dirs.div_ceil(10);
        self.files + self.big + self.dirs + top + usize::from(self.big > 0)
    }

    /// Writes the tree under `root` (created if missing).
    pub fn write(&self, root: &Path) {
        for i in 0..self.files {
            write(root, &self.small_path(i), &text(small_size(i), i as u64));
        }
        for i in 0..self.big {
            write(
                root,
                &self.big_path(i),
                &pseudo_random(self.big_size, 2001 + 2 * i as u64),
            );
        }
    }

    /// One round of edits, like `make-tree.py mutate`: rewrites 1% of the
    /// small files and inserts 100 bytes in the middle of each big file.
    /// Round `k` is always the same edit.
    pub fn mutate(&self, root: &Path, round: u64) {
        let n = (self.files / 100).max(1);
        for j in 0..n {
            let i = ((round as usize) * 7919 + j * 104_729) % self.files;
            let len = small_size(i + round as usize);
            write(
                root,
                &self.small_path(i),
                &text(len, round * 1_000_003 + i as u64),
            );
        }
        for i in 0..self.big {
            let p = root.join(self.big_path(i));
            let mut data = std::fs::read(&p).expect("reading a big file");
            let mid = data.len() / 2 + (round as usize * 4099) % 8192;
            let insert = pseudo_random(100, round * 31 + i as u64);
            data.splice(mid..mid, insert);
            std::fs::write(&p, data).expect("writing a big file");
        }
    }
}

/// Size of small file `i`: 1-8 KiB, skewed small.
fn small_size(i: usize) -> usize {
    let r = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    1024 + ((r % 7168) * (r % 7168) / 7168) as usize
}

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("a relative file path has a parent"))
        .expect("creating parents");
    std::fs::write(&p, bytes).expect("writing a file");
}

/// Scratch directories that live until the end of the bench. Deleting a
/// tree of thousands of files and creating the next right after is several
/// times slower on ext4 (peers-and-limits C.6), so nothing is removed while
/// measuring.
#[derive(Debug, Default)]
pub struct Scratch {
    dirs: Vec<TempDir>,
}

impl Scratch {
    /// A fresh, never used directory (under `$WSD_BENCH_DIR` if set, else the
    /// system temp directory).
    pub fn dir(&mut self) -> PathBuf {
        let t = match std::env::var_os("WSD_BENCH_DIR") {
            Some(base) => tempfile::Builder::new()
                .prefix("wsd-bench-")
                .tempdir_in(base),
            None => tempfile::Builder::new().prefix("wsd-bench-").tempdir(),
        }
        .expect("creating a scratch directory");
        let p = t.path().to_owned();
        self.dirs.push(t);
        p
    }
}

/// A `wsd serve` daemon (store, exec runner, RPC server) running on its own
/// thread with its own current-thread runtime, like a separate process.
/// Stops when dropped.
#[derive(Debug)]
pub struct Daemon {
    pub addr: String,
    pub root: PathBuf,
    _daemon: wsd::daemon::Background,
}

impl Daemon {
    /// Serves `root` (state in `state`) on a fresh loopback port.
    pub fn start(root: &Path, state: &Path) -> Daemon {
        std::fs::create_dir_all(root).expect("creating the workspace root");
        let root = root.canonicalize().expect("canonical root");
        let config = wsd::daemon::DaemonConfig::local(root.clone(), state.to_owned());
        let daemon = wsd::daemon::Background::start(config).expect("the bench daemon failed");
        Daemon {
            addr: daemon.addr().to_owned(),
            root,
            _daemon: daemon,
        }
    }
}

/// A current-thread runtime, as the CLI and the daemon use.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs `fut` to completion inside a `LocalSet` on a fresh current-thread
/// runtime (capnp-rpc is `!Send`).
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let rt = runtime();
    tokio::task::LocalSet::new().block_on(&rt, fut)
}

/// A local directory indexed like the CLI indexes it: no watcher, settled
/// explicitly once per transfer, its index in `state` (outside the tree).
pub fn open_local(dir: &Path, state: &Path) -> WorkspaceStore {
    std::fs::create_dir_all(dir).expect("creating the local directory");
    WorkspaceStore::open(
        dir,
        state,
        StoreOptions {
            watch: false,
            auto_settle: false,
            ..StoreOptions::default()
        },
    )
    .expect("opening a local index")
}

/// Connects to `addr` as `peer`.
pub async fn connect(addr: &str, peer: &str) -> Client {
    client::connect(addr, None, peer)
        .await
        .expect("connecting to the bench daemon")
}

/// What `wsd push` does: settle the local directory, connect, compare
/// watermarks, push.
pub async fn push(local: &mut WorkspaceStore, addr: &str, peer: &str) -> SyncReport {
    transfer(local, addr, peer, true).await
}

/// What `wsd pull` does: settle, connect, compare watermarks, pull.
pub async fn pull(local: &mut WorkspaceStore, addr: &str, peer: &str) -> SyncReport {
    transfer(local, addr, peer, false).await
}

async fn transfer(local: &mut WorkspaceStore, addr: &str, peer: &str, push: bool) -> SyncReport {
    local.settle().expect("settling the local directory");
    sync_store(local, addr, peer, push).await
}

/// Connects to `addr` as `peer`, compares watermarks and pushes (or
/// pulls) `local`, any sync store (a dofs, say), as the kernel does.
pub async fn sync_store<S: wsd_sync::Store>(
    local: &mut S,
    addr: &str,
    peer: &str,
    push: bool,
) -> SyncReport {
    let mut remote = connect(addr, peer).await;
    driver::reconcile(local, &mut remote, addr)
        .await
        .expect("reconcile");
    let ignore = IgnoreRules::none();
    let opts = SyncOptions {
        remote_name: addr,
        ignore: &ignore,
    };
    if push {
        driver::push(local, &mut remote, &opts, |_| {}).await
    } else {
        driver::pull(local, &mut remote, &opts, |_| {}).await
    }
    .expect("the transfer failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pushed_tree_arrives_whole_and_a_second_push_sends_nothing() {
        let mut scratch = Scratch::default();
        let spec = TreeSpec {
            files: 50,
            dirs: 7,
            big: 1,
            big_size: 300 * 1024,
        };
        let src = scratch.dir();
        spec.write(&src);
        let daemon = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
        let mut local = open_local(&src, &scratch.dir());
        let first = block_on(push(&mut local, &daemon.addr, "bench"));
        assert_eq!(first.entries as usize, spec.entries());
        assert_eq!(first.object_bytes, spec.bytes());
        for i in 0..spec.files {
            let rel = spec.small_path(i);
            assert_eq!(
                std::fs::read(src.join(&rel)).unwrap(),
                std::fs::read(daemon.root.join(&rel)).unwrap()
            );
        }
        assert_eq!(block_on(push(&mut local, &daemon.addr, "bench")).entries, 0);
        spec.mutate(&src, 1);
        let incr = block_on(push(&mut local, &daemon.addr, "bench"));
        assert!(
            incr.entries >= 2 && incr.object_bytes < 600 * 1024,
            "{incr:?}"
        );
    }
}
