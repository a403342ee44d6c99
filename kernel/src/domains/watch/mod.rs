//! The `watch` domain: change feeds over a store's `(rev, path)` index
//! (`fs.watch`, `fs.changes`, `fs.unwatch`), and the scheduled tombstone
//! pruning that must never pass what a feed still needs.
//!
//! It owns the live watches (one delivery task each, by watch id), a wake-up
//! channel per store (fed by dofs' commit listener, so every mutation —
//! `fs.*`, a pull after `shell.exec`, anything later — reaches the feeds),
//! and the `fs_watches` table of durable watches, whose cursors hold the
//! prune horizon until their TTL runs out. The calls are in [`calls`];
//! watches on a device (its own watcher, relayed) in [`device`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rusqlite::{Connection, params};
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use wsd_dofs::Dofs;
use wsd_sync::{ChangeCursor, SyncPath};

use crate::db::{Migration, opt};
use crate::error::KernelError;

pub mod calls;
pub mod device;
pub mod filter;

/// The `fs_watches` table (durable watches). Never edit a released
/// migration; add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 40,
    name: "durable watches",
    sql: "CREATE TABLE fs_watches(
            watch_id TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            path TEXT NOT NULL,
            recursive INTEGER NOT NULL,
            include TEXT NOT NULL,
            exclude TEXT NOT NULL,
            store TEXT NOT NULL,
            cursor TEXT NOT NULL,
            ttl_seconds INTEGER NOT NULL,
            acked_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL);
         CREATE INDEX fs_watches_store ON fs_watches(store);",
}];

/// Which store a feed reads: the system tree or one workspace's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoreKey {
    System,
    Workspace(String),
}

impl StoreKey {
    /// The `fs_watches.store` spelling.
    pub fn as_column(&self) -> String {
        match self {
            StoreKey::System => "system".to_owned(),
            StoreKey::Workspace(id) => format!("ws:{id}"),
        }
    }

    /// How a store path reads back to the caller.
    pub fn display(&self, p: &SyncPath) -> String {
        match self {
            StoreKey::System => format!("/{p}"),
            StoreKey::Workspace(id) => format!("/workspaces/{id}/{p}"),
        }
    }
}

/// A position in one store incarnation's change index, as clients see it:
/// `c1.<incarnation>.<rev>[.<base64url path>]`. Opaque to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub incarnation: u64,
    pub at: ChangeCursor,
}

impl Cursor {
    pub fn encode(&self) -> String {
        let mut s = format!("c1.{:x}.{}", self.incarnation, self.at.rev);
        if let Some(p) = &self.at.path {
            s.push('.');
            s.push_str(&URL_SAFE_NO_PAD.encode(p.as_str()));
        }
        s
    }

    /// `None` when `s` is not a cursor this kernel wrote.
    pub fn decode(s: &str) -> Option<Cursor> {
        let mut parts = s.split('.');
        if parts.next()? != "c1" {
            return None;
        }
        let incarnation = u64::from_str_radix(parts.next()?, 16).ok()?;
        let rev: u64 = parts.next()?.parse().ok()?;
        let path = match parts.next() {
            None => None,
            Some(b) => {
                let raw = URL_SAFE_NO_PAD.decode(b).ok()?;
                Some(SyncPath::new(String::from_utf8(raw).ok()?).ok()?)
            }
        };
        if parts.next().is_some() || (rev == 0 && path.is_some()) {
            return None;
        }
        Some(Cursor {
            incarnation,
            at: ChangeCursor { rev, path },
        })
    }
}

/// What a live watch reads: a store's change index, or a device's own
/// watcher whose signals the kernel relays.
#[derive(Debug)]
pub enum LiveSource {
    Store {
        key: StoreKey,
        /// Every rev at or below this one has been handed to the connection.
        complete_rev: Arc<AtomicU64>,
    },
    Device(Arc<device::DeviceLink>),
}

/// A live watch as the registry sees it.
#[derive(Debug)]
struct Live {
    connection_id: String,
    owner_uid: i64,
    /// Set (under its lock) when the watch is stopped; the delivery task
    /// sends only while holding it unset, so nothing follows a stop.
    stopped: Arc<Mutex<bool>>,
    source: LiveSource,
    /// Stops the delivery task.
    cancel: CancellationToken,
    /// Lets the delivery task start once the `fs.watch` answer is queued.
    start: Option<oneshot::Sender<()>>,
    /// Tells a resumed instance from the one it replaced.
    generation: u64,
}

impl Live {
    /// Stops the watch from the kernel's side (`fs.unwatch`, the watcher's
    /// connection closing, a lag); a device is told to stop watching.
    fn halt(&self, id: &str) {
        *self.stopped.lock().unwrap() = true;
        self.cancel.cancel();
        if let LiveSource::Device(link) = &self.source {
            link.tell_device_to_stop(id);
        }
    }

    /// Ends a device watch from the device's side: the watcher is told
    /// why (`fs.watch.ended`); the device is not asked anything.
    fn end(&self, reason: String) {
        if let LiveSource::Device(link) = &self.source {
            link.set_ended(reason);
        }
        *self.stopped.lock().unwrap() = true;
        self.cancel.cancel();
    }
}

/// A store's wake-up channel and the store its listener is installed on.
type Feed = (Weak<Mutex<Dofs>>, watch::Sender<u64>);

/// Live watches and the per-store wake-up channels.
#[derive(Debug, Default)]
pub struct Watches {
    live: Mutex<HashMap<String, Live>>,
    /// Per store: the store the listener is installed on, and the channel.
    feeds: Mutex<HashMap<StoreKey, Feed>>,
    /// Each store's rev at the previous prune tick: a tombstone is pruned
    /// only once it is a tick old, so a reader polling with `fs.changes`
    /// gets at least one interval to come back.
    revs_at_last_prune: Mutex<HashMap<StoreKey, u64>>,
    generations: AtomicU64,
}

/// What the delivery task of a new live watch gets from the registry.
#[derive(Debug)]
pub struct Registered {
    pub cancel: CancellationToken,
    pub start: oneshot::Receiver<()>,
    pub generation: u64,
    pub stopped: Arc<Mutex<bool>>,
}

impl Watches {
    /// A wake-up receiver for `key`'s store, installing the store's commit
    /// listener the first time.
    pub fn feed(
        &self,
        key: &StoreKey,
        store: &Arc<Mutex<Dofs>>,
    ) -> Result<watch::Receiver<u64>, KernelError> {
        let mut feeds = self.feeds.lock().unwrap();
        // A store closed and opened again (an archived workspace) is a new
        // value without the listener: install it again.
        if let Some((of, tx)) = feeds.get(key)
            && std::ptr::eq(of.as_ptr(), Arc::as_ptr(store))
        {
            return Ok(tx.subscribe());
        }
        let (tx, rx) = watch::channel(0u64);
        let notify = tx.clone();
        store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .on_commit(move || notify.send_modify(|n| *n = n.wrapping_add(1)))
            .map_err(|e| KernelError::internal("listening to a store's commits", e))?;
        feeds.insert(key.clone(), (Arc::downgrade(store), tx));
        Ok(rx)
    }

    /// Registers live watch `id` on `connection_id`, replacing (stopping)
    /// any running instance of it.
    pub fn register(
        &self,
        id: &str,
        owner_uid: i64,
        connection_id: &str,
        source: LiveSource,
    ) -> Registered {
        let stopped = Arc::new(Mutex::new(false));
        let cancel = CancellationToken::new();
        let (start_tx, start) = oneshot::channel();
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let old = self.live.lock().unwrap().insert(
            id.to_owned(),
            Live {
                connection_id: connection_id.to_owned(),
                owner_uid,
                stopped: stopped.clone(),
                source,
                cancel: cancel.clone(),
                start: Some(start_tx),
                generation,
            },
        );
        if let Some(old) = old {
            old.halt(id);
        }
        Registered {
            stopped,
            cancel,
            start,
            generation,
        }
    }

    /// The `fs.watch` answer naming `id` is queued: delivery may begin.
    pub fn start(&self, id: &str) {
        if let Some(l) = self.live.lock().unwrap().get_mut(id)
            && let Some(s) = l.start.take()
        {
            let _ = s.send(());
        }
    }

    /// Stops live watch `id` if `uid` owns it (`None`: anyone's); whether
    /// it was running. Once this returns no signal of it is sent.
    pub fn stop(&self, id: &str, uid: Option<i64>) -> bool {
        let mut live = self.live.lock().unwrap();
        if live
            .get(id)
            .is_none_or(|l| uid.is_some_and(|u| u != l.owner_uid))
        {
            return false;
        }
        if let Some(l) = live.remove(id) {
            l.halt(id);
        }
        true
    }

    /// Stops watch `id` without telling its device (whose route failed
    /// before it opened the watch).
    pub fn forget(&self, id: &str) {
        if let Some(l) = self.live.lock().unwrap().remove(id) {
            *l.stopped.lock().unwrap() = true;
            l.cancel.cancel();
        }
    }

    /// A delivery task ended on its own: forget it, unless a newer instance
    /// of the same id already replaced it.
    pub fn ended(&self, id: &str, generation: u64) {
        let mut live = self.live.lock().unwrap();
        if live.get(id).is_some_and(|l| l.generation == generation) {
            live.remove(id);
        }
    }

    /// Stops every watch of a closed connection, and ends (telling their
    /// watchers) the device watches a closed driver connection served.
    pub fn connection_closed(&self, connection_id: &str) {
        self.live.lock().unwrap().retain(|id, l| {
            if l.connection_id == connection_id {
                l.halt(id);
                return false;
            }
            match &l.source {
                LiveSource::Device(link) if link.driver_connection_id == connection_id => {
                    l.end(format!("Device disconnected: {}", link.device));
                    false
                }
                _ => true,
            }
        });
    }

    /// A signal from driver connection `driver_connection_id` about one of
    /// the device watches it serves: `fs.changed` is handed to the watch's
    /// relay, `fs.watch.ended` ends it. Anything about a watch this
    /// connection does not serve is dropped.
    pub fn from_device(&self, driver_connection_id: &str, signal: &str, payload: Value) {
        let Some(id) = payload["watchId"].as_str().map(str::to_owned) else {
            tracing::debug!(%signal, "a device watch signal without watchId");
            return;
        };
        let mut live = self.live.lock().unwrap();
        let Some(l) = live.get(&id) else {
            tracing::debug!(%signal, watch = %id, "a signal for a watch that is gone");
            return;
        };
        let LiveSource::Device(link) = &l.source else {
            return;
        };
        if link.driver_connection_id != driver_connection_id {
            tracing::debug!(%signal, watch = %id, "a signal from a connection that does not serve the watch");
            return;
        }
        match signal {
            device::CHANGED => link.hand_over(payload),
            device::ENDED => {
                let reason = payload["reason"]
                    .as_str()
                    .unwrap_or("the device ended the watch")
                    .to_owned();
                if let Some(l) = live.remove(&id) {
                    l.end(reason);
                }
            }
            _ => {}
        }
    }

    /// Whether watch `id` is being delivered now.
    pub fn is_live(&self, id: &str) -> bool {
        self.live.lock().unwrap().contains_key(id)
    }

    /// The lowest complete rev a live watch on `key` has reached.
    pub fn live_hold(&self, key: &StoreKey) -> Option<u64> {
        self.live
            .lock()
            .unwrap()
            .values()
            .filter_map(|l| match &l.source {
                LiveSource::Store {
                    key: k,
                    complete_rev,
                } if k == key => Some(complete_rev.load(Ordering::Acquire)),
                _ => None,
            })
            .min()
    }

    /// Records `key`'s rev at this tick; the one of the previous tick.
    pub fn swap_tick_rev(&self, key: &StoreKey, rev: u64) -> Option<u64> {
        self.revs_at_last_prune
            .lock()
            .unwrap()
            .insert(key.clone(), rev)
    }

    pub fn live_count(&self) -> usize {
        self.live.lock().unwrap().len()
    }
}

/// A durable watch's row.
#[derive(Debug, Clone)]
pub struct DurableRow {
    pub watch_id: String,
    pub owner_uid: i64,
    pub path: String,
    pub recursive: bool,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub store: String,
    pub cursor: String,
    pub ttl_seconds: u64,
    pub acked_at: i64,
}

impl DurableRow {
    /// When the hold lapses unless acked again (ms since the epoch).
    pub fn expires_at(&self) -> i64 {
        self.acked_at
            .saturating_add((self.ttl_seconds as i64).saturating_mul(1000))
    }
}

const DURABLE_COLUMNS: &str =
    "watch_id, owner_uid, path, recursive, include, exclude, store, cursor, ttl_seconds, acked_at";

fn durable_from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<DurableRow> {
    let list = |s: String| serde_json::from_str::<Vec<String>>(&s).unwrap_or_default();
    Ok(DurableRow {
        watch_id: r.get(0)?,
        owner_uid: r.get(1)?,
        path: r.get(2)?,
        recursive: r.get(3)?,
        include: list(r.get(4)?),
        exclude: list(r.get(5)?),
        store: r.get(6)?,
        cursor: r.get(7)?,
        ttl_seconds: r.get(8)?,
        acked_at: r.get(9)?,
    })
}

pub fn insert_durable(c: &Connection, row: &DurableRow, now: i64) -> Result<(), KernelError> {
    c.execute(
        &format!("INSERT INTO fs_watches({DURABLE_COLUMNS}, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
        params![
            row.watch_id,
            row.owner_uid,
            row.path,
            row.recursive,
            serde_json::to_string(&row.include).unwrap_or_default(),
            serde_json::to_string(&row.exclude).unwrap_or_default(),
            row.store,
            row.cursor,
            row.ttl_seconds,
            row.acked_at,
            now
        ],
    )?;
    Ok(())
}

pub fn get_durable(c: &Connection, id: &str) -> Result<Option<DurableRow>, KernelError> {
    opt(c.query_row(
        &format!("SELECT {DURABLE_COLUMNS} FROM fs_watches WHERE watch_id = ?1"),
        [id],
        durable_from_sql,
    ))
}

/// Moves a durable watch's cursor (an ack) and restarts its TTL.
pub fn ack_durable(c: &Connection, id: &str, cursor: &str, now: i64) -> Result<(), KernelError> {
    c.execute(
        "UPDATE fs_watches SET cursor = ?2, acked_at = ?3 WHERE watch_id = ?1",
        params![id, cursor, now],
    )?;
    Ok(())
}

pub fn delete_durable(c: &Connection, id: &str) -> Result<bool, KernelError> {
    Ok(c.execute("DELETE FROM fs_watches WHERE watch_id = ?1", [id])? > 0)
}

/// Every durable watch on `store` (the `store` column spelling).
pub fn durable_on(c: &Connection, store: &str) -> Result<Vec<DurableRow>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {DURABLE_COLUMNS} FROM fs_watches WHERE store = ?1"
    ))?;
    let rows = stmt.query_map([store], durable_from_sql)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Every durable watch.
pub fn all_durable(c: &Connection) -> Result<Vec<DurableRow>, KernelError> {
    let mut stmt = c.prepare(&format!("SELECT {DURABLE_COLUMNS} FROM fs_watches"))?;
    let rows = stmt.query_map([], durable_from_sql)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        for at in [
            ChangeCursor::at(0),
            ChangeCursor::at(7),
            ChangeCursor::within(3, SyncPath::new("a b/ü.txt").unwrap()),
        ] {
            let c = Cursor {
                incarnation: 0xdead_beef,
                at,
            };
            assert_eq!(Cursor::decode(&c.encode()), Some(c));
        }
        for bad in [
            "",
            "now",
            "c1",
            "c1.zz.1",
            "c2.1.1",
            "c1.1.x",
            "c1.1.1.!!",
            "c1.1.1.YQ.x",
            "c1.1.0.YQ",
        ] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
