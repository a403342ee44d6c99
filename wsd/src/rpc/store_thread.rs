//! The single writer: the store lives on its own OS thread and the event
//! loop sends it closures over a bounded channel, each answered on a
//! oneshot. Calls therefore run one at a time in arrival order (sync
//! rule 12), and a slow SQLite transaction never blocks the `LocalSet`.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};
use wsd_sync::{ErrorCode, Store, SyncError};

use super::WireError;
use super::limits::STORE_QUEUE_CAPACITY;

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

/// The event-loop side of the store thread. Cloning shares the queue.
pub(crate) struct StoreHandle<S> {
    /// `None` once shutdown began: new calls fail with `ESHUTDOWN` while
    /// the jobs already queued still run. Shared with every [`StoreCaller`]
    /// so that closing it closes the queue for them too.
    tx: Arc<Mutex<Option<mpsc::Sender<Job<S>>>>>,
    /// The store's current rev, republished by the store thread after every
    /// call: long polls (`waitChanges`) wait on it without queueing a job.
    rev: watch::Receiver<u64>,
}

/// A `Send` handle to the store thread for code that runs off the event
/// loop (the exec runner's settle hook). Its calls queue behind the RPC
/// calls already queued, like any other call.
pub struct StoreCaller<S> {
    tx: Arc<Mutex<Option<mpsc::Sender<Job<S>>>>>,
}

impl<S> Clone for StoreCaller<S> {
    fn clone(&self) -> Self {
        StoreCaller {
            tx: self.tx.clone(),
        }
    }
}

impl<S> std::fmt::Debug for StoreCaller<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCaller").finish_non_exhaustive()
    }
}

impl<S: 'static> StoreCaller<S> {
    /// Runs `f` on the store thread and waits for its answer, blocking the
    /// calling thread. Must not be called from an async task (use a
    /// blocking thread); fails with `ESHUTDOWN` once the server stopped.
    pub fn call_blocking<T, F>(&self, f: F) -> Result<T, WireError>
    where
        T: Send + 'static,
        F: FnOnce(&mut S) -> Result<T, SyncError> + Send + 'static,
    {
        let tx = self.tx.lock().expect("store queue lock").clone();
        let tx = tx.ok_or_else(shutting_down)?;
        let (reply_tx, reply_rx) = oneshot::channel();
        tx.blocking_send(Box::new(move |store: &mut S| {
            let _ = reply_tx.send(f(store));
        }))
        .map_err(|_| shutting_down())?;
        drop(tx);
        match reply_rx.blocking_recv() {
            Ok(result) => result.map_err(WireError::from),
            Err(_) => Err(WireError::new(
                ErrorCode::Io,
                "the store thread has stopped",
            )),
        }
    }
}

impl<S> Clone for StoreHandle<S> {
    fn clone(&self) -> Self {
        StoreHandle {
            tx: self.tx.clone(),
            rev: self.rev.clone(),
        }
    }
}

/// Joins the store thread; resolves to the store once every queued job ran.
pub(crate) struct StoreThread<S> {
    done: oneshot::Receiver<S>,
    /// Its sender lives as long as the thread's loop: it resolves when the
    /// thread ends, which before [`StoreHandle::close`] means it died.
    ended: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl<S: Store + Send + 'static> StoreHandle<S> {
    /// Moves `store` onto a new thread named `wsd-store`.
    pub(crate) fn spawn(mut store: S) -> std::io::Result<(StoreHandle<S>, StoreThread<S>)> {
        let (tx, mut rx) = mpsc::channel::<Job<S>>(STORE_QUEUE_CAPACITY);
        let (done_tx, done) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel::<()>();
        let (rev_tx, rev) = watch::channel(store.current_rev().unwrap_or(0));
        let thread = std::thread::Builder::new()
            .name("wsd-store".into())
            .spawn(move || {
                // Dropped when this closure ends, by return or by a panic
                // unwinding through a job.
                let _ended = ended_tx;
                while let Some(job) = rx.blocking_recv() {
                    job(&mut store);
                    // Every rev bump happens inside some job (a push, a
                    // settle): one indexed read after each keeps `rev` exact.
                    if let Ok(now) = store.current_rev() {
                        rev_tx.send_if_modified(|r| std::mem::replace(r, now) != now);
                    }
                }
                tracing::debug!("store queue closed and drained; store thread exits");
                let _ = done_tx.send(store);
            })?;
        Ok((
            StoreHandle {
                tx: Arc::new(Mutex::new(Some(tx))),
                rev,
            },
            StoreThread {
                done,
                ended,
                thread,
            },
        ))
    }

    /// Runs `f` on the store thread after every call queued before it.
    /// Waits (without blocking the event loop) while the queue is full.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, WireError>
    where
        T: Send + 'static,
        F: FnOnce(&mut S) -> Result<T, SyncError> + Send + 'static,
    {
        let tx = self.tx.lock().expect("store queue lock").clone();
        let tx = tx.ok_or_else(shutting_down)?;
        let (reply_tx, reply_rx) = oneshot::channel();
        tx.send(Box::new(move |store: &mut S| {
            // The caller may have gone (its connection dropped): the work is
            // still done, only the answer is discarded.
            let _ = reply_tx.send(f(store));
        }))
        .await
        .map_err(|_| shutting_down())?;
        drop(tx);
        match reply_rx.await {
            Ok(result) => result.map_err(WireError::from),
            // The job was dropped unrun: the thread died (a panic in the store).
            Err(_) => Err(WireError::new(
                ErrorCode::Io,
                "the store thread has stopped",
            )),
        }
    }

    /// The store's current rev as of its last call; changes when a call
    /// moved it.
    pub(crate) fn rev(&self) -> watch::Receiver<u64> {
        self.rev.clone()
    }

    /// Stops taking new calls. Jobs already queued still run.
    pub(crate) fn close(&self) {
        self.tx.lock().expect("store queue lock").take();
    }

    pub(crate) fn caller(&self) -> StoreCaller<S> {
        StoreCaller {
            tx: self.tx.clone(),
        }
    }
}

impl<S> StoreThread<S> {
    /// Resolves when the thread has ended. Before the handles are closed
    /// that only happens when a store call panicked: every later call
    /// would fail with `EIO`, so the server stops instead of serving on
    /// without a store.
    pub(crate) async fn ended(&mut self) {
        let _ = (&mut self.ended).await;
    }

    /// Waits until every handle is closed or dropped and the queue drained;
    /// returns the store, or `None` if the thread died.
    pub(crate) async fn join(self) -> Option<S> {
        let store = self.done.await.ok();
        if store.is_none() {
            tracing::error!("the store thread died (a store call panicked)");
        }
        // The thread has sent its result or unwound; joining is immediate.
        let _ = tokio::task::spawn_blocking(move || self.thread.join()).await;
        store
    }
}

fn shutting_down() -> WireError {
    WireError::new(
        ErrorCode::Shutdown,
        "the daemon is shutting down; reconnect after it restarts",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use wsd_sync::testkit::MemStore;

    #[test]
    fn after_close_new_calls_are_eshutdown_and_queued_calls_still_run() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, async {
            let store = MemStore::new();
            store.set_apply_delay(std::time::Duration::from_millis(100));
            let (handle, thread) = StoreHandle::spawn(store).unwrap();
            let queued = {
                let handle = handle.clone();
                tokio::task::spawn_local(async move {
                    handle
                        .call(|s| {
                            let e = wsd_sync::ChangeEntry {
                                rev: 1,
                                path: wsd_sync::SyncPath::new("d").unwrap(),
                                state: wsd_sync::EntryState::Dir {
                                    mode: 0o755,
                                    mtime: 0,
                                },
                            };
                            s.apply(wsd_sync::ApplyBatch {
                                remote: "p",
                                sender: None,
                                entries: &[e],
                                baseline: wsd_sync::Baseline::Off,
                                ignore: &wsd_sync::IgnoreRules::none(),
                            })
                        })
                        .await
                })
            };
            tokio::task::yield_now().await;
            handle.close();
            let err = handle.call(|s| s.current_rev()).await.unwrap_err();
            assert_eq!(err.code, ErrorCode::Shutdown);
            assert_eq!(queued.await.unwrap().unwrap().rev, 1, "the queued call ran");
            let mut store = thread
                .join()
                .await
                .expect("the thread hands the store back");
            assert_eq!(store.current_rev().unwrap(), 1);
        });
    }
}
