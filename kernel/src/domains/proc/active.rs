//! What of a process lives only in memory: its active run, how to abort
//! it, the approvals it waits for, its last known queue length, and which
//! socket asked for each run (its run route). A restart loses it on
//! purpose; the rows say the rest (see `calls::run::recover`),
//! and a run without a route is told to every socket of its owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::domains::adapter::SurfaceRoute;

/// Where a run's signals go (reference §6.3, `run_routes`).
#[derive(Debug, Clone, PartialEq)]
pub enum RunRoute {
    /// The user connection whose `proc.send` started it.
    Connection(String),
    /// The chat surface whose message started it: the answer and approval
    /// requests are posted there through `adapter.send`.
    Surface(SurfaceRoute),
}

/// The active run of one process.
#[derive(Debug)]
pub struct Active {
    pub run_id: String,
    /// The conversation the run answers in.
    pub conversation_id: String,
    pub cancel: CancellationToken,
    /// Waiting approvals of this run by request id.
    pub hil: HashMap<String, oneshot::Sender<bool>>,
    /// Messages queued behind this run, as of the last signal.
    pub queued: i64,
}

/// Active runs by pid. A run is started and ended only under this lock,
/// so `proc.send` either sees the run (and queues) or starts one.
#[derive(Debug, Default)]
pub struct Procs {
    active: Mutex<HashMap<String, Active>>,
    /// Run id → where its signals go. Lives from the start of the run to
    /// its `proc.run.finished`.
    routes: Mutex<HashMap<String, RunRoute>>,
    /// Pid → the lock under which its queue is read and written together
    /// with its active run (see [`Procs::queue_lock`]).
    queues: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    http: reqwest::Client,
}

/// Held while a process's queue and active run are decided together.
#[derive(Debug)]
pub struct QueueGuard {
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Procs {
    /// Serialises `proc.send`'s "start or queue" with the promotion of a
    /// queued message. Without it a message queued while a promotion
    /// held its placeholder run (and found the queue still empty) stayed
    /// queued with nobody left to start it, and its sender waited for
    /// the placeholder's run id, which never finishes.
    pub async fn queue_lock(&self, pid: &str) -> QueueGuard {
        let lock = {
            let mut all = self.queues.lock().unwrap();
            // Locks nobody holds or waits for are dropped as we go.
            all.retain(|_, l| Arc::strong_count(l) > 1);
            all.entry(pid.to_owned()).or_default().clone()
        };
        QueueGuard {
            _guard: lock.lock_owned().await,
        }
    }

    /// Makes a new run of `pid` active, unless one already is: its run id
    /// and the token that aborts it.
    pub fn reserve(&self, pid: &str, conversation_id: &str) -> Option<(String, CancellationToken)> {
        let mut live = self.active.lock().unwrap();
        if live.contains_key(pid) {
            return None;
        }
        let run_id = format!("run_{}", uuid::Uuid::new_v4());
        let cancel = CancellationToken::new();
        live.insert(
            pid.to_owned(),
            Active {
                run_id: run_id.clone(),
                conversation_id: conversation_id.to_owned(),
                cancel: cancel.clone(),
                hil: Default::default(),
                queued: 0,
            },
        );
        Some((run_id, cancel))
    }

    /// Sets the conversation of run `run_id` of `pid` (a promoted run
    /// learns it from the queued message it takes).
    pub fn set_conversation(&self, pid: &str, run_id: &str, conversation_id: &str) {
        let mut live = self.active.lock().unwrap();
        if let Some(a) = live.get_mut(pid).filter(|a| a.run_id == run_id) {
            a.conversation_id = conversation_id.to_owned();
        }
    }

    /// Ends run `run_id` of `pid`; a newer run of it is left alone.
    pub fn release(&self, pid: &str, run_id: &str) {
        let mut live = self.active.lock().unwrap();
        if live.get(pid).is_some_and(|a| a.run_id == run_id) {
            live.remove(pid);
        }
    }

    /// Parks `answer` for approval `request_id` of run `run_id`; false
    /// when that run is no longer the active one.
    pub fn await_hil(
        &self,
        pid: &str,
        run_id: &str,
        request_id: String,
        answer: oneshot::Sender<bool>,
    ) -> bool {
        let mut live = self.active.lock().unwrap();
        match live.get_mut(pid) {
            Some(a) if a.run_id == run_id => {
                a.hil.insert(request_id, answer);
                true
            }
            _ => false,
        }
    }

    /// Records the queue length of `pid`'s active run (signals carry it).
    pub fn set_queued(&self, pid: &str, n: i64) {
        if let Some(a) = self.active.lock().unwrap().get_mut(pid) {
            a.queued = n;
        }
    }

    /// The queue length of `pid` as of its last signal; 0 when idle.
    pub fn queued(&self, pid: &str) -> i64 {
        self.active.lock().unwrap().get(pid).map_or(0, |a| a.queued)
    }

    /// Sends the signals of run `run_id` along `route` only.
    pub fn route(&self, run_id: &str, route: RunRoute) {
        self.routes.lock().unwrap().insert(run_id.to_owned(), route);
    }

    /// Where run `run_id`'s signals go, if it has a route.
    pub fn route_of(&self, run_id: &str) -> Option<RunRoute> {
        self.routes.lock().unwrap().get(run_id).cloned()
    }

    /// Forgets the route of a finished run.
    pub fn end_route(&self, run_id: &str) {
        self.routes.lock().unwrap().remove(run_id);
    }

    /// The HTTP client model calls share (one connection pool).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The conversation of `pid`'s active run.
    pub fn active_conversation(&self, pid: &str) -> Option<String> {
        self.active
            .lock()
            .unwrap()
            .get(pid)
            .map(|a| a.conversation_id.clone())
    }

    pub fn active_run(&self, pid: &str) -> Option<String> {
        self.active
            .lock()
            .unwrap()
            .get(pid)
            .map(|a| a.run_id.clone())
    }

    /// Cancels the active run of `pid`; its task ends it.
    pub fn abort(&self, pid: &str) -> Option<String> {
        let live = self.active.lock().unwrap();
        live.get(pid).map(|a| {
            a.cancel.cancel();
            a.run_id.clone()
        })
    }

    /// Hands a decision to the waiting run; false when nothing waits.
    pub fn answer_hil(&self, pid: &str, request_id: &str, approve: bool) -> bool {
        let mut live = self.active.lock().unwrap();
        match live.get_mut(pid).and_then(|a| a.hil.remove(request_id)) {
            Some(tx) => tx.send(approve).is_ok(),
            None => false,
        }
    }
}
