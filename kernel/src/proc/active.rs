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
    pub(super) active: Mutex<HashMap<String, Active>>,
    pub(super) http: reqwest::Client,
}

impl Procs {
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
