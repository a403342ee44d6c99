//! Property test of the hub topology: store A (the authority) pushes to
//! and pulls from store B while both sides write. Local operations are
//! checked against a `BTreeMap` model of POSIX-like semantics after every
//! step; sync steps (some interrupted mid-way) happen at random points. At
//! the end the pair must settle, be equal and pass the integrity check, and
//! then one-sided changes on either side must arrive exactly (no write lost
//! when there is no conflict, whatever the history before). Tombstone
//! pruning and B losing its whole state happen at random points too.
//!
//! Cases: `PROPTEST_CASES` or 200.

use std::collections::BTreeMap;

use crate::util::{Node, Peer, faulty, noise, p, pull, pull_via, push, push_via, quiesce};
use futures::executor::block_on;
use proptest::prelude::*;
use wsd_dofs::{Dofs, DofsError, WriteOptions};
use wsd_sync::{ErrorCode, driver};

type Model = BTreeMap<String, Node>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    A,
    B,
}

#[derive(Clone, Debug)]
enum Content {
    Small(Vec<u8>),
    /// 150 KiB of noise: several chunks.
    Big(u8),
}

impl Content {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Content::Small(b) => b.clone(),
            Content::Big(seed) => noise(150 * 1024, u64::from(*seed)),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum NewKind {
    File,
    Dir,
    Symlink,
}

#[derive(Clone, Debug)]
enum Local {
    Write(String, Content),
    Append(String, Content),
    Rm(String),
    Rename(String, String),
    Chmod(String, u32),
    Mkdir(String),
    Symlink(String, &'static str),
    /// `rm -r` whatever is there, then create the path as another kind.
    Replace(String, NewKind),
}

#[derive(Clone, Debug)]
enum Op {
    Local(Side, Local),
    Push,
    Pull,
    /// A push or pull whose connection dies after this many calls.
    InterruptedPush(usize),
    InterruptedPull(usize),
    /// Prune the tombstones every registered remote has acknowledged.
    Prune(Side),
    /// B loses its whole state (a fresh container); A reconciles with it.
    ResetB,
}

// --- the model -------------------------------------------------------------

fn parent(path: &str) -> Option<&str> {
    path.rfind('/').map(|i| &path[..i])
}

fn ancestors(path: &str) -> Vec<&str> {
    path.match_indices('/').map(|(i, _)| &path[..i]).collect()
}

fn in_subtree(path: &str, root: &str) -> bool {
    path == root || (path.starts_with(root) && path.as_bytes().get(root.len()) == Some(&b'/'))
}

fn is_dir(m: &Model, path: &str) -> bool {
    matches!(m.get(path), Some(Node::Dir { .. }))
}

fn require_parent(m: &Model, path: &str) -> Result<(), ()> {
    match parent(path) {
        Some(par) if !is_dir(m, par) => Err(()),
        _ => Ok(()),
    }
}

fn create_parents(m: &mut Model, path: &str) -> Result<(), ()> {
    for anc in ancestors(path) {
        match m.get(anc) {
            Some(Node::Dir { .. }) => {}
            Some(_) => return Err(()),
            None => {
                m.insert(anc.to_owned(), Node::Dir { mode: 0o755 });
            }
        }
    }
    Ok(())
}

fn model_rm(m: &mut Model, path: &str) -> Result<(), ()> {
    if !m.contains_key(path) {
        return Err(());
    }
    m.retain(|k, _| !in_subtree(k, path));
    Ok(())
}

fn model_mkdir_p(m: &mut Model, path: &str) -> Result<(), ()> {
    match m.get(path) {
        Some(Node::Dir { .. }) => return Ok(()),
        Some(_) => return Err(()),
        None => {}
    }
    create_parents(m, path)?;
    m.insert(path.to_owned(), Node::Dir { mode: 0o755 });
    Ok(())
}

fn model_write(m: &mut Model, path: &str, bytes: Vec<u8>) -> Result<(), ()> {
    let mode = match m.get(path) {
        Some(Node::File { mode, .. }) => *mode,
        Some(_) => return Err(()),
        None => 0o644,
    };
    create_parents(m, path)?;
    m.insert(path.to_owned(), Node::File { mode, bytes });
    Ok(())
}

fn model_symlink(m: &mut Model, path: &str, target: &str) -> Result<(), ()> {
    if m.contains_key(path) {
        return Err(());
    }
    require_parent(m, path)?;
    m.insert(
        path.to_owned(),
        Node::Symlink {
            mode: 0o777,
            target: target.to_owned(),
        },
    );
    Ok(())
}

fn model_rename(m: &mut Model, from: &str, to: &str) -> Result<(), ()> {
    let src = m.get(from).cloned().ok_or(())?;
    if from == to {
        return Ok(());
    }
    if in_subtree(to, from) {
        return Err(());
    }
    require_parent(m, to)?;
    let src_dir = matches!(src, Node::Dir { .. });
    match m.get(to) {
        Some(Node::Dir { .. }) if !src_dir => return Err(()),
        Some(Node::Dir { .. }) if m.keys().any(|k| k != to && in_subtree(k, to)) => return Err(()),
        Some(n) if !matches!(n, Node::Dir { .. }) && src_dir => return Err(()),
        _ => {}
    }
    let moved: Vec<(String, Node)> = m
        .iter()
        .filter(|(k, _)| in_subtree(k, from))
        .map(|(k, v)| (format!("{to}{}", &k[from.len()..]), v.clone()))
        .collect();
    m.retain(|k, _| !in_subtree(k, from));
    m.extend(moved);
    Ok(())
}

/// Applies one local op to the model; `Err` when dofs must refuse it. A
/// refused op leaves the model untouched (dofs rolls back).
fn model_apply(m: &mut Model, op: &Local) -> Result<(), ()> {
    let mut next = m.clone();
    match op {
        Local::Write(path, c) => model_write(&mut next, path, c.bytes())?,
        Local::Append(path, c) => match next.get_mut(path) {
            Some(Node::File { bytes, .. }) => bytes.extend(c.bytes()),
            Some(_) => return Err(()),
            None => {
                require_parent(&next, path)?;
                next.insert(
                    path.clone(),
                    Node::File {
                        mode: 0o644,
                        bytes: c.bytes(),
                    },
                );
            }
        },
        Local::Rm(path) => model_rm(&mut next, path)?,
        Local::Rename(from, to) => model_rename(&mut next, from, to)?,
        Local::Chmod(path, mode) => match next.get_mut(path) {
            Some(
                Node::File { mode: m, .. } | Node::Dir { mode: m } | Node::Symlink { mode: m, .. },
            ) => *m = *mode,
            None => return Err(()),
        },
        Local::Mkdir(path) => model_mkdir_p(&mut next, path)?,
        Local::Symlink(path, target) => model_symlink(&mut next, path, target)?,
        Local::Replace(path, kind) => {
            // Three separate calls on the store; each one may fail alone.
            let _ = model_rm(&mut next, path);
            *m = next.clone();
            match kind {
                NewKind::File => model_write(&mut next, path, b"replaced".to_vec())?,
                NewKind::Dir => model_mkdir_p(&mut next, path)?,
                NewKind::Symlink => {
                    if let Some(par) = parent(path) {
                        let _ = model_mkdir_p(&mut next, par);
                        *m = next.clone();
                    }
                    model_symlink(&mut next, path, "target")?
                }
            }
        }
    }
    *m = next;
    Ok(())
}

// --- the same ops on a store ----------------------------------------------

fn store_apply(d: &mut Dofs, op: &Local) -> Result<(), DofsError> {
    let parents = WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    };
    match op {
        Local::Write(path, c) => d
            .write_file_with(&p(path), &c.bytes()[..], parents)
            .map(drop),
        Local::Append(path, c) => d.append_file(&p(path), &c.bytes()[..]).map(drop),
        Local::Rm(path) => d.rm(&p(path), true),
        Local::Rename(from, to) => d.rename(&p(from), &p(to)),
        Local::Chmod(path, mode) => d.chmod(&p(path), *mode),
        Local::Mkdir(path) => d.mkdir(&p(path), true),
        Local::Symlink(path, target) => d.symlink(target, &p(path)),
        Local::Replace(path, kind) => {
            let _ = d.rm(&p(path), true);
            match kind {
                NewKind::File => d
                    .write_file_with(&p(path), &b"replaced"[..], parents)
                    .map(drop),
                NewKind::Dir => d.mkdir(&p(path), true),
                NewKind::Symlink => {
                    if let Some(par) = parent(path) {
                        let _ = d.mkdir(&p(par), true);
                    }
                    d.symlink("target", &p(path))
                }
            }
        }
    }
}

fn run_local(peer: &Peer, model: &mut Model, op: &Local) {
    let expected = model_apply(model, op);
    let got = store_apply(&mut peer.store.borrow_mut(), op);
    if let Err(e) = &got {
        assert_ne!(e.code(), ErrorCode::Io, "{op:?} on {}: {e}", peer.name);
    }
    assert_eq!(
        expected.is_ok(),
        got.is_ok(),
        "{op:?} on {}: store said {got:?}",
        peer.name
    );
    assert_eq!(&peer.tree(), model, "after {op:?} on {}", peer.name);
}

fn expect_injected(result: Result<wsd_sync::driver::SyncReport, wsd_sync::SyncError>) {
    if let Err(e) = result {
        assert_eq!(
            e.code(),
            ErrorCode::Io,
            "only the injected failure may happen: {e}"
        );
    }
}

// --- strategies --------------------------------------------------------------

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 1..=3)
        .prop_map(|v| v.join("/"))
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        12 => prop::collection::vec(prop::sample::select(b"xy\n".to_vec()), 0..8).prop_map(Content::Small),
        1 => any::<u8>().prop_map(Content::Big),
    ]
}

fn local() -> impl Strategy<Value = Local> {
    let kind = prop_oneof![
        Just(NewKind::File),
        Just(NewKind::Dir),
        Just(NewKind::Symlink)
    ];
    prop_oneof![
        5 => (path(), content()).prop_map(|(p, c)| Local::Write(p, c)),
        1 => (path(), content()).prop_map(|(p, c)| Local::Append(p, c)),
        2 => path().prop_map(Local::Rm),
        2 => (path(), path()).prop_map(|(a, b)| Local::Rename(a, b)),
        2 => (path(), prop::sample::select(vec![0o600, 0o644, 0o700, 0o755])).prop_map(|(p, m)| Local::Chmod(p, m)),
        1 => path().prop_map(Local::Mkdir),
        1 => (path(), prop::sample::select(vec!["a", "../b", "/abs"])).prop_map(|(p, t)| Local::Symlink(p, t)),
        2 => (path(), kind).prop_map(|(p, k)| Local::Replace(p, k)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let side = prop_oneof![Just(Side::A), Just(Side::B)];
    prop_oneof![
        12 => (side, local()).prop_map(|(s, l)| Op::Local(s, l)),
        3 => Just(Op::Push),
        3 => Just(Op::Pull),
        1 => (0usize..6).prop_map(Op::InterruptedPush),
        1 => (0usize..6).prop_map(Op::InterruptedPull),
        1 => prop_oneof![Just(Side::A), Just(Side::B)].prop_map(Op::Prune),
        1 => Just(Op::ResetB),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn a_hub_pair_with_writes_on_both_sides_converges(
        ops in prop::collection::vec(op(), 1..40),
        tail_a in prop::collection::vec(local(), 0..5),
        tail_b in prop::collection::vec(local(), 0..5),
    ) {
        let (a, b) = (Peer::new("A"), Peer::new("B"));
        let (mut model_a, mut model_b) = (Model::new(), Model::new());
        for op in &ops {
            match op {
                Op::Local(Side::A, l) => run_local(&a, &mut model_a, l),
                Op::Local(Side::B, l) => run_local(&b, &mut model_b, l),
                Op::Push => drop(push(&a, &b).unwrap()),
                Op::Pull => drop(pull(&a, &b).unwrap()),
                Op::InterruptedPush(calls) => {
                    let (mut remote, faults) = faulty(&b, &a);
                    faults.calls_left.set(Some(*calls));
                    expect_injected(push_via(&a, "B", &mut remote));
                }
                Op::InterruptedPull(calls) => {
                    let (mut remote, faults) = faulty(&b, &a);
                    faults.calls_left.set(Some(*calls));
                    expect_injected(pull_via(&a, "B", &mut remote));
                }
                Op::Prune(side) => {
                    let peer = if *side == Side::A { &a } else { &b };
                    peer.store.borrow_mut().prune_tombstones().unwrap();
                }
                Op::ResetB => {
                    *b.store.borrow_mut() = Dofs::open_in_memory().unwrap();
                    let mut remote = b.remote_for(&a);
                    block_on(driver::reconcile(&mut *a.store.borrow_mut(), &mut remote, "B"))
                        .unwrap();
                }
            }
            if !matches!(op, Op::Local(..)) {
                // Sync follows last-applier rules the model does not encode;
                // it picks up whatever the stores now hold.
                model_a = a.tree();
                model_b = b.tree();
            }
        }
        quiesce(&a, &b);
        prop_assert_eq!(a.tree(), b.tree());
        a.store.borrow().check_integrity().unwrap();
        b.store.borrow().check_integrity().unwrap();

        // With nothing in conflict, every change arrives exactly.
        let mut model = a.tree();
        for l in &tail_a {
            run_local(&a, &mut model, l);
        }
        quiesce(&a, &b);
        prop_assert_eq!(&b.tree(), &model);
        prop_assert_eq!(&a.tree(), &model);
        for l in &tail_b {
            run_local(&b, &mut model, l);
        }
        quiesce(&a, &b);
        prop_assert_eq!(&a.tree(), &model);
        prop_assert_eq!(&b.tree(), &model);
        a.store.borrow().check_integrity().unwrap();
        b.store.borrow().check_integrity().unwrap();
    }
}
