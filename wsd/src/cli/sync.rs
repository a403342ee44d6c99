//! `wsd push`, `pull`, `sync` and `watermarks`: the sync driver between a
//! local directory (indexed in `LOCAL_DIR/.wsd`) and a remote daemon.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use wsd::store::{ConflictCopy, FirstIndex, Piece, StoreOptions, WorkspaceStore};
use wsd_client::client::Client;
use wsd_sync::driver::{self, IndexStep, Indexing, SyncOptions, SyncReport};
use wsd_sync::{
    ChangeCursor, ChangeEntry, ChangeStream, ChangesQuery, EntryState, IgnoreRules, Store,
    SyncError,
};

use super::RemoteArgs;
use super::agent;
use super::excludes::{Released, Remembered};

/// The state directory of a local directory, never synced.
const LOCAL_STATE: &str = ".wsd";
/// The file in it holding this directory's stable peer name.
pub(crate) const PEER_FILE: &str = "peer";
/// Gitignore-syntax exclusions at the top of LOCAL_DIR.
const IGNORE_FILE: &str = ".wsdignore";
/// Entries a dry run reads per page.
const DRY_RUN_PAGE: usize = 1000;

#[derive(Debug, Args)]
pub struct TransferArgs {
    /// The local directory; it must exist unless --create is given.
    #[arg(value_name = "LOCAL_DIR")]
    local: PathBuf,
    /// Create LOCAL_DIR if it is missing.
    #[arg(long)]
    create: bool,
    /// Leave out paths matching PATTERN (gitignore syntax; repeatable), on
    /// top of LOCAL_DIR/.wsdignore, in this transfer and every later one of
    /// LOCAL_DIR: the pattern is remembered with its sync state (`wsd
    /// exclude list` shows them). Excluded paths are neither sent nor
    /// fetched, nor deleted on either side (a directory holding them that
    /// the other side replaced by a file is kept as a conflict copy by a
    /// pull and refused by a push).
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Stop excluding a remembered PATTERN (repeatable), from this
    /// transfer on. What it hid in LOCAL_DIR is sent by the next push (this
    /// one, if it pushes), replacing the daemon's copy; what it hid on the
    /// daemon's side comes when it next changes there.
    #[arg(long, value_name = "PATTERN")]
    no_exclude: Vec<String>,
    /// Print the paths a push or pull would send or fetch ("write PATH",
    /// "delete PATH") and change neither tree. Only LOCAL_DIR's index
    /// (under .wsd) is refreshed.
    #[arg(short = 'n', long)]
    dry_run: bool,
    /// Print no summary (errors still go to stderr).
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    remote: RemoteArgs,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Keep LOCAL_DIR's index here instead of LOCAL_DIR/.wsd.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PushArgs {
    #[command(flatten)]
    transfer: TransferArgs,
    /// Push by walking LOCAL_DIR here: do not ask a local agent, and start
    /// none. Without it a push is made by the agent serving LOCAL_DIR if
    /// one answers, and otherwise starts one in the background for the
    /// next transfers (not with `WSD_AGENT=off`; see `wsd agent`).
    #[arg(long)]
    no_agent: bool,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    #[command(flatten)]
    transfer: TransferArgs,
    /// Pull by walking LOCAL_DIR here: do not ask a local agent, and start
    /// none. Without it a pull is made by the agent serving LOCAL_DIR if
    /// one answers, and otherwise starts one in the background for the
    /// next transfers (not with `WSD_AGENT=off`; see `wsd agent`).
    #[arg(long)]
    no_agent: bool,
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    #[command(flatten)]
    transfer: TransferArgs,
    /// Keep syncing until interrupted: a round runs when LOCAL_DIR's
    /// watcher or the daemon reports a change, not on a timer.
    #[arg(long, conflicts_with = "dry_run")]
    watch: bool,
    /// With --watch, the longest time between rounds when no change was
    /// reported (a safety net for changes no watcher sees, such as on
    /// network filesystems), in milliseconds. Rounds no longer run every
    /// interval: changes start one as they happen.
    #[arg(long, default_value_t = 300_000, value_name = "MS")]
    interval: u64,
    /// Without --watch: sync by walking LOCAL_DIR here, do not ask a local
    /// agent, and start none (see `wsd push --no-agent`).
    #[arg(long, conflicts_with = "watch")]
    no_agent: bool,
}

/// How long `sync --watch` lets a burst of changes go on before its round:
/// one round per burst (an editor's save, a build) instead of one per file.
const WATCH_DEBOUNCE: Duration = Duration::from_millis(100);
/// How long one `waitChanges` long poll may be held by the daemon.
const WATCH_LONG_POLL: Duration = Duration::from_secs(50);
/// Without a local watcher (it could not start), how often `sync --watch`
/// looks at LOCAL_DIR anyway.
const WATCH_FALLBACK_POLL: Duration = Duration::from_secs(2);

/// A local directory opened for a transfer, connected to its remote.
struct Session {
    store: WorkspaceStore,
    remote: Client,
    remote_name: String,
    /// `.wsdignore` and the remembered excludes: left out of pushes, and
    /// sent with every fetch so the daemon leaves them out too.
    ignore: IgnoreRules,
    /// The remembered excludes, and the dropped ones still to be pushed.
    remembered: Remembered,
    /// Where they are saved (none for a dry run, which changes nothing).
    save_to: Option<PathBuf>,
    /// True right after a settle: the next push or pull needs none.
    settled: bool,
    /// A never-indexed directory's index, still being built for the push
    /// that sends it (see [`FirstIndexing`]); the push takes it.
    indexing: Option<FirstIndexing>,
}

/// How many hashed pieces of a first index may wait for the push: the
/// walk runs ahead of the push by at most this many (a few MiB of rows).
const PIECES_AHEAD: usize = 8;

/// A first index ([`FirstIndex`]) walking and hashing on a thread of its
/// own, its pieces recorded in the store as the push asks for more.
struct FirstIndexing {
    pieces: tokio::sync::mpsc::Receiver<Result<Piece, SyncError>>,
    thread: Option<std::thread::JoinHandle<()>>,
    complete: bool,
}

impl FirstIndexing {
    fn start(first: FirstIndex) -> Result<FirstIndexing> {
        let (tx, pieces) = tokio::sync::mpsc::channel(PIECES_AHEAD);
        let walk = move || {
            let t0 = Instant::now();
            match first.run(|piece| tx.blocking_send(Ok(piece)).is_ok()) {
                Ok(report) => tracing::debug!(
                    target: "wsd::timing",
                    index_ms = t0.elapsed().as_secs_f64() * 1e3,
                    hashed = report.hashed,
                    changed = report.changed,
                    "first index built"
                ),
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                }
            }
        };
        let thread = std::thread::Builder::new()
            .name("wsd-first-index".into())
            .spawn(walk)
            .context("starting the indexing thread")?;
        Ok(FirstIndexing {
            pieces,
            thread: Some(thread),
            complete: false,
        })
    }
}

impl Indexing<WorkspaceStore> for FirstIndexing {
    async fn next(
        &mut self,
        store: &mut WorkspaceStore,
        wait: bool,
    ) -> Result<IndexStep, SyncError> {
        use tokio::sync::mpsc::error::TryRecvError;
        loop {
            let piece = if wait {
                self.pieces.recv().await
            } else {
                match self.pieces.try_recv() {
                    Ok(p) => Some(p),
                    Err(TryRecvError::Empty) => return Ok(IndexStep::NotYet),
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            let Some(piece) = piece else {
                // The walk is over; a panic in it is no complete index.
                if let Some(t) = self.thread.take()
                    && t.join().is_err()
                {
                    return Err(SyncError::Storage(
                        "the indexing thread panicked".to_owned(),
                    ));
                }
                self.complete = true;
                return Ok(IndexStep::Complete);
            };
            if let Some(rev) = store.record_piece(piece?)? {
                return Ok(IndexStep::Grew(rev));
            }
        }
    }

    fn is_complete(&self) -> bool {
        self.complete
    }
}

impl Session {
    /// `watch`: keep an inotify watcher on LOCAL_DIR (for `sync --watch`),
    /// so that settles look only at what it reported and [`Wake`] hears of
    /// changes as they happen. `pushing`: the session's first transfer is a
    /// push, so a never-indexed LOCAL_DIR is indexed while it is pushed
    /// instead of before.
    async fn open(a: &TransferArgs, watch: bool, pushing: bool) -> Result<Session> {
        if a.create {
            std::fs::create_dir_all(&a.local)
                .with_context(|| format!("creating {}", a.local.display()))?;
        } else {
            match std::fs::metadata(&a.local) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => anyhow::bail!("{} is not a directory", a.local.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
                    "{} does not exist (give --create to make it)",
                    a.local.display()
                ),
                Err(e) => {
                    return Err(e).with_context(|| format!("reading {}", a.local.display()));
                }
            }
        }
        let t0 = Instant::now();
        let state = local_state(&a.local, a.state.as_deref());
        let wsdignore = wsdignore(&a.local)?;
        let mut remembered = Remembered::load(&state)?;
        remembered
            .change(&a.exclude, &a.no_exclude, &wsdignore)
            .with_context(|| format!("the excludes of {}", a.local.display()))?;
        let ignore = ignore_rules(&a.local, &wsdignore, &remembered.patterns)?;
        let save_to = (!a.dry_run).then(|| state.clone());
        if let Some(state) = &save_to {
            remembered.save(state)?;
        }
        let index_lost = !state.join(wsd::store::INDEX_FILE).exists();
        let mut store = WorkspaceStore::open(
            &a.local,
            &state,
            StoreOptions {
                watch,
                // Without a watcher every settle walks the whole tree:
                // settle once per direction explicitly instead of on every
                // store call.
                auto_settle: false,
                // A pull never silently replaces a local edit.
                conflict_copies: true,
                // What an OS crash takes from the index is resent.
                durable_index: false,
            },
        )
        .with_context(|| format!("opening the index of {}", a.local.display()))?;
        let t_open = t0.elapsed();
        let first = match pushing {
            true => store
                .first_index()
                .with_context(|| format!("reading the index of {}", a.local.display()))?,
            false => None,
        };
        let (settled, indexing) = match first {
            Some(first) => (Default::default(), Some(FirstIndexing::start(first)?)),
            None => (
                store
                    .settle()
                    .with_context(|| format!("indexing {}", a.local.display()))?,
                None,
            ),
        };
        let t_settle = t0.elapsed();
        let peer = peer_name(&state, index_lost || store.index_rebuilt())?;
        let mut remote = a.remote.connect(&peer).await?;
        let remote_name = a.remote.remote.clone();
        driver::reconcile(&mut store, &mut remote, &remote_name)
            .await
            .with_context(|| format!("comparing watermarks with {}", a.remote.remote))?;
        // Where a transfer's fixed cost goes (issue 16 asks for the split).
        tracing::debug!(
            target: "wsd::timing",
            open_ms = t_open.as_secs_f64() * 1e3,
            settle_ms = (t_settle - t_open).as_secs_f64() * 1e3,
            connect_ms = (t0.elapsed() - t_settle).as_secs_f64() * 1e3,
            hashed = settled.hashed,
            changed = settled.changed,
            "session open"
        );
        Ok(Session {
            store,
            remote,
            remote_name,
            ignore,
            remembered,
            save_to,
            settled: indexing.is_none(),
            indexing,
        })
    }

    /// Settles the local directory unless nothing could have changed since
    /// the last settle of this session.
    fn settle(&mut self) -> Result<()> {
        anyhow::ensure!(
            self.indexing.is_none(),
            "a first index is still being built for a push"
        );
        if !std::mem::take(&mut self.settled) {
            self.store
                .settle()
                .context("indexing the local directory")?;
        }
        Ok(())
    }

    async fn push(&mut self, progress: &Progress) -> Result<SyncReport> {
        let mut indexing = self.indexing.take();
        if indexing.is_none() {
            self.settle()?;
        }
        let opts = SyncOptions {
            remote_name: &self.remote_name,
            ignore: &self.ignore,
        };
        let pushed = match &mut indexing {
            Some(indexing) => {
                driver::push_while_indexing(
                    &mut self.store,
                    &mut self.remote,
                    &opts,
                    indexing,
                    |r| progress.update("push", r),
                )
                .await
            }
            None => {
                driver::push(&mut self.store, &mut self.remote, &opts, |r| {
                    progress.update("push", r)
                })
                .await
            }
        };
        let mut report = pushed.context("push failed")?;
        if self.remembered.released.is_empty() {
            return Ok(report);
        }
        // What the dropped excludes hid: the cursor has passed it.
        let mut released = Released {
            inner: &mut self.store,
            rules: IgnoreRules::new(&self.remembered.released)?,
        };
        let more = driver::push(&mut released, &mut self.remote, &opts, |r| {
            progress.update("push", r)
        })
        .await
        .context("push of what the dropped excludes hid failed")?;
        report.entries += more.entries;
        report.applied += more.applied;
        report.objects += more.objects;
        report.object_bytes += more.object_bytes;
        report.deduplicated_bytes += more.deduplicated_bytes;
        report.batches += more.batches;
        self.remembered.released.clear();
        if let Some(state) = &self.save_to {
            self.remembered.save(state)?;
        }
        Ok(report)
    }

    /// What a push would send now: our changes after the remote's
    /// acknowledged cursor, minus excluded paths and the remote's own echo.
    fn planned_push(&mut self) -> Result<Vec<ChangeEntry>> {
        self.settle()?;
        let wm = self.store.watermarks(&self.remote_name)?;
        let window = self.store.open_changes(&wm.push_cursor)?;
        let mut after = if window.baseline {
            ChangeCursor::ZERO
        } else {
            wm.push_cursor
        };
        let mut out = Vec::new();
        loop {
            let page = self.store.changes(ChangesQuery {
                after: &after,
                through: &window.through,
                ignore: &self.ignore,
                exclude_applied_from: Some(&self.remote_name),
                limit: DRY_RUN_PAGE,
            })?;
            let done = page.len() < DRY_RUN_PAGE;
            if let Some(e) = page.last() {
                after = ChangeCursor::within(e.rev, e.path.clone());
            }
            out.extend(page);
            if done {
                break;
            }
        }
        if self.remembered.released.is_empty() {
            return Ok(out);
        }
        let mut released = Released {
            inner: &mut self.store,
            rules: IgnoreRules::new(&self.remembered.released)?,
        };
        let through = released.open_changes(&ChangeCursor::ZERO)?.through;
        let mut after = ChangeCursor::ZERO;
        loop {
            let page = released.changes(ChangesQuery {
                after: &after,
                through: &through,
                ignore: &self.ignore,
                exclude_applied_from: Some(&self.remote_name),
                limit: DRY_RUN_PAGE,
            })?;
            let done = page.len() < DRY_RUN_PAGE;
            if let Some(e) = page.last() {
                after = ChangeCursor::within(e.rev, e.path.clone());
            }
            for e in page {
                if !out.iter().any(|o| o.path == e.path) {
                    out.push(e);
                }
            }
            if done {
                return Ok(out);
            }
        }
    }

    /// What a pull would fetch now: the remote's changes after our fetch
    /// cursor, minus excluded paths. Read-only on both sides; entries whose
    /// local state already matches are listed too (a pull skips them).
    async fn planned_pull(&mut self) -> Result<Vec<ChangeEntry>> {
        self.settle()?;
        let wm = self.store.watermarks(&self.remote_name)?;
        let (_, mut stream) = self
            .remote
            .fetch_changes(&wm.fetch_cursor, self.ignore.patterns())
            .await
            .context("listing the remote's changes")?;
        let mut out = Vec::new();
        loop {
            let batch = stream
                .next_batch(DRY_RUN_PAGE)
                .await
                .context("listing the remote's changes")?;
            if batch.is_empty() {
                return Ok(out);
            }
            out.extend(batch);
        }
    }

    async fn pull(&mut self, progress: &Progress) -> Result<SyncReport> {
        self.settle()?;
        let opts = SyncOptions {
            remote_name: &self.remote_name,
            ignore: &self.ignore,
        };
        driver::pull(&mut self.store, &mut self.remote, &opts, |r| {
            progress.update("pull", r)
        })
        .await
        .context("pull failed")
    }
}

/// LOCAL_DIR's sync state directory: `--state`, else LOCAL_DIR/.wsd.
pub(crate) fn local_state(local: &Path, state: Option<&Path>) -> PathBuf {
    state.map_or_else(|| local.join(LOCAL_STATE), Path::to_owned)
}

/// LOCAL_DIR/.wsdignore's patterns (blank lines and `#` comments dropped,
/// as git does); none without the file.
pub(crate) fn wsdignore(local: &Path) -> Result<Vec<String>> {
    let file = local.join(IGNORE_FILE);
    match std::fs::read_to_string(&file) {
        Ok(text) => Ok(text
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.display())),
    }
}

/// The exclusions of a transfer: LOCAL_DIR/.wsdignore's patterns, the
/// remembered excludes (`--exclude`), then conflict copies (one
/// machine's leftovers, never pushed). That one goes last because the last
/// matching pattern wins: a user's negation such as `!*.log` must not
/// re-include `x.log.wsd-conflict-...`. It takes one of the wire's pattern
/// slots, so the user gets one fewer.
fn ignore_rules(local: &Path, wsdignore: &[String], remembered: &[String]) -> Result<IgnoreRules> {
    let file = local.join(IGNORE_FILE);
    let mut patterns: Vec<String> = wsdignore.to_vec();
    patterns.extend(remembered.iter().cloned());
    let room = wsd_sync::limits::MAX_IGNORE_PATTERNS - 1;
    if patterns.len() > room {
        anyhow::bail!(
            "ELIMIT: {} exclusions (--exclude and {}); at most {room}: one of the \
             {} patterns a transfer carries is always {:?}",
            patterns.len(),
            file.display(),
            wsd_sync::limits::MAX_IGNORE_PATTERNS,
            wsd_sync::CONFLICT_COPY_PATTERN
        );
    }
    patterns.push(wsd_sync::CONFLICT_COPY_PATTERN.to_owned());
    IgnoreRules::new(&patterns).with_context(|| {
        format!(
            "the exclusions (--exclude and {}) are not valid",
            file.display()
        )
    })
}

/// How a dry run shows one entry.
fn describe(e: &ChangeEntry) -> String {
    let what = match &e.state {
        EntryState::Delete => "delete",
        EntryState::Dir { .. } => "mkdir",
        EntryState::Symlink { .. } => "link",
        EntryState::File { .. } => "write",
    };
    format!("{what} {}", e.path.as_str())
}

/// This directory's stable name as a peer: created once, kept in the state
/// directory, so the daemon keeps its watermarks across runs.
///
/// The name stands for the sync state in the index: when the index is new
/// (lost, or never made) the name is made afresh too. Under the old name
/// the daemon would still take every path it received from us for our own
/// echo and never send it, though we no longer know we hold it.
fn peer_name(state: &Path, index_lost: bool) -> Result<String> {
    let file = state.join(PEER_FILE);
    match std::fs::read_to_string(&file) {
        Ok(s) if !s.trim().is_empty() && !index_lost => Ok(s.trim().to_owned()),
        old => {
            let name = format!("cli-{}", uuid::Uuid::new_v4().simple());
            if let Ok(old) = old
                && !old.trim().is_empty()
            {
                tracing::warn!(old = old.trim(), new = %name,
                    "the local index is new: this directory syncs under a new peer name");
            }
            std::fs::write(&file, &name).with_context(|| format!("writing {}", file.display()))?;
            Ok(name)
        }
    }
}

/// A progress bar on a terminal: a spinner until the driver knows its plan,
/// then the bytes to move (or, when nothing needs moving, the entries to
/// apply) against their total, with rate and ETA. Hidden when stderr is not
/// a terminal, and with `-q` or `--json`.
struct Progress {
    bar: Option<ProgressBar>,
    /// What the bar shows now: the verb and whether it counts bytes.
    mode: std::cell::Cell<Option<(&'static str, bool)>>,
}

impl Progress {
    /// No bar (a push the agent makes for another process).
    fn hidden() -> Progress {
        Progress {
            bar: None,
            mode: std::cell::Cell::new(None),
        }
    }

    fn new(a: &TransferArgs) -> Progress {
        let shown = std::io::stderr().is_terminal() && !a.quiet && !a.json;
        let bar = shown.then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            bar,
            mode: std::cell::Cell::new(None),
        }
    }

    fn update(&self, verb: &'static str, r: &SyncReport) {
        let Some(bar) = &self.bar else { return };
        if r.planned_entries == 0 {
            return;
        }
        let bytes = r.planned_bytes > 0;
        if self.mode.get() != Some((verb, bytes)) {
            self.mode.set(Some((verb, bytes)));
            let template = if bytes {
                "{msg} [{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}"
            } else {
                "{msg} [{wide_bar}] {pos}/{len} entries {per_sec} ETA {eta}"
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            // Rate and ETA start over with each verb and unit.
            bar.reset();
        }
        // The plan grows as the changes are paged in: "+" until it is whole.
        bar.set_message(format!(
            "{verb}: {}/{}{} entries",
            r.entries,
            r.planned_entries,
            if r.plan_complete { "" } else { "+" }
        ));
        if bytes {
            bar.set_length(r.planned_bytes);
            bar.set_position(r.object_bytes.min(r.planned_bytes));
        } else {
            bar.set_length(r.planned_entries);
            bar.set_position(r.entries.min(r.planned_entries));
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// One line per conflict copy, on stderr whatever `-q` says: a local
/// version was replaced and now lives under another name.
fn print_conflicts(verb: &str, conflicts: &[ConflictCopy]) {
    for c in conflicts {
        print_conflict(verb, c.path.as_str(), c.copy.as_str());
    }
}

fn print_conflict(verb: &str, path: &str, copy: &str) {
    eprintln!(
        "{verb}: conflict: {path} changed on both sides; the remote's version is in place, \
         the local one kept as {copy}"
    );
}

/// Prints a transfer's summary; `conflicts` are the local versions a pull
/// kept as conflict copies, listed even when quiet.
fn summarize(
    verb: &str,
    r: &SyncReport,
    conflicts: &[ConflictCopy],
    elapsed: Duration,
    json: bool,
    quiet: bool,
) {
    print_conflicts(verb, conflicts);
    print_summary(&summary_json(verb, r, conflicts, elapsed), json, quiet);
}

/// A transfer's summary as `--json` prints it.
fn summary_json(
    verb: &str,
    r: &SyncReport,
    conflicts: &[ConflictCopy],
    elapsed: Duration,
) -> serde_json::Value {
    serde_json::json!({
        "op": verb,
        "entries": r.entries,
        "applied": r.applied,
        "objects": r.objects,
        "bytes_sent": r.object_bytes,
        "bytes_deduplicated": r.deduplicated_bytes,
        "batches": r.batches,
        "rebaselined": r.rebaselined,
        "overwrote_local": r.overwrote_local,
        "conflicts": conflicts
            .iter()
            .map(|c| serde_json::json!({"path": c.path.as_str(), "copy": c.copy.as_str()}))
            .collect::<Vec<_>>(),
        "elapsed_ms": elapsed.as_millis() as u64,
    })
}

/// Prints a summary made by [`summary_json`]: the JSON line with `json`,
/// the human line on stderr unless `quiet`.
fn print_summary(v: &serde_json::Value, json: bool, quiet: bool) {
    if json {
        println!("{v}");
    }
    if quiet {
        return;
    }
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let (verb, entries, objects) = (v["op"].as_str().unwrap_or("?"), n("entries"), n("objects"));
    eprintln!(
        "{verb}: {entries} {}, {} in {objects} {} moved, {} deduplicated, {:.2} s{}{}",
        if entries == 1 { "entry" } else { "entries" },
        HumanBytes(n("bytes_sent")),
        if objects == 1 { "object" } else { "objects" },
        HumanBytes(n("bytes_deduplicated")),
        n("elapsed_ms") as f64 / 1e3,
        if v["rebaselined"].as_bool() == Some(true) {
            " (re-baselined)"
        } else {
            ""
        },
        if v["agent"].as_bool() == Some(true) {
            " (by the local agent)"
        } else {
            ""
        }
    );
    // Replacements that left no copy: a local delete or mode change undone.
    let copies = v["conflicts"].as_array().map_or(0, Vec::len);
    let uncopied = (n("overwrote_local") as usize).saturating_sub(copies);
    if uncopied > 0 {
        eprintln!("{verb}: {uncopied} local changes were overwritten by the remote's");
    }
}

/// Prints a dry run's plan: one line per entry on stdout (or one JSON
/// object), and a count on stderr unless quiet.
fn print_plan(verb: &str, plan: &[ChangeEntry], a: &TransferArgs) {
    if a.json {
        let v = serde_json::json!({
            "op": verb,
            "dryRun": true,
            "changes": plan.iter().map(describe).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        for e in plan {
            println!("{verb}: {}", describe(e));
        }
    }
    if !a.quiet {
        eprintln!(
            "{verb}: dry run, {} entries would change; nothing was changed",
            plan.len()
        );
    }
}

/// Has this process keep the memory it frees instead of handing it back to
/// the kernel, for a one-shot transfer (the process exits when it ends, so
/// what it keeps is at most its peak). A push builds hundreds of upload
/// messages of about 1 MiB, which capnp allocates zeroed; at glibc's
/// defaults each large one was mapped fresh or the heap was trimmed behind
/// it, so every message was paid for again in page faults (a tenth of the
/// client's CPU in a cold push of 163 MiB). Not for `sync --watch` or an
/// agent, which live on.
fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    {
        // At most glibc's largest mmap threshold (32 MiB on 64-bit): larger
        // blocks are still mapped and unmapped whole.
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        const TRIM_THRESHOLD: libc::c_int = 256 << 20;
        // SAFETY: mallopt(3) only sets two thresholds of glibc's allocator
        // (under its own lock); it touches no memory of ours.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}

pub async fn push(a: PushArgs) -> Result<ExitCode> {
    keep_freed_memory();
    let PushArgs {
        transfer: a,
        no_agent,
    } = a;
    let started = Instant::now();
    let asked = ask_agent(&a, no_agent, agent::Transfer::Push)?;
    if let ThroughAgent::Made(summaries) = asked {
        print_made(summaries, started, &a);
        return Ok(ExitCode::SUCCESS);
    }
    let mut s = Session::open(&a, false, !a.dry_run).await?;
    if a.dry_run {
        let plan = s.planned_push()?;
        print_plan("push", &plan, &a);
        return Ok(ExitCode::SUCCESS);
    }
    let progress = Progress::new(&a);
    let opened = started.elapsed();
    let report = s.push(&progress).await;
    progress.finish();
    tracing::debug!(
        target: "wsd::timing",
        push_ms = (started.elapsed() - opened).as_secs_f64() * 1e3,
        "push done"
    );
    let report = report?;
    // Started once the index is settled and closed, so its first walk
    // competes with no push and finds the index current.
    drop(s);
    start_agent_after(&a, no_agent, &asked);
    summarize("push", &report, &[], started.elapsed(), a.json, a.quiet);
    Ok(ExitCode::SUCCESS)
}

/// What asking a local agent to make a transfer came to.
enum ThroughAgent {
    /// It made it; its summaries, in the order they are printed (a sync's
    /// pull, then its push).
    Made(Vec<serde_json::Value>),
    /// One answers but would not make this one: transfer directly, start
    /// none.
    Refused,
    /// None answered: transfer directly, then start one.
    NoAgent,
    /// It refused and exits: transfer directly, then start its successor.
    Retiring,
    /// Not asked (`--no-agent`, a dry run, excludes given).
    NotAsked,
}

/// Has the agent serving LOCAL_DIR make `op` (`agent.rs`), when it is a
/// transfer the agent makes the same way and `--no-agent` was not given.
fn ask_agent(a: &TransferArgs, no_agent: bool, op: agent::Transfer) -> Result<ThroughAgent> {
    if no_agent || a.dry_run || !a.exclude.is_empty() || !a.no_exclude.is_empty() {
        return Ok(ThroughAgent::NotAsked);
    }
    let state = local_state(&a.local, a.state.as_deref());
    if !state.join(agent::AGENT_SOCKET).exists() {
        return Ok(ThroughAgent::NoAgent);
    }
    let Ok(root) = std::fs::canonicalize(&a.local) else {
        return Ok(ThroughAgent::NotAsked);
    };
    let req = op.request(agent::TransferRequest {
        root,
        remote: a.remote.remote.clone(),
        wsdignore: wsdignore(&a.local)?,
        remembered: Remembered::load(&state)?.patterns,
    });
    use agent::{Asked, Reply, Transfer};
    Ok(match (agent::ask(&state, &req)?, op) {
        (Asked::Answered(Reply::Pushed(push)), Transfer::Push) => ThroughAgent::Made(vec![push]),
        (Asked::Answered(Reply::Pulled(pull)), Transfer::Pull) => ThroughAgent::Made(vec![pull]),
        (Asked::Answered(Reply::Synced { pull, push }), Transfer::Sync) => {
            ThroughAgent::Made(vec![pull, push])
        }
        (Asked::Answered(Reply::Refused(why)), _) => {
            tracing::debug!(%why, "the agent refused; transferring directly");
            ThroughAgent::Refused
        }
        (Asked::Answered(Reply::Retiring(why)), _) => {
            tracing::debug!(%why, "the agent refused and exits; transferring directly");
            ThroughAgent::Retiring
        }
        (Asked::Answered(other), _) => {
            tracing::debug!(
                ?other,
                "the agent answered something else; transferring directly"
            );
            ThroughAgent::Refused
        }
        (Asked::NoAgent | Asked::Gone, _) => ThroughAgent::NoAgent,
    })
}

/// Prints what the agent made for this command as the command itself
/// would have: each summary's conflict copies, then the summary, timed
/// from this process's start.
fn print_made(summaries: Vec<serde_json::Value>, started: Instant, a: &TransferArgs) {
    for mut summary in summaries {
        summary["elapsed_ms"] = (started.elapsed().as_millis() as u64).into();
        summary["agent"] = true.into();
        let verb = summary["op"].as_str().unwrap_or("?").to_owned();
        if let Some(copies) = summary["conflicts"].as_array() {
            for c in copies {
                print_conflict(
                    &verb,
                    c["path"].as_str().unwrap_or("?"),
                    c["copy"].as_str().unwrap_or("?"),
                );
            }
        }
        print_summary(&summary, a.json, a.quiet);
    }
}

/// After a transfer made here: starts an agent for the next ones, unless
/// `--no-agent`, `WSD_AGENT=off`, or one answered and refused (it serves
/// other transfers: another remote, other excludes).
fn start_agent_after(a: &TransferArgs, no_agent: bool, asked: &ThroughAgent) {
    if no_agent || matches!(asked, ThroughAgent::Refused) || !agent::on_demand_enabled() {
        return;
    }
    let successor = matches!(asked, ThroughAgent::Retiring);
    if let Err(e) = start_agent(a, successor) {
        tracing::warn!(error = format!("{e:#}"), "cannot start a local agent");
    }
}

/// Starts `wsd agent run` for this push's LOCAL_DIR and remote in the
/// background (see [`agent::start`]); paths absolute, as it runs from `/`.
fn start_agent(a: &TransferArgs, successor: bool) -> Result<()> {
    let state = local_state(&a.local, a.state.as_deref());
    let absolute = |p: &Path| std::path::absolute(p).with_context(|| format!("{}", p.display()));
    let mut args: Vec<std::ffi::OsString> = vec![absolute(&a.local)?.into()];
    let remote = match a.remote.remote.strip_prefix("unix:") {
        Some(path) => format!("unix:{}", absolute(Path::new(path))?.display()),
        None => a.remote.remote.clone(),
    };
    args.extend(["--remote".into(), remote.into()]);
    if let Some(t) = &a.remote.token_file {
        args.extend(["--token-file".into(), absolute(t)?.into()]);
    }
    if let Some(st) = &a.state {
        args.extend(["--state".into(), absolute(st)?.into()]);
    }
    agent::start(&state, &args, successor)
}

pub async fn pull(a: PullArgs) -> Result<ExitCode> {
    keep_freed_memory();
    let PullArgs {
        transfer: a,
        no_agent,
    } = a;
    let started = Instant::now();
    let asked = ask_agent(&a, no_agent, agent::Transfer::Pull)?;
    if let ThroughAgent::Made(summaries) = asked {
        print_made(summaries, started, &a);
        return Ok(ExitCode::SUCCESS);
    }
    let mut s = Session::open(&a, false, false).await?;
    if a.dry_run {
        let plan = s.planned_pull().await?;
        print_plan("pull", &plan, &a);
        return Ok(ExitCode::SUCCESS);
    }
    let progress = Progress::new(&a);
    let report = s.pull(&progress).await;
    progress.finish();
    let conflicts = s.store.take_conflict_copies();
    if report.is_err() {
        // Copies made before the failure exist all the same.
        print_conflicts("pull", &conflicts);
    }
    let report = report?;
    drop(s);
    start_agent_after(&a, no_agent, &asked);
    summarize(
        "pull",
        &report,
        &conflicts,
        started.elapsed(),
        a.json,
        a.quiet,
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn sync(a: SyncArgs) -> Result<ExitCode> {
    if !a.watch {
        keep_freed_memory();
    }
    let asked_at = Instant::now();
    let through = match a.watch {
        // It is an agent itself.
        true => ThroughAgent::NotAsked,
        false => ask_agent(&a.transfer, a.no_agent, agent::Transfer::Sync)?,
    };
    if let ThroughAgent::Made(summaries) = through {
        print_made(summaries, asked_at, &a.transfer);
        return Ok(ExitCode::SUCCESS);
    }
    let mut s = Session::open(&a.transfer, a.watch, false).await?;
    if a.transfer.dry_run {
        let pulled = s.planned_pull().await?;
        let pushed = s.planned_push()?;
        print_plan("pull", &pulled, &a.transfer);
        print_plan("push", &pushed, &a.transfer);
        return Ok(ExitCode::SUCCESS);
    }
    // Read as the session read them: a push asking the agent must match.
    let started_with = (wsdignore(&a.transfer.local)?, s.remembered.patterns.clone());
    let agent = if a.watch {
        let state = local_state(&a.transfer.local, a.transfer.state.as_deref());
        // An on-demand agent steps aside: this session watches anyway.
        if let agent::Asked::Answered(agent::Reply::Status(st)) =
            agent::ask(&state, &agent::Request::Status)?
            && st.kind == agent::AgentKind::OnDemand
            && let Err(e) = agent::stop(&state)
        {
            tracing::warn!(
                error = format!("{e:#}"),
                "the on-demand agent did not step aside"
            );
        }
        agent::Agent::bind(&state)?
    } else {
        None
    };
    let mut wake = if a.watch {
        let wake = Wake::start(&s);
        // A change made after the settle of `open` and before the watcher
        // started would otherwise wait for the safety interval.
        s.settled = false;
        Some(wake)
    } else {
        None
    };
    let mut served = agent::Served::default();
    loop {
        let started = Instant::now();
        let progress = Progress::new(&a.transfer);
        let round = async {
            let pulled = s.pull(&progress).await?;
            let pushed = s.push(&progress).await?;
            anyhow::Ok((pulled, pushed))
        }
        .await;
        progress.finish();
        let conflicts = s.store.take_conflict_copies();
        if round.is_err() {
            print_conflicts("pull", &conflicts);
        }
        let (pulled, pushed) = round?;
        if !a.watch || pulled.entries + pushed.entries > 0 || !conflicts.is_empty() {
            summarize(
                "pull",
                &pulled,
                &conflicts,
                started.elapsed(),
                a.transfer.json,
                a.transfer.quiet,
            );
            summarize(
                "push",
                &pushed,
                &[],
                started.elapsed(),
                a.transfer.json,
                a.transfer.quiet,
            );
        }
        let Some(wake) = wake.as_mut() else {
            drop(s);
            start_agent_after(&a.transfer, a.no_agent, &through);
            return Ok(ExitCode::SUCCESS);
        };
        // The daemon's rev our pull fetched through: anything beyond it
        // wakes the next round. Not the daemon's rev read after the round:
        // a daemon-side write settled between our push and that read would
        // pass for ours and wait for the safety interval. Our own push's
        // revs are beyond it too, so a round that pushed is followed by one
        // that finds nothing (its pull moves this past them).
        let synced = pulled.cursor.rev;
        loop {
            let asked = async {
                match &agent {
                    Some(agent) => agent.accept().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                woke = wake.next(synced, Duration::from_millis(a.interval), s.store.is_watching()) => {
                    woke?;
                    break;
                }
                asked = asked => {
                    // Read here, not in the select: a wake-up winning the
                    // race must not drop a half-read request.
                    let mut conn = asked?;
                    let Some(req) = agent::read_request(&mut conn).await else {
                        continue;
                    };
                    let reply = match agent::Asking::from(req) {
                        agent::Asking::Transfer(op, req) => {
                            serve_transfer(&mut s, &a.transfer, &started_with, op, req, &mut served).await
                        }
                        agent::Asking::Status => agent::Reply::Status(agent::AgentStatus {
                            pid: std::process::id(),
                            kind: agent::AgentKind::SyncWatch,
                            root: s.store.root().to_owned(),
                            remote: a.transfer.remote.remote.clone(),
                            idle_timeout_secs: None,
                            pushes: served.pushes,
                            pulls: served.pulls,
                        }),
                        agent::Asking::Stop => agent::Reply::Refused(
                            "it is a `wsd sync --watch`: stop that instead".to_owned(),
                        ),
                    };
                    if let Err(e) = agent::answer(&mut conn, &reply).await {
                        tracing::debug!(error = %e, "the client went away");
                    }
                }
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        }
    }
}

/// Why this session would not make the transfer `req` asks for, if it
/// would not. `.1`: the directory's excludes changed since the session started
/// (its rules are stale, not just other than the client's).
fn refusal(
    s: &Session,
    a: &TransferArgs,
    started_with: &(Vec<String>, Vec<String>),
    req: &agent::TransferRequest,
) -> Option<(String, bool)> {
    let current = wsdignore(&a.local).ok();
    if req.root != s.store.root() {
        Some((format!("it watches {}", s.store.root().display()), false))
    } else if req.remote != a.remote.remote {
        Some((format!("it syncs with {}", a.remote.remote), false))
    } else if req.wsdignore != started_with.0 || current.as_ref() != Some(&started_with.0) {
        Some((format!("{IGNORE_FILE} changed since it started"), true))
    } else if req.remembered != started_with.1 {
        Some((
            "the remembered excludes changed since it started".to_owned(),
            true,
        ))
    } else {
        None
    }
}

/// Makes `op` from the watched store for a client: the reply carrying its
/// summaries, or `Err` when it failed (the client then makes it by itself,
/// over a fresh connection; transfers are idempotent).
async fn transfer_for_client(s: &mut Session, op: agent::Transfer) -> Result<agent::Reply, String> {
    let started = Instant::now();
    // The session's own settle covers every write made before the request
    // (the watcher's cookie barrier).
    s.settled = false;
    let hidden = Progress::hidden();
    let pull = match op.pulls() {
        true => {
            let report = s.pull(&hidden).await;
            let conflicts = s.store.take_conflict_copies();
            match report {
                Ok(r) => Some(summary_json("pull", &r, &conflicts, started.elapsed())),
                Err(e) => return Err(failed_for_client("pull", &e, &conflicts)),
            }
        }
        false => None,
    };
    if !op.pushes() {
        return Ok(agent::Reply::Pulled(pull.unwrap_or_default()));
    }
    let push = match s.push(&hidden).await {
        Ok(r) => summary_json("push", &r, &[], started.elapsed()),
        Err(e) => {
            // A sync's pull went through: its copies are named in the error.
            let copies = pull
                .as_ref()
                .and_then(|p| p["conflicts"].as_array().cloned())
                .unwrap_or_default();
            let mut why = failed_for_client("push", &e, &[]);
            if !copies.is_empty() {
                why.push_str(&format!("; its pull kept local versions as {copies:?}"));
            }
            return Err(why);
        }
    };
    Ok(match pull {
        Some(pull) => agent::Reply::Synced { pull, push },
        None => agent::Reply::Pushed(push),
    })
}

/// Logs a transfer this agent failed to make for a client, and says why
/// (with the conflict copies it made before failing: they stay).
fn failed_for_client(verb: &str, e: &anyhow::Error, conflicts: &[ConflictCopy]) -> String {
    tracing::warn!(
        error = format!("{e:#}"),
        conflict_copies = conflicts.len(),
        "a {verb} asked of this agent failed"
    );
    let mut why = format!("its {verb} failed: {e:#}");
    for c in conflicts {
        why.push_str(&format!("; kept the local {} as {}", c.path, c.copy));
    }
    why
}

/// A one-shot transfer's request to `sync --watch`: made from the watched
/// store when it is the transfer this session would make, else refused.
async fn serve_transfer(
    s: &mut Session,
    a: &TransferArgs,
    started_with: &(Vec<String>, Vec<String>),
    op: agent::Transfer,
    req: agent::TransferRequest,
    served: &mut agent::Served,
) -> agent::Reply {
    if let Some((why, _)) = refusal(s, a, started_with, &req) {
        return agent::Reply::Refused(why);
    }
    match transfer_for_client(s, op).await {
        Ok(reply) => {
            served.count(op);
            reply
        }
        Err(why) => agent::Reply::Refused(why),
    }
}

#[derive(Debug, Args)]
pub struct AgentRunArgs {
    /// The local directory to watch; pushed before (its index exists).
    #[arg(value_name = "LOCAL_DIR")]
    local: PathBuf,
    #[command(flatten)]
    remote: RemoteArgs,
    /// LOCAL_DIR's index is kept here instead of LOCAL_DIR/.wsd.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    /// Exit after this many seconds without a transfer asked of it.
    #[arg(long, value_name = "SECS", env = "WSD_AGENT_IDLE_TIMEOUT",
          default_value_t = agent::DEFAULT_IDLE_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout: u64,
}

#[derive(Debug, clap::Subcommand)]
pub enum AgentCommand {
    /// Run LOCAL_DIR's agent in the foreground (what `wsd push`, `pull` and
    /// `sync` start in the background, logging to STATE/agent.log).
    Run(AgentRunArgs),
    /// Stop the agent serving LOCAL_DIR's transfers, and wait until it has
    /// exited (a `wsd sync --watch` is not stopped: stop it instead).
    Stop {
        #[command(flatten)]
        dir: LocalDirArgs,
    },
    /// Print which agent serves LOCAL_DIR's transfers, if any.
    Status {
        #[command(flatten)]
        dir: LocalDirArgs,
        /// One JSON object: {running, pid, kind, root, remote,
        /// idle_timeout_secs, pushes, pulls}.
        #[arg(long)]
        json: bool,
    },
}

/// How often the on-demand agent checks, without any event, that its
/// directory, state directory, index and socket are still the ones it
/// started with (events wake it sooner).
const AGENT_CHECK_EVERY: Duration = Duration::from_secs(5);

/// The least time between two checks woken by watcher events.
const AGENT_EVENT_CHECK_GAP: Duration = Duration::from_millis(250);

/// What the on-demand agent vouches for: removed or replaced, it exits.
struct AgentIdentity {
    root: PathBuf,
    root_id: Option<agent::FileId>,
    state: PathBuf,
    state_id: Option<agent::FileId>,
    index_id: Option<agent::FileId>,
    peer: Option<String>,
}

impl AgentIdentity {
    fn read(root: &Path, state: &Path) -> AgentIdentity {
        AgentIdentity {
            root: root.to_owned(),
            root_id: agent::FileId::of(root),
            state: state.to_owned(),
            state_id: agent::FileId::of(state),
            index_id: agent::FileId::of(&state.join(wsd::store::INDEX_FILE)),
            peer: std::fs::read_to_string(state.join(PEER_FILE)).ok(),
        }
    }

    /// Why this agent can no longer serve, if it cannot.
    fn lost(&self, listener: &agent::Agent) -> Option<String> {
        let now = AgentIdentity::read(&self.root, &self.state);
        if now.root_id.is_none() || now.root_id != self.root_id {
            Some(format!("{} was removed or replaced", self.root.display()))
        } else if now.state_id.is_none() || now.state_id != self.state_id {
            Some(format!("{} was removed or replaced", self.state.display()))
        } else if now.index_id.is_none() || now.index_id != self.index_id {
            Some("its index was removed or replaced".to_owned())
        } else if now.peer != self.peer {
            Some("the directory's peer name changed".to_owned())
        } else if !listener.socket_is_ours() {
            Some(format!("its socket {} was removed", agent::AGENT_SOCKET))
        } else {
            None
        }
    }
}

pub async fn agent_command(c: AgentCommand) -> Result<ExitCode> {
    match c {
        AgentCommand::Run(a) => agent_run(a).await,
        AgentCommand::Stop { dir } => {
            let state = local_state(&dir.local, dir.state.as_deref());
            match agent::stop(&state)? {
                agent::StopOutcome::NoAgent => {
                    eprintln!("no agent serves {}", dir.local.display());
                    Ok(ExitCode::SUCCESS)
                }
                agent::StopOutcome::Exited(pid) => {
                    eprintln!("stopped the agent of {} (pid {pid})", dir.local.display());
                    Ok(ExitCode::SUCCESS)
                }
                agent::StopOutcome::Refused(why) => {
                    anyhow::bail!("the agent of {} did not stop: {why}", dir.local.display())
                }
            }
        }
        AgentCommand::Status { dir, json } => {
            let state = local_state(&dir.local, dir.state.as_deref());
            let status = match agent::ask(&state, &agent::Request::Status)? {
                agent::Asked::Answered(agent::Reply::Status(st)) => Some(st),
                _ => None,
            };
            if json {
                let mut v = serde_json::json!({ "running": status.is_some() });
                if let Some(st) = &status
                    && let (serde_json::Value::Object(out), serde_json::Value::Object(more)) =
                        (&mut v, serde_json::to_value(st)?)
                {
                    out.extend(more);
                }
                println!("{v}");
            } else {
                match &status {
                    Some(st) => println!(
                        "{} agent (pid {}) serves {} for {}; {} pushes, {} pulls{}",
                        match st.kind {
                            agent::AgentKind::OnDemand => "an on-demand",
                            agent::AgentKind::SyncWatch => "a `wsd sync --watch`",
                        },
                        st.pid,
                        st.root.display(),
                        st.remote,
                        st.pushes,
                        st.pulls,
                        st.idle_timeout_secs
                            .map(|t| format!("; exits after {t} s without one"))
                            .unwrap_or_default()
                    ),
                    None => println!("no agent serves {}", dir.local.display()),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `wsd agent run`: the on-demand agent. Takes the state directory's
/// agent lock (or exits: another has it), settles LOCAL_DIR once with a
/// watcher, connects, then serves transfers on `STATE/agent.sock` until it is
/// idle for `--idle-timeout`, stopped, signalled, or what it watches goes.
async fn agent_run(a: AgentRunArgs) -> Result<ExitCode> {
    let state = local_state(&a.local, a.state.as_deref());
    anyhow::ensure!(
        state.join(wsd::store::INDEX_FILE).exists(),
        "{} has no index in {}: push it first",
        a.local.display(),
        state.display()
    );
    let Some(lock) = agent::take_lock(&state)? else {
        tracing::info!(state = %state.display(), "another agent holds this directory's lock");
        return Ok(ExitCode::SUCCESS);
    };
    let transfer = TransferArgs {
        local: a.local.clone(),
        create: false,
        exclude: Vec::new(),
        no_exclude: Vec::new(),
        dry_run: false,
        quiet: true,
        remote: a.remote.clone(),
        json: false,
        state: a.state.clone(),
    };
    let mut s = Session::open(&transfer, true, false).await?;
    let started_with = (wsdignore(&a.local)?, s.remembered.patterns.clone());
    let identity = AgentIdentity::read(s.store.root(), s.store.state_dir());
    let idle = Duration::from_secs(a.idle_timeout);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let listener = match agent::Agent::bind(&state) {
        Ok(Some(listener)) => listener,
        Ok(None) => return Ok(ExitCode::SUCCESS),
        Err(e) => {
            // Held until idle, so that pushes (which see the lock taken)
            // do not start one walking agent after another.
            tracing::warn!(
                error = format!("{e:#}"),
                "cannot serve; holding the lock until idle"
            );
            tokio::select! {
                _ = tokio::time::sleep(idle) => {}
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return Err(e);
        }
    };
    tracing::info!(
        root = %s.store.root().display(),
        remote = %a.remote.remote,
        idle_timeout_secs = a.idle_timeout,
        watching = s.store.is_watching(),
        "agent serving"
    );
    // Events wake the checks of what it watches (a removed directory
    // shows as events first); one slot, as a burst needs one check.
    let (tx, mut changed) = tokio::sync::mpsc::channel(1);
    s.store.set_change_hook(move |_: Option<&Path>| {
        let _ = tx.try_send(());
    });
    let mut check = tokio::time::interval(AGENT_CHECK_EVERY);
    let mut idle_until = tokio::time::Instant::now() + idle;
    let mut served = agent::Served::default();
    let mut last_event_check = Instant::now();
    let why = loop {
        tokio::select! {
            asked = listener.accept() => {
                let mut conn = asked?;
                let Some(req) = agent::read_request(&mut conn).await else {
                    continue;
                };
                let (reply, exit, rewalk) = match agent::Asking::from(req) {
                    agent::Asking::Transfer(op, req) => {
                        idle_until = tokio::time::Instant::now() + idle;
                        let asked = AgentAsked { s: &mut s, a: &transfer, started_with: &started_with, identity: &identity, listener: &listener };
                        agent_transfer(asked, op, req, &mut served).await
                    }
                    agent::Asking::Status => (
                        agent::Reply::Status(agent::AgentStatus {
                            pid: std::process::id(),
                            kind: agent::AgentKind::OnDemand,
                            root: s.store.root().to_owned(),
                            remote: a.remote.remote.clone(),
                            idle_timeout_secs: Some(a.idle_timeout),
                            pushes: served.pushes,
                            pulls: served.pulls,
                        }),
                        None,
                        false,
                    ),
                    agent::Asking::Stop => {
                        (agent::Reply::Stopping, Some("asked to stop".to_owned()), false)
                    }
                };
                if let Err(e) = agent::answer(&mut conn, &reply).await {
                    tracing::debug!(error = %e, "the client went away");
                }
                drop(conn);
                if let Some(why) = exit {
                    break why;
                }
                if rewalk {
                    // Ready for the next transfer: the walk its view needs.
                    s.settled = false;
                    if let Err(e) = s.settle() {
                        break format!("its settle failed: {e:#}");
                    }
                }
            }
            _ = tokio::time::sleep_until(idle_until) => {
                break format!("no transfer asked for {idle:?}");
            }
            Some(()) = changed.recv() => {
                // At most a few checks a second under an event storm (a
                // build); the tick catches what this skips.
                if last_event_check.elapsed() < AGENT_EVENT_CHECK_GAP {
                    continue;
                }
                last_event_check = Instant::now();
                if let Some(why) = identity.lost(&listener) {
                    break why;
                }
            }
            _ = check.tick() => {
                if let Some(why) = identity.lost(&listener) {
                    break why;
                }
            }
            _ = term.recv() => break "SIGTERM".to_owned(),
            _ = tokio::signal::ctrl_c() => break "interrupted".to_owned(),
        }
    };
    tracing::info!(%why, pushes = served.pushes, pulls = served.pulls, "agent exiting");
    // Socket, then lock, before the index closes (its checkpoint may take
    // a while): a successor a retiring answer asked for may start at once.
    drop(listener);
    drop(lock);
    Ok(ExitCode::SUCCESS)
}

/// What the on-demand agent answers a transfer request from.
struct AgentAsked<'a> {
    s: &'a mut Session,
    a: &'a TransferArgs,
    started_with: &'a (Vec<String>, Vec<String>),
    identity: &'a AgentIdentity,
    listener: &'a agent::Agent,
}

/// The on-demand agent's answer to a transfer request, whether it then
/// exits (and why), and whether it owes its view a walk first.
async fn agent_transfer(
    asked: AgentAsked<'_>,
    op: agent::Transfer,
    req: agent::TransferRequest,
    served: &mut agent::Served,
) -> (agent::Reply, Option<String>, bool) {
    let AgentAsked {
        s,
        a,
        started_with,
        identity,
        listener,
    } = asked;
    if let Some(why) = identity.lost(listener) {
        return (agent::Reply::Retiring(why.clone()), Some(why), false);
    }
    if let Some((why, stale)) = refusal(s, a, started_with, &req) {
        // Stale excludes: the client starts an agent with the new ones.
        return match stale {
            true => (agent::Reply::Retiring(why.clone()), Some(why), false),
            false => (agent::Reply::Refused(why), None, false),
        };
    }
    if !s.store.is_watching() {
        // Stays (until idle) so that transfers do not start one agent
        // after another, each walking once.
        let why = s.store.full_walk_due().unwrap_or_default();
        return (
            agent::Reply::Refused(format!("it has no watcher ({why})")),
            None,
            false,
        );
    }
    if let Some(why) = s.store.full_walk_due() {
        return (
            agent::Reply::Refused(format!("it cannot vouch for its view: {why}")),
            None,
            true,
        );
    }
    let started = Instant::now();
    match transfer_for_client(s, op).await {
        Ok(reply) => {
            served.count(op);
            // Debug, not info: a busy agent's log would grow by a line a
            // transfer (it is cut back only when the next agent starts).
            tracing::debug!(
                ?op,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "made a transfer for a client"
            );
            (reply, None, false)
        }
        // Its connection may be what failed: the client starts a new one.
        Err(why) => (agent::Reply::Retiring(why.clone()), Some(why), false),
    }
}

/// What wakes `sync --watch`: a local change (the local store's inotify
/// watcher, through its change hook), a remote one (a `waitChanges` long
/// poll on the daemon), or the safety interval. Waiting costs no CPU:
/// nothing runs until one fires. Our own pulls' writes wake it too; the
/// round that follows settles only those paths, which match the index.
struct Wake {
    local: tokio::sync::mpsc::Receiver<()>,
    remote: Client,
    /// The long poll in flight, kept across rounds: dropping it would leave
    /// the daemon holding an orphaned call.
    poll: Option<futures::future::LocalBoxFuture<'static, Result<u64, wsd_client::WsdError>>>,
    /// False once the daemon turned out not to know `waitChanges` (an
    /// older one): its changes are then looked for every
    /// [`WATCH_FALLBACK_POLL`].
    long_poll: bool,
}

impl Wake {
    fn start(s: &Session) -> Wake {
        // One slot: a burst of events while a round runs collapses to one.
        let (tx, local) = tokio::sync::mpsc::channel(1);
        let root = s.store.root().to_owned();
        let ignore = s.ignore.clone();
        if !s.store.is_watching() {
            tracing::warn!(dir = %root.display(),
                "cannot watch the local directory; looking at it every {:?} instead",
                WATCH_FALLBACK_POLL);
        }
        s.store.set_change_hook(move |path: Option<&Path>| {
            // A lost event (`None`) may hide anything.
            if path.is_none_or(|p| counts(p, &root, &ignore)) {
                let _ = tx.try_send(());
            }
        });
        Wake {
            local,
            remote: s.remote.clone(),
            poll: None,
            long_poll: true,
        }
    }

    /// Waits until something changed on either side since the daemon was
    /// at rev `synced`, or `interval` passed; then lets the burst settle.
    /// `watching`: whether the local watcher still runs.
    async fn next(&mut self, synced: u64, interval: Duration, watching: bool) -> Result<()> {
        let interval = if !watching || !self.long_poll {
            interval.min(WATCH_FALLBACK_POLL)
        } else {
            interval
        };
        let safety = tokio::time::sleep(interval);
        tokio::pin!(safety);
        loop {
            let long_poll = self.long_poll;
            let poll = self.poll.get_or_insert_with(|| {
                let remote = self.remote.clone();
                Box::pin(async move {
                    if !long_poll {
                        return std::future::pending().await;
                    }
                    remote.wait_changes(synced, WATCH_LONG_POLL).await
                })
            });
            tokio::select! {
                rev = poll => {
                    self.poll = None;
                    let rev = match rev {
                        Ok(rev) => rev,
                        Err(e) if e.code == wsd_sync::ErrorCode::Protocol => {
                            tracing::warn!(error = %e,
                                "the daemon cannot report changes (an older wsd?); \
                                 looking for them every {WATCH_FALLBACK_POLL:?}");
                            self.long_poll = false;
                            break;
                        }
                        Err(e) => return Err(e).context("waiting for the remote's changes"),
                    };
                    // A poll started before our own round may answer with
                    // the rev that round made: not a change to fetch.
                    if rev > synced {
                        tracing::debug!(rev, synced, "the remote changed");
                        break;
                    }
                }
                Some(()) = self.local.recv() => {
                    tracing::debug!("the local directory changed");
                    break;
                }
                _ = &mut safety => break,
            }
        }
        tokio::time::sleep(WATCH_DEBOUNCE).await;
        // Events of the burst that arrived meanwhile are covered by the
        // round about to run.
        while self.local.try_recv().is_ok() {}
        Ok(())
    }
}

/// Whether a change at `path` can change what a sync sends: under the
/// root and not excluded (the store's watcher already leaves out its state
/// directory).
fn counts(path: &Path, root: &Path, ignore: &IgnoreRules) -> bool {
    let Ok(rel) = path.strip_prefix(root) else {
        return false;
    };
    match rel.to_str().and_then(|r| wsd_sync::SyncPath::new(r).ok()) {
        Some(p) => !ignore.is_ignored_any_kind(&p),
        // The root itself, or a name sync cannot carry: look anyway.
        None => true,
    }
}

#[derive(Debug, Args)]
pub struct WatermarksArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// Report the watermarks kept for this local directory's peer name.
    #[arg(value_name = "LOCAL_DIR")]
    local: Option<PathBuf>,
    /// Report the watermarks kept for this peer name (without LOCAL_DIR).
    #[arg(long, default_value = "default", conflicts_with = "local")]
    peer: String,
}

pub async fn watermarks(a: WatermarksArgs) -> Result<ExitCode> {
    let peer = match &a.local {
        Some(dir) => peer_name(&dir.join(LOCAL_STATE), false)?,
        None => a.peer.clone(),
    };
    let c = a.remote.connect(&peer).await?;
    let wm = c.watermarks().await.context("watermarks")?;
    let v = serde_json::json!({
        "currentRev": wm.current_rev,
        "pushRev": wm.push_rev(),
        "fetchCursor": {
            "rev": wm.fetch_cursor.rev,
            "path": wm.fetch_cursor.path.as_ref().map(|p| p.as_str()),
        },
    });
    println!("{v}");
    Ok(ExitCode::SUCCESS)
}

/// LOCAL_DIR and where its sync state is, for `wsd exclude`.
#[derive(Debug, Args)]
pub struct LocalDirArgs {
    /// The local directory.
    #[arg(value_name = "LOCAL_DIR")]
    local: PathBuf,
    /// LOCAL_DIR's index is kept here instead of LOCAL_DIR/.wsd.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ExcludeCommand {
    /// Print LOCAL_DIR's excludes, one a line: the remembered ones, then
    /// `.wsdignore`'s (marked `(.wsdignore)`).
    List {
        #[command(flatten)]
        dir: LocalDirArgs,
        /// One JSON object: {excludes, wsdignore, unsent}.
        #[arg(long)]
        json: bool,
    },
    /// Remember PATTERNs (gitignore syntax) for every transfer of LOCAL_DIR.
    Add {
        #[command(flatten)]
        dir: LocalDirArgs,
        #[arg(value_name = "PATTERN", required = true)]
        patterns: Vec<String>,
    },
    /// Stop excluding remembered PATTERNs; the next push sends what they
    /// hid in LOCAL_DIR (replacing the daemon's copy).
    Rm {
        #[command(flatten)]
        dir: LocalDirArgs,
        #[arg(value_name = "PATTERN", required = true)]
        patterns: Vec<String>,
    },
}

/// LOCAL_DIR's excludes as `wsd status` and `wsd exclude list` show them.
pub(crate) struct LocalExcludes {
    pub remembered: Remembered,
    pub wsdignore: Vec<String>,
}

impl LocalExcludes {
    pub(crate) fn load(local: &Path, state: Option<&Path>) -> Result<LocalExcludes> {
        Ok(LocalExcludes {
            remembered: Remembered::load(&local_state(local, state))?,
            wsdignore: wsdignore(local)?,
        })
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "excludes": self.remembered.patterns,
            "wsdignore": self.wsdignore,
            "unsent": self.remembered.released,
        })
    }

    /// One pattern a line, each with where it comes from.
    pub(crate) fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.remembered.patterns.clone();
        out.extend(self.wsdignore.iter().map(|p| format!("{p} (.wsdignore)")));
        out.extend(
            self.remembered
                .released
                .iter()
                .map(|p| format!("{p} (dropped; the next push sends what it hid)")),
        );
        out
    }
}

pub fn exclude(c: ExcludeCommand) -> Result<ExitCode> {
    let (dir, add, drop) = match c {
        ExcludeCommand::List { dir, json } => {
            let ex = LocalExcludes::load(&dir.local, dir.state.as_deref())?;
            if json {
                println!("{}", ex.to_json());
            } else {
                for line in ex.lines() {
                    println!("{line}");
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        ExcludeCommand::Add { dir, patterns } => (dir, patterns, Vec::new()),
        ExcludeCommand::Rm { dir, patterns } => (dir, Vec::new(), patterns),
    };
    if !dir.local.is_dir() {
        anyhow::bail!("{} is not a directory", dir.local.display());
    }
    let state = local_state(&dir.local, dir.state.as_deref());
    let lines = wsdignore(&dir.local)?;
    let mut remembered = Remembered::load(&state)?;
    remembered
        .change(&add, &drop, &lines)
        .with_context(|| format!("the excludes of {}", dir.local.display()))?;
    // Checked as a transfer would compile them, before anything is saved.
    ignore_rules(&dir.local, &lines, &remembered.patterns)?;
    remembered.save(&state)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wsdignore_negation_cannot_re_include_conflict_copies() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(IGNORE_FILE), "*.log\n!*\n").unwrap();
        let lines = wsdignore(tmp.path()).unwrap();
        let rules = ignore_rules(tmp.path(), &lines, &["!*.rs".to_owned()]).unwrap();
        let copy = wsd_sync::SyncPath::new("src/main.rs.wsd-conflict-20261125T033500Z").unwrap();
        assert!(rules.is_ignored(&copy, false));
        let plain = wsd_sync::SyncPath::new("src/main.rs").unwrap();
        assert!(!rules.is_ignored(&plain, false));
    }

    #[test]
    fn too_many_exclusions_fail_naming_the_room_left_beside_the_built_in_one() {
        let tmp = tempfile::tempdir().unwrap();
        let room = wsd_sync::limits::MAX_IGNORE_PATTERNS - 1;
        let fits: Vec<String> = (0..room).map(|i| format!("p{i}")).collect();
        assert_eq!(
            ignore_rules(tmp.path(), &[], &fits)
                .unwrap()
                .patterns()
                .len(),
            room + 1
        );
        let over: Vec<String> = (0..=room).map(|i| format!("p{i}")).collect();
        let e = format!("{:#}", ignore_rules(tmp.path(), &[], &over).unwrap_err());
        assert!(
            e.contains("ELIMIT") && e.contains(&format!("at most {room}")),
            "{e}"
        );
    }
}
