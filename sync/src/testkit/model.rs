//! The reference model: two trees (`A`, the driver's local store, and `B`,
//! its remote) plus, per side, the paths whose state the other side may
//! lack. A property test drives two real stores and the model with the
//! same random steps and compares both trees after every step.
//!
//! What the model encodes, beyond plain tree edits:
//! - a push sends A's dirty paths (rule 7) and a pull B's (rule 8); the
//!   receiving side's own dirty paths that this overwrote are no longer
//!   dirty there (what was applied from a peer is not echoed back to it);
//! - an ancestor the receiver had to create (rule 3) is its own change;
//! - a side that lost its state (a wiped remote, or a wiped local store
//!   that comes back under a new peer name) ends equal to the other side
//!   after the next push or pull, whatever was exchanged before;
//! - a push cursor moved back sends every row the sender has, tombstones
//!   included; when the sender has pruned tombstones it is a sweeping
//!   baseline and the receiver ends equal to the sender.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::{LocalOp, Node, StoreUnderTest, block_on, live_tree};
use crate::driver::{self, StoreRemote, SyncOptions};
use crate::{ChangeCursor, IgnoreRules};

/// A tree: path → node, every live path's ancestors live directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree(pub BTreeMap<String, Node>);

fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

fn is_below(path: &str, dir: &str) -> bool {
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

impl Tree {
    fn subtree(&self, path: &str) -> Vec<String> {
        self.0
            .keys()
            .filter(|k| *k == path || is_below(k, path))
            .cloned()
            .collect()
    }

    /// Whether `path` can be created: no ancestor is a file or symlink.
    fn parents_ok(&self, path: &str) -> bool {
        ancestors(path).all(|a| self.0.get(a).is_none_or(Node::is_dir))
    }

    /// Whether `op` fits this tree (the suite issues only those).
    pub fn check(&self, op: &LocalOp) -> bool {
        match op {
            // A write or chmod that changes nothing is left out: whether it
            // counts as a local change is up to the store.
            LocalOp::Write { path, bytes, mode } => {
                self.parents_ok(path)
                    && match self.0.get(path) {
                        None => true,
                        Some(n @ Node::File { .. }) => *n != Node::file(bytes, *mode),
                        Some(_) => false,
                    }
            }
            LocalOp::Mkdir { path, .. } | LocalOp::Symlink { path, .. } => {
                self.parents_ok(path) && !self.0.contains_key(path)
            }
            LocalOp::Remove { path } => self.0.contains_key(path),
            LocalOp::Rename { from, to } => {
                self.0.contains_key(from)
                    && !self.0.contains_key(to)
                    && from != to
                    && !is_below(to, from)
                    && self.parents_ok(to)
            }
            LocalOp::Chmod { path, mode } => matches!(
                self.0.get(path),
                Some(Node::File { mode: m, .. } | Node::Dir { mode: m }) if m != mode
            ),
        }
    }

    fn make_parents(&mut self, path: &str, changed: &mut BTreeSet<String>) {
        for a in ancestors(path) {
            if !self.0.get(a).is_some_and(Node::is_dir) {
                self.0.insert(a.to_owned(), Node::Dir { mode: 0o755 });
                changed.insert(a.to_owned());
            }
        }
    }

    fn remove(&mut self, path: &str, changed: &mut BTreeSet<String>) {
        for k in self.subtree(path) {
            self.0.remove(&k);
            changed.insert(k);
        }
    }

    /// Applies a local op that fits; returns the paths whose state changed.
    pub fn local(&mut self, op: &LocalOp) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        match op {
            LocalOp::Write { path, bytes, mode } => {
                self.make_parents(path, &mut changed);
                self.0.insert(path.clone(), Node::file(bytes, *mode));
                changed.insert(path.clone());
            }
            LocalOp::Mkdir { path, mode } => {
                self.make_parents(path, &mut changed);
                self.0.insert(path.clone(), Node::Dir { mode: *mode });
                changed.insert(path.clone());
            }
            LocalOp::Symlink { path, target } => {
                self.make_parents(path, &mut changed);
                self.0.insert(
                    path.clone(),
                    Node::Symlink {
                        target: target.clone(),
                    },
                );
                changed.insert(path.clone());
            }
            LocalOp::Remove { path } => self.remove(path, &mut changed),
            LocalOp::Rename { from, to } => {
                self.make_parents(to, &mut changed);
                for k in self.subtree(from) {
                    let node = self.0.remove(&k).expect("listed");
                    let moved = format!("{to}{}", &k[from.len()..]);
                    self.0.insert(moved.clone(), node);
                    changed.insert(moved);
                    changed.insert(k);
                }
            }
            LocalOp::Chmod { path, mode } => {
                match self.0.get_mut(path) {
                    Some(Node::File { mode: m, .. } | Node::Dir { mode: m }) => *m = *mode,
                    _ => unreachable!("checked"),
                }
                changed.insert(path.clone());
            }
        }
        changed
    }

    /// Makes `path` here what it is in `src` (one applied entry). Returns
    /// the paths that changed and the ancestors that had to be created.
    fn take_from(&mut self, src: &Tree, path: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut changed, mut created) = (BTreeSet::new(), BTreeSet::new());
        match src.0.get(path) {
            None => {
                if self.0.contains_key(path) {
                    self.remove(path, &mut changed);
                }
            }
            Some(node) => {
                if self.0.get(path) == Some(node) {
                    return (changed, created);
                }
                if self.0.get(path).is_some_and(Node::is_dir) && !node.is_dir() {
                    for k in self.subtree(path) {
                        if k != path {
                            self.0.remove(&k);
                            changed.insert(k);
                        }
                    }
                }
                self.make_parents(path, &mut created);
                self.0.insert(path.to_owned(), node.clone());
                changed.insert(path.to_owned());
            }
        }
        (changed, created)
    }
}

/// One step of a property-test case.
#[derive(Clone, Debug)]
pub enum Step {
    LocalA(LocalOp),
    LocalB(LocalOp),
    /// Reconcile, then push A's changes to B.
    Push,
    /// Reconcile, then pull B's changes into A.
    Pull,
    /// Push, then prune A's acknowledged tombstones (a later rewind then
    /// pushes a baseline).
    PushAndPrune,
    /// A's push cursor moves back to zero (as when B looks reset), then push.
    RewindPush,
    /// B loses everything; A reconnects and pushes.
    WipeB,
    /// A loses everything and comes back under a new peer name, then pulls.
    WipeA,
}

fn path_strategy() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 1..=3)
        .prop_map(|v| v.join("/"))
}

fn op_strategy() -> impl Strategy<Value = LocalOp> {
    let content = prop::sample::select(vec![
        b"".to_vec(),
        b"one".to_vec(),
        b"two".to_vec(),
        b"three three".to_vec(),
    ]);
    prop_oneof![
        4 => (path_strategy(), content, prop::sample::select(vec![0o644u32, 0o600, 0o755]))
            .prop_map(|(path, bytes, mode)| LocalOp::Write { path, bytes, mode }),
        2 => (path_strategy(), prop::sample::select(vec![0o755u32, 0o700]))
            .prop_map(|(path, mode)| LocalOp::Mkdir { path, mode }),
        1 => (path_strategy(), prop::sample::select(vec!["t1", "../t2"]))
            .prop_map(|(path, t)| LocalOp::Symlink { path, target: t.to_owned() }),
        2 => path_strategy().prop_map(|path| LocalOp::Remove { path }),
        2 => (path_strategy(), path_strategy()).prop_map(|(from, to)| LocalOp::Rename { from, to }),
        1 => (path_strategy(), prop::sample::select(vec![0o600u32, 0o700, 0o644]))
            .prop_map(|(path, mode)| LocalOp::Chmod { path, mode }),
    ]
}

pub fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => op_strategy().prop_map(Step::LocalA),
        4 => op_strategy().prop_map(Step::LocalB),
        3 => Just(Step::Push),
        3 => Just(Step::Pull),
        1 => Just(Step::PushAndPrune),
        1 => Just(Step::RewindPush),
        1 => Just(Step::WipeB),
        1 => Just(Step::WipeA),
    ]
}

/// Runs `cases` random step sequences against two stores from `factory`.
pub fn check<S: StoreUnderTest, F: FnMut() -> S>(cases: u32, factory: F) {
    let factory = RefCell::new(factory);
    // A fixed seed: the same cases on every run (tests are deterministic).
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let result = runner.run(&prop::collection::vec(step_strategy(), 1..40), |steps| {
        run_steps(&mut *factory.borrow_mut(), &steps);
        Ok(())
    });
    if let Err(e) = result {
        panic!("the store departs from the reference model: {e}");
    }
}

struct Run<S> {
    a: S,
    b: Rc<RefCell<S>>,
    /// A's peer name as B knows it (new after A loses its state).
    a_name: String,
    generation: u32,
    ta: Tree,
    tb: Tree,
    /// Paths whose state on that side the other side may lack.
    da: BTreeSet<String>,
    db: BTreeSet<String>,
    /// Paths A holds a row for (live or tombstone).
    rows_a: BTreeSet<String>,
}

const B_NAME: &str = "B";

impl<S: StoreUnderTest> Run<S> {
    fn remote(&self) -> StoreRemote<S> {
        StoreRemote::new(self.b.clone(), self.a_name.clone())
    }

    fn push(&mut self) {
        let ignore = IgnoreRules::none();
        let opts = SyncOptions {
            remote_name: B_NAME,
            ignore: &ignore,
        };
        let mut remote = self.remote();
        block_on(driver::reconcile(&mut self.a, &mut remote, B_NAME)).unwrap();
        block_on(driver::push(&mut self.a, &mut remote, &opts, |_| {})).unwrap();
    }

    fn pull(&mut self) {
        let ignore = IgnoreRules::none();
        let opts = SyncOptions {
            remote_name: B_NAME,
            ignore: &ignore,
        };
        let mut remote = self.remote();
        block_on(driver::reconcile(&mut self.a, &mut remote, B_NAME)).unwrap();
        block_on(driver::pull(&mut self.a, &mut remote, &opts, |_| {})).unwrap();
    }

    /// The model of a push that sends A's state of `paths`.
    fn model_push(&mut self, paths: BTreeSet<String>) {
        for p in paths {
            let (changed, created) = self.tb.take_from(&self.ta, &p);
            for c in changed {
                self.db.remove(&c);
            }
            self.db.extend(created);
        }
        self.da.clear();
    }

    fn model_pull(&mut self) {
        for p in std::mem::take(&mut self.db) {
            let (changed, created) = self.ta.take_from(&self.tb, &p);
            for c in changed {
                self.da.remove(&c);
            }
            self.da.extend(created);
        }
    }

    fn step(&mut self, factory: &mut dyn FnMut() -> S, step: &Step) {
        match step {
            Step::LocalA(op) => {
                if self.ta.check(op) {
                    self.a.local(op).unwrap();
                    self.da.extend(self.ta.local(op));
                }
            }
            Step::LocalB(op) => {
                if self.tb.check(op) {
                    self.b.borrow_mut().local(op).unwrap();
                    self.db.extend(self.tb.local(op));
                }
            }
            Step::Push => {
                self.push();
                let dirty = std::mem::take(&mut self.da);
                self.model_push(dirty);
            }
            Step::Pull => {
                self.pull();
                self.model_pull();
            }
            Step::PushAndPrune => {
                self.push();
                let dirty = std::mem::take(&mut self.da);
                self.model_push(dirty);
                if self.a.prune().unwrap() {
                    self.rows_a = self.ta.0.keys().cloned().collect();
                }
            }
            Step::RewindPush => {
                self.a.set_push_cursor(B_NAME, &ChangeCursor::ZERO).unwrap();
                let baseline = self.a.open_changes(&ChangeCursor::ZERO).unwrap().baseline;
                self.push();
                if baseline {
                    self.tb = self.ta.clone();
                    self.db.clear();
                    self.da.clear();
                } else {
                    let mut all = self.rows_a.clone();
                    all.extend(std::mem::take(&mut self.da));
                    self.model_push(all);
                }
            }
            Step::WipeB => {
                *self.b.borrow_mut() = factory();
                self.push();
                self.tb = self.ta.clone();
                self.da.clear();
                self.db.clear();
            }
            Step::WipeA => {
                self.a = factory();
                self.generation += 1;
                self.a_name = format!("A{}", self.generation);
                self.pull();
                self.ta = self.tb.clone();
                self.da.clear();
                self.db.clear();
                self.rows_a.clear();
            }
        }
        self.rows_a.extend(self.ta.0.keys().cloned());
        let (a, b) = (
            live_tree(&mut self.a).unwrap(),
            live_tree(&mut *self.b.borrow_mut()).unwrap(),
        );
        assert_eq!(a, self.ta.0, "A after {step:?}");
        assert_eq!(b, self.tb.0, "B after {step:?}");
    }
}

fn run_steps<S: StoreUnderTest>(factory: &mut dyn FnMut() -> S, steps: &[Step]) {
    let mut run = Run {
        a: factory(),
        b: Rc::new(RefCell::new(factory())),
        a_name: "A0".to_owned(),
        generation: 0,
        ta: Tree::default(),
        tb: Tree::default(),
        da: BTreeSet::new(),
        db: BTreeSet::new(),
        rows_a: BTreeSet::new(),
    };
    for step in steps {
        run.step(factory, step);
    }
    // Whatever happened, a pull then a push leave both sides equal.
    run.pull();
    run.push();
    let (a, b) = (
        live_tree(&mut run.a).unwrap(),
        live_tree(&mut *run.b.borrow_mut()).unwrap(),
    );
    assert_eq!(a, b, "A and B after a final pull and push");
}
