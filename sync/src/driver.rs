//! The push/pull driver (rules 7–9): moves one local [`Store`] forward
//! against a [`Remote`], in bounded batches, with checkpoints.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::limits::{BATCH_ENTRIES, BATCH_OBJECT_BYTES, MAX_HASHES_PER_CALL};
use crate::store::{ApplyBatch, ChangesQuery};
use crate::{
    Baseline, ChangeCursor, ChangeEntry, ChangeStream, ErrorCode, FetchOpened, Hash, IgnoreRules,
    Object, PendingPush, PendingUpload, PushOutcome, Remote, Store, SyncError, Watermarks,
};

/// Counters of one push or pull, also handed to the progress callback after
/// every batch, whenever the plan grows (`planned_*`), and during a pull
/// after every slice of objects fetched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Entries sent (push) or received (pull).
    pub entries: u64,
    /// Entries the receiving store changed local state for.
    pub applied: u64,
    /// Objects moved over the wire and their bytes.
    pub objects: u64,
    pub object_bytes: u64,
    /// Chunk bytes the entries referenced that the receiver already held.
    pub deduplicated_bytes: u64,
    pub batches: u64,
    /// Local writes overwritten by the other side (rule 6), pull only.
    pub overwrote_local: u64,
    /// The cursor reached (push cursor for push, fetch cursor for pull).
    pub cursor: ChangeCursor,
    /// True when the run restarted from zero (remote lost state or baseline).
    pub rebaselined: bool,
    /// The plan so far, for progress bars: entries cut into batches and the
    /// object bytes they need moved (after `hasObjects`, so deduplicated
    /// chunks are not counted). It grows batch by batch as the changes are
    /// paged in; when `plan_complete`, it is the whole run's total.
    pub planned_entries: u64,
    pub planned_bytes: u64,
    /// No more entries are expected beyond `planned_entries`.
    pub plan_complete: bool,
}

impl SyncReport {
    /// Adds one batch to the plan.
    fn plan(&mut self, entries: usize, bytes: u64, last: bool) {
        self.planned_entries += entries as u64;
        self.planned_bytes += bytes;
        self.plan_complete = last;
    }
}

/// Options shared by [`push`] and [`pull`].
#[derive(Debug)]
pub struct SyncOptions<'a> {
    /// The name under which the local store keeps this remote's watermarks.
    pub remote_name: &'a str,
    pub ignore: &'a IgnoreRules,
}

fn distinct_chunks(entries: &[ChangeEntry]) -> (Vec<Hash>, HashMap<Hash, u32>) {
    let mut order = Vec::new();
    let mut sizes = HashMap::new();
    for e in entries {
        for c in e.chunks() {
            if sizes.insert(c.hash, c.size).is_none() {
                order.push(c.hash);
            }
        }
    }
    (order, sizes)
}

/// Checks rule 9 on an echoed cursor: `Ok(true)` when the remote is behind
/// our push cursor by whole revs (it lost its state), `Ok(false)` when it
/// covers it, and an invariant error for any other shortfall.
fn remote_lost_state(applied: &ChangeCursor, pushed: &ChangeCursor) -> Result<bool, SyncError> {
    if applied >= pushed {
        return Ok(false);
    }
    if applied.complete_rev() < pushed.complete_rev() || applied.rev < pushed.rev {
        return Ok(true);
    }
    Err(SyncError::InvariantViolated {
        applied: applied.clone(),
        pushed: pushed.clone(),
    })
}

/// Compares both sides' watermarks once per connection and resets what the
/// remote forgot: our push cursor when the remote's fetch cursor is behind
/// it (a fresh container), our fetch cursor when the remote's log is shorter
/// than it. Returns the remote's watermarks.
pub async fn reconcile<S: Store, R: Remote>(
    local: &mut S,
    remote: &mut R,
    remote_name: &str,
) -> Result<Watermarks, SyncError> {
    let theirs = remote.watermarks().await?;
    let ours = local.watermarks(remote_name)?;
    if theirs.fetch_cursor < ours.push_cursor {
        tracing::warn!(
            remote = remote_name,
            remote_fetch_cursor = %theirs.fetch_cursor,
            our_push_cursor = %ours.push_cursor,
            "remote is behind what we pushed (it lost its state); re-baselining the push"
        );
        local.set_push_cursor(remote_name, &ChangeCursor::ZERO)?;
    }
    if theirs.current_rev < ours.fetch_cursor.rev {
        tracing::warn!(
            remote = remote_name,
            remote_rev = theirs.current_rev,
            our_fetch_cursor = %ours.fetch_cursor,
            "remote's log is shorter than our fetch cursor; re-baselining the pull"
        );
        local.set_fetch_cursor(remote_name, &ChangeCursor::ZERO)?;
    }
    Ok(theirs)
}

/// Pushes every local change after our push cursor for `opts.remote_name`
/// (rule 7). Batches hold at most [`BATCH_ENTRIES`] entries and about
/// [`BATCH_OBJECT_BYTES`] of missing chunk bytes (a single larger file goes
/// alone). The push cursor advances after every acknowledged batch, so an
/// interrupted push resumes after the last acknowledged batch.
pub async fn push<S: Store, R: Remote>(
    local: &mut S,
    remote: &mut R,
    opts: &SyncOptions<'_>,
    on_batch: impl FnMut(&SyncReport),
) -> Result<SyncReport, SyncError> {
    push_while_indexing(local, remote, opts, &mut Indexed, on_batch).await
}

/// What one [`Indexing::next`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IndexStep {
    /// Recorded more of the index; the local store's rev is now this.
    Grew(u64),
    /// Nothing new is ready yet (only when not asked to wait).
    NotYet,
    /// The index is complete: every change is recorded.
    Complete,
}

/// The local index of a push that is still being built (the first push of
/// a never-indexed tree): [`push_while_indexing`] sends what is recorded
/// while the rest is hashed, and asks for more as its page runs short.
#[allow(async_fn_in_trait)]
pub trait Indexing<S> {
    /// Records the next part of the index in `local`, waiting for one when
    /// `wait` (else [`IndexStep::NotYet`] if none is ready).
    async fn next(&mut self, local: &mut S, wait: bool) -> Result<IndexStep, SyncError>;

    /// True once [`Indexing::next`] has nothing more to record.
    fn is_complete(&self) -> bool;
}

/// An index already complete: a plain [`push`].
struct Indexed;

impl<S> Indexing<S> for Indexed {
    async fn next(&mut self, _: &mut S, _: bool) -> Result<IndexStep, SyncError> {
        Ok(IndexStep::Complete)
    }

    fn is_complete(&self) -> bool {
        true
    }
}

/// [`push`] of a local store whose index `indexing` is still building:
/// the change window grows as it records more (each part under a rev of
/// its own, so what is acknowledged is a prefix of whole revs and paths),
/// and the push ends once it is complete and everything is sent. An
/// interrupted run leaves the parts recorded so far and the push cursor
/// after the last acknowledged batch, as an interrupted [`push`] does.
/// A push that must re-baseline waits for the whole index first (its sweep
/// deletes what the index does not list).
pub async fn push_while_indexing<S: Store, R: Remote, I: Indexing<S>>(
    local: &mut S,
    remote: &mut R,
    opts: &SyncOptions<'_>,
    indexing: &mut I,
    mut on_batch: impl FnMut(&SyncReport),
) -> Result<SyncReport, SyncError> {
    let wm = local.watermarks(opts.remote_name)?;
    let mut cursor = wm.push_cursor.clone();
    let window = local.open_changes(&cursor)?;
    let mut through = window.through;
    let mut report = SyncReport {
        cursor: cursor.clone(),
        ..SyncReport::default()
    };
    let baseline = window.baseline;
    if baseline {
        cursor = ChangeCursor::ZERO;
        report.rebaselined = true;
        while !indexing.is_complete() {
            match indexing.next(local, true).await? {
                IndexStep::Grew(rev) => through = ChangeCursor::at(rev),
                IndexStep::NotYet => {}
                IndexStep::Complete => break,
            }
        }
    }
    let mut pager = Pager {
        page: Vec::new(),
        exhausted: false,
        after: cursor.clone(),
        through,
        baseline,
        indexing: !baseline && !indexing.is_complete(),
    };
    if pager.indexing {
        // Waits for the first part (or the end of an empty tree).
        pager.fill_indexing(local, opts, indexing).await?;
        if pager.page.is_empty() && cursor >= pager.through {
            return Ok(report);
        }
    } else if cursor >= pager.through && !baseline {
        return Ok(report);
    }
    // Pipelined so that the receiver's store (one writer, the bottleneck)
    // seldom waits for us. Per batch i:
    // - objects(i) are uploaded while the receiver applies batch i-1;
    // - once the receiver has staged them all (the upload's `done`), the
    //   probe for batch i+1 and push(i) are sent back to back on the same
    //   capability, so the probe is answered before batch i is applied
    //   and sees batch i's objects staged (no chunk is sent twice);
    // - a push is sent only after the previous one was acknowledged and
    //   after its own objects were staged (uploads go to another
    //   capability, whose calls are not ordered with the sync calls).
    pager.fill_indexing(local, opts, indexing).await?;
    let (hashes, sizes) = distinct_chunks(&pager.page);
    let held = probe(remote, &hashes).await?.await?;
    let mut current = pager.cut(&held, &sizes);
    report.plan(
        current.entries.len(),
        current.missing_bytes() as u64,
        current.last,
    );
    on_batch(&report);
    let mut uploads =
        send_objects(local, remote, &current.missing, &mut report, &mut on_batch).await?;
    let mut previous: Option<InFlight> = None;
    loop {
        report.deduplicated_bytes += current.deduplicated_bytes;
        if !current.last {
            // Local work while the uploads are on their way.
            pager.fill_indexing(local, opts, indexing).await?;
        }
        let staged = async {
            for u in uploads.drain(..) {
                u.await?;
            }
            Ok::<(), SyncError>(())
        }
        .await;
        if let Some(p) = previous.take() {
            // Recorded even if this batch's upload failed.
            let acked = conclude(local, remote, opts, &mut report, p).await?;
            acknowledge(local, opts, &mut report, &mut on_batch, acked)?;
        }
        staged?;
        let next_probe = if current.last {
            None
        } else {
            let (hashes, sizes) = distinct_chunks(&pager.page);
            Some((probe(remote, &hashes).await?, sizes))
        };
        report.entries += current.entries.len() as u64;
        let current_bytes = current.missing_bytes();
        let sender = current.sender.clone();
        // Kept for a retry (see `conclude`).
        let entries = current.entries.clone();
        let mut pending = Some(InFlight {
            pending: remote
                .push_pipelined(
                    Some(sender.clone()),
                    current.entries,
                    current.phase,
                    opts.ignore.patterns(),
                )
                .await?,
            sender,
            entries,
            phase: current.phase,
        });
        let step = async {
            let Some((probe, sizes)) = next_probe else {
                return Ok(None);
            };
            let held = probe.await?;
            let next = pager.cut(&held, &sizes);
            report.plan(next.entries.len(), next.missing_bytes() as u64, next.last);
            on_batch(&report);
            // Upload the next batch during this apply only while both stay
            // within two batch budgets: the receiver stages objects in
            // memory, and two large-file batches at once would make it
            // spill them to disk.
            if current_bytes + next.missing_bytes() > 2 * BATCH_OBJECT_BYTES
                && let Some(p) = pending.take()
            {
                let acked = conclude(local, remote, opts, &mut report, p).await?;
                acknowledge(local, opts, &mut report, &mut on_batch, acked)?;
            }
            let next_uploads =
                send_objects(local, remote, &next.missing, &mut report, &mut on_batch).await?;
            Ok(Some((next, next_uploads)))
        }
        .await;
        match step {
            Err(e) => {
                // Record this batch's acknowledgement even if what followed
                // it failed (no retry: the push is over either way).
                if let Some(p) = pending
                    && let Ok(outcome) = p.pending.await
                {
                    let acked = Acked {
                        sender: p.sender,
                        phase: p.phase,
                        outcome,
                    };
                    acknowledge(local, opts, &mut report, &mut on_batch, acked)?;
                }
                return Err(e);
            }
            Ok(None) => {
                if let Some(p) = pending {
                    let acked = conclude(local, remote, opts, &mut report, p).await?;
                    acknowledge(local, opts, &mut report, &mut on_batch, acked)?;
                }
                return Ok(report);
            }
            Ok(Some((next, next_uploads))) => {
                previous = pending;
                current = next;
                uploads = next_uploads;
            }
        }
    }
}

/// How many times one push that failed with `EUNKNOWN_HASH` is re-probed,
/// its missing objects re-sent and the push sent again.
const UNKNOWN_HASH_RETRIES: u32 = 3;

/// A push sent and not yet acknowledged, with what a retry needs.
struct InFlight {
    pending: PendingPush,
    /// The cursor the batch acknowledges.
    sender: ChangeCursor,
    entries: Vec<ChangeEntry>,
    phase: Baseline,
}

/// A push the receiver applied.
struct Acked {
    sender: ChangeCursor,
    phase: Baseline,
    outcome: PushOutcome,
}

/// Waits for a pipelined push's outcome. A push that fails with
/// `EUNKNOWN_HASH` is re-probed, its missing objects are re-sent (and
/// staged) and it is sent again, at most [`UNKNOWN_HASH_RETRIES`] times: its
/// batch was probed before the previous batch was applied, and that apply
/// may have removed the only copy of a chunk the probe reported as held (a
/// rename is deletes plus creates). Nothing else of ours is in flight then.
async fn conclude<S: Store, R: Remote>(
    local: &mut S,
    remote: &mut R,
    opts: &SyncOptions<'_>,
    report: &mut SyncReport,
    push: InFlight,
) -> Result<Acked, SyncError> {
    let InFlight {
        pending,
        sender,
        entries,
        phase,
    } = push;
    let mut result = pending.await;
    let mut retries = 0;
    loop {
        match result {
            Err(e) if e.code() == ErrorCode::UnknownHash && retries < UNKNOWN_HASH_RETRIES => {
                retries += 1;
                tracing::debug!(error = %e, retries, "a chunk went away since the probe; re-probing the batch");
                let (hashes, sizes) = distinct_chunks(&entries);
                let held = probe(remote, &hashes).await?.await?;
                let missing: Vec<(Hash, u32)> = hashes
                    .into_iter()
                    .filter(|h| !held.contains(h))
                    .map(|h| (h, sizes[&h]))
                    .collect();
                for upload in send_objects(local, remote, &missing, report, &mut |_| {}).await? {
                    upload.await?;
                }
                result = remote
                    .push(
                        Some(sender.clone()),
                        entries.clone(),
                        phase,
                        opts.ignore.patterns(),
                    )
                    .await;
            }
            other => {
                return Ok(Acked {
                    sender,
                    phase,
                    outcome: other?,
                });
            }
        }
    }
}

/// Checks a push's echoed cursor (rule 9) and advances the push cursor
/// (not during a baseline's mark phase).
fn acknowledge<S: Store>(
    local: &mut S,
    opts: &SyncOptions<'_>,
    report: &mut SyncReport,
    on_batch: &mut impl FnMut(&SyncReport),
    acked: Acked,
) -> Result<(), SyncError> {
    let Acked {
        sender,
        phase,
        outcome,
    } = acked;
    if remote_lost_state(&outcome.applied_push_cursor, &sender)? {
        return Err(SyncError::InvariantViolated {
            applied: outcome.applied_push_cursor,
            pushed: sender,
        });
    }
    // A baseline is only complete with its sweep: until then the push
    // cursor stays where it was, so an interrupted baseline starts over
    // (objects already sent are deduplicated) instead of resuming as an
    // incremental push that would never sweep.
    if phase != Baseline::Mark {
        local.set_push_cursor(opts.remote_name, &sender)?;
    }
    report.batches += 1;
    report.cursor = sender;
    on_batch(report);
    Ok(())
}

/// Sends a probe for `hashes` (in windows of [`MAX_HASHES_PER_CALL`]); the
/// future resolves to the set the remote holds.
async fn probe<R: Remote>(
    remote: &mut R,
    hashes: &[Hash],
) -> Result<impl std::future::Future<Output = Result<HashSet<Hash>, SyncError>> + use<R>, SyncError>
{
    let mut pending = Vec::new();
    for window in hashes.chunks(MAX_HASHES_PER_CALL) {
        pending.push(remote.has_objects_pipelined(window).await?);
    }
    Ok(async move {
        let mut held = HashSet::new();
        for p in pending {
            held.extend(p.await?);
        }
        Ok(held)
    })
}

/// One push batch, cut and probed.
struct PushBatch {
    entries: Vec<ChangeEntry>,
    /// The batch's chunks the remote does not hold, in first-use order,
    /// with their sizes.
    missing: Vec<(Hash, u32)>,
    deduplicated_bytes: u64,
    /// The cursor the batch acknowledges.
    sender: ChangeCursor,
    phase: Baseline,
    last: bool,
}

impl PushBatch {
    fn missing_bytes(&self) -> usize {
        self.missing.iter().map(|(_, size)| *size as usize).sum()
    }
}

/// Pages through the local changes and cuts them into push batches.
struct Pager {
    /// Entries read but not yet in a batch.
    page: Vec<ChangeEntry>,
    exhausted: bool,
    /// Where the page continues (after the last entry read).
    after: ChangeCursor,
    through: ChangeCursor,
    baseline: bool,
    /// The local index is still being built: `through` grows, and the
    /// window is not over when the page runs dry.
    indexing: bool,
}

impl Pager {
    /// [`Pager::fill`], then, while the index is still being built and the
    /// page is short of a batch, records more of it and reads on: waiting
    /// for a part only when the page is empty (something to send goes out
    /// now rather than waiting to be a full batch).
    async fn fill_indexing<S: Store, I: Indexing<S>>(
        &mut self,
        local: &mut S,
        opts: &SyncOptions<'_>,
        indexing: &mut I,
    ) -> Result<(), SyncError> {
        loop {
            self.fill(local, opts)?;
            if !self.indexing || self.page.len() >= BATCH_ENTRIES {
                return Ok(());
            }
            match indexing.next(local, self.page.is_empty()).await? {
                IndexStep::Grew(rev) => {
                    self.through = ChangeCursor::at(rev);
                    self.exhausted = false;
                }
                IndexStep::NotYet => return Ok(()),
                IndexStep::Complete => self.indexing = false,
            }
        }
    }

    /// Tops the page up to [`BATCH_ENTRIES`].
    fn fill<S: Store>(&mut self, local: &mut S, opts: &SyncOptions<'_>) -> Result<(), SyncError> {
        if self.page.len() < BATCH_ENTRIES && !self.exhausted {
            let want = BATCH_ENTRIES - self.page.len();
            let more = local.changes(ChangesQuery {
                after: &self.after,
                through: &self.through,
                ignore: opts.ignore,
                exclude_applied_from: Some(opts.remote_name),
                limit: want,
            })?;
            self.exhausted = more.len() < want;
            if let Some(e) = more.last() {
                self.after = ChangeCursor::within(e.rev, e.path.clone());
            }
            self.page.extend(more);
        }
        Ok(())
    }

    /// Cuts the next batch off the page where the chunk bytes the remote
    /// lacks (`held` is what it holds) pass [`BATCH_OBJECT_BYTES`] (a
    /// single larger file goes alone).
    fn cut(&mut self, held: &HashSet<Hash>, sizes: &HashMap<Hash, u32>) -> PushBatch {
        let mut take = 0usize;
        let mut budget = 0usize;
        let mut counted: HashSet<Hash> = HashSet::new();
        for e in &self.page {
            let extra: usize = e
                .chunks()
                .iter()
                .filter(|c| !held.contains(&c.hash) && !counted.contains(&c.hash))
                .map(|c| c.size as usize)
                .sum();
            if take > 0 && budget + extra > BATCH_OBJECT_BYTES {
                break;
            }
            budget += extra;
            take += 1;
            counted.extend(e.chunks().iter().map(|c| c.hash));
        }
        let entries: Vec<ChangeEntry> = self.page.drain(..take).collect();
        let (batch_hashes, _) = distinct_chunks(&entries);
        let mut missing = Vec::new();
        let mut deduplicated_bytes = 0u64;
        for h in batch_hashes {
            if held.contains(&h) {
                deduplicated_bytes += u64::from(sizes[&h]);
            } else {
                missing.push((h, sizes[&h]));
            }
        }
        let last = self.exhausted && !self.indexing && self.page.is_empty();
        let sender = match (last, entries.last()) {
            (true, _) | (false, None) => self.through.clone(),
            (false, Some(e)) => ChangeCursor::within(e.rev, e.path.clone()),
        };
        let phase = match (self.baseline, last) {
            (false, _) => Baseline::Off,
            (true, false) => Baseline::Mark,
            (true, true) => Baseline::Sweep,
        };
        PushBatch {
            entries,
            missing,
            deduplicated_bytes,
            sender,
            phase,
            last,
        }
    }
}

/// Reads `missing` (a batch's chunks the remote lacks) from the local store
/// and uploads them, about [`BATCH_OBJECT_BYTES`] per upload, each object
/// read straight into the message it goes out in where the remote builds
/// its own ([`Remote::push_objects_from`]). Returns once everything is
/// sent; the futures resolve when the remote has staged them.
async fn send_objects<S: Store, R: Remote>(
    local: &mut S,
    remote: &mut R,
    missing: &[(Hash, u32)],
    report: &mut SyncReport,
    on_progress: &mut impl FnMut(&SyncReport),
) -> Result<Vec<PendingUpload>, SyncError> {
    let mut pending: Vec<PendingUpload> = Vec::new();
    let mut start = 0;
    let mut group_bytes = 0usize;
    for (i, (_, size)) in missing.iter().enumerate() {
        group_bytes += *size as usize;
        if group_bytes >= BATCH_OBJECT_BYTES || i + 1 == missing.len() {
            // A large file's upload spans many groups: keep at most two in
            // flight, so memory stays at a few groups whatever the file size.
            while pending.len() >= 2 {
                pending.remove(0).await?;
            }
            let group = &missing[start..=i];
            let mut reader = local.object_reader(group)?;
            pending.push(remote.push_objects_from(group, reader.as_mut()).await?);
            drop(reader);
            report.objects += group.len() as u64;
            report.object_bytes += group_bytes as u64;
            on_progress(report);
            start = i + 1;
            group_bytes = 0;
        }
    }
    Ok(pending)
}

/// Pulls every remote change after our fetch cursor (rule 8): batches of
/// [`BATCH_ENTRIES`], objects fetched in slices of about
/// [`BATCH_OBJECT_BYTES`] and staged before the batch is applied, the fetch
/// cursor checkpointed with each batch, `currentCursor` written after a
/// clean drain.
pub async fn pull<S: Store, R: Remote>(
    local: &mut S,
    remote: &mut R,
    opts: &SyncOptions<'_>,
    on_batch: impl FnMut(&SyncReport),
) -> Result<SyncReport, SyncError> {
    pull_with(local, remote, opts, on_batch, |_| {}).await
}

/// [`pull`], also handing every batch of entries to `on_applied` right
/// after the store applied it, so a caller can report what a pull changed.
/// A batch includes entries the store found already matching (counted in
/// [`SyncReport::entries`] but not [`SyncReport::applied`]); deletions a
/// baseline's final sweep makes are not in any batch.
pub async fn pull_with<S: Store, R: Remote>(
    local: &mut S,
    remote: &mut R,
    opts: &SyncOptions<'_>,
    mut on_batch: impl FnMut(&SyncReport),
    mut on_applied: impl FnMut(&[ChangeEntry]),
) -> Result<SyncReport, SyncError> {
    let wm = local.watermarks(opts.remote_name)?;
    let mut after = wm.fetch_cursor.clone();
    let mut report = SyncReport::default();
    let patterns = opts.ignore.patterns().to_vec();
    let (mut opened, mut stream) = remote.fetch_changes(&after, &patterns).await?;
    if opened.current < after {
        tracing::warn!(remote = opts.remote_name, %after, current = %opened.current,
            "remote's log is shorter than our fetch cursor; pulling a baseline");
        local.set_fetch_cursor(opts.remote_name, &ChangeCursor::ZERO)?;
        after = ChangeCursor::ZERO;
        report.rebaselined = true;
        (opened, stream) = remote.fetch_changes(&after, &patterns).await?;
    }
    if remote_lost_state(&opened.applied_push_cursor, &wm.push_cursor)? {
        tracing::warn!(remote = opts.remote_name, applied = %opened.applied_push_cursor,
            pushed = %wm.push_cursor, "remote lost what we pushed; the next push re-baselines");
        local.set_push_cursor(opts.remote_name, &ChangeCursor::ZERO)?;
    }
    let FetchOpened {
        current, baseline, ..
    } = opened;
    report.rebaselined |= baseline;
    if !baseline && current <= after && after != ChangeCursor::ZERO {
        // Nothing past our fetch cursor (which is stored, so the remote is
        // registered): no batch to ask for, and no bookkeeping commit,
        // which would wake the store's commit listeners for nothing.
        report.plan_complete = true;
        report.cursor = after;
        return Ok(report);
    }
    let mark = if baseline {
        Baseline::Mark
    } else {
        Baseline::Off
    };
    loop {
        let batch = stream.next_batch(BATCH_ENTRIES).await?;
        if batch.is_empty() {
            break;
        }
        for e in &batch {
            e.validate()?;
            if current.is_before(e.rev, &e.path) {
                return Err(SyncError::Protocol(format!(
                    "entry {} at rev {} is beyond the stream's current cursor {current}",
                    e.path, e.rev
                )));
            }
        }
        let (hashes, sizes) = distinct_chunks(&batch);
        let held: HashSet<Hash> = local.has_objects(&hashes)?.into_iter().collect();
        let missing_bytes = hashes
            .iter()
            .filter(|h| !held.contains(h))
            .map(|h| u64::from(sizes[h]))
            .sum();
        // A short batch means the stream is drained (it fills every batch
        // it can); a full one may still be the last.
        report.plan(batch.len(), missing_bytes, batch.len() < BATCH_ENTRIES);
        on_batch(&report);
        let mut slice = Vec::new();
        let mut slice_bytes = 0usize;
        for h in hashes {
            let size = sizes[&h] as usize;
            if held.contains(&h) {
                report.deduplicated_bytes += size as u64;
                continue;
            }
            slice.push(h);
            slice_bytes += size;
            if slice_bytes >= BATCH_OBJECT_BYTES || slice.len() == MAX_HASHES_PER_CALL {
                fetch_and_stage(local, remote, &std::mem::take(&mut slice), &mut report).await?;
                on_batch(&report);
                slice_bytes = 0;
            }
        }
        if !slice.is_empty() {
            fetch_and_stage(local, remote, &slice, &mut report).await?;
        }
        let last = batch.last().expect("non-empty batch");
        // During a baseline the fetch cursor must not move before the sweep
        // (ZERO never moves it), so an interrupted baseline starts over.
        let sender = if baseline {
            ChangeCursor::ZERO
        } else {
            ChangeCursor::within(last.rev, last.path.clone())
        };
        let outcome = local.apply(ApplyBatch {
            remote: opts.remote_name,
            sender: Some(sender),
            entries: &batch,
            baseline: mark,
            ignore: opts.ignore,
        })?;
        report.entries += batch.len() as u64;
        report.applied += outcome.applied as u64;
        report.overwrote_local += outcome.overwrote_local as u64;
        report.batches += 1;
        report.cursor = outcome.fetch_cursor;
        on_applied(&batch);
        on_batch(&report);
    }
    report.plan_complete = true;
    let outcome = local.apply(ApplyBatch {
        remote: opts.remote_name,
        sender: Some(current),
        entries: &[],
        baseline: if baseline {
            Baseline::Sweep
        } else {
            Baseline::Off
        },
        // The sweep spares what we exclude: the remote never listed it.
        ignore: opts.ignore,
    })?;
    report.cursor = outcome.fetch_cursor;
    Ok(report)
}

async fn fetch_and_stage<S: Store, R: Remote>(
    local: &mut S,
    remote: &mut R,
    hashes: &[Hash],
    report: &mut SyncReport,
) -> Result<(), SyncError> {
    let objects = remote.fetch_objects(hashes).await?;
    if objects.len() != hashes.len() || objects.iter().zip(hashes).any(|(o, h)| o.hash != *h) {
        return Err(SyncError::Protocol(format!(
            "fetchObjects answered {} objects for {} requested, or out of order",
            objects.len(),
            hashes.len()
        )));
    }
    report.objects += objects.len() as u64;
    report.object_bytes += objects.iter().map(|o| o.bytes.len() as u64).sum::<u64>();
    local.stage_objects(&objects)
}

/// An in-process [`Remote`] over a shared [`Store`], as the RPC server would
/// serve it to the peer named `peer`. Used by tests and by in-process
/// gateways; the change stream is lazy, so the deferred-path rule applies
/// exactly as over the wire.
#[derive(Debug)]
pub struct StoreRemote<S> {
    store: Rc<RefCell<S>>,
    peer: String,
}

impl<S: Store> StoreRemote<S> {
    pub fn new(store: Rc<RefCell<S>>, peer: impl Into<String>) -> StoreRemote<S> {
        StoreRemote {
            store,
            peer: peer.into(),
        }
    }
}

/// The lazy change stream of a [`StoreRemote`].
#[derive(Debug)]
pub struct StoreChangeStream<S> {
    store: Rc<RefCell<S>>,
    peer: String,
    after: ChangeCursor,
    through: ChangeCursor,
    ignore: IgnoreRules,
    done: bool,
}

impl<S: Store> ChangeStream for StoreChangeStream<S> {
    async fn next_batch(&mut self, max: usize) -> Result<Vec<ChangeEntry>, SyncError> {
        if self.done {
            return Ok(Vec::new());
        }
        let batch = self.store.borrow_mut().changes(ChangesQuery {
            after: &self.after,
            through: &self.through,
            ignore: &self.ignore,
            exclude_applied_from: Some(&self.peer),
            limit: max,
        })?;
        self.done = batch.len() < max;
        if let Some(e) = batch.last() {
            self.after = ChangeCursor::within(e.rev, e.path.clone());
        }
        Ok(batch)
    }
}

impl<S: Store> Remote for StoreRemote<S> {
    type Changes = StoreChangeStream<S>;

    async fn watermarks(&mut self) -> Result<Watermarks, SyncError> {
        self.store.borrow_mut().watermarks(&self.peer)
    }

    async fn fetch_changes(
        &mut self,
        after: &ChangeCursor,
        ignore: &[String],
    ) -> Result<(FetchOpened, Self::Changes), SyncError> {
        let ignore = IgnoreRules::new(ignore)?;
        let mut store = self.store.borrow_mut();
        let window = store.open_changes(after)?;
        let applied = store.watermarks(&self.peer)?.fetch_cursor;
        let start = if window.baseline {
            ChangeCursor::ZERO
        } else {
            after.clone()
        };
        let opened = FetchOpened {
            current: window.through.clone(),
            applied_push_cursor: applied,
            baseline: window.baseline,
        };
        let stream = StoreChangeStream {
            store: self.store.clone(),
            peer: self.peer.clone(),
            after: start,
            through: window.through,
            ignore,
            done: false,
        };
        Ok((opened, stream))
    }

    async fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        SyncError::check_limit("hashes per call", MAX_HASHES_PER_CALL, hashes.len())?;
        self.store.borrow_mut().has_objects(hashes)
    }

    async fn fetch_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError> {
        SyncError::check_limit("hashes per call", MAX_HASHES_PER_CALL, hashes.len())?;
        self.store.borrow_mut().read_objects(hashes)
    }

    async fn push_objects(&mut self, objects: Vec<Object>) -> Result<(), SyncError> {
        self.store.borrow_mut().stage_objects(&objects)
    }

    async fn push(
        &mut self,
        sender: Option<ChangeCursor>,
        entries: Vec<ChangeEntry>,
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PushOutcome, SyncError> {
        SyncError::check_limit(
            "entries per push",
            crate::limits::MAX_PUSH_ENTRIES,
            entries.len(),
        )?;
        for e in &entries {
            e.validate()?;
        }
        let ignore = IgnoreRules::new(ignore)?;
        let outcome = self.store.borrow_mut().apply(ApplyBatch {
            remote: &self.peer,
            sender,
            entries: &entries,
            baseline,
            ignore: &ignore,
        })?;
        Ok(PushOutcome {
            rev: outcome.rev,
            applied_push_cursor: outcome.fetch_cursor,
        })
    }
}
