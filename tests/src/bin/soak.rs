//! The soak: a `Dofs` authority store (as the kernel holds it) and a real
//! `wsd serve` child process on loopback, written to concurrently on both
//! sides while the authority pushes into and pulls from the daemon (the hub
//! topology). At the end it quiesces and proves convergence:
//!
//! - both trees identical (content, modes, symlinks);
//! - watermarks converged: the authority's `pushRev == currentRev`, the
//!   daemon's stored fetch cursor for the authority (`appliedPushCursor`)
//!   covers it, the authority's fetch cursor reaches the daemon's
//!   `currentRev`; and during the run, sampled watermarks never move
//!   backwards nor past the other side;
//! - no write lost: every write (with its side and its logical time
//!   interval) is logged; each path's final state must equal one of the
//!   writes that no other logged write supersedes (a later write on the same
//!   side, or a write on the other side made after the first successful sync
//!   that delivered it);
//! - integrity: `Dofs::check_integrity`, `PRAGMA integrity_check` of the
//!   daemon's databases after a graceful stop, no `.wsd-apply-*` temp files;
//! - the daemon's RSS and open fds flat (last quarter vs first quarter).
//!
//! Fault schedule: at a third of the run the daemon loses its state (it is
//! stopped, its root and state directory wiped, and started again; the
//! authority reconnects and pushes), and at two thirds the authority does
//! (its store is replaced by an empty one that syncs under a new peer name
//! and pulls). Each drill pauses the daemon-side writers, syncs first so no
//! logged write is lost with the wiped side, and must end with both trees
//! equal: a re-baseline may not silently leave anything out.
//!
//! Determinism: the operation sequence of each actor is a pure function of
//! `--seed` (ops never look at the tree to decide what to do; an op that
//! does not fit the tree fails and is counted). The main actor (authority
//! ops, its own daemon-side ops in `w0/`, exec commands in `x/`, push, pull
//! and sampling, in one sequence) and each of the `--workers` threads
//! (daemon-side file-system ops in `w<i>/`) have their own sequence; how the
//! threads interleave with each other and with the daemon is up to the
//! scheduler, and so is how many ops fit in `--seconds`. With
//! `--workers 0` the whole op sequence is one deterministic list. The main
//! actor prints a fingerprint of its first 2000 steps: equal seeds print
//! equal fingerprints.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};
use wsd::rpc::{ExecEventKind, ExecRequest};
use wsd_client::client::{self, Client};
use wsd_dofs::{Dofs, WriteOptions};
use wsd_sync::driver::{self, SyncOptions};
use wsd_sync::{ChangeCursor, IgnoreRules, Kind, Store, SyncError, SyncPath, Watermarks};
use wsd_tests::{Daemon, differing_paths, digest_diff, dofs_digest, find_named, tree_digest};

#[derive(Parser, Debug)]
#[command(about = "Soak the hub topology: dofs authority <-> wsd daemon, both written to")]
struct Args {
    /// How long the concurrent phase runs.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// The seed of every op sequence (random when omitted; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Threads doing file-system ops in the served directory, besides the
    /// main actor.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Keep the temp directory (printed) instead of removing it.
    #[arg(long)]
    keep: bool,
}

const REMOTE: &str = "wsd";
/// Steps of the main actor whose op sequence is fingerprinted (printed).
const FINGERPRINT_STEPS: u64 = 2000;
const PEER: &str = "authority";

/// A side losing its sync state, on the fault schedule.
#[derive(Clone, Copy, Debug)]
enum Drill {
    /// The daemon's root and state directory are wiped; the authority
    /// pushes.
    RemoteStateLoss,
    /// The authority's store is replaced by an empty one under a new peer
    /// name; it pulls.
    AuthorityStateLoss,
}

// --- logical time, events and the sync log -------------------------------

/// A global logical clock shared by every actor: a value taken after an
/// op's last syscall is greater than one taken before another op's first
/// syscall iff the first op finished before the second started.
static CLOCK: AtomicU64 = AtomicU64::new(1);

fn tick() -> u64 {
    CLOCK.fetch_add(1, Ordering::SeqCst)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Auth,
    Wsd,
}

/// One path's state as the checks compare it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum St {
    File { sha: [u8; 32], mode: u32 },
    Symlink(String),
    Dir,
    Absent,
}

impl St {
    fn file(bytes: &[u8], mode: u32) -> St {
        St::File {
            sha: Sha256::digest(bytes).into(),
            mode: mode & 0o7777,
        }
    }

    fn short(&self) -> String {
        match self {
            St::File { sha, mode } => format!("file {mode:o} {}", &hex::encode(sha)[..12]),
            St::Symlink(t) => format!("symlink -> {t}"),
            St::Dir => "dir".into(),
            St::Absent => "absent".into(),
        }
    }
}

/// A logged state change: `path` became `st` (or, with `subtree`, `path`
/// and everything below it became absent) somewhere in the logical
/// interval `[lo, hi]`. An uncertain event (a command that failed, a
/// recursive delete that failed half-way) may explain a final state but
/// never supersedes anything.
#[derive(Clone, Debug)]
struct Ev {
    path: String,
    st: St,
    subtree: bool,
    side: Side,
    lo: u64,
    hi: u64,
    certain: bool,
    what: String,
}

#[derive(Default)]
struct Journal {
    events: Mutex<Vec<Ev>>,
}

impl Journal {
    fn add(&self, ev: Ev) {
        self.events.lock().unwrap().push(ev);
    }
}

/// A successful push or pull: it delivered every write of the sending side
/// that finished before `start`, by `end`.
#[derive(Clone, Copy, Debug)]
struct SyncRec {
    push: bool,
    start: u64,
    end: u64,
}

// --- op generation (pure functions of the rng) ---------------------------

const NAMES: [&str; 6] = ["d0", "d1", "d2", "f0", "f1", "f2"];

fn gen_path(rng: &mut StdRng, area: &str) -> String {
    let depth = rng.random_range(1..=3);
    let mut p = area.to_owned();
    for _ in 0..depth {
        p.push('/');
        p.push_str(NAMES[rng.random_range(0..NAMES.len())]);
    }
    p
}

fn gen_mode(rng: &mut StdRng) -> u32 {
    [0o644, 0o644, 0o600, 0o755, 0o640][rng.random_range(0..5)]
}

/// Content unique to this write (`tag` first), mostly small, sometimes
/// several chunks.
fn gen_content(rng: &mut StdRng, tag: &str) -> Vec<u8> {
    let len = match rng.random_range(0..100) {
        0..70 => rng.random_range(0..2000),
        70..95 => rng.random_range(2000..64 * 1024),
        _ => rng.random_range(100 * 1024..700 * 1024),
    };
    let mut v = format!("{tag}\n").into_bytes();
    let start = v.len();
    v.resize(start + len, 0);
    rng.fill(&mut v[start..]);
    v
}

fn gen_target(rng: &mut StdRng, tag: &str) -> String {
    // Always dangling: nothing is ever written through one.
    if rng.random_bool(0.5) {
        format!("/nonexistent/soak/{tag}")
    } else {
        format!("nowhere/{tag}")
    }
}

#[derive(Clone, Debug)]
enum NewKind {
    File(Vec<u8>, u32),
    Dir,
    Symlink(String),
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        path: String,
        content: Vec<u8>,
        mode: u32,
        atomic: bool,
    },
    Append {
        path: String,
        content: Vec<u8>,
    },
    Rm {
        path: String,
    },
    Rename {
        from: String,
        to: String,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
    Mkdir {
        path: String,
    },
    /// `rm -r` whatever is there, then create another kind.
    Replace {
        path: String,
        kind: NewKind,
    },
}

/// An actor's op generator: its rng and a counter making content unique.
struct Gen {
    rng: StdRng,
    actor: String,
    n: u64,
}

impl Gen {
    fn new(seed: u64, actor: &str, index: u64) -> Gen {
        Gen {
            rng: StdRng::seed_from_u64(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            actor: actor.to_owned(),
            n: 0,
        }
    }

    fn tag(&mut self) -> String {
        self.n += 1;
        format!("{}#{}", self.actor, self.n)
    }

    /// One file-system op in `areas` (renames stay within one area).
    fn fs_op(&mut self, areas: &[&str]) -> Op {
        let area = areas[self.rng.random_range(0..areas.len())];
        let path = gen_path(&mut self.rng, area);
        let tag = self.tag();
        let r = &mut self.rng;
        match r.random_range(0..100) {
            0..35 => Op::Write {
                content: gen_content(r, &tag),
                mode: gen_mode(r),
                atomic: r.random_bool(0.5),
                path,
            },
            35..45 => Op::Append {
                content: format!("{tag}+").into_bytes(),
                path,
            },
            45..58 => Op::Rm { path },
            58..68 => Op::Rename {
                to: gen_path(r, area),
                from: path,
            },
            68..76 => Op::Chmod {
                mode: gen_mode(r),
                path,
            },
            76..82 => Op::Symlink {
                target: gen_target(r, &tag),
                path,
            },
            82..90 => Op::Mkdir { path },
            _ => {
                let kind = match r.random_range(0..3) {
                    0 => NewKind::File(gen_content(r, &tag), gen_mode(r)),
                    1 => NewKind::Dir,
                    _ => NewKind::Symlink(gen_target(r, &tag)),
                };
                Op::Replace { path, kind }
            }
        }
    }
}

fn ancestors(path: &str) -> Vec<&str> {
    path.match_indices('/').map(|(i, _)| &path[..i]).collect()
}

fn parent(path: &str) -> &str {
    path.rfind('/').map(|i| &path[..i]).unwrap_or("")
}

fn sp(s: &str) -> SyncPath {
    SyncPath::new(s).expect("generated paths are canonical")
}

// --- the authority side ---------------------------------------------------

fn auth_state(d: &Dofs, path: &str) -> St {
    match d.stat(&sp(path)) {
        Err(_) => St::Absent,
        Ok(s) => match s.kind {
            Kind::Dir => St::Dir,
            Kind::Symlink => St::Symlink(s.target.unwrap_or_default()),
            Kind::File => St::file(&d.read_file(&sp(path)).unwrap_or_default(), s.mode),
        },
    }
}

fn auth_subtree(d: &Dofs, path: &str, out: &mut Vec<(String, St)>) {
    let st = auth_state(d, path);
    let is_dir = st == St::Dir;
    out.push((path.to_owned(), st));
    if is_dir && let Ok(children) = d.readdir(Some(&sp(path))) {
        for c in children {
            auth_subtree(d, c.path.as_str(), out);
        }
    }
}

/// Applies `op` to the authority store and logs what it changed. Every
/// authority mutation happens on the main thread, so reading the state back
/// after the op is exact.
fn auth_apply(d: &mut Dofs, op: &Op, j: &Journal) -> bool {
    let lo = tick();
    let missing_ancestors = |d: &Dofs, p: &str| -> Vec<String> {
        ancestors(p)
            .into_iter()
            .filter(|a| !d.exists(&sp(a)).unwrap_or(true))
            .map(str::to_owned)
            .collect()
    };
    let create = WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    };
    let mut touched: Vec<String> = Vec::new();
    let mut subtree_gone: Option<String> = None;
    let ok = match op {
        Op::Write {
            path,
            content,
            mode,
            ..
        } => {
            touched = missing_ancestors(d, path);
            touched.push(path.clone());
            let opts = WriteOptions {
                mode: Some(*mode),
                ..create
            };
            d.write_file_with(&sp(path), &content[..], opts).is_ok()
        }
        Op::Append { path, content } => {
            touched.push(path.clone());
            d.append_file(&sp(path), &content[..]).is_ok()
        }
        Op::Rm { path } => {
            subtree_gone = Some(path.clone());
            d.rm(&sp(path), true).is_ok()
        }
        Op::Rename { from, to } => {
            let ok = d.rename(&sp(from), &sp(to)).is_ok();
            if ok {
                subtree_gone = Some(from.clone());
                let mut moved = Vec::new();
                auth_subtree(d, to, &mut moved);
                touched = moved.into_iter().map(|(p, _)| p).collect();
            }
            ok
        }
        Op::Chmod { path, mode } => {
            touched.push(path.clone());
            d.chmod(&sp(path), *mode).is_ok()
        }
        Op::Symlink { path, target } => {
            touched.push(path.clone());
            d.symlink(target, &sp(path)).is_ok()
        }
        Op::Mkdir { path } => {
            touched = missing_ancestors(d, path);
            touched.push(path.clone());
            d.mkdir(&sp(path), true).is_ok()
        }
        Op::Replace { path, kind } => {
            let removed = d.rm(&sp(path), true).is_ok();
            if removed {
                subtree_gone = Some(path.clone());
            }
            touched = missing_ancestors(d, path);
            touched.push(path.clone());
            let p = sp(path);
            let created = match kind {
                NewKind::File(content, mode) => d
                    .write_file_with(
                        &p,
                        &content[..],
                        WriteOptions {
                            mode: Some(*mode),
                            ..create
                        },
                    )
                    .is_ok(),
                NewKind::Dir => d.mkdir(&p, true).is_ok(),
                NewKind::Symlink(t) => {
                    let parent_ok = match p.parent() {
                        Some(par) => d.mkdir(&par, true).is_ok(),
                        None => true,
                    };
                    parent_ok && d.symlink(t, &p).is_ok()
                }
            };
            removed || created
        }
    };
    let hi = tick();
    if !ok {
        return false;
    }
    let what = format!("auth {}", op_name(op));
    if let Some(g) = subtree_gone {
        j.add(Ev {
            path: g,
            st: St::Absent,
            subtree: true,
            side: Side::Auth,
            lo,
            hi,
            certain: true,
            what: what.clone(),
        });
    }
    for p in touched {
        let st = auth_state(d, &p);
        j.add(Ev {
            path: p,
            st,
            subtree: false,
            side: Side::Auth,
            lo,
            hi,
            certain: true,
            what: what.clone(),
        });
    }
    true
}

fn op_name(op: &Op) -> String {
    match op {
        Op::Write { path, atomic, .. } => {
            format!("write{} {path}", if *atomic { "(atomic)" } else { "" })
        }
        Op::Append { path, .. } => format!("append {path}"),
        Op::Rm { path } => format!("rm -r {path}"),
        Op::Rename { from, to } => format!("rename {from} -> {to}"),
        Op::Chmod { path, mode } => format!("chmod {mode:o} {path}"),
        Op::Symlink { path, .. } => format!("symlink {path}"),
        Op::Mkdir { path } => format!("mkdir -p {path}"),
        Op::Replace { path, kind } => format!(
            "replace {path} by a {}",
            match kind {
                NewKind::File(..) => "file",
                NewKind::Dir => "dir",
                NewKind::Symlink(_) => "symlink",
            }
        ),
    }
}

// --- the daemon side: plain file-system ops in the served directory -------

fn disk_state(root: &Path, path: &str) -> St {
    let abs = root.join(path);
    match std::fs::symlink_metadata(&abs) {
        Err(_) => St::Absent,
        Ok(m) if m.file_type().is_symlink() => St::Symlink(
            std::fs::read_link(&abs)
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
        Ok(m) if m.is_dir() => St::Dir,
        Ok(_) => match open_nofollow(&abs, false) {
            Ok(mut f) => fd_state(&mut f).unwrap_or(St::Absent),
            Err(_) => St::Absent,
        },
    }
}

fn open_nofollow(abs: &Path, write: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW)
        .open(abs)
}

/// The state of an open file: its whole content and mode, read through the
/// descriptor (so a concurrent rename over the path does not matter).
fn fd_state(f: &mut File) -> std::io::Result<St> {
    let meta = f.metadata()?;
    if meta.is_dir() {
        return Ok(St::Dir);
    }
    let mut bytes = Vec::new();
    f.rewind()?;
    f.read_to_end(&mut bytes)?;
    Ok(St::file(&bytes, meta.permissions().mode()))
}

fn disk_subtree(root: &Path, path: &str, out: &mut Vec<String>) {
    out.push(path.to_owned());
    let abs = root.join(path);
    if std::fs::symlink_metadata(&abs).is_ok_and(|m| m.is_dir())
        && let Ok(rd) = std::fs::read_dir(&abs)
    {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            disk_subtree(root, &format!("{path}/{name}"), out);
        }
    }
}

fn remove_any(abs: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(abs) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(abs),
        Ok(_) => std::fs::remove_file(abs),
        Err(e) => Err(e),
    }
}

/// Creates the missing ancestors of `path`; returns those it created.
fn make_parents(root: &Path, path: &str) -> std::io::Result<Vec<String>> {
    let mut made = Vec::new();
    for a in ancestors(path) {
        match std::fs::create_dir(root.join(a)) {
            Ok(()) => made.push(a.to_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(made)
}

fn write_new(abs: &Path, content: &[u8], mode: u32, truncate: bool) -> std::io::Result<File> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(truncate)
        .create_new(!truncate)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(mode)
        .open(abs)?;
    f.write_all(content)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(f)
}

/// Applies `op` in the served directory (as a command in the workspace
/// would) and logs it. The daemon may be applying a push concurrently, so
/// states are read through the descriptors the op wrote.
fn disk_apply(root: &Path, op: &Op, j: &Journal, tmp_counter: &mut u64) -> bool {
    let lo = tick();
    let mut evs: Vec<(String, St, bool)> = Vec::new(); // (path, state, subtree)
    let mut certain = true;
    let result: std::io::Result<()> = (|| {
        match op {
            Op::Write {
                path,
                content,
                mode,
                atomic,
            } => {
                let abs = root.join(path);
                if std::fs::symlink_metadata(&abs).is_ok_and(|m| m.file_type().is_symlink()) {
                    std::fs::remove_file(&abs)?;
                }
                for a in make_parents(root, path)? {
                    evs.push((a, St::Dir, false));
                }
                let mut f = if *atomic {
                    *tmp_counter += 1;
                    let tmp = root
                        .join(parent(path))
                        .join(format!(".soak-tmp-{}", tmp_counter));
                    let f = write_new(&tmp, content, *mode, true)?;
                    if let Err(e) = std::fs::rename(&tmp, &abs) {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(e);
                    }
                    f
                } else {
                    write_new(&abs, content, *mode, true)?
                };
                evs.push((path.clone(), fd_state(&mut f)?, false));
            }
            Op::Append { path, content } => {
                let mut f = OpenOptions::new()
                    .read(true)
                    .append(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(root.join(path))?;
                f.write_all(content)?;
                evs.push((path.clone(), fd_state(&mut f)?, false));
            }
            Op::Rm { path } => {
                let r = remove_any(&root.join(path));
                match &r {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return r,
                    Err(_) => certain = false,
                    Ok(()) => {}
                }
                evs.push((path.clone(), St::Absent, true));
                r?;
            }
            Op::Rename { from, to } => {
                if to.starts_with(&format!("{from}/")) || from == to {
                    return Err(std::io::ErrorKind::InvalidInput.into());
                }
                std::fs::rename(root.join(from), root.join(to))?;
                evs.push((from.clone(), St::Absent, true));
                let mut moved = Vec::new();
                disk_subtree(root, to, &mut moved);
                for p in moved {
                    let st = disk_state(root, &p);
                    evs.push((p, st, false));
                }
            }
            Op::Chmod { path, mode } => {
                let mut f = open_nofollow(&root.join(path), false)?;
                f.set_permissions(std::fs::Permissions::from_mode(*mode))?;
                let st = fd_state(&mut f)?;
                evs.push((path.clone(), st, false));
            }
            Op::Symlink { path, target } => {
                std::os::unix::fs::symlink(target, root.join(path))?;
                evs.push((path.clone(), St::Symlink(target.clone()), false));
            }
            Op::Mkdir { path } => {
                for a in make_parents(root, &format!("{path}/x"))? {
                    evs.push((a, St::Dir, false));
                }
            }
            Op::Replace { path, kind } => {
                let abs = root.join(path);
                match remove_any(&abs) {
                    Ok(()) => evs.push((path.clone(), St::Absent, true)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        certain = false;
                        evs.push((path.clone(), St::Absent, true));
                        return Err(e);
                    }
                }
                for a in make_parents(root, path)? {
                    evs.push((a, St::Dir, false));
                }
                match kind {
                    NewKind::File(content, mode) => {
                        let mut f = write_new(&abs, content, *mode, false)?;
                        evs.push((path.clone(), fd_state(&mut f)?, false));
                    }
                    NewKind::Dir => {
                        std::fs::create_dir(&abs)?;
                        evs.push((path.clone(), St::Dir, false));
                    }
                    NewKind::Symlink(t) => {
                        std::os::unix::fs::symlink(t, &abs)?;
                        evs.push((path.clone(), St::Symlink(t.clone()), false));
                    }
                }
            }
        }
        Ok(())
    })();
    let hi = tick();
    let what = format!("wsd {}", op_name(op));
    let any = !evs.is_empty();
    for (path, st, subtree) in evs {
        j.add(Ev {
            path,
            st,
            subtree,
            side: Side::Wsd,
            lo,
            hi,
            // Logged steps of a failed op did happen (parents made, a
            // subtree removed); a half-done recursive delete is uncertain.
            certain,
            what: what.clone(),
        });
    }
    result.is_ok() || any
}

// --- exec: commands that write files, run by the daemon --------------------

/// A command for `x/` and the events it makes if it exits 0.
fn gen_exec(g: &mut Gen) -> (String, Vec<(String, St, bool)>) {
    let tag = g.tag();
    let r = &mut g.rng;
    let alnum = |r: &mut StdRng, n: usize| -> String {
        (0..n)
            .map(|_| {
                let c = r.random_range(0..62u8);
                (match c {
                    0..10 => b'0' + c,
                    10..36 => b'a' + c - 10,
                    _ => b'A' + c - 36,
                }) as char
            })
            .collect()
    };
    let q = |s: &str| format!("'{s}'");
    let write = |r: &mut StdRng, path: &str, evs: &mut Vec<(String, St, bool)>| -> String {
        let n = r.random_range(0..3000);
        let content = format!("{tag}{path}\n{}", alnum(r, n));
        let mode = gen_mode(r);
        for a in ancestors(path).into_iter().skip(1) {
            evs.push((a.to_owned(), St::Dir, false));
        }
        evs.push((path.to_owned(), St::file(content.as_bytes(), mode), false));
        format!(
            "mkdir -p {} && printf '%s' {} > {} && chmod {mode:o} {}",
            q(parent(path)),
            q(&content),
            q(path),
            q(path)
        )
    };
    let mut evs = Vec::new();
    let cmd = match r.random_range(0..10) {
        0..4 => {
            let p = gen_path(r, "x");
            write(r, &p, &mut evs)
        }
        4..6 => {
            let (a, b) = (gen_path(r, "x"), gen_path(r, "x"));
            let c1 = write(r, &a, &mut evs);
            let c2 = write(r, &b, &mut evs);
            format!("{c1} && {c2}")
        }
        6 => {
            let p = gen_path(r, "x");
            let n = r.random_range(100_000..600_000);
            let line = format!("{tag} {}\n", alnum(r, 40));
            let content: Vec<u8> = line.bytes().cycle().take(n).collect();
            for a in ancestors(&p).into_iter().skip(1) {
                evs.push((a.to_owned(), St::Dir, false));
            }
            evs.push((p.clone(), St::file(&content, 0o644), false));
            format!(
                "mkdir -p {} && yes {} | head -c {n} > {} && chmod 644 {}",
                q(parent(&p)),
                q(line.trim_end()),
                q(&p),
                q(&p)
            )
        }
        7 | 8 => {
            let p = gen_path(r, "x");
            evs.push((p.clone(), St::Absent, true));
            format!("rm -rf {}", q(&p))
        }
        _ => {
            let p = gen_path(r, "x");
            let t = gen_target(r, &tag);
            for a in ancestors(&p).into_iter().skip(1) {
                evs.push((a.to_owned(), St::Dir, false));
            }
            evs.push((p.clone(), St::Absent, true));
            evs.push((p.clone(), St::Symlink(t.clone()), false));
            // `-T`: if a concurrent command made the path a directory again
            // after the `rm`, fail instead of linking inside it (a path this
            // command never names, which the checker cannot explain).
            format!(
                "mkdir -p {} && rm -rf {} && ln -sT {} {}",
                q(parent(&p)),
                q(&p),
                q(&t),
                q(&p)
            )
        }
    };
    (cmd, evs)
}

/// Runs one command to its exit event; logs its writes over `[lo, exit]`.
async fn run_exec(
    client: Client,
    cmd: String,
    evs: Vec<(String, St, bool)>,
    j: Arc<Journal>,
    stats: Rc<std::cell::RefCell<ExecStats>>,
) {
    let lo = tick();
    let req = ExecRequest {
        command: cmd.clone(),
        ..ExecRequest::default()
    };
    let mut code = None;
    let mut err = None;
    let mut stderr = Vec::new();
    match client.exec(&req).await {
        Err(e) => err = Some(e.code.to_string()),
        Ok(mut stream) => loop {
            match stream.next().await {
                Ok(Some(ev)) => match ev.kind {
                    ExecEventKind::Exit(c) => code = Some(c),
                    ExecEventKind::Stderr(b) => stderr.extend(b),
                    ExecEventKind::Stdout(_) => {}
                },
                Ok(None) => break,
                Err(e) => {
                    err = Some(e.code.to_string());
                    break;
                }
            }
        },
    }
    let hi = tick();
    let mut s = stats.borrow_mut();
    s.execs += 1;
    match (code, err) {
        (Some(0), _) => s.exec_ok += 1,
        (Some(c), _) => {
            s.exec_failed += 1;
            if s.exec_failed <= 3 {
                eprintln!(
                    "soak: exec exited {c}: {}",
                    String::from_utf8_lossy(&stderr).trim()
                );
            }
        }
        (None, e) => *s.errors.entry(e.unwrap_or_default()).or_default() += 1,
    }
    // A command that failed may have done part of its work: its writes can
    // explain a final state but supersede nothing. One that never reported
    // an exit (connection lost) may still run: the same.
    for (path, st, subtree) in evs {
        j.add(Ev {
            path,
            st,
            subtree,
            side: Side::Wsd,
            lo,
            hi,
            certain: code == Some(0),
            what: format!(
                "exec `{}`",
                cmd.lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(60)
                    .collect::<String>()
            ),
        });
    }
}

// --- samples -------------------------------------------------------------

/// Counters of the exec tasks (shared with them; never borrowed across an
/// await).
#[derive(Default)]
struct ExecStats {
    execs: u64,
    exec_ok: u64,
    exec_failed: u64,
    errors: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Stats {
    auth_ops: u64,
    auth_failed: u64,
    wsd_ops: u64,
    wsd_failed: u64,
    pushes: u64,
    pulls: u64,
    pushed_entries: u64,
    pulled_entries: u64,
    overwrote_local: u64,
    reconnects: u64,
    errors: BTreeMap<String, u64>,
    samples: u64,
    drills: u64,
}

/// What a drill's syncs need.
struct DrillCtx<'a> {
    dofs: &'a mut Dofs,
    link: &'a mut Link,
    stats: &'a mut Stats,
    syncs: &'a mut Vec<SyncRec>,
}

impl DrillCtx<'_> {
    /// A push or pull that must succeed (a few tries: the daemon may still
    /// be settling after its restart).
    async fn retry(&mut self, push: bool, drill: Drill, violations: &mut Vec<String>) {
        for _ in 0..5 {
            if sync_step(push, self.dofs, self.link, self.stats, self.syncs)
                .await
                .is_ok()
            {
                return;
            }
        }
        violations.push(format!(
            "{drill:?}: the {} around the state loss kept failing",
            if push { "push" } else { "pull" }
        ));
    }
}

#[derive(Clone, Copy)]
struct ProcSample {
    rss_kib: u64,
    fds: usize,
}

struct Sampler {
    last_dofs: Option<Watermarks>,
    last_wsd: Option<Watermarks>,
    procs: Vec<ProcSample>,
}

impl Sampler {
    /// Watermarks of both sides must only move forward, and never past
    /// what the other side holds.
    async fn sample(
        &mut self,
        dofs: &mut Dofs,
        client: &Client,
        pid: u32,
        violations: &mut Vec<String>,
    ) {
        if let (Some(rss_kib), Some(fds)) =
            (wsd_tests::proc_rss_kib(pid), wsd_tests::proc_fd_count(pid))
        {
            self.procs.push(ProcSample { rss_kib, fds });
        }
        let d = match Store::watermarks(dofs, REMOTE) {
            Ok(w) => w,
            Err(e) => {
                violations.push(format!("dofs watermarks failed: {e}"));
                return;
            }
        };
        let Ok(w) = client.watermarks().await else {
            return; // counted by the sync steps; a lost connection is not a violation
        };
        let mut v = |m: String| violations.push(m);
        if d.push_cursor > ChangeCursor::at(d.current_rev) {
            v(format!(
                "dofs push cursor {} beyond its currentRev {}",
                d.push_cursor, d.current_rev
            ));
        }
        if d.fetch_cursor > ChangeCursor::at(w.current_rev) {
            v(format!(
                "dofs fetch cursor {} beyond the daemon's currentRev {}",
                d.fetch_cursor, w.current_rev
            ));
        }
        if w.fetch_cursor > ChangeCursor::at(d.current_rev) {
            v(format!(
                "daemon's appliedPushCursor {} beyond the authority's currentRev {}",
                w.fetch_cursor, d.current_rev
            ));
        }
        if let (Some(pd), Some(pw)) = (&self.last_dofs, &self.last_wsd) {
            if d.current_rev < pd.current_rev || w.current_rev < pw.current_rev {
                v(format!(
                    "a currentRev moved back: dofs {} -> {}, wsd {} -> {}",
                    pd.current_rev, d.current_rev, pw.current_rev, w.current_rev
                ));
            }
            if d.push_cursor < pd.push_cursor || d.fetch_cursor < pd.fetch_cursor {
                v(format!(
                    "dofs cursors moved back: push {} -> {}, fetch {} -> {}",
                    pd.push_cursor, d.push_cursor, pd.fetch_cursor, d.fetch_cursor
                ));
            }
            if w.fetch_cursor < pw.fetch_cursor {
                v(format!(
                    "daemon's appliedPushCursor moved back: {} -> {}",
                    pw.fetch_cursor, w.fetch_cursor
                ));
            }
        }
        self.last_dofs = Some(d);
        self.last_wsd = Some(w);
    }
}

// --- the no-write-lost check ----------------------------------------------

/// Every final state must be explained by a logged write that nothing
/// logged supersedes; every such write's path must hold one of those.
fn check_no_write_lost(
    events: &[Ev],
    syncs: &[SyncRec],
    final_tree: &BTreeMap<String, String>,
    root_final: &Path,
    violations: &mut Vec<String>,
) -> usize {
    // When was each event delivered to the other side: the end of the
    // first successful sync in its direction that started after it ended.
    let pushes: Vec<SyncRec> = syncs.iter().copied().filter(|s| s.push).collect();
    let pulls: Vec<SyncRec> = syncs.iter().copied().filter(|s| !s.push).collect();
    let delivered = |e: &Ev| -> u64 {
        let list = if e.side == Side::Auth {
            &pushes
        } else {
            &pulls
        };
        let i = list.partition_point(|s| s.start <= e.hi);
        list.get(i).map(|s| s.end).unwrap_or(u64::MAX)
    };
    let mut by_path: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut has_descendant_events: std::collections::HashSet<&str> = Default::default();
    for (i, e) in events.iter().enumerate() {
        by_path.entry(e.path.as_str()).or_default().push(i);
        for a in ancestors(&e.path) {
            has_descendant_events.insert(a);
        }
    }
    let mut paths: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e.path.as_str()).collect();
    paths.extend(final_tree.keys().map(String::as_str));
    let mut checked = 0;
    for path in paths {
        // Events at the path, and recursive deletes of its ancestors.
        let mut rel: Vec<usize> = by_path.get(path).cloned().unwrap_or_default();
        for a in ancestors(path) {
            if let Some(v) = by_path.get(a) {
                rel.extend(v.iter().copied().filter(|&i| events[i].subtree));
            }
        }
        // y supersedes x iff y is certain and started after x ended (same
        // side) or after x was delivered (other side): only the latest
        // certain start per side matters.
        let mut latest = [0u64; 2];
        for &i in &rel {
            let e = &events[i];
            if e.certain {
                let k = e.side as usize;
                latest[k] = latest[k].max(e.lo);
            }
        }
        let candidates: Vec<usize> = rel
            .iter()
            .copied()
            .filter(|&x| {
                let e = &events[x];
                let same = latest[e.side as usize];
                let other = latest[1 - e.side as usize];
                !(same > e.hi || other > delivered(e))
            })
            .collect();
        let final_st = disk_state(root_final, path);
        let implied_dir = has_descendant_events.contains(path);
        let matches = |i: usize| -> bool {
            match (&events[i].st, &final_st) {
                (St::Absent, St::Absent) | (St::Dir, St::Dir) => true,
                // A path removed with its subtree may come back as the
                // implied parent of a concurrent write below it.
                (St::Absent, St::Dir) => implied_dir,
                (a, b) => a == b,
            }
        };
        // Under a final file or symlink nothing can exist: a kind change
        // replaces the subtree (last applier wins), so a concurrent write
        // below it lost the conflict. Whether that ancestor's state is
        // explained is checked at the ancestor itself.
        let shadowed = final_st == St::Absent
            && ancestors(path)
                .into_iter()
                .any(|a| std::fs::symlink_metadata(root_final.join(a)).is_ok_and(|m| !m.is_dir()));
        checked += 1;
        let ok = candidates.iter().any(|&i| matches(i))
            || (final_st == St::Dir && implied_dir)
            || (rel.is_empty() && final_st == St::Absent)
            || shadowed;
        if !ok {
            let mut msg = format!(
                "write lost or unexplained state at {path}: final is {}; unsuperseded writes:",
                final_st.short()
            );
            for &i in &candidates {
                let e = &events[i];
                msg.push_str(&format!(
                    "\n      [{}..{}] {:?} {}{} -> {}{}",
                    e.lo,
                    e.hi,
                    e.side,
                    e.what,
                    if e.certain { "" } else { " (uncertain)" },
                    if e.subtree { "subtree " } else { "" },
                    e.st.short()
                ));
            }
            if candidates.is_empty() {
                msg.push_str(" none");
            }
            // The whole history at the path and its ancestors, so a
            // failure found in CI can be read without a replay.
            let mut history: Vec<usize> = by_path.get(path).cloned().unwrap_or_default();
            for a in ancestors(path) {
                history.extend(by_path.get(a).into_iter().flatten().copied());
            }
            history.sort_by_key(|&i| (events[i].lo, i));
            let skip = history.len().saturating_sub(40);
            msg.push_str(
                "\n    history (path and ancestors; delivered = end of the sync that carried it):",
            );
            for &i in &history[skip..] {
                let e = &events[i];
                let d = delivered(e);
                msg.push_str(&format!(
                    "\n      [{}..{}] delivered {} {:?} {} {}{}{} -> {}",
                    e.lo,
                    e.hi,
                    if d == u64::MAX {
                        "never".to_owned()
                    } else {
                        d.to_string()
                    },
                    e.side,
                    e.path,
                    e.what,
                    if e.certain { "" } else { " (uncertain)" },
                    if e.subtree { " subtree" } else { "" },
                    e.st.short()
                ));
            }
            violations.push(msg);
        }
    }
    checked
}

// --- the run ---------------------------------------------------------------

struct Link {
    addr: String,
    /// The authority's peer name (new after it lost its state).
    peer: String,
    client: Option<Client>,
}

impl Link {
    /// The connection, re-dialled (and reconciled) after a loss.
    async fn get(&mut self, dofs: &mut Dofs, stats: &mut Stats) -> Result<Client, SyncError> {
        if let Some(c) = &self.client
            && c.is_connected()
        {
            return Ok(c.clone());
        }
        if self.client.is_some() {
            stats.reconnects += 1;
        }
        let mut c = client::connect(&self.addr, None, &self.peer).await?;
        driver::reconcile(dofs, &mut c, REMOTE).await?;
        self.client = Some(c.clone());
        Ok(c)
    }
}

async fn sync_step(
    push: bool,
    dofs: &mut Dofs,
    link: &mut Link,
    stats: &mut Stats,
    syncs: &mut Vec<SyncRec>,
) -> Result<u64, SyncError> {
    let ignore = IgnoreRules::none();
    let opts = SyncOptions {
        remote_name: REMOTE,
        ignore: &ignore,
    };
    let mut c = link.get(dofs, stats).await?;
    let start = tick();
    let r = if push {
        driver::push(dofs, &mut c, &opts, |_| {}).await
    } else {
        driver::pull(dofs, &mut c, &opts, |_| {}).await
    };
    let end = tick();
    match r {
        Ok(rep) => {
            syncs.push(SyncRec { push, start, end });
            if push {
                stats.pushes += 1;
                stats.pushed_entries += rep.entries;
            } else {
                stats.pulls += 1;
                stats.pulled_entries += rep.entries;
                stats.overwrote_local += rep.overwrote_local;
            }
            Ok(rep.entries)
        }
        Err(e) => {
            let key = format!("{} {}", if push { "push" } else { "pull" }, e.code());
            let n = stats.errors.entry(key).or_default();
            *n += 1;
            if *n <= 3 {
                eprintln!("soak: {} failed: {e}", if push { "push" } else { "pull" });
            }
            Err(e)
        }
    }
}

fn daemon_program() -> Vec<OsString> {
    if let Some(p) = std::env::var_os("WSD_BIN") {
        return vec![p];
    }
    let exe = std::env::current_exe().expect("own path");
    let sibling = exe.with_file_name("wsd");
    if sibling.exists() {
        return vec![sibling.into()];
    }
    // No `wsd` binary built beside us: serve from this binary (the same
    // `wsd::daemon::run` the `wsd serve` command runs).
    vec![exe.into(), "__daemon".into()]
}

/// `soak __daemon serve --listen A --root R --state S`: the embedded daemon.
fn embedded_daemon(args: &[String]) -> Result<ExitCode> {
    let get = |flag: &str| -> Result<String> {
        let i = args
            .iter()
            .position(|a| a == flag)
            .with_context(|| format!("{flag} missing"))?;
        args.get(i + 1)
            .cloned()
            .with_context(|| format!("{flag} needs a value"))
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("wsd=info,warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let root = PathBuf::from(get("--root")?).canonicalize()?;
    let mut config = wsd::daemon::DaemonConfig::local(root, PathBuf::from(get("--state")?));
    config.listen = vec![get("--listen")?];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio::task::LocalSet::new().block_on(&rt, async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        wsd::daemon::run(config, |_| {}, async move {
            term.recv().await;
        })
        .await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some("__daemon") {
        return match embedded_daemon(&raw[2..]) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("soak daemon: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(rand::random);
    println!(
        "soak: seed {seed} (replay: --seed {seed} --workers {})",
        args.workers
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = tokio::task::LocalSet::new().block_on(&rt, run(args, seed));
    match result {
        Ok(violations) if violations.is_empty() => {
            println!("soak: PASS (seed {seed})");
            ExitCode::SUCCESS
        }
        Ok(violations) => {
            println!(
                "soak: FAIL with {} violation(s) (seed {seed}):",
                violations.len()
            );
            for v in violations.iter().take(40) {
                println!("  - {v}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("soak: ERROR {e:#} (seed {seed})");
            ExitCode::FAILURE
        }
    }
}

/// What the journal and the daemon's log say about `path` (and the paths
/// above and below it), so a divergence CI reports can be read from its
/// output alone: the run's directory is gone with the machine.
fn divergence_history(path: &str, events: &[Ev], log: &Path) -> Vec<String> {
    let related = |p: &str| {
        p == path
            || path.strip_prefix(p).is_some_and(|r| r.starts_with('/'))
            || p.strip_prefix(path).is_some_and(|r| r.starts_with('/'))
    };
    let mut evs: Vec<&Ev> = events.iter().filter(|e| related(&e.path)).collect();
    evs.sort_by_key(|e| e.hi);
    let mut out = vec![format!(
        "history of {path}: last journal events (of {}), oldest first",
        evs.len()
    )];
    for e in evs.iter().skip(evs.len().saturating_sub(12)) {
        out.push(format!(
            "  [{}..{}] {:?} {}{}: {} is {}",
            e.lo,
            e.hi,
            e.side,
            e.what,
            if e.certain { "" } else { " (uncertain)" },
            if e.subtree {
                format!("{}/**", e.path)
            } else {
                e.path.clone()
            },
            e.st.short()
        ));
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(path)).collect();
    out.push(format!(
        "daemon log lines naming {path} (of {}), last ones",
        lines.len()
    ));
    for l in lines.iter().skip(lines.len().saturating_sub(12)) {
        out.push(format!("  {}", l.chars().take(400).collect::<String>()));
    }
    out
}

async fn run(args: Args, seed: u64) -> Result<Vec<String>> {
    let tmp = tempfile::Builder::new().prefix("wsd-soak-").tempdir()?;
    let served = tmp.path().join("served");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&served)?;
    std::fs::create_dir_all(&state)?;
    let log_path = tmp.path().join("daemon.log");
    let program = daemon_program();
    println!("soak: daemon {:?}, dir {}", program, tmp.path().display());
    let mut daemon = Daemon::builder(&served)
        .state(&state)
        .program(program)
        .log(&log_path)
        .start();
    let mut pid = daemon.pid();
    let served = served.canonicalize()?;
    let mut dofs = Dofs::open(tmp.path().join("authority.dofs"))?;
    let journal = Arc::new(Journal::default());
    let exec_stats = Rc::new(std::cell::RefCell::new(ExecStats::default()));
    let mut stats = Stats::default();
    let mut violations = Vec::new();
    let mut syncs = Vec::new();
    let mut link = Link {
        addr: daemon.addr.clone(),
        peer: PEER.to_owned(),
        client: None,
    };
    let mut sampler = Sampler {
        last_dofs: None,
        last_wsd: None,
        procs: Vec::new(),
    };

    // Daemon-side workers, each in its own area. A drill holds `gate` to
    // pause them between two ops.
    let stop = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(tokio::sync::Mutex::new(()));
    let mut workers = Vec::new();
    for i in 1..=args.workers {
        let (stop, j, root) = (stop.clone(), journal.clone(), served.clone());
        let gate = gate.clone();
        workers.push(std::thread::spawn(move || {
            let area = format!("w{i}");
            let mut g = Gen::new(seed, &area, i as u64);
            let (mut ops, mut failed, mut tmp_n) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let op = g.fs_op(&[&area]);
                ops += 1;
                let paused = gate.blocking_lock();
                if !disk_apply(&root, &op, &j, &mut tmp_n) {
                    failed += 1;
                }
                drop(paused);
                let pause = g.rng.random_range(0..4);
                std::thread::sleep(Duration::from_millis(pause));
            }
            (ops, failed)
        }));
    }

    // The main actor.
    let mut g = Gen::new(seed, "main", 0);
    let mut tmp_n = 0u64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let mut last_sample = Instant::now() - Duration::from_secs(1);
    let mut execs: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let areas_all: Vec<String> = std::iter::once("a".to_owned())
        .chain((0..=args.workers).map(|i| format!("w{i}")))
        .chain(std::iter::once("x".to_owned()))
        .collect();
    let areas_all: Vec<&str> = areas_all.iter().map(String::as_str).collect();
    let mut steps = 0u64;
    let mut next_report = Duration::from_secs(60);
    // Equal for equal seeds: the op sequence does not depend on timing.
    let mut fingerprint = Sha256::new();
    let mut drills = vec![
        (
            Duration::from_secs(args.seconds) / 3,
            Drill::RemoteStateLoss,
        ),
        (
            Duration::from_secs(args.seconds) * 2 / 3,
            Drill::AuthorityStateLoss,
        ),
    ];
    let mut authority_generation = 0u32;
    while Instant::now() < deadline {
        if let Some(&(at, drill)) = drills.first()
            && started.elapsed() >= at
        {
            drills.remove(0);
            let paused = gate.lock().await;
            let exec_deadline = Instant::now() + Duration::from_secs(60);
            for h in execs.drain(..) {
                let left = exec_deadline.saturating_duration_since(Instant::now());
                if tokio::time::timeout(left, h).await.is_err() {
                    violations.push(format!("{drill:?}: an exec did not finish within 60 s"));
                }
            }
            let mut ctx = DrillCtx {
                dofs: &mut dofs,
                link: &mut link,
                stats: &mut stats,
                syncs: &mut syncs,
            };
            match drill {
                Drill::RemoteStateLoss => {
                    ctx.retry(false, drill, &mut violations).await;
                    daemon.stop();
                    for dir in [&served, &state] {
                        std::fs::remove_dir_all(dir)?;
                        std::fs::create_dir_all(dir)?;
                    }
                    daemon.restart();
                    pid = daemon.pid();
                    ctx.link.client = None;
                    ctx.retry(true, drill, &mut violations).await;
                }
                Drill::AuthorityStateLoss => {
                    ctx.retry(true, drill, &mut violations).await;
                    authority_generation += 1;
                    *ctx.dofs = Dofs::open(
                        tmp.path()
                            .join(format!("authority-{authority_generation}.dofs")),
                    )?;
                    ctx.link.peer = format!("{PEER}-{authority_generation}");
                    ctx.link.client = None;
                    ctx.retry(false, drill, &mut violations).await;
                }
            }
            let (auth_tree, wsd_tree) = (dofs_digest(&dofs), tree_digest(&served));
            if auth_tree != wsd_tree {
                violations.push(format!(
                    "{drill:?}: trees differ after the re-baseline ({} vs {} paths):\n    {}",
                    auth_tree.len(),
                    wsd_tree.len(),
                    digest_diff(&auth_tree, &wsd_tree, 20).join("\n    ")
                ));
            }
            println!(
                "soak: t={:>4} s  drill {drill:?}: {} paths on both sides",
                started.elapsed().as_secs(),
                wsd_tree.len()
            );
            stats.drills += 1;
            // Watermarks legitimately restart with the wiped side.
            sampler.last_dofs = None;
            sampler.last_wsd = None;
            drop(paused);
        }
        steps += 1;
        execs.retain(|h| !h.is_finished());
        let dice = g.rng.random_range(0..100);
        if steps <= FINGERPRINT_STEPS {
            fingerprint.update([dice as u8]);
            fingerprint.update(g.n.to_le_bytes());
            if steps == FINGERPRINT_STEPS {
                println!(
                    "soak: main op sequence fingerprint after {FINGERPRINT_STEPS} steps: {}",
                    &hex::encode(fingerprint.clone().finalize())[..16]
                );
            }
        }
        match dice {
            0..40 => {
                // Mostly its own area, often the daemon side's (conflicts).
                let areas: &[&str] = if g.rng.random_bool(0.5) {
                    &["a"]
                } else {
                    &areas_all
                };
                let op = g.fs_op(areas);
                stats.auth_ops += 1;
                if !auth_apply(&mut dofs, &op, &journal) {
                    stats.auth_failed += 1;
                }
            }
            40..50 => {
                let op = g.fs_op(&["w0"]);
                stats.wsd_ops += 1;
                if !disk_apply(&served, &op, &journal, &mut tmp_n) {
                    stats.wsd_failed += 1;
                }
            }
            50..56 => {
                let (cmd, evs) = gen_exec(&mut g);
                if execs.len() < 2
                    && let Ok(c) = link.get(&mut dofs, &mut stats).await
                {
                    execs.push(tokio::task::spawn_local(run_exec(
                        c,
                        cmd,
                        evs,
                        journal.clone(),
                        exec_stats.clone(),
                    )));
                }
            }
            56..92 => {
                let s = &mut stats;
                let (pull, push) = match dice {
                    56..70 => (false, true),
                    70..84 => (true, false),
                    _ => (true, true),
                };
                if pull {
                    let _ = sync_step(false, &mut dofs, &mut link, s, &mut syncs).await;
                }
                if push {
                    let _ = sync_step(true, &mut dofs, &mut link, s, &mut syncs).await;
                }
            }
            92 => {
                if let Err(e) = dofs.prune_tombstones() {
                    violations.push(format!("dofs prune failed: {e}"));
                }
            }
            _ => {}
        }
        if last_sample.elapsed() >= Duration::from_millis(200) {
            last_sample = Instant::now();
            stats.samples += 1;
            if let Some(p) = sampler.procs.last()
                && started.elapsed() >= next_report
            {
                next_report += Duration::from_secs(60);
                println!(
                    "soak: t={:>4} s  daemon RSS {:.1} MiB, {} fds; {} steps, {} pushes, {} pulls",
                    started.elapsed().as_secs(),
                    p.rss_kib as f64 / 1024.0,
                    p.fds,
                    steps,
                    stats.pushes,
                    stats.pulls
                );
            }
            if let Ok(c) = link.get(&mut dofs, &mut stats).await {
                sampler.sample(&mut dofs, &c, pid, &mut violations).await;
            }
        }
        tokio::task::yield_now().await;
        if !daemon.is_running() {
            violations.push("the daemon exited during the run".into());
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut worker_ops = (0u64, 0u64);
    for w in workers {
        let (o, f) = w.join().expect("worker panicked");
        worker_ops.0 += o;
        worker_ops.1 += f;
    }
    let exec_deadline = Instant::now() + Duration::from_secs(60);
    for h in execs {
        let left = exec_deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, h).await.is_err() {
            violations.push("an exec did not finish within 60 s after the run".into());
        }
    }
    let concurrent_secs = started.elapsed().as_secs_f64();

    // Quiesce: pull then push until nothing moves; no error is allowed now.
    let mut rounds = 0;
    loop {
        rounds += 1;
        let pulled = sync_step(false, &mut dofs, &mut link, &mut stats, &mut syncs).await;
        let pushed = sync_step(true, &mut dofs, &mut link, &mut stats, &mut syncs).await;
        match (pulled, pushed) {
            (Ok(0), Ok(0)) if rounds > 1 => break,
            (Ok(_), Ok(_)) => {}
            (a, b) => violations.push(format!("quiesce round {rounds}: pull {a:?}, push {b:?}")),
        }
        if rounds == 10 {
            violations.push("did not quiesce in 10 pull+push rounds".into());
            break;
        }
    }

    // Convergence.
    let auth_tree = dofs_digest(&dofs);
    let wsd_tree = tree_digest(&served);
    let mut diverged: Vec<String> = Vec::new();
    if auth_tree != wsd_tree {
        diverged = differing_paths(&auth_tree, &wsd_tree)
            .take(3)
            .cloned()
            .collect();
        violations.push(format!(
            "trees differ (authority {} vs daemon disk {} paths):\n    {}",
            auth_tree.len(),
            wsd_tree.len(),
            digest_diff(&auth_tree, &wsd_tree, 20).join("\n    ")
        ));
    }
    let c = link.get(&mut dofs, &mut stats).await;
    let d = Store::watermarks(&mut dofs, REMOTE)?;
    match c {
        Err(e) => violations.push(format!("cannot reach the daemon after the run: {e}")),
        Ok(c) => {
            let w = c.watermarks().await?;
            if d.push_rev() != d.current_rev || d.push_cursor != ChangeCursor::at(d.current_rev) {
                violations.push(format!(
                    "authority pushRev {} (cursor {}) != currentRev {}",
                    d.push_rev(),
                    d.push_cursor,
                    d.current_rev
                ));
            }
            if w.fetch_cursor < d.push_cursor {
                violations.push(format!(
                    "daemon's appliedPushCursor {} does not cover the authority's push cursor {}",
                    w.fetch_cursor, d.push_cursor
                ));
            }
            if d.fetch_cursor < ChangeCursor::at(w.current_rev) {
                violations.push(format!(
                    "authority fetch cursor {} does not reach the daemon's currentRev {}",
                    d.fetch_cursor, w.current_rev
                ));
            }
            println!(
                "soak: watermarks: authority currentRev {} pushRev {} fetch {}; daemon currentRev {} appliedPushCursor {}",
                d.current_rev,
                d.push_rev(),
                d.fetch_cursor,
                w.current_rev,
                w.fetch_cursor
            );
        }
    }
    let events = std::mem::take(&mut *journal.events.lock().unwrap());
    let checked = check_no_write_lost(&events, &syncs, &wsd_tree, &served, &mut violations);
    for path in &diverged {
        for line in divergence_history(path, &events, &log_path) {
            println!("soak: {line}");
        }
    }
    if let Err(e) = dofs.check_integrity() {
        violations.push(format!("dofs integrity: {e}"));
    }
    let temps = find_named(&served, ".wsd-apply-");
    if !temps.is_empty() {
        violations.push(format!("temp files left in the workspace: {temps:?}"));
    }

    // Memory and descriptors: the last quarter against the first.
    let procs = &sampler.procs;
    let mut mem_line = String::from("too few samples");
    if procs.len() >= 8 {
        let q = procs.len() / 4;
        let avg = |s: &[ProcSample]| {
            (
                s.iter().map(|p| p.rss_kib).sum::<u64>() as f64 / s.len() as f64,
                s.iter().map(|p| p.fds).sum::<usize>() as f64 / s.len() as f64,
            )
        };
        let (rss0, fd0) = avg(&procs[..q]);
        let (rss1, fd1) = avg(&procs[procs.len() - q..]);
        mem_line = format!(
            "RSS {:.1} -> {:.1} MiB, fds {fd0:.1} -> {fd1:.1} ({} samples)",
            rss0 / 1024.0,
            rss1 / 1024.0,
            procs.len()
        );
        // Generous for warm-up (caches, SQLite pages), tight enough that a
        // steady leak shows within ten minutes or so.
        if rss1 > rss0 * 1.5 + 32.0 * 1024.0 {
            violations.push(format!("daemon memory grew: {mem_line}"));
        }
        if fd1 > fd0 + 16.0 {
            violations.push(format!("daemon file descriptors grew: {mem_line}"));
        }
    }
    drop(link);

    // A graceful stop, then the daemon's databases must be intact.
    let status = daemon.stop();
    if !status.success() {
        violations.push(format!("the daemon's graceful stop exited with {status}"));
    }
    for db in ["index.sqlite3", "exec.sqlite3"] {
        if let Err(e) = wsd_tests::sqlite_integrity(&state.join(db)) {
            violations.push(e);
        }
    }

    let s = &stats;
    let x = exec_stats.borrow();
    println!(
        "soak: {concurrent_secs:.1} s concurrent, {steps} main steps; authority ops {} ({} refused), \
         daemon-side ops {} ({} refused) + workers {} ({} refused), execs {} ({} ok, {} failed)",
        s.auth_ops,
        s.auth_failed,
        s.wsd_ops,
        s.wsd_failed,
        worker_ops.0,
        worker_ops.1,
        x.execs,
        x.exec_ok,
        x.exec_failed
    );
    println!(
        "soak: pushes {} ({} entries), pulls {} ({} entries, overwrote_local {}), reconnects {}, \
         {} state-loss drills, quiesced in {rounds} rounds, {} samples",
        s.pushes,
        s.pushed_entries,
        s.pulls,
        s.pulled_entries,
        s.overwrote_local,
        s.reconnects,
        s.drills,
        s.samples
    );
    println!(
        "soak: final tree {} paths; {} writes logged, {checked} paths checked for lost writes; {mem_line}",
        wsd_tree.len(),
        events.len()
    );
    if !s.errors.is_empty() || !x.errors.is_empty() {
        println!(
            "soak: errors during the concurrent phase (tolerated): sync {:?}, exec {:?}",
            s.errors, x.errors
        );
    }
    if !violations.is_empty() || args.keep {
        let kept = tmp.keep();
        println!("soak: kept {} (daemon log: daemon.log)", kept.display());
    }
    Ok(violations)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(path: &str, st: St, hi: u64) -> Ev {
        Ev {
            path: path.into(),
            st,
            subtree: false,
            side: Side::Wsd,
            lo: hi,
            hi,
            certain: true,
            what: format!("op@{hi}"),
        }
    }

    #[test]
    fn a_divergence_history_names_the_path_its_ancestors_and_descendants_only() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("daemon.log");
        std::fs::write(&log, "x applied w1/f2/d0\nunrelated w2/f2\n").unwrap();
        let events = [
            ev("w1/f2/d0", St::Dir, 3),
            ev("w1", St::Dir, 1),
            ev("w1/f20", St::Absent, 2),
            ev("w2/f2", St::Absent, 4),
        ];
        let out = divergence_history("w1/f2", &events, &log).join("\n");
        assert!(out.contains("op@1") && out.contains("op@3"), "{out}");
        assert!(!out.contains("op@2") && !out.contains("op@4"), "{out}");
        assert!(out.find("op@1") < out.find("op@3"), "oldest first: {out}");
        assert!(out.contains("x applied w1/f2/d0"), "{out}");
        assert!(!out.contains("unrelated"), "{out}");
    }
}
