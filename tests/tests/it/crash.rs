//! `kill -9` of a real `wsd serve` at random points — while it applies a
//! push, serves a pull, runs a command, settles a burst of local writes —
//! then restart and converge. After every kill: the daemon's SQLite
//! databases pass `PRAGMA integrity_check`, and every file visible at its
//! final path in the workspace is a complete version that some writer
//! wrote (never a torn one). After restart and a settle: no `.wsd-apply-*`
//! temp file is left, and the authority and the workspace converge to
//! identical trees.
//!
//! The kill delay is drawn (seeded, printed) from `[0, 1.2 × t]` where `t`
//! is the duration of the same operation measured uninterrupted first, so
//! most kills land inside the operation on any machine. Iterations: 3 per
//! scenario, 10 with `WSD_SLOW_TESTS=1`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use wsd::rpc::{ExecEventKind, ExecRequest, ResumeFrom};
use wsd_tests::hub::{Hub, block_on_local};
use wsd_tests::{Daemon, bytes, find_named, sqlite_integrity};

fn iterations() -> usize {
    if std::env::var_os("WSD_SLOW_TESTS").is_some_and(|v| v == "1") {
        10
    } else {
        3
    }
}

struct Env {
    _tmp: TempDir,
    served: PathBuf,
    state: PathBuf,
    daemon: Daemon,
    hub: Hub,
    rng: StdRng,
    /// SHA-256 of every content written into the workspace directly.
    local_versions: HashSet<[u8; 32]>,
    interrupted: usize,
}

fn setup(seed: u64) -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&served).unwrap();
    let daemon = Daemon::start(&served, &state, None);
    let hub = Hub::open(&tmp.path().join("authority.dofs"), &daemon.addr);
    let served = served.canonicalize().unwrap();
    eprintln!("crash: seed {seed}");
    Env {
        _tmp: tmp,
        served,
        state,
        daemon,
        hub,
        rng: StdRng::seed_from_u64(seed),
        local_versions: HashSet::new(),
        interrupted: 0,
    }
}

impl Env {
    /// Runs `op` (a sync call or a command) and kills the daemon with
    /// SIGKILL after `delay`, wherever `op` is by then. Returns whether `op`
    /// failed (the kill interrupted it).
    async fn with_kill_after<F, T, E>(&mut self, delay: Duration, op: F) -> bool
    where
        F: AsyncFnOnce(&mut Hub) -> Result<T, E>,
    {
        let pid = self.daemon.pid();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        });
        let failed = op(&mut self.hub).await.is_err();
        killer.join().unwrap();
        self.daemon.kill9(); // reap
        self.hub.disconnect();
        if failed {
            self.interrupted += 1;
        }
        failed
    }

    /// What must hold right after a kill, before the restart.
    fn check_after_kill(&self, what: &str) {
        for db in ["index.sqlite3", "exec.sqlite3"] {
            let path = self.state.join(db);
            if path.exists() {
                sqlite_integrity(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
        let mut torn = Vec::new();
        visit_files(&self.served, &mut |rel, bytes| {
            let name = rel.rsplit('/').next().unwrap();
            // Temp files are not final paths: the daemon's, and those of
            // the command in the exec scenario (it writes them, then mv).
            if name.starts_with(".wsd-apply-") || name.starts_with(".tmp.") {
                return;
            }
            let sha: [u8; 32] = Sha256::digest(bytes).into();
            if !self.hub.written.contains(&sha) && !self.local_versions.contains(&sha) {
                torn.push(format!("{rel} ({} bytes)", bytes.len()));
            }
        });
        assert!(
            torn.is_empty(),
            "{what}: files at their final path that no writer wrote (torn?): {torn:?}"
        );
    }

    /// Restart, settle, converge and compare.
    async fn restart_and_converge(&mut self, what: &str) {
        self.daemon.restart();
        // watermarks() settles: the startup walk has run by its answer.
        let c = self.hub.client().await.unwrap();
        c.watermarks().await.unwrap();
        let temps = find_named(&self.served, ".wsd-apply-");
        assert!(
            temps.is_empty(),
            "{what}: temp files after restart: {temps:?}"
        );
        self.hub
            .converge_and_compare(&self.served, &format!("{what} (after restart)"))
            .await;
    }

    fn write_local(&mut self, rel: &str, data: &[u8]) {
        self.local_versions.insert(Sha256::digest(data).into());
        wsd_tests::write(&self.served, rel, data, 0o644);
    }

    fn random_delay(&mut self, calibrated: Duration) -> Duration {
        let max = calibrated.as_micros() as u64 * 12 / 10 + 1;
        Duration::from_micros(self.rng.random_range(0..max))
    }
}

fn visit_files(root: &Path, f: &mut dyn FnMut(&str, &[u8])) {
    fn go(root: &Path, dir: &Path, f: &mut dyn FnMut(&str, &[u8])) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            if rel == ".wsd" {
                continue;
            }
            let Ok(t) = e.file_type() else {
                continue;
            };
            // A command still running renames files away meanwhile.
            if t.is_dir() {
                if std::fs::symlink_metadata(&path).is_ok() {
                    go(root, &path, f);
                }
            } else if t.is_file()
                && let Ok(bytes) = std::fs::read(&path)
            {
                f(&rel, &bytes);
            }
        }
    }
    go(root, root, f);
}

/// A batch of authority changes: rewrites of many small files and a few
/// multi-chunk ones, some deletes, a kind change.
fn authority_changes(hub: &mut Hub, round: u64) {
    for i in 0..150u64 {
        let len = 500 + ((i * 7919 + round * 31) % 20_000) as usize;
        hub.put(
            &format!("t/d{}/f{i}", i % 9),
            &bytes(len, round * 1000 + i),
            0o644,
        );
    }
    for i in 0..4u64 {
        hub.put(
            &format!("big/b{i}"),
            &bytes(1_500_000, round * 100 + i),
            0o600,
        );
    }
    if round > 0 {
        let _ = hub
            .dofs
            .rm(&wsd_tests::hub::p(&format!("t/d{}", round % 9)), true);
    }
}

#[test]
fn kill_during_push_apply_then_restart_converges() {
    block_on_local(async {
        let mut e = setup(0xC4A5_0001);
        authority_changes(&mut e.hub, 0);
        let t = Instant::now();
        e.hub.push().await.unwrap();
        let calibrated = t.elapsed();
        for round in 1..=iterations() as u64 {
            authority_changes(&mut e.hub, round);
            let delay = e.random_delay(calibrated);
            let what = format!("push round {round}, kill after {delay:?}");
            e.with_kill_after(delay, async |h: &mut Hub| h.push().await)
                .await;
            e.check_after_kill(&what);
            e.restart_and_converge(&what).await;
        }
        eprintln!(
            "crash: push interrupted {} of {} times",
            e.interrupted,
            iterations()
        );
    });
}

#[test]
fn kill_during_pull_then_restart_converges() {
    block_on_local(async {
        let mut e = setup(0xC4A5_0002);
        let local = |e: &mut Env, round: u64| {
            for i in 0..200u64 {
                let len = 100 + ((i * 104_729 + round) % 30_000) as usize;
                e.write_local(
                    &format!("made/d{}/f{i}", i % 11),
                    &bytes(len, round * 7 + i),
                );
            }
            e.write_local(&format!("made/big{round}"), &bytes(2_000_000, round));
        };
        local(&mut e, 0);
        let t = Instant::now();
        e.hub.pull().await.unwrap();
        let calibrated = t.elapsed();
        for round in 1..=iterations() as u64 {
            local(&mut e, round);
            let delay = e.random_delay(calibrated);
            let what = format!("pull round {round}, kill after {delay:?}");
            e.with_kill_after(delay, async |h: &mut Hub| h.pull().await)
                .await;
            // The authority side of an interrupted pull is consistent.
            e.hub.dofs.check_integrity().unwrap();
            e.check_after_kill(&what);
            e.restart_and_converge(&what).await;
        }
        eprintln!(
            "crash: pull interrupted {} of {} times",
            e.interrupted,
            iterations()
        );
    });
}

#[test]
fn kill_during_settle_of_a_burst_of_local_writes_then_restart_converges() {
    block_on_local(async {
        let mut e = setup(0xC4A5_0003);
        let burst = |e: &mut Env, round: u64| {
            for i in 0..1500u64 {
                let len = ((i * 31 + round) % 3000) as usize;
                e.write_local(
                    &format!("burst/d{}/f{i}", i % 23),
                    &bytes(len, round * 10_000 + i),
                );
            }
        };
        burst(&mut e, 0);
        let t = Instant::now();
        e.hub.client().await.unwrap().watermarks().await.unwrap();
        let calibrated = t.elapsed();
        for round in 1..=iterations() as u64 {
            burst(&mut e, round);
            let delay = e.random_delay(calibrated);
            let what = format!("settle round {round}, kill after {delay:?}");
            e.with_kill_after(delay, async |h: &mut Hub| {
                h.client()
                    .await?
                    .watermarks()
                    .await
                    .map_err(wsd_sync::SyncError::from)
            })
            .await;
            e.check_after_kill(&what);
            e.restart_and_converge(&what).await;
        }
    });
}

#[test]
fn kill_during_exec_reports_a_lost_exit_and_the_commands_writes_converge() {
    block_on_local(async {
        let mut e = setup(0xC4A5_0004);
        // Each write is atomic (temp + mv), so whatever the daemon sees at a
        // final path is complete; the command outlives the daemon (its own
        // process group) and leaves a marker when done.
        let script = |round: u64| {
            format!(
                "mkdir -p ex && for i in $(seq 1 120); do \
                   printf 'round {round} file %s\\n' \"$i\" > ex/.tmp.$i && mv ex/.tmp.$i ex/f$((i % 40)); \
                 done; echo done > ex/.tmp.marker && mv ex/.tmp.marker ex/marker{round}"
            )
        };
        for round in 0..=40u64 {
            for i in 1..=120u64 {
                e.local_versions
                    .insert(Sha256::digest(format!("round {round} file {i}\n")).into());
            }
            e.local_versions.insert(Sha256::digest("done\n").into());
        }
        let run = async |h: &mut Hub, round: u64, id: String| {
            let c = h.client().await?;
            let req = ExecRequest {
                command: script(round),
                id: Some(id),
                ..ExecRequest::default()
            };
            let mut s = c.exec(&req).await?;
            while let Some(ev) = s.next().await? {
                if let ExecEventKind::Exit(code) = ev.kind {
                    assert_eq!(code, 0);
                }
            }
            Ok::<_, wsd::rpc::WireError>(())
        };
        let t = Instant::now();
        run(&mut e.hub, 0, "calibrate".into()).await.unwrap();
        let calibrated = t.elapsed();
        for round in 1..=iterations() as u64 {
            let delay = e.random_delay(calibrated);
            let what = format!("exec round {round}, kill after {delay:?}");
            let id = format!("crash-{round}");
            let interrupted = e
                .with_kill_after(delay, async |h: &mut Hub| run(h, round, id.clone()).await)
                .await;
            e.check_after_kill(&what);
            // Wait for the orphaned command to finish its writes.
            let marker = e.served.join(format!("ex/marker{round}"));
            let deadline = Instant::now() + Duration::from_secs(30);
            while !marker.exists() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            e.restart_and_converge(&what).await;
            // The exec's log survived; if the daemon died under it, the last
            // event is the documented lost exit.
            let c = e.hub.client().await.unwrap();
            match c.get_exec(&id, ResumeFrom::Start).await {
                Ok(mut s) => {
                    let mut last = None;
                    while let Ok(Some(ev)) = s.next().await {
                        last = Some(ev.kind);
                    }
                    match last {
                        Some(ExecEventKind::Exit(0)) => {}
                        Some(ExecEventKind::Exit(code)) => {
                            assert_eq!(code, wsd::exec::EXIT_LOST, "{what}")
                        }
                        other => panic!("{what}: the exec's log ends with {other:?}"),
                    }
                }
                // Killed before the exec was registered.
                Err(err) => assert!(
                    interrupted && err.code == wsd_sync::ErrorCode::NotFound,
                    "{what}: getExec: {err}"
                ),
            }
        }
    });
}
