use crate::{Baseline, ChangeCursor, ChangeEntry, Hash, SyncError, Watermarks};

/// A content-addressed object in transit.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Object {
    pub hash: Hash,
    pub bytes: Vec<u8>,
}

impl Object {
    /// What a receiver checks before staging an object: its size is within
    /// [`crate::chunk::MAX_CHUNK`] (`ELIMIT`) and its bytes hash to its
    /// name (`EPROTOCOL`).
    pub fn check(&self) -> Result<(), SyncError> {
        SyncError::check_limit(
            "object size (bytes)",
            crate::chunk::MAX_CHUNK,
            self.bytes.len(),
        )?;
        self.hash.verify(&self.bytes)
    }
}

/// The head of a `fetchChanges` answer.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FetchOpened {
    /// `{remote's currentRev at open, None}`; the stream ends there.
    pub current: ChangeCursor,
    /// The remote's stored fetch cursor for us: how much of our pushes it
    /// has applied.
    pub applied_push_cursor: ChangeCursor,
    /// The stream is a full baseline from zero (our cursor was older than
    /// the remote's tombstone prune horizon): apply it with sweep.
    pub baseline: bool,
}

/// The answer of a `push`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PushOutcome {
    /// The receiver's current rev after the push.
    pub rev: u64,
    /// The receiver's stored fetch cursor for us after the push.
    pub applied_push_cursor: ChangeCursor,
}

/// The outcome of a push already sent ([`Remote::push_pipelined`]); it
/// borrows nothing, so the driver can use the remote while it is pending.
pub type PendingPush =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<PushOutcome, SyncError>>>>;

/// A probe already sent ([`Remote::has_objects_pipelined`]).
pub type PendingProbe =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<Hash>, SyncError>>>>;

/// An upload already sent ([`Remote::push_objects_pipelined`]): resolves
/// once the receiver has staged every object of it.
pub type PendingUpload =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), SyncError>>>>;

/// A pull iterator over a remote change stream.
#[allow(async_fn_in_trait)]
pub trait ChangeStream {
    /// Up to `max` next entries; an empty batch means the stream is drained.
    async fn next_batch(&mut self, max: usize) -> Result<Vec<ChangeEntry>, SyncError>;
}

/// The sync half of a remote peer as the driver sees it. Implemented over
/// Cap'n Proto by `wsd::client`, and in-process by [`crate::driver::StoreRemote`].
#[allow(async_fn_in_trait)]
pub trait Remote {
    type Changes: ChangeStream;

    /// The remote's watermarks with respect to us.
    async fn watermarks(&mut self) -> Result<Watermarks, SyncError>;

    async fn fetch_changes(
        &mut self,
        after: &ChangeCursor,
        ignore: &[String],
    ) -> Result<(FetchOpened, Self::Changes), SyncError>;

    async fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError>;

    /// The objects in request order; `EUNKNOWN_HASH` for one not held.
    async fn fetch_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError>;

    async fn push_objects(&mut self, objects: Vec<Object>) -> Result<(), SyncError>;

    /// [`Remote::has_objects`], returning once the probe is *sent*; calls
    /// made after it reach the receiver after it. By default the probe
    /// completes before this returns.
    async fn has_objects_pipelined(&mut self, hashes: &[Hash]) -> Result<PendingProbe, SyncError> {
        let held = self.has_objects(hashes).await;
        Ok(Box::pin(std::future::ready(held)))
    }

    /// [`Remote::push_objects`], returning once every object is *sent*
    /// (flow control permitting); the returned future resolves when the
    /// receiver has staged them all. By default the upload completes before
    /// this returns.
    async fn push_objects_pipelined(
        &mut self,
        objects: Vec<Object>,
    ) -> Result<PendingUpload, SyncError> {
        let done = self.push_objects(objects).await;
        Ok(Box::pin(std::future::ready(done)))
    }

    /// [`Remote::push_objects_pipelined`] of the objects `wanted` names
    /// (hash and size), their bytes read by `reader` in that order. A remote
    /// that builds its messages itself (the capnp client) has the reader
    /// write each object straight into the message it is sent in; by
    /// default the objects are read into buffers of their own first. An
    /// error of `reader` is returned as it is.
    async fn push_objects_from(
        &mut self,
        wanted: &[(Hash, u32)],
        reader: &mut dyn crate::ObjectReader,
    ) -> Result<PendingUpload, SyncError> {
        let objects = wanted
            .iter()
            .map(|(hash, size)| {
                let mut bytes = vec![0; *size as usize];
                reader.read_into(hash, &mut bytes)?;
                Ok(Object { hash: *hash, bytes })
            })
            .collect::<Result<Vec<Object>, SyncError>>()?;
        self.push_objects_pipelined(objects).await
    }

    /// `sender` is `None` for an external writer (wire `senderRev = 0`).
    /// `ignore` is the sender's exclusions (gitignore patterns): a sweeping
    /// baseline spares the receiver's paths they match.
    async fn push(
        &mut self,
        sender: Option<ChangeCursor>,
        entries: Vec<ChangeEntry>,
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PushOutcome, SyncError>;

    /// [`Remote::push`], returning once the push is *sent*: the outcome
    /// arrives on the returned future while the caller goes on using the
    /// remote (the driver uploads the next batch's objects meanwhile). Calls
    /// made after it reach the receiver after it. By default the push
    /// completes before this returns.
    async fn push_pipelined(
        &mut self,
        sender: Option<ChangeCursor>,
        entries: Vec<ChangeEntry>,
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PendingPush, SyncError> {
        let outcome = self.push(sender, entries, baseline, ignore).await;
        Ok(Box::pin(std::future::ready(outcome)))
    }
}
