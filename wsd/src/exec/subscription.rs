//! A reader of one exec's events: first a replay from the log (in pages),
//! then, for a live exec, the live channel. The hand-over is gap-free
//! because attaching reads `delivered_through` and registers the channel
//! under the same lock the runner holds when it delivers: every event up to
//! that seq is committed (so replayable), every later one arrives on the
//! channel. Events already seen are skipped by seq, so each is yielded
//! exactly once and in order.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::log::{ExecLogReader, MetaRow};
use super::runner::{EndReason, LiveExec};
use super::{After, ExecError, ExecEvent, MAX_SUBSCRIBERS_PER_EXEC, SUBSCRIBER_WINDOW};

/// A stream of one exec's events, in `seq` order, each exactly once. Ends
/// (`None`) after the exit event, or after an error. Dropping it detaches;
/// the command keeps running and its output is still logged.
pub struct Subscription {
    id: String,
    reader: Arc<ExecLogReader>,
    /// Generation of the exec being read; a replay that finds another one
    /// under the id (disposed and reused) ends with `ENOENT`.
    generation: u64,
    /// Highest seq yielded (or the resume point).
    after: u64,
    /// Replay from the log while `after < replay_until`.
    replay_until: u64,
    /// The current replay page.
    page: VecDeque<ExecEvent>,
    live: Option<(mpsc::Receiver<ExecEvent>, Arc<LiveExec>)>,
    done: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("after", &self.after)
            .field("replay_until", &self.replay_until)
            .field("live", &self.live.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl Subscription {
    /// The subscriber created with a new exec, before its runner starts.
    pub(crate) fn first(reader: Arc<ExecLogReader>, live: Arc<LiveExec>) -> Subscription {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_WINDOW);
        live.state
            .lock()
            .expect("live state poisoned")
            .subscribers
            .push(tx);
        Subscription {
            id: live.id.clone(),
            reader,
            generation: 0,
            after: 0,
            replay_until: 0,
            page: VecDeque::new(),
            live: Some((rx, live)),
            done: false,
        }
    }

    pub(crate) async fn attach_live(
        reader: Arc<ExecLogReader>,
        live: Arc<LiveExec>,
        after: After,
    ) -> Result<Subscription, ExecError> {
        let id = live.id.clone();
        if live.disposing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ExecError::NotFound { id });
        }
        let (rx, delivered) = {
            let mut st = live.state.lock().expect("live state poisoned");
            match &st.end {
                Some(EndReason::Disposed) => return Err(ExecError::NotFound { id }),
                Some(EndReason::Failed(reason)) => {
                    return Err(ExecError::RunnerStopped {
                        id,
                        reason: reason.clone(),
                    });
                }
                // The exit is delivered, so committed: replay covers it.
                Some(EndReason::Exited) => (None, st.delivered_through),
                None => {
                    st.subscribers.retain(|s| !s.is_closed());
                    ExecError::check_limit(
                        "live subscribers per exec",
                        MAX_SUBSCRIBERS_PER_EXEC,
                        st.subscribers.len() + 1,
                    )?;
                    let (tx, rx) = mpsc::channel(SUBSCRIBER_WINDOW);
                    st.subscribers.push(tx);
                    (Some(rx), st.delivered_through)
                }
            }
        };
        let start = match after {
            After::All => 0,
            After::Seq(n) => n,
            After::Tail => delivered,
        };
        let mut sub = Subscription {
            id,
            reader,
            generation: live.generation.get().copied().unwrap_or_default(),
            after: start,
            replay_until: delivered,
            page: VecDeque::new(),
            live: rx.map(|rx| (rx, live)),
            done: false,
        };
        // Read the first page now so a resume point below the window fails
        // the call itself. On failure the channel is dropped with `sub`,
        // which frees its slot (unlike the reference, bug 7.2-18).
        if sub.after < sub.replay_until {
            sub.fill().await?;
        }
        Ok(sub)
    }

    pub(crate) async fn attach_finished(
        reader: Arc<ExecLogReader>,
        id: &str,
        meta: MetaRow,
        after: After,
    ) -> Result<Subscription, ExecError> {
        let start = match after {
            After::All => 0,
            After::Seq(n) => n,
            After::Tail => meta.last_seq,
        };
        let mut sub = Subscription {
            id: id.to_owned(),
            reader,
            generation: meta.generation,
            after: start,
            replay_until: meta.last_seq,
            page: VecDeque::new(),
            live: None,
            done: false,
        };
        if sub.after < sub.replay_until {
            sub.fill().await?;
        }
        Ok(sub)
    }

    /// The exec's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The next event; `None` after the exit event (or after an error, or at
    /// once for `After::Tail` on a finished exec). Errors: `ELOG_TRUNCATED`
    /// if eviction overtook a replay, `ENOENT` if the exec was disposed,
    /// `EIO` if its runner stopped without an exit. Cancellation-safe.
    pub async fn next(&mut self) -> Option<Result<ExecEvent, ExecError>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(event) = self.page.pop_front() {
                return Some(Ok(self.hand_out(event)));
            }
            if self.after < self.replay_until {
                if let Err(e) = self.fill().await {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            }
            let Some((rx, live)) = &mut self.live else {
                self.done = true;
                return None;
            };
            match rx.recv().await {
                Some(event) if event.seq <= self.after => continue,
                Some(event) if event.seq == self.after + 1 => {
                    return Some(Ok(self.hand_out(event)));
                }
                Some(event) => {
                    self.done = true;
                    return Some(Err(ExecError::Storage(format!(
                        "exec {:?}: live stream jumped from seq {} to {}",
                        self.id, self.after, event.seq
                    ))));
                }
                None => {
                    self.done = true;
                    let reason = live.state.lock().expect("live state poisoned").end.clone();
                    let id = self.id.clone();
                    return Some(Err(match reason {
                        Some(EndReason::Disposed) => ExecError::Disposed { id },
                        Some(EndReason::Failed(reason)) => ExecError::RunnerStopped { id, reason },
                        Some(EndReason::Exited) | None => ExecError::RunnerStopped {
                            id,
                            reason: "the runner stopped".into(),
                        },
                    }));
                }
            }
        }
    }

    fn hand_out(&mut self, event: ExecEvent) -> ExecEvent {
        self.after = event.seq;
        if event.is_exit() {
            self.done = true;
        }
        event
    }

    /// Reads the next replay page (events `after < seq <= replay_until`).
    async fn fill(&mut self) -> Result<(), ExecError> {
        let reader = self.reader.clone();
        let (id, generation, after, until) = (
            self.id.clone(),
            self.generation,
            self.after,
            self.replay_until,
        );
        let page = tokio::task::spawn_blocking(move || reader.page(&id, generation, after, until))
            .await
            .map_err(|e| ExecError::Storage(format!("log read task failed: {e}")))??;
        if page.is_empty() {
            return Err(ExecError::Storage(format!(
                "exec {:?}: log ends at seq {after}, expected events up to {until}",
                self.id
            )));
        }
        self.page.extend(page);
        Ok(())
    }
}
