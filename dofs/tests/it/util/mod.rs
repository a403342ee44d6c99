//! Helpers shared by the cross-store tests: two (or more) `Dofs` stores
//! synced in-process through `wsd_sync::driver` and `StoreRemote`, a tree
//! dump for comparisons, and a fault-injecting `Remote` wrapper.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use futures::executor::block_on;
use wsd_dofs::{Dofs, WriteOptions};
use wsd_sync::driver::{self, StoreRemote, SyncOptions, SyncReport};
use wsd_sync::{
    Baseline, ChangeCursor, ChangeEntry, ChangeStream, ErrorCode, FetchOpened, Hash, IgnoreRules,
    Kind, Object, PushOutcome, Remote, SyncError, SyncPath, Watermarks,
};

pub type Shared = Rc<RefCell<Dofs>>;

/// A store with a name: the name its peers keep watermarks under.
#[derive(Clone)]
pub struct Peer {
    pub name: &'static str,
    pub store: Shared,
}

impl Peer {
    pub fn new(name: &'static str) -> Peer {
        Peer {
            name,
            store: Rc::new(RefCell::new(Dofs::open_in_memory().unwrap())),
        }
    }

    pub fn put(&self, path: &str, bytes: &[u8]) {
        let opts = WriteOptions {
            create_parents: true,
            ..WriteOptions::default()
        };
        self.store
            .borrow_mut()
            .write_file_with(&p(path), bytes, opts)
            .unwrap();
    }

    pub fn tree(&self) -> BTreeMap<String, Node> {
        tree(&self.store.borrow())
    }

    pub fn rev(&self) -> u64 {
        self.store.borrow().current_rev().unwrap()
    }

    /// This store as `local` sees it over the wire.
    pub fn remote_for(&self, local: &Peer) -> StoreRemote<Dofs> {
        StoreRemote::new(self.store.clone(), local.name)
    }
}

pub fn p(s: &str) -> SyncPath {
    SyncPath::new(s).unwrap()
}

/// `local` pushes its changes to `remote`.
pub fn push(local: &Peer, remote: &Peer) -> Result<SyncReport, SyncError> {
    push_via(local, remote.name, &mut remote.remote_for(local))
}

/// `local` pulls `remote`'s changes.
pub fn pull(local: &Peer, remote: &Peer) -> Result<SyncReport, SyncError> {
    pull_via(local, remote.name, &mut remote.remote_for(local))
}

pub fn push_via<R: Remote>(
    local: &Peer,
    name: &str,
    remote: &mut R,
) -> Result<SyncReport, SyncError> {
    let ignore = IgnoreRules::none();
    let opts = SyncOptions {
        remote_name: name,
        ignore: &ignore,
    };
    block_on(driver::push(
        &mut *local.store.borrow_mut(),
        remote,
        &opts,
        |_| {},
    ))
}

pub fn pull_via<R: Remote>(
    local: &Peer,
    name: &str,
    remote: &mut R,
) -> Result<SyncReport, SyncError> {
    let ignore = IgnoreRules::none();
    let opts = SyncOptions {
        remote_name: name,
        ignore: &ignore,
    };
    block_on(driver::pull(
        &mut *local.store.borrow_mut(),
        remote,
        &opts,
        |_| {},
    ))
}

/// The hub tick until nothing moves: `a` pulls from `b`, then pushes to it.
/// Returns the number of ticks that moved something; panics if the pair
/// never settles.
pub fn quiesce(a: &Peer, b: &Peer) -> usize {
    for tick in 0..6 {
        let pulled = pull(a, b).unwrap();
        let pushed = push(a, b).unwrap();
        if pulled.entries == 0 && pushed.entries == 0 {
            return tick;
        }
    }
    panic!("{} and {} did not settle in 6 ticks", a.name, b.name);
}

/// A node as the comparisons see it: mtime is not part of sync identity.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Node {
    File { mode: u32, bytes: Vec<u8> },
    Dir { mode: u32 },
    Symlink { mode: u32, target: String },
}

/// Every live path of `d` with its content, by walking `readdir`.
pub fn tree(d: &Dofs) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<Option<SyncPath>> = vec![None];
    while let Some(dir) = stack.pop() {
        for e in d.readdir(dir.as_ref()).unwrap() {
            let node = match e.stat.kind {
                Kind::File => Node::File {
                    mode: e.stat.mode,
                    bytes: d.read_file(&e.path).unwrap(),
                },
                Kind::Dir => {
                    stack.push(Some(e.path.clone()));
                    Node::Dir { mode: e.stat.mode }
                }
                Kind::Symlink => Node::Symlink {
                    mode: e.stat.mode,
                    target: d.readlink(&e.path).unwrap(),
                },
            };
            out.insert(e.path.into_string(), node);
        }
    }
    out
}

/// Deterministic non-repeating bytes (they cut into several chunks).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What a [`Faulty`] remote does wrong, and what it saw.
#[derive(Default)]
pub struct Faults {
    /// Calls (including each `next_batch`) that succeed before every later
    /// one fails with `EIO`.
    pub calls_left: Cell<Option<usize>>,
    /// `push_objects` reports success but stores nothing.
    pub drop_objects: Cell<bool>,
    /// `push_objects` flips a byte of every object.
    pub corrupt_objects: Cell<bool>,
    /// Runs right after `fetch_changes` opened its stream.
    pub after_open: RefCell<Option<Box<dyn FnMut()>>>,
    /// The next this many `has_objects` answers claim every hash held.
    pub claim_held: Cell<usize>,
    /// `has_objects` calls seen.
    pub probes: Cell<usize>,
    /// Largest `has_objects` request seen.
    pub max_probe: Cell<usize>,
    /// Entries handed out by streams.
    pub streamed: Cell<usize>,
}

impl Faults {
    fn tick(&self) -> Result<(), SyncError> {
        match self.calls_left.get() {
            Some(0) => Err(SyncError::Remote {
                code: ErrorCode::Io,
                message: "injected failure: connection lost".into(),
            }),
            Some(n) => {
                self.calls_left.set(Some(n - 1));
                Ok(())
            }
            None => Ok(()),
        }
    }
}

pub struct Faulty<R> {
    pub inner: R,
    pub faults: Rc<Faults>,
}

pub struct FaultyStream<S> {
    inner: S,
    faults: Rc<Faults>,
}

impl<S: ChangeStream> ChangeStream for FaultyStream<S> {
    async fn next_batch(&mut self, max: usize) -> Result<Vec<ChangeEntry>, SyncError> {
        self.faults.tick()?;
        let batch = self.inner.next_batch(max).await?;
        self.faults
            .streamed
            .set(self.faults.streamed.get() + batch.len());
        Ok(batch)
    }
}

impl<R: Remote> Remote for Faulty<R> {
    type Changes = FaultyStream<R::Changes>;

    async fn watermarks(&mut self) -> Result<Watermarks, SyncError> {
        self.faults.tick()?;
        self.inner.watermarks().await
    }

    async fn fetch_changes(
        &mut self,
        after: &ChangeCursor,
        ignore: &[String],
    ) -> Result<(FetchOpened, Self::Changes), SyncError> {
        self.faults.tick()?;
        let (opened, inner) = self.inner.fetch_changes(after, ignore).await?;
        if let Some(hook) = self.faults.after_open.borrow_mut().as_mut() {
            hook();
        }
        Ok((
            opened,
            FaultyStream {
                inner,
                faults: self.faults.clone(),
            },
        ))
    }

    async fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        self.faults.tick()?;
        self.faults
            .max_probe
            .set(self.faults.max_probe.get().max(hashes.len()));
        self.faults.probes.set(self.faults.probes.get() + 1);
        let lies = self.faults.claim_held.get();
        if lies > 0 {
            self.faults.claim_held.set(lies - 1);
            return Ok(hashes.to_vec());
        }
        self.inner.has_objects(hashes).await
    }

    async fn fetch_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError> {
        self.faults.tick()?;
        self.inner.fetch_objects(hashes).await
    }

    async fn push_objects(&mut self, mut objects: Vec<Object>) -> Result<(), SyncError> {
        self.faults.tick()?;
        if self.faults.drop_objects.get() {
            return Ok(());
        }
        if self.faults.corrupt_objects.get() {
            for o in &mut objects {
                o.bytes[0] ^= 0xff;
            }
        }
        self.inner.push_objects(objects).await
    }

    async fn push(
        &mut self,
        sender: Option<ChangeCursor>,
        entries: Vec<ChangeEntry>,
        baseline: Baseline,
        ignore: &[String],
    ) -> Result<PushOutcome, SyncError> {
        self.faults.tick()?;
        self.inner.push(sender, entries, baseline, ignore).await
    }
}

/// `remote` as seen by `local`, behind a fault injector.
pub fn faulty(remote: &Peer, local: &Peer) -> (Faulty<StoreRemote<Dofs>>, Rc<Faults>) {
    let faults = Rc::new(Faults::default());
    (
        Faulty {
            inner: remote.remote_for(local),
            faults: faults.clone(),
        },
        faults,
    )
}
