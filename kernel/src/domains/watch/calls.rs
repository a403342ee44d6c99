//! `fs.watch`, `fs.changes`, `fs.unwatch`, the delivery of `fs.changed`
//! to a watching connection, and the scheduled tombstone pruning.
//!
//! A watch never buffers: its delivery task reads a page of the store's
//! change index after its cursor, hands the batches to the connection's
//! bounded queue without waiting, and sleeps until the store commits
//! again. A full queue stops the watch at the last batch queued and, once
//! the socket has room, tells the client with `fs.watch.lagged`.

mod device;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gsv_protocol::frames::Outbound;
use gsv_protocol::fs::FsError;
use gsv_protocol::watch::{
    AFTER_NOW, BadGlob, CURSOR_EXPIRED, Change, ChangeType, ChangedSignal, ChangesArgs,
    ChangesResult, DEFAULT_DURABLE_TTL_SECONDS, ExpiredFailure, LaggedSignal, UnwatchArgs,
    UnwatchResult, WatchArgs, WatchFailure, WatchOutcome, WatchResult,
};
use gsv_protocol::{Done, OpResult};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use wsd_dofs::{Dofs, DofsError};
use wsd_sync::{ChangeCursor, ChangeEntry, ChangesQuery, EntryState, IgnoreRules, Store, SyncPath};

use super::filter::Filter;
use super::{Cursor, DurableRow, LiveSource, Registered, StoreKey};
use crate::db::now_ms;
use crate::domains::accounts::{self, ProcessIdentity};
use crate::domains::fs::calls::with_store;
use crate::domains::fs::vfs::{self, Access, Place};
use crate::domains::workspace;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::routing;
use crate::session::{Outgoing, Session};

/// Index rows read per page (a delivery step, an `fs.changes` scan step).
const PAGE: usize = 1000;
/// Most changes one `fs.changes` answer carries.
const MAX_CHANGES_LIMIT: usize = 1000;

/// An operation failure of a watch call (`ok:true, data:{ok:false, …}`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatchError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Glob(#[from] BadGlob),
    #[error("Cursor expired: {0}; list the tree again and watch from \"now\"")]
    CursorExpired(String),
    #[error("Unknown watch: {0}")]
    UnknownWatch(String),
    #[error("Invalid argument: {0}")]
    Invalid(String),
}

/// A handler failure: an operation error, a device's own operation
/// error (relayed as it is), or a kernel fault.
#[derive(Debug)]
enum Fail {
    Op(WatchError),
    Device(WatchFailure),
    Kernel(KernelError),
}

impl From<WatchError> for Fail {
    fn from(e: WatchError) -> Self {
        Fail::Op(e)
    }
}

impl From<FsError> for Fail {
    fn from(e: FsError) -> Self {
        Fail::Op(e.into())
    }
}

impl From<BadGlob> for Fail {
    fn from(e: BadGlob) -> Self {
        Fail::Op(e.into())
    }
}

impl WatchError {
    /// The stable `code` beside the message (`fs.*`'s codes where they
    /// apply).
    fn code(&self) -> &'static str {
        match self {
            WatchError::Fs(e) => e.code().as_str(),
            WatchError::Glob(_) | WatchError::Invalid(_) => "invalid_argument",
            WatchError::UnknownWatch(_) => "not_found",
            WatchError::CursorExpired(_) => CURSOR_EXPIRED,
        }
    }
}

impl From<WatchError> for WatchFailure {
    fn from(e: WatchError) -> Self {
        match e {
            WatchError::CursorExpired(_) => {
                WatchFailure::Expired(ExpiredFailure::new(e.to_string()))
            }
            e => WatchFailure::Op(gsv_protocol::OpFailure {
                ok: false,
                error: e.to_string(),
                code: Some(e.code().to_owned()),
            }),
        }
    }
}

fn kernel_fail(e: KernelError) -> Fail {
    Fail::Kernel(e)
}

fn store_fail(what: &str, e: impl std::fmt::Display) -> Fail {
    Fail::Kernel(KernelError::internal(what, e))
}

/// Folds an operation error into the answer: a cursor the store cannot
/// serve is `{ok:false, error:{code:"ECURSOR_EXPIRED", message}, code,
/// resync:true}`, anything else `{ok:false, error:"message", code}` as
/// `fs.*`; only kernel faults are frame errors.
fn finish<T>(r: Result<T, Fail>) -> Result<WatchOutcome<T>, KernelError> {
    match r {
        Ok(v) => Ok(OpResult::Done(Done::new(v))),
        Err(Fail::Op(e)) => Ok(OpResult::Failed(e.into())),
        Err(Fail::Device(f)) => Ok(OpResult::Failed(f)),
        Err(Fail::Kernel(e)) => Err(e),
    }
}

/// Where a watched path lives, after the permission check.
struct Source {
    key: StoreKey,
    store: Arc<Mutex<Dofs>>,
    root: Option<SyncPath>,
    /// The path as the caller names it.
    display: String,
    system_reader: Option<ProcessIdentity>,
}

/// [`locate`]s `path` and builds its filter: the one start of `fs.watch`
/// and `fs.changes`.
async fn locate_filtered(
    k: &Arc<Kernel>,
    s: &Session,
    path: &str,
    recursive: bool,
    include: &[String],
    exclude: &[String],
) -> Result<(Source, Filter), Fail> {
    let src = locate(k, s, path).await?;
    let filter = Filter::new(
        src.root.clone(),
        recursive,
        include,
        exclude,
        src.system_reader.clone(),
    )?;
    Ok((src, filter))
}

/// Resolves `path` for reading, as `fs.read` does: another user's
/// workspace or home is refused the same way.
async fn locate(k: &Arc<Kernel>, s: &Session, path: &str) -> Result<Source, Fail> {
    let r = vfs::resolve(path, &s.identity.home)?;
    match &r.place {
        Place::System(sub) => {
            vfs::check_system(&s.identity, &r, Access::Read)?;
            Ok(Source {
                key: StoreKey::System,
                store: k.system.clone(),
                root: sub.clone(),
                display: r.display.clone(),
                system_reader: (!s.identity.is_root()).then(|| s.identity.clone()),
            })
        }
        Place::WorkspacesDir => Err(WatchError::Invalid(format!(
            "watch one workspace at a time: {}/<id>",
            r.display
        ))
        .into()),
        Place::Workspace { id, sub } => {
            let wid = id.clone();
            let row =
                k.db.call(move |c| workspace::get_row(c, &wid))
                    .await
                    .map_err(kernel_fail)?;
            let row = match row {
                Some(row) if vfs::check_workspace(&s.identity, row.owner_uid) => row,
                Some(_) => {
                    return Err(FsError::PermissionDenied {
                        path: r.display.clone(),
                    }
                    .into());
                }
                None => {
                    return Err(FsError::NotFound {
                        path: r.display.clone(),
                    }
                    .into());
                }
            };
            let w = k.workspaces.open(&row).await.map_err(kernel_fail)?;
            Ok(Source {
                key: StoreKey::Workspace(row.id),
                store: w.dofs.clone(),
                root: sub.clone(),
                display: r.display.clone(),
                system_reader: None,
            })
        }
    }
}

/// Why a cursor cannot be served, or a store failure.
#[derive(Debug)]
enum PageError {
    Expired(String),
    Store(String),
}

impl From<DofsError> for PageError {
    fn from(e: DofsError) -> Self {
        PageError::Store(e.to_string())
    }
}

impl From<wsd_sync::SyncError> for PageError {
    fn from(e: wsd_sync::SyncError) -> Self {
        PageError::Store(e.to_string())
    }
}

impl From<PageError> for Fail {
    fn from(e: PageError) -> Self {
        match e {
            PageError::Expired(m) => Fail::Op(WatchError::CursorExpired(m)),
            PageError::Store(m) => store_fail("reading the change index", m),
        }
    }
}

/// `after` (a cursor, `"now"` or nothing) as a position in `d`, or why
/// `d` cannot serve it.
fn resolve_after(d: &Dofs, after: Option<&str>) -> Result<Cursor, PageError> {
    let incarnation = d.incarnation()?;
    let current = d.current_rev()?;
    let Some(raw) = after.filter(|a| *a != AFTER_NOW) else {
        return Ok(Cursor {
            incarnation,
            at: ChangeCursor::at(current),
        });
    };
    let c = Cursor::decode(raw)
        .ok_or_else(|| PageError::Expired(format!("'{raw}' is not a cursor")))?;
    if c.incarnation != incarnation {
        return Err(PageError::Expired(
            "the cursor belongs to another store (or an earlier incarnation of this one)".into(),
        ));
    }
    check_servable(d, &c.at, current)?;
    Ok(c)
}

/// Whether `d` still holds every change after `at`.
fn check_servable(d: &Dofs, at: &ChangeCursor, current: u64) -> Result<(), PageError> {
    if at.rev > current {
        return Err(PageError::Expired(format!(
            "the cursor is at rev {} but the store is at {current}",
            at.rev
        )));
    }
    let horizon = d.prune_horizon()?;
    if horizon > 0 && at.complete_rev() < horizon {
        return Err(PageError::Expired(format!(
            "deletions up to rev {horizon} were pruned"
        )));
    }
    Ok(())
}

/// One page of the index after a cursor.
struct Page {
    entries: Vec<ChangeEntry>,
    /// More rows wait past the last entry.
    more: bool,
    /// Where the next page starts when this one is the last.
    through: ChangeCursor,
}

fn read_page(d: &mut Dofs, after: &ChangeCursor, limit: usize) -> Result<Page, PageError> {
    let current = d.current_rev()?;
    check_servable(d, after, current)?;
    let through = d.open_changes(after)?.through;
    let ignore = IgnoreRules::none();
    let mut entries = d.changes(ChangesQuery {
        after,
        through: &through,
        ignore: &ignore,
        exclude_applied_from: None,
        limit: limit + 1,
    })?;
    let more = entries.len() > limit;
    entries.truncate(limit);
    Ok(Page {
        entries,
        more,
        through,
    })
}

fn to_change(key: &StoreKey, e: &ChangeEntry) -> Change {
    let (kind, size, mode, hash) = match &e.state {
        EntryState::File {
            mode, size, chunks, ..
        } => (
            ChangeType::File,
            Some(*size),
            Some(*mode),
            Some(wsd_sync::manifest::hash(chunks).to_string()),
        ),
        EntryState::Dir { mode, .. } => (ChangeType::Dir, None, Some(*mode), None),
        EntryState::Symlink { mode, .. } => (ChangeType::Symlink, None, Some(*mode), None),
        EntryState::Delete => (ChangeType::Deleted, None, None, None),
    };
    Change {
        path: key.display(&e.path),
        kind,
        rev: e.rev,
        size,
        mode,
        hash,
    }
}

/// A page cut into one batch per rev: `(the cursor after the batch, the
/// kept changes)`.
fn batches(
    key: &StoreKey,
    filter: &Filter,
    entries: &[ChangeEntry],
) -> Vec<(ChangeCursor, Vec<Change>)> {
    let mut out: Vec<(ChangeCursor, Vec<Change>)> = Vec::new();
    for e in entries {
        let at = ChangeCursor::within(e.rev, e.path.clone());
        let same_rev = out.last().is_some_and(|(c, _)| c.rev == e.rev);
        if !same_rev {
            out.push((at.clone(), Vec::new()));
        }
        let last = out.last_mut().expect("pushed");
        last.0 = at;
        if filter.keeps(&e.path) {
            last.1.push(to_change(key, e));
        }
    }
    out
}

fn sig_text(signal: &str, payload: impl Serialize) -> String {
    Outbound::Sig {
        signal: signal.to_owned(),
        payload: serde_json::to_value(payload).unwrap_or(Value::Null),
        seq: None,
    }
    .to_text()
}

/// `fs.watch` (on a device with `target`: [`device`]).
pub async fn watch(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: WatchArgs,
) -> Result<WatchOutcome<WatchResult>, KernelError> {
    finish(watch_inner(&k, &s, a).await)
}

async fn watch_inner(k: &Arc<Kernel>, s: &Session, a: WatchArgs) -> Result<WatchResult, Fail> {
    if let Some(target) = a
        .target
        .clone()
        .filter(|t| !t.is_empty() && t != routing::NATIVE_TARGET)
    {
        return device::open(k, s, a, target).await;
    }
    let uid = s.identity.uid;
    let now = now_ms();
    // A resumed durable watch keeps its path and filters.
    let (id, resumed) = match &a.watch_id {
        Some(id) => {
            let wid = id.clone();
            let row =
                k.db.call(move |c| super::get_durable(c, &wid))
                    .await
                    .map_err(kernel_fail)?;
            match row {
                Some(r)
                    if (r.owner_uid == uid || s.identity.is_root()) && r.expires_at() >= now =>
                {
                    (id.clone(), Some(r))
                }
                _ => return Err(WatchError::UnknownWatch(id.clone()).into()),
            }
        }
        None => (format!("w_{}", accounts::random_hex(8)), None),
    };
    let (path, recursive, include, exclude, durable, ttl, after) = match &resumed {
        Some(r) => (
            r.path.clone(),
            r.recursive,
            r.include.clone(),
            r.exclude.clone(),
            true,
            a.ttl_seconds.unwrap_or(r.ttl_seconds),
            a.after.clone().or_else(|| Some(r.cursor.clone())),
        ),
        None => (
            a.path.clone(),
            a.recursive,
            a.include.clone(),
            a.exclude.clone(),
            a.durable,
            a.ttl_seconds.unwrap_or(DEFAULT_DURABLE_TTL_SECONDS),
            a.after.clone(),
        ),
    };
    if ttl == 0 {
        return Err(WatchError::Invalid("ttlSeconds must be at least 1".into()).into());
    }
    let (src, filter) = locate_filtered(k, s, &path, recursive, &include, &exclude).await?;
    // Subscribed before the first read, so no commit falls between.
    let wake = k.watches.feed(&src.key, &src.store).map_err(kernel_fail)?;
    let from = with_store(&src.store, move |d| resolve_after(d, after.as_deref()))
        .await
        .map_err(kernel_fail)??;
    let tx = k
        .pool
        .sender(&s.connection_id)
        .ok_or_else(|| kernel_fail(KernelError::Cancelled("the connection closed".into())))?;
    let cursor = from.encode();
    let expires_at = durable.then(|| now.saturating_add((ttl as i64).saturating_mul(1000)));
    if durable {
        let row = DurableRow {
            watch_id: id.clone(),
            owner_uid: resumed.as_ref().map_or(uid, |r| r.owner_uid),
            path: src.display.clone(),
            recursive,
            include,
            exclude,
            store: src.key.as_column(),
            cursor: cursor.clone(),
            ttl_seconds: ttl,
            acked_at: now,
        };
        let fresh = resumed.is_none();
        k.db.call(move |c| {
            if fresh {
                super::insert_durable(c, &row, now)
            } else {
                c.execute(
                    "UPDATE fs_watches SET cursor = ?2, acked_at = ?3, ttl_seconds = ?4 WHERE watch_id = ?1",
                    rusqlite::params![row.watch_id, row.cursor, now, row.ttl_seconds],
                )?;
                Ok(())
            }
        })
        .await
        .map_err(kernel_fail)?;
    }
    let owner = resumed.as_ref().map_or(uid, |r| r.owner_uid);
    let complete_rev = Arc::new(AtomicU64::new(from.at.complete_rev()));
    let reg = k.watches.register(
        &id,
        owner,
        &s.connection_id,
        LiveSource::Store {
            key: src.key.clone(),
            complete_rev: complete_rev.clone(),
        },
    );
    tokio::spawn(deliver(
        k.clone(),
        Delivery {
            id: id.clone(),
            key: src.key,
            store: src.store,
            filter,
            incarnation: from.incarnation,
            durable,
        },
        from.at,
        tx,
        wake,
        reg,
        complete_rev,
    ));
    Ok(WatchResult {
        watch_id: id,
        cursor,
        durable,
        expires_at,
    })
}

/// What a delivery task reads and for whom.
struct Delivery {
    id: String,
    key: StoreKey,
    store: Arc<Mutex<Dofs>>,
    filter: Filter,
    incarnation: u64,
    durable: bool,
}

/// What the last page's delivery came to.
enum Step {
    /// Everything up to the cursor was handed over; `more` pages wait.
    Delivered { more: bool },
    /// The queue was full at the cursor.
    Lagged,
    /// The watch was stopped or its connection closed.
    Gone,
}

async fn deliver(
    k: Arc<Kernel>,
    d: Delivery,
    mut cursor: ChangeCursor,
    tx: mpsc::Sender<Outgoing>,
    mut wake: watch::Receiver<u64>,
    reg: Registered,
    complete_rev: Arc<AtomicU64>,
) {
    let Registered {
        cancel,
        start,
        generation,
        stopped,
    } = reg;
    // The `fs.watch` answer goes first (the server starts us once queued).
    tokio::select! {
        biased;
        _ = cancel.cancelled() => return,
        _ = start => {}
    }
    loop {
        wake.borrow_and_update();
        let after = cursor.clone();
        let page = with_store(&d.store, move |s| read_page(s, &after, PAGE)).await;
        let page = match page {
            Ok(Ok(p)) => p,
            Ok(Err(PageError::Expired(why))) => {
                tracing::info!(watch = %d.id, %why, "a live watch's cursor can no longer be served");
                lagged(&d, &cursor, &tx, &cancel).await;
                break;
            }
            Ok(Err(PageError::Store(e))) => {
                tracing::error!(watch = %d.id, error = %e, "reading the change index");
                lagged(&d, &cursor, &tx, &cancel).await;
                break;
            }
            Err(e) => {
                tracing::error!(watch = %d.id, error = %e, "reading the change index");
                break;
            }
        };
        let before = cursor.clone();
        let step = send_page(&d, &page, &mut cursor, &tx, &stopped);
        complete_rev.store(cursor.complete_rev(), Ordering::Release);
        if d.durable && cursor != before {
            let (id, c) = (
                d.id.clone(),
                Cursor {
                    incarnation: d.incarnation,
                    at: cursor.clone(),
                }
                .encode(),
            );
            if let Err(e) =
                k.db.call(move |db| super::ack_durable(db, &id, &c, now_ms()))
                    .await
            {
                tracing::warn!(watch = %d.id, error = %e, "recording a durable watch's cursor");
            }
        }
        match step {
            Step::Gone => break,
            Step::Lagged => {
                lagged(&d, &cursor, &tx, &cancel).await;
                break;
            }
            Step::Delivered { more: true } => continue,
            Step::Delivered { more: false } => {}
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            changed = wake.changed() => if changed.is_err() { break },
        }
    }
    k.watches.ended(&d.id, generation);
}

/// Queues a page's batches without waiting, advancing `cursor` past each
/// batch handed over (and past the page when all of it was).
fn send_page(
    d: &Delivery,
    page: &Page,
    cursor: &mut ChangeCursor,
    tx: &mpsc::Sender<Outgoing>,
    stopped: &Mutex<bool>,
) -> Step {
    for (end, changes) in batches(&d.key, &d.filter, &page.entries) {
        if !changes.is_empty() {
            let text = sig_text(
                "fs.changed",
                ChangedSignal {
                    watch_id: d.id.clone(),
                    cursor: Cursor {
                        incarnation: d.incarnation,
                        at: end.clone(),
                    }
                    .encode(),
                    changes,
                },
            );
            // Held across the send: a stop waits for it, so no signal
            // follows the answer to `fs.unwatch`.
            let gate = stopped.lock().unwrap();
            if *gate {
                return Step::Gone;
            }
            match tx.try_send(Outgoing::Text(text)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => return Step::Lagged,
                Err(mpsc::error::TrySendError::Closed(_)) => return Step::Gone,
            }
        }
        *cursor = end;
    }
    if !page.more {
        *cursor = page.through.clone();
    }
    Step::Delivered { more: page.more }
}

/// Waits for room on the socket (or the watch's end) and sends
/// `fs.watch.lagged` with the last cursor handed over.
async fn lagged(
    d: &Delivery,
    cursor: &ChangeCursor,
    tx: &mpsc::Sender<Outgoing>,
    cancel: &tokio_util::sync::CancellationToken,
) {
    let text = sig_text(
        "fs.watch.lagged",
        LaggedSignal {
            watch_id: d.id.clone(),
            cursor: Cursor {
                incarnation: d.incarnation,
                at: cursor.clone(),
            }
            .encode(),
        },
    );
    tokio::select! {
        _ = cancel.cancelled() => {}
        permit = tx.reserve() => if let Ok(p) = permit { p.send(Outgoing::Text(text)) },
    }
}

/// `fs.changes`.
pub async fn changes(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ChangesArgs,
) -> Result<WatchOutcome<ChangesResult>, KernelError> {
    finish(changes_inner(&k, &s, a).await)
}

async fn changes_inner(
    k: &Arc<Kernel>,
    s: &Session,
    a: ChangesArgs,
) -> Result<ChangesResult, Fail> {
    let limit = match a.limit {
        None => MAX_CHANGES_LIMIT,
        Some(n) if (1..=MAX_CHANGES_LIMIT).contains(&n) => n,
        Some(n) => {
            return Err(WatchError::Invalid(format!(
                "limit must be 1..={MAX_CHANGES_LIMIT}, not {n}"
            ))
            .into());
        }
    };
    let (src, filter) = locate_filtered(k, s, &a.path, a.recursive, &a.include, &a.exclude).await?;
    let key = src.key.clone();
    let after = a.after;
    with_store(&src.store, move |d| -> Result<ChangesResult, PageError> {
        let from = resolve_after(d, Some(&after))?;
        let answer = |changes, at, more| ChangesResult {
            changes,
            cursor: Cursor {
                incarnation: from.incarnation,
                at,
            }
            .encode(),
            more,
        };
        let mut at = from.at.clone();
        let mut changes = Vec::new();
        loop {
            let page = read_page(d, &at, PAGE)?;
            for e in &page.entries {
                if changes.len() == limit {
                    return Ok(answer(changes, at, true));
                }
                if filter.keeps(&e.path) {
                    changes.push(to_change(&key, e));
                }
                at = ChangeCursor::within(e.rev, e.path.clone());
            }
            if !page.more {
                return Ok(answer(changes, page.through, false));
            }
        }
    })
    .await
    .map_err(kernel_fail)?
    .map_err(Fail::from)
}

/// `fs.unwatch`: stops a live watch (a device's too) and forgets a
/// durable one.
pub async fn unwatch(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: UnwatchArgs,
) -> Result<WatchOutcome<UnwatchResult>, KernelError> {
    finish(unwatch_inner(&k, &s, a).await)
}

async fn unwatch_inner(
    k: &Arc<Kernel>,
    s: &Session,
    a: UnwatchArgs,
) -> Result<UnwatchResult, Fail> {
    let uid = (!s.identity.is_root()).then_some(s.identity.uid);
    let stopped = k.watches.stop(&a.watch_id, uid);
    let id = a.watch_id.clone();
    let forgotten =
        k.db.call(move |c| match super::get_durable(c, &id)? {
            Some(r) if uid.is_none_or(|u| u == r.owner_uid) => super::delete_durable(c, &id),
            _ => Ok(false),
        })
        .await
        .map_err(kernel_fail)?;
    if stopped || forgotten {
        Ok(UnwatchResult {
            watch_id: a.watch_id,
        })
    } else {
        Err(WatchError::UnknownWatch(a.watch_id).into())
    }
}

/// What one prune tick did to one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub store: StoreKey,
    pub pruned: usize,
    pub horizon: u64,
}

/// Prunes the tombstones of the system store and every open workspace's,
/// never past: what a registered remote has not acknowledged (dofs'
/// rule), the cursor of a live or unexpired durable watch, or the rev the
/// store had at the previous tick (so a poller gets one interval). Drops
/// durable watches whose TTL ran out.
pub async fn prune_now(k: &Arc<Kernel>) -> Result<Vec<Pruned>, KernelError> {
    let now = now_ms();
    let rows = k.db.call(|c| super::all_durable(c)).await?;
    let (expired, holding): (Vec<DurableRow>, Vec<DurableRow>) = rows
        .into_iter()
        .partition(|r| r.expires_at() < now && !k.watches.is_live(&r.watch_id));
    if !expired.is_empty() {
        let ids: Vec<String> = expired.into_iter().map(|r| r.watch_id).collect();
        tracing::info!(watches = ?ids, "durable watches expired");
        k.db.call(move |c| {
            for id in &ids {
                super::delete_durable(c, id)?;
            }
            Ok(())
        })
        .await?;
    }
    let mut stores = vec![(StoreKey::System, k.system.clone())];
    stores.extend(
        k.workspaces
            .open_list()
            .into_iter()
            .map(|w| (StoreKey::Workspace(w.id.clone()), w.dofs.clone())),
    );
    let mut out = Vec::new();
    for (key, store) in stores {
        let cursors: Vec<Cursor> = holding
            .iter()
            .filter(|r| r.store == key.as_column())
            .filter_map(|r| Cursor::decode(&r.cursor))
            .collect();
        let live = k.watches.live_hold(&key);
        let (incarnation, current) = with_store(&store, |d| {
            Ok::<_, DofsError>((d.incarnation()?, d.current_rev()?))
        })
        .await?
        .map_err(|e| KernelError::internal("reading a store before pruning", e))?;
        let previous = k.watches.swap_tick_rev(&key, current).unwrap_or(0);
        let hold = cursors
            .iter()
            // A cursor of another incarnation cannot be served anyway.
            .filter(|c| c.incarnation == incarnation)
            .map(|c| c.at.complete_rev())
            .chain(live)
            .fold(previous, u64::min);
        let outcome = with_store(&store, move |d| d.prune_tombstones_holding(hold))
            .await?
            .map_err(|e| KernelError::internal("pruning tombstones", e))?;
        out.push(Pruned {
            store: key,
            pruned: outcome.pruned,
            horizon: outcome.horizon,
        });
    }
    Ok(out)
}

/// Prunes every `config.prune_every` until the kernel goes away.
pub async fn prune_periodically(kernel: std::sync::Weak<Kernel>) {
    loop {
        let every = match kernel.upgrade() {
            Some(k) => k.config.prune_every,
            None => return,
        };
        tokio::time::sleep(every).await;
        let Some(k) = kernel.upgrade() else { return };
        match prune_now(&k).await {
            Ok(done) => {
                let pruned: usize = done.iter().map(|p| p.pruned).sum();
                if pruned > 0 {
                    tracing::info!(pruned, "pruned tombstones");
                }
            }
            Err(e) => tracing::warn!(error = %e, "pruning tombstones"),
        }
    }
}

#[cfg(test)]
mod tests {
    use wsd_dofs::WriteOptions;

    use super::*;

    fn store_with(files: &[&str]) -> Arc<Mutex<Dofs>> {
        let mut d = Dofs::open_in_memory().unwrap();
        for f in files {
            d.write_file_with(
                &SyncPath::new(*f).unwrap(),
                &b"x"[..],
                WriteOptions {
                    create_parents: true,
                    ..WriteOptions::default()
                },
            )
            .unwrap();
        }
        Arc::new(Mutex::new(d))
    }

    /// A live, unfiltered watch of the whole system store.
    fn delivery(store: Arc<Mutex<Dofs>>) -> Delivery {
        Delivery {
            id: "w_1".into(),
            key: StoreKey::System,
            store,
            filter: Filter::new(None, true, &[], &[], None).unwrap(),
            incarnation: 1,
            durable: false,
        }
    }

    #[test]
    fn a_full_queue_stops_delivery_at_the_last_batch_handed_over() {
        let store = store_with(&["a", "b", "c"]);
        let page = read_page(&mut store.lock().unwrap(), &ChangeCursor::ZERO, PAGE).unwrap();
        let d = delivery(store);
        let (tx, mut rx) = mpsc::channel(1);
        let mut cursor = ChangeCursor::ZERO;
        let step = send_page(&d, &page, &mut cursor, &tx, &Mutex::new(false));
        assert!(matches!(step, Step::Lagged));
        assert_eq!(
            cursor,
            ChangeCursor::within(1, SyncPath::new("a").unwrap()),
            "only the first rev went out"
        );
        let Ok(Outgoing::Text(first)) = rx.try_recv() else {
            panic!("one frame queued")
        };
        assert!(first.contains("\"/a\""), "{first}");
        // With room again, the rest follows from that cursor, in order.
        let page = read_page(&mut d.store.lock().unwrap(), &cursor, PAGE).unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let step = send_page(&d, &page, &mut cursor, &tx, &Mutex::new(false));
        assert!(matches!(step, Step::Delivered { more: false }));
        assert_eq!(cursor, ChangeCursor::at(3));
        let mut got = Vec::new();
        while let Ok(Outgoing::Text(t)) = rx.try_recv() {
            got.push(t);
        }
        assert_eq!(got.len(), 2);
        assert!(got[0].contains("\"/b\"") && got[1].contains("\"/c\""));
    }

    #[test]
    fn a_stopped_watch_sends_nothing() {
        let store = store_with(&["a"]);
        let page = read_page(&mut store.lock().unwrap(), &ChangeCursor::ZERO, PAGE).unwrap();
        let d = delivery(store);
        let (tx, mut rx) = mpsc::channel(8);
        let mut cursor = ChangeCursor::ZERO;
        let step = send_page(&d, &page, &mut cursor, &tx, &Mutex::new(true));
        assert!(matches!(step, Step::Gone));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn cursors_below_the_horizon_or_ahead_of_the_store_cannot_be_served() {
        let store = store_with(&["a"]);
        let mut d = store.lock().unwrap();
        let inc = d.incarnation().unwrap();
        let ahead = Cursor {
            incarnation: inc,
            at: ChangeCursor::at(9),
        };
        assert!(matches!(
            resolve_after(&d, Some(&ahead.encode())),
            Err(PageError::Expired(_))
        ));
        d.rm(&SyncPath::new("a").unwrap(), false).unwrap();
        d.prune_tombstones_holding(2).unwrap();
        let old = Cursor {
            incarnation: inc,
            at: ChangeCursor::at(1),
        };
        assert!(matches!(
            resolve_after(&d, Some(&old.encode())),
            Err(PageError::Expired(_))
        ));
        let now = resolve_after(&d, Some("now")).unwrap();
        assert_eq!(now.at, ChangeCursor::at(2));
    }
}
