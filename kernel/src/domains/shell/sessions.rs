//! A command running in a workspace, as the kernel keeps it between
//! `shell.exec` calls: its output (tail capped at [`MAX_OUTPUT_CHARS`]),
//! merged and per stream (`stdout`, `stderr`, so a client can print each
//! where it belongs), what no `running` answer has returned yet, its outcome, and a wake-up
//! for callers waiting on it. The syscall that starts and drives it is
//! [`super::calls`].

use gsv_protocol::shell::{ExecResult, ExecStatus, FileChange};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use wsd_client::WsdHandle;
use wsd_sync::ErrorCode;

use gsv_node::MAX_OUTPUT_CHARS;
use gsv_node::output::{CappedText, Utf8Stream};

/// How a command ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Completed {
        exit_code: i32,
        changes: Vec<FileChange>,
    },
    Failed {
        error: String,
        exit_code: Option<i32>,
        /// The wsd's error code when a wsd call failed the command.
        code: Option<ErrorCode>,
    },
}

#[derive(Debug)]
struct SessionState {
    /// Everything (its last [`MAX_OUTPUT_CHARS`]), returned with the final
    /// result.
    output: CappedText,
    /// What no `running` answer has returned yet.
    pending: CappedText,
    stdout: Stream,
    stderr: Stream,
    outcome: Option<Outcome>,
}

/// One of the command's two streams: what no answer has returned yet
/// (capped). It decodes its own bytes, so a character split across two
/// reads of one stream is not mangled by the other stream's bytes in
/// between.
#[derive(Debug)]
struct Stream {
    pending: CappedText,
    utf8: Utf8Stream,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            pending: CappedText::new(MAX_OUTPUT_CHARS),
            utf8: Utf8Stream::default(),
        }
    }
}

impl SessionState {
    fn push(&mut self, text: &str, stderr: bool) {
        self.output.push(text);
        self.pending.push(text);
        let stream = if stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        stream.pending.push(text);
    }
}

impl Default for SessionState {
    fn default() -> Self {
        SessionState {
            output: CappedText::new(MAX_OUTPUT_CHARS),
            pending: CappedText::new(MAX_OUTPUT_CHARS),
            stdout: Stream::default(),
            stderr: Stream::default(),
            outcome: None,
        }
    }
}

/// One running (or just finished) command.
#[derive(Debug)]
pub struct ShellSession {
    pub id: String,
    /// The wsd connection the command runs on (for stdin writes).
    pub handle: Option<WsdHandle>,
    pub owner_uid: i64,
    pub workspace_id: String,
    state: Mutex<SessionState>,
    changed: Notify,
    /// Its final result went to a caller.
    answered: AtomicBool,
    /// Its final row is written (or failed to be: nothing will retry).
    row_final: AtomicBool,
    /// A `running` row was asked for (the first `running` answer).
    running_row: AtomicBool,
}

impl ShellSession {
    /// A session with no output yet, for the command `id` just started.
    pub fn new(
        id: String,
        handle: Option<WsdHandle>,
        owner_uid: i64,
        workspace_id: String,
    ) -> Self {
        ShellSession {
            id,
            handle,
            owner_uid,
            workspace_id,
            state: Mutex::default(),
            changed: Notify::new(),
            answered: AtomicBool::new(false),
            row_final: AtomicBool::new(false),
            running_row: AtomicBool::new(false),
        }
    }

    /// Records that the final result was answered; true when the final
    /// row is written too (the session may be forgotten).
    pub fn mark_answered(&self) -> bool {
        self.answered.store(true, Ordering::SeqCst);
        self.row_final.load(Ordering::SeqCst)
    }

    /// Records that the final row is written; true when the final result
    /// was answered too (the session may be forgotten). With
    /// [`ShellSession::mark_answered`], whichever comes second sees both.
    pub fn mark_row_final(&self) -> bool {
        self.row_final.store(true, Ordering::SeqCst);
        self.answered.load(Ordering::SeqCst)
    }

    /// Whether its final result went to a caller.
    pub fn is_answered(&self) -> bool {
        self.answered.load(Ordering::SeqCst)
    }

    /// True the first time: the `running` row is to be written.
    pub fn needs_running_row(&self) -> bool {
        !self.running_row.swap(true, Ordering::SeqCst)
    }

    /// The `running` row asked for could not be written: the next
    /// `running` answer tries again.
    pub fn running_row_failed(&self) {
        self.running_row.store(false, Ordering::SeqCst);
    }

    /// For a session whose final result was answered: its status as its
    /// row records it and its error.
    pub fn answered_end(&self) -> Option<(&'static str, Option<String>)> {
        if !self.is_answered() {
            return None;
        }
        match &self.state.lock().unwrap().outcome {
            Some(Outcome::Completed { .. }) => Some(("completed", None)),
            Some(Outcome::Failed { error, .. }) => Some(("failed", Some(error.clone()))),
            None => None,
        }
    }

    /// Whether the command has ended (an outcome is recorded).
    pub fn is_over(&self) -> bool {
        self.state.lock().unwrap().outcome.is_some()
    }

    /// Output of the command, from its stderr when `stderr`.
    pub fn append(&self, bytes: &[u8], stderr: bool) {
        let mut st = self.state.lock().unwrap();
        let text = if stderr {
            st.stderr.utf8.decode(bytes)
        } else {
            st.stdout.utf8.decode(bytes)
        };
        st.push(&text, stderr);
        drop(st);
        self.changed.notify_waiters();
    }

    pub fn finish(&self, outcome: Outcome) {
        let mut st = self.state.lock().unwrap();
        let rest = st.stdout.utf8.finish();
        st.push(&rest, false);
        let rest = st.stderr.utf8.finish();
        st.push(&rest, true);
        st.outcome = Some(outcome);
        drop(st);
        self.changed.notify_waiters();
    }

    /// Waits until the command ends or `budget` passes, then answers;
    /// with `until_output`, also as soon as there is output no answer has
    /// returned yet (a streaming poller's long poll). Returns the result
    /// and whether the session is over.
    pub async fn wait(&self, budget: Duration, until_output: bool) -> (ExecResult, bool) {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let notified = self.changed.notified();
            {
                let mut st = self.state.lock().unwrap();
                if let Some(outcome) = st.outcome.clone() {
                    let (output, truncated) = st.output.take_flagged();
                    let mut v = self.final_result(outcome, output, truncated);
                    // Per stream, only what no `running` answer returned:
                    // a poller prints the fields as they come.
                    v.stdout = Some(st.stdout.pending.take());
                    v.stderr = Some(st.stderr.pending.take());
                    return (v, true);
                }
                let fresh = until_output
                    && !(st.stdout.pending.text().is_empty()
                        && st.stderr.pending.text().is_empty());
                if fresh || tokio::time::Instant::now() >= deadline {
                    let (output, truncated) = st.pending.take_flagged();
                    let v = ExecResult {
                        status: Some(ExecStatus::Running),
                        session_id: Some(self.id.clone()),
                        output: Some(output),
                        stdout: Some(st.stdout.pending.take()),
                        stderr: Some(st.stderr.pending.take()),
                        truncated,
                        ..Default::default()
                    };
                    return (v, false);
                }
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    /// The command's state without taking any output: `running`, or how
    /// it ended (the answer to a control call).
    pub fn status(&self) -> ExecStatus {
        match &self.state.lock().unwrap().outcome {
            None => ExecStatus::Running,
            Some(Outcome::Completed { .. }) => ExecStatus::Completed,
            Some(Outcome::Failed { .. }) => ExecStatus::Failed,
        }
    }

    fn final_result(&self, outcome: Outcome, output: String, truncated: bool) -> ExecResult {
        let base = ExecResult {
            output: Some(output),
            session_id: Some(self.id.clone()),
            truncated,
            ..Default::default()
        };
        match outcome {
            Outcome::Completed { exit_code, changes } => ExecResult {
                status: Some(ExecStatus::Completed),
                exit_code: Some(exit_code),
                changes: Some(changes),
                ..base
            },
            Outcome::Failed {
                error,
                exit_code,
                code,
            } => ExecResult {
                status: Some(ExecStatus::Failed),
                error: Some(error),
                code: code.map(|c| c.as_str().to_owned()),
                exit_code,
                ..base
            },
        }
    }
}

/// Live shell sessions by id (their rows are in `shell_sessions`), and the
/// live sync of the workspaces that have a session open.
#[derive(Debug, Default)]
pub struct Sessions {
    live: Mutex<HashMap<String, Arc<ShellSession>>>,
    /// Followers of workspaces with an open command or terminal.
    pub sync: Arc<super::live::LiveSync>,
    /// Each workspace's last push, so a command after no change skips it.
    pub pushes: super::bracket::PushMarks,
    /// When expired rows were last pruned (unix ms).
    pruned_at: AtomicI64,
}

/// How often a session row's write also prunes the expired rows: they are
/// never read (every read checks `expires_at`), so once a minute is as
/// good as every time, and one statement fewer per command.
const PRUNE_EVERY_MS: i64 = 60_000;

impl Sessions {
    /// Whether a row written at `now` (unix ms) should prune expired rows
    /// too; true at most once per [`PRUNE_EVERY_MS`].
    pub fn prune_due(&self, now: i64) -> bool {
        let last = self.pruned_at.load(Ordering::Relaxed);
        now - last >= PRUNE_EVERY_MS
            && self
                .pruned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Whether a command still runs in workspace `id`.
    pub fn running_in(&self, id: &str) -> bool {
        self.live
            .lock()
            .unwrap()
            .values()
            .any(|s| s.workspace_id == id && !s.is_over())
    }

    pub fn insert(&self, session: Arc<ShellSession>) {
        self.live
            .lock()
            .unwrap()
            .insert(session.id.clone(), session);
    }

    pub fn get(&self, id: &str) -> Option<Arc<ShellSession>> {
        self.live.lock().unwrap().get(id).cloned()
    }

    pub fn remove(&self, id: &str) {
        self.live.lock().unwrap().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session() -> ShellSession {
        ShellSession::new("sh_t".into(), None, 1000, "ws_t".into())
    }

    #[test]
    fn a_character_split_across_events_is_joined_not_mangled() {
        let s = session();
        let bytes = "né".as_bytes();
        s.append(&bytes[..2], false);
        s.append(b"!", true);
        s.append(&bytes[2..], false);
        let st = s.state.lock().unwrap();
        assert_eq!(st.stdout.pending.text(), "né");
        assert_eq!(st.stderr.pending.text(), "!");
    }

    #[tokio::test]
    async fn waiting_answers_running_with_pending_output_then_the_final_result() {
        let s = session();
        s.append(b"first ", false);
        s.append(b"oops ", true);
        let (v, over) = s.wait(Duration::from_millis(10), false).await;
        let v = serde_json::to_value(v).unwrap();
        assert!(!over);
        assert_eq!(
            v,
            json!({"status": "running", "sessionId": "sh_t", "output": "first oops ",
                   "stdout": "first ", "stderr": "oops "})
        );
        s.append(b"second", false);
        s.finish(Outcome::Completed {
            exit_code: 0,
            changes: vec![],
        });
        let (v, over) = s.wait(Duration::from_secs(5), false).await;
        let v = serde_json::to_value(v).unwrap();
        assert!(over);
        assert_eq!(v["status"], "completed");
        assert_eq!(
            v["output"], "first oops second",
            "the final result carries all output"
        );
        // The streams carry only what the running answer did not.
        assert_eq!(v["stdout"], "second");
        assert_eq!(v["stderr"], "");
    }

    #[tokio::test]
    async fn a_streaming_wait_answers_as_soon_as_output_is_there() {
        let s = std::sync::Arc::new(session());
        let waiter = {
            let s = s.clone();
            // A budget far beyond the test's patience: only the output can
            // end this wait.
            tokio::spawn(async move { s.wait(Duration::from_secs(3600), true).await })
        };
        tokio::task::yield_now().await;
        s.append(b"line\n", false);
        let (v, over) = tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("the output ends the wait")
            .unwrap();
        assert!(!over);
        assert_eq!(v.status, Some(ExecStatus::Running));
        assert_eq!(v.stdout.as_deref(), Some("line\n"));
    }
}
