//! The `Sync` half of the server, its change iterator and its upload sink.
//! Every store access goes through the store thread ([`StoreHandle`]).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use wsd_schema::workspace_capnp as wire;
use wsd_sync::limits::{MAX_HASHES_PER_CALL, MAX_PUSH_ENTRIES};
use wsd_sync::{ApplyBatch, ChangeCursor, ChangesQuery, ErrorCode, Hash, IgnoreRules, Store};

use super::WireError;
use super::conn::{Conn, run_call};
use super::convert::{
    baseline_from, cursor_to, entries_from, entries_to, hashes_from, hashes_to, ignore_from,
    maybe_entry_to, objects_from, objects_to, opt_cursor_from, path_from,
};
use super::limits::{MAX_CHANGES_PER_NEXT, MAX_WAIT_CHANGES, OBJECT_WRITE_BYTES};
use super::store_thread::StoreHandle;
use super::stream::{self, StreamWindow, message_bytes};

/// Objects `fetchObjects` reads per store lookup: one write stays below
/// `OBJECT_WRITE_BYTES + READ_GROUP * MAX_CHUNK` = 3 MiB.
const READ_GROUP: usize = 8;

/// How long after its last push a connection counts as quiet, when the
/// store does its idle housekeeping ([`Store::idle`]).
const IDLE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// `Sync` for one peer on one connection.
pub(crate) struct SyncServer<S> {
    store: StoreHandle<S>,
    conn: Rc<Conn>,
    /// The name the store keeps this peer's watermarks under.
    peer: Arc<str>,
    /// Bumped by every push; an idle task runs only if none came after it.
    pushes: Rc<std::cell::Cell<u64>>,
    /// The server's set of peers that synced, for `status`.
    syncing: PeersSeen,
}

/// The names of the peers that pushed or fetched changes since the server
/// started (a probe or an exec client connects as a peer too, but only a
/// syncing peer has watermarks worth reporting).
pub(crate) type PeersSeen = Rc<RefCell<std::collections::BTreeSet<Arc<str>>>>;

impl<S: Store + Send + 'static> SyncServer<S> {
    pub(crate) fn new(
        store: StoreHandle<S>,
        conn: Rc<Conn>,
        peer: Arc<str>,
        syncing: PeersSeen,
    ) -> Self {
        SyncServer {
            store,
            conn,
            peer,
            pushes: Rc::default(),
            syncing,
        }
    }

    fn note_syncing(&self) {
        if !self.syncing.borrow().contains(&self.peer) {
            self.syncing.borrow_mut().insert(self.peer.clone());
        }
    }

    /// After a push, once the connection has been quiet for
    /// [`IDLE_AFTER`], lets the store settle what the push wrote (its
    /// watcher reports every file) so the next request does not wait for it.
    fn schedule_idle(&self) {
        let n = self.pushes.get() + 1;
        self.pushes.set(n);
        let (pushes, store) = (self.pushes.clone(), self.store.clone());
        tokio::task::spawn_local(async move {
            tokio::time::sleep(IDLE_AFTER).await;
            if pushes.get() == n
                && let Err(e) = store.call(|s| s.idle()).await
            {
                tracing::debug!(error = %e, "idle housekeeping failed");
            }
        });
    }
}

impl<S: Store + Send + 'static> wire::sync::Server for SyncServer<S> {
    async fn push(
        self: Rc<Self>,
        params: wire::sync::PushParams,
        mut results: wire::sync::PushResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "push", async {
            self.note_syncing();
            let p = params.get()?;
            let sender = opt_cursor_from(p.has_sender(), p.get_sender())?;
            // senderRev 0: an external writer, whose entries are local writes.
            let sender = (sender.rev > 0).then_some(sender);
            let baseline = baseline_from(p.get_baseline())?;
            let entries = entries_from(p.get_entries()?, "entries per push", MAX_PUSH_ENTRIES)?;
            let ignore = IgnoreRules::new(&ignore_from(p.has_ignore(), p.get_ignore())?)?;
            let peer = self.peer.clone();
            let count = entries.len();
            let outcome = self
                .store
                .call(move |s| {
                    s.apply(ApplyBatch {
                        remote: &peer,
                        sender,
                        entries: &entries,
                        baseline,
                        ignore: &ignore,
                    })
                })
                .await?;
            tracing::debug!(
                peer = &*self.peer,
                count,
                applied = outcome.applied,
                skipped = outcome.skipped,
                rev = outcome.rev,
                "push applied"
            );
            if outcome.overwrote_local > 0 {
                tracing::warn!(
                    peer = &*self.peer,
                    overwritten = outcome.overwrote_local,
                    "a push overwrote local changes not yet synced to that peer"
                );
            }
            self.schedule_idle();
            let mut r = results.get();
            r.set_rev(outcome.rev);
            cursor_to(r.init_applied_push_cursor(), &outcome.fetch_cursor);
            Ok(())
        })
        .await
    }

    async fn fetch_changes(
        self: Rc<Self>,
        params: wire::sync::FetchChangesParams,
        mut results: wire::sync::FetchChangesResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "fetchChanges", async {
            self.note_syncing();
            let p = params.get()?;
            let after = opt_cursor_from(p.has_after(), p.get_after())?;
            let patterns = ignore_from(p.has_ignore(), p.get_ignore())?;
            let ignore = Arc::new(IgnoreRules::new(&patterns)?);
            let peer = self.peer.clone();
            let open_after = after.clone();
            let (window, applied) = self
                .store
                .call(move |s| {
                    let window = s.open_changes(&open_after)?;
                    let wm = s.watermarks(&peer)?;
                    // Asking for what follows `after` acknowledges all up
                    // to it: recorded (forward only) as this peer's push
                    // cursor, it lets the scheduled prune drop the
                    // tombstones the peer has, and none it still needs.
                    if !window.baseline && open_after > wm.push_cursor {
                        s.set_push_cursor(&peer, &open_after)?;
                    }
                    Ok((window, wm.fetch_cursor))
                })
                .await?;
            let start = if window.baseline {
                ChangeCursor::ZERO
            } else {
                after
            };
            let mut r = results.get();
            cursor_to(r.reborrow().init_current_cursor(), &window.through);
            cursor_to(r.reborrow().init_applied_push_cursor(), &applied);
            r.set_baseline(window.baseline);
            let iter = ChangeIter {
                store: self.store.clone(),
                conn: self.conn.clone(),
                peer: self.peer.clone(),
                through: window.through,
                ignore,
                state: tokio::sync::Mutex::new(IterState {
                    after: start,
                    drained: false,
                }),
            };
            r.set_changes(capnp_rpc::new_client(iter));
            Ok(())
        })
        .await
    }

    async fn watermarks(
        self: Rc<Self>,
        _: wire::sync::WatermarksParams,
        mut results: wire::sync::WatermarksResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "watermarks", async {
            let peer = self.peer.clone();
            let wm = self.store.call(move |s| s.watermarks(&peer)).await?;
            let mut r = results.get();
            r.set_current_rev(wm.current_rev);
            cursor_to(r.reborrow().init_push_cursor(), &wm.push_cursor);
            cursor_to(r.init_fetch_cursor(), &wm.fetch_cursor);
            Ok(())
        })
        .await
    }

    async fn read_entry(
        self: Rc<Self>,
        params: wire::sync::ReadEntryParams,
        mut results: wire::sync::ReadEntryResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "readEntry", async {
            let path = path_from(params.get()?.get_path())?;
            let entry = self.store.call(move |s| s.read_entry(&path)).await?;
            maybe_entry_to(results.get().init_entry(), entry.as_ref());
            Ok(())
        })
        .await
    }

    async fn has_objects(
        self: Rc<Self>,
        params: wire::sync::HasObjectsParams,
        mut results: wire::sync::HasObjectsResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "hasObjects", async {
            let hashes = hashes_from(params.get()?.get_hashes()?, MAX_HASHES_PER_CALL)?;
            let held = self.store.call(move |s| s.has_objects(&hashes)).await?;
            hashes_to(results.get().init_held(held.len() as u32), &held);
            Ok(())
        })
        .await
    }

    async fn fetch_objects(
        self: Rc<Self>,
        params: wire::sync::FetchObjectsParams,
        _: wire::sync::FetchObjectsResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "fetchObjects", async {
            let p = params.get()?;
            let hashes: Arc<[Hash]> = hashes_from(p.get_hashes()?, MAX_HASHES_PER_CALL)?.into();
            let sink = p.get_sink()?;
            let mut next = 0;
            let mut window = StreamWindow::new();
            while next < hashes.len() {
                let (start, hs) = (next, hashes.clone());
                // One store call reads about one write's worth of objects, so
                // the store thread is not held for a whole 16k-hash request.
                let (objects, end) = self
                    .store
                    .call(move |s| {
                        let (mut out, mut bytes, mut i) = (Vec::new(), 0, start);
                        while i < hs.len() && bytes < OBJECT_WRITE_BYTES {
                            // A few objects per read (each at most
                            // MAX_CHUNK), so a write stays well within
                            // MAX_OBJECT_WRITE_BYTES.
                            let end = (i + READ_GROUP).min(hs.len());
                            let objects = s.read_objects(&hs[i..end])?;
                            bytes += objects.iter().map(|o| o.bytes.len()).sum::<usize>();
                            out.extend(objects);
                            i = end;
                        }
                        Ok((out, i))
                    })
                    .await?;
                next = end;
                let mut req = stream::object_write_call(&sink);
                objects_to(req.get().init_objects(objects.len() as u32), &objects);
                let size = message_bytes(req.get().into_reader().total_size());
                // Resolves when the stream window has room: the caller's
                // pace bounds what is in flight.
                window.send(req, size).await?;
            }
            window.finish().await?;
            // Ordered after the writes on the same capability: its answer
            // means every write was processed.
            sink.done_request().send().promise.await?;
            Ok(())
        })
        .await
    }

    async fn push_objects(
        self: Rc<Self>,
        _: wire::sync::PushObjectsParams,
        mut results: wire::sync::PushObjectsResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "pushObjects", async {
            let sink = UploadSink {
                store: self.store.clone(),
                conn: self.conn.clone(),
                failed: RefCell::new(None),
            };
            results.get().set_sink(capnp_rpc::new_client(sink));
            Ok(())
        })
        .await
    }

    async fn wait_changes(
        self: Rc<Self>,
        params: wire::sync::WaitChangesParams,
        mut results: wire::sync::WaitChangesResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "waitChanges", async {
            let p = params.get()?;
            let after = p.get_after();
            let wait =
                std::time::Duration::from_millis(p.get_timeout_ms().into()).min(MAX_WAIT_CHANGES);
            // The rev the store thread publishes after every call: waiting
            // on it queues nothing on the store, so the long poll never
            // holds up other calls.
            let mut rev = self.store.rev();
            // Timing out, or the store thread stopping (shutdown), answers
            // with the rev as it stands.
            let _ = tokio::time::timeout(wait, rev.wait_for(|r| *r > after)).await;
            let current = *rev.borrow();
            results.get().set_current_rev(current);
            Ok(())
        })
        .await
    }
}

struct IterState {
    /// The last entry handed out (or the window's start).
    after: ChangeCursor,
    drained: bool,
}

/// An open change window. The mutex serialises pipelined `next` calls so
/// each continues where the previous one stopped.
struct ChangeIter<S> {
    store: StoreHandle<S>,
    conn: Rc<Conn>,
    peer: Arc<str>,
    through: ChangeCursor,
    ignore: Arc<IgnoreRules>,
    state: tokio::sync::Mutex<IterState>,
}

impl<S: Store + Send + 'static> wire::change_iterator::Server for ChangeIter<S> {
    async fn next(
        self: Rc<Self>,
        params: wire::change_iterator::NextParams,
        mut results: wire::change_iterator::NextResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "ChangeIterator.next", async {
            let max = params.get()?.get_max() as usize;
            // The schema promises ELIMIT "entries per next" outside
            // 1..=4096, on both sides of the range.
            if max == 0 {
                return Err(WireError::new(
                    ErrorCode::Limit,
                    format!("entries per next is 1..={MAX_CHANGES_PER_NEXT}, got 0"),
                )
                .with_subject("entries per next"));
            }
            WireError::check_limit("entries per next", MAX_CHANGES_PER_NEXT, max)?;
            let mut state = self.state.lock().await;
            if state.drained {
                results.get().init_entries(0);
                return Ok(());
            }
            let (after, through) = (state.after.clone(), self.through.clone());
            let (ignore, peer) = (self.ignore.clone(), self.peer.clone());
            let batch = self
                .store
                .call(move |s| {
                    s.changes(ChangesQuery {
                        after: &after,
                        through: &through,
                        ignore: &ignore,
                        exclude_applied_from: Some(&peer),
                        limit: max,
                    })
                })
                .await?;
            state.drained = batch.len() < max;
            if let Some(e) = batch.last() {
                state.after = ChangeCursor::within(e.rev, e.path.clone());
            }
            entries_to(results.get().init_entries(batch.len() as u32), &batch);
            Ok(())
        })
        .await
    }
}

/// The server side of `pushObjects`: each write is verified and staged by
/// the store before it is acknowledged. Capnp-rpc delivers a streaming
/// capability's calls one at a time, so writes are staged in order.
struct UploadSink<S> {
    store: StoreHandle<S>,
    conn: Rc<Conn>,
    /// The first failure; every later write and `done` repeat it.
    failed: RefCell<Option<WireError>>,
}

impl<S: Store + Send + 'static> UploadSink<S> {
    async fn write_inner(&self, params: wire::object_sink::WriteParams) -> Result<(), WireError> {
        if let Some(e) = self.failed.borrow().clone() {
            return Err(e);
        }
        let objects = objects_from(params.get()?.get_objects()?)?;
        // Verified here, on the network thread, so the store thread (the
        // single writer, the bottleneck of a push) only keeps the bytes. A
        // write with a bad object stages nothing.
        for o in &objects {
            o.check()?;
        }
        self.store
            .call(move |s| s.stage_checked_objects(objects))
            .await
    }
}

impl<S: Store + Send + 'static> wire::object_sink::Server for UploadSink<S> {
    async fn write(
        self: Rc<Self>,
        params: wire::object_sink::WriteParams,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "ObjectSink.write", async {
            let result = self.write_inner(params).await;
            if let Err(e) = &result {
                self.failed.borrow_mut().get_or_insert_with(|| e.clone());
            }
            result
        })
        .await
    }

    async fn done(
        self: Rc<Self>,
        _: wire::object_sink::DoneParams,
        _: wire::object_sink::DoneResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "ObjectSink.done", async {
            match self.failed.borrow().clone() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })
        .await
    }
}
