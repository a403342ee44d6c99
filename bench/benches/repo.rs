//! `repo.*`'s numbers (issue 30), each twice: on the store the handlers
//! call, and as the call over a real WebSocket to an in-process kernel on
//! loopback (which adds the frame, the access check, opening the
//! repository and the blocking-pool hop):
//!
//! * `repo.apply` of 100 files in one commit (target p50 ≤ 50 ms);
//! * `repo.log` of a 10,000-commit history: the first page (30, the
//!   default) and one 100-entry page at offset 9,000 (target ≤ 10 ms);
//! * `repo.read` of a small file (target p50 ≤ 2 ms).
//!
//! The history is made by `store::apply`, so it is packed the way applies
//! pack it (one pack per commit, small packs merged).
//!
//! `cargo bench -p wsd-bench --bench repo` prints them; results go in
//! `bench/RESULTS.md` by hand.

use std::time::Instant;

use gsv_kernel::KernelConfig;
use gsv_kernel::domains::repo::names::Slug;
use gsv_kernel::domains::repo::store::{self, Author, Commit, Op, RepoStore};
use serde_json::json;
use wsd_bench::gateway::{login, report, serve_set_up};

const HISTORY: usize = 10_000;

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

/// Round `round`'s 100 files: ten directories of ten, 300–400 bytes each.
fn hundred_files(round: usize) -> Vec<(String, String)> {
    (0..100)
        .map(|i| {
            (
                format!("dir{}/file{i}.txt", i % 10),
                format!("round {round} file {i}\n").repeat(20),
            )
        })
        .collect()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let repos = RepoStore::new(data.join("repos"));
    let author = Author {
        name: "alice".into(),
        email: "alice@gsv.local".into(),
    };
    store_figures(&repos, &author);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(call_figures(data));
}

/// The store's own figures; leaves `alice/history` (10,000 commits) for
/// the calls.
fn store_figures(repos: &RepoStore, author: &Author) {
    let slug = Slug::parse("alice/apply").unwrap();
    let (repo, _) = repos.open_or_init(&slug, "main").unwrap();
    let mut applies = Vec::new();
    for round in 0..50 {
        let ops: Vec<Op> = hundred_files(round)
            .into_iter()
            .map(|(path, text)| Op::Put {
                path,
                bytes: text.into_bytes(),
            })
            .collect();
        let t = Instant::now();
        commit(&repo, author, &ops);
        applies.push(t.elapsed());
    }
    report("store: repo.apply 100 files", applies);

    let mut reads = Vec::new();
    let head = store::resolve_commit(&repo, "main").unwrap();
    for _ in 0..1000 {
        let t = Instant::now();
        let found = store::read(&repo, head, "dir3/file13.txt").unwrap();
        reads.push(t.elapsed());
        assert!(matches!(found, store::Found::File { .. }));
    }
    report("store: repo.read small file", reads);

    let slug = Slug::parse("alice/history").unwrap();
    repos.open_or_init(&slug, "main").unwrap();
    let started = Instant::now();
    for i in 0..HISTORY {
        let ops = [Op::Put {
            path: "counter".into(),
            bytes: i.to_string().into_bytes(),
        }];
        // A repository opened per commit, as each call opens one: one gix
        // store kept across hundreds of pack merges starts to miss objects.
        commit(&repos.open(&slug).unwrap(), author, &ops);
    }
    let repo = repos.open(&slug).unwrap();
    println!("(built {HISTORY} commits in {:?})", started.elapsed());
    let head = store::resolve_commit(&repo, "main").unwrap();
    let mut first = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let page = store::log(&repo, head, 0, 30).unwrap();
        first.push(t.elapsed());
        assert_eq!(page.len(), 30);
    }
    report("store: repo.log first page of 30 of 10000", first);
    // The first deep page also writes the first-parent index (a walk of
    // the whole history); the pages after it read the index.
    let t = Instant::now();
    let page = store::log(&repo, head, 9_000, 100).unwrap();
    println!(
        "store: repo.log first page at offset 9000 (builds the index): {:?}",
        t.elapsed()
    );
    assert_eq!(page.len(), 100);
    let mut deep = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let page = store::log(&repo, head, 9_000, 100).unwrap();
        deep.push(t.elapsed());
        assert_eq!(page.len(), 100);
    }
    report("store: repo.log page of 100 at offset 9000 of 10000", deep);
}

/// The same over the WebSocket, as alice, against a kernel on `data`.
async fn call_figures(data: std::path::PathBuf) {
    let (kernel, url) = serve_set_up(KernelConfig::new(data)).await;
    let mut c = login(&url, "alice", "alice-password").await;
    c.call("repo.create", json!({"repo": "alice/calls"}))
        .await
        .unwrap();
    let mut applies = Vec::new();
    for round in 0..50 {
        let ops: Vec<_> = hundred_files(round)
            .into_iter()
            .map(|(path, content)| json!({"type": "put", "path": path, "content": content}))
            .collect();
        let args = json!({"repo": "alice/calls", "message": "bench", "ops": ops});
        let t = Instant::now();
        let r = c.call("repo.apply", args).await.unwrap();
        applies.push(t.elapsed());
        assert_eq!(r["ok"], true, "{r}");
    }
    report("call: repo.apply 100 files", applies);

    let read = json!({"repo": "alice/calls", "path": "dir3/file13.txt"});
    let mut reads = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        let r = c.call("repo.read", read.clone()).await.unwrap();
        reads.push(t.elapsed());
        assert_eq!(r["kind"], "file", "{r}");
    }
    report("call: repo.read small file", reads);

    for (name, args, n) in [
        (
            "call: repo.log first page (30) of 10000",
            json!({"repo": "alice/history"}),
            30,
        ),
        (
            "call: repo.log page of 100 at offset 9000 of 10000",
            json!({"repo": "alice/history", "limit": 100, "offset": 9000}),
            100,
        ),
    ] {
        let mut logs = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            let r = c.call("repo.log", args.clone()).await.unwrap();
            logs.push(t.elapsed());
            assert_eq!(r["entries"].as_array().map(Vec::len), Some(n), "{r}");
        }
        report(name, logs);
    }
    c.close().await;
    kernel.shutdown().await;
}
