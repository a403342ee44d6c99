//! `repo.*`'s numbers (issue 30), on the store the handlers call (the
//! WebSocket round trip is `kernel`'s `fs.read` figure on top):
//!
//! * `repo.apply` of 100 files in one commit: p50/p99 of 50 (target p50
//!   ≤ 50 ms);
//! * `repo.log` of one 100-entry page deep in a 10,000-commit history:
//!   p50/p99 of 50 (target ≤ 10 ms);
//! * `repo.read` of a small file: p50/p99 of 1000 (target p50 ≤ 2 ms).
//!
//! `cargo bench -p wsd-bench --bench repo` prints them; results go in
//! `bench/RESULTS.md` by hand.

use std::time::{Duration, Instant};

use gsv_kernel::domains::repo::names::Slug;
use gsv_kernel::domains::repo::store::{self, Author, Commit, Op, RepoStore};

const HISTORY: usize = 10_000;

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut v: Vec<Duration>) {
    let (p50, p99) = (percentile(&mut v, 0.5), percentile(&mut v, 0.99));
    println!("{name}: p50 {p50:?}  p99 {p99:?}  (n={})", v.len());
}

/// One commit of `ops` on `main`.
fn commit(repo: &gix::Repository, author: &Author, ops: &[Op]) {
    store::apply(
        repo,
        &Commit {
            branch: "main",
            message: "bench",
            author,
            expected_head: None,
            allow_empty: true,
            ops,
        },
    )
    .unwrap();
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let repos = RepoStore::new(dir.path().join("repos"));
    let author = Author {
        name: "bench".into(),
        email: "bench@gsv.local".into(),
    };
    let slug = Slug::parse("bench/apply").unwrap();
    let (repo, _) = repos.open_or_init(&slug, "main").unwrap();
    let mut applies = Vec::new();
    for round in 0..50 {
        let ops: Vec<Op> = (0..100)
            .map(|i| Op::Put {
                path: format!("dir{}/file{i}.txt", i % 10),
                bytes: format!("round {round} file {i}\n").repeat(20).into_bytes(),
            })
            .collect();
        let t = Instant::now();
        commit(&repo, &author, &ops);
        applies.push(t.elapsed());
    }
    report("repo.apply 100 files", applies);

    let mut reads = Vec::new();
    let head = store::resolve_commit(&repo, "main").unwrap();
    for _ in 0..1000 {
        let t = Instant::now();
        let found = store::read(&repo, head, "dir3/file13.txt").unwrap();
        reads.push(t.elapsed());
        assert!(matches!(found, store::Found::File { .. }));
    }
    report("repo.read small file", reads);

    let slug = Slug::parse("bench/history").unwrap();
    let (repo, _) = repos.open_or_init(&slug, "main").unwrap();
    let started = Instant::now();
    for i in 0..HISTORY {
        let ops = [Op::Put {
            path: "counter".into(),
            bytes: i.to_string().into_bytes(),
        }];
        commit(&repo, &author, &ops);
    }
    println!("(built {HISTORY} commits in {:?})", started.elapsed());
    let head = store::resolve_commit(&repo, "main").unwrap();
    let mut logs = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let page = store::log(&repo, head, 9_000, 100).unwrap();
        logs.push(t.elapsed());
        assert_eq!(page.len(), 100);
    }
    report("repo.log page of 100 at offset 9000 of 10000", logs);
    let mut first = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        store::log(&repo, head, 0, 30).unwrap();
        first.push(t.elapsed());
    }
    report("repo.log first page of 30", first);
}
