//! What of a process lives only in memory: its active run, how to abort
//! it and the approvals it waits for. A restart loses it on purpose; the
//! rows say the rest (see `run::recover`).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The active run of one process.
#[derive(Debug)]
pub struct Active {
    pub run_id: String,
    pub cancel: CancellationToken,
    /// Waiting approvals of this run by request id.
    pub hil: HashMap<String, oneshot::Sender<bool>>,
}

/// Active runs by pid. A run is started and ended only under this lock,
/// so `proc.send` either sees the run (and queues) or starts one.
#[derive(Debug, Default)]
pub struct Procs {
    active: Mutex<HashMap<String, Active>>,
    http: reqwest::Client,
}

impl Procs {
    /// Makes a new run of `pid` active, unless one already is: its run id
    /// and the token that aborts it.
    pub fn reserve(&self, pid: &str) -> Option<(String, CancellationToken)> {
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
                cancel: cancel.clone(),
                hil: Default::default(),
            },
        );
        Some((run_id, cancel))
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

    /// The HTTP client model calls share (one connection pool).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
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
