//! Pushes a local directory into a wsd workspace, runs a command there and
//! pulls back what it changed, from a plain multi-threaded tokio program
//! (no `LocalSet`: the `WsdHandle` keeps the `!Send` connection on its own
//! thread).
//!
//! ```text
//! wsd serve --root /tmp/ws --state /tmp/ws-state &
//! cargo run -p wsd-client --example push_and_run -- 127.0.0.1:45678 ./some-dir 'ls -l; touch made-here'
//! ```
//!
//! The directory is read into a throwaway `wsd-dofs` store (a stand-in for
//! a gateway's own store); `WSD_TOKEN` is sent as the token when set.

use std::error::Error;
use std::path::Path;
use std::sync::{Arc, Mutex};

use wsd_client::{ClientOptions, ExecEventKind, ExecRequest, WsdHandle};
use wsd_dofs::{Dofs, WriteOptions};
use wsd_sync::SyncPath;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, dir, command] = args.as_slice() else {
        return Err("usage: push_and_run HOST:PORT|unix:/PATH DIR COMMAND".into());
    };
    let scratch = tempfile::tempdir()?;
    let mut store = Dofs::open(scratch.path().join("local.db"))?;
    copy_tree(Path::new(dir), Path::new(dir), &mut store)?;
    let store = Arc::new(Mutex::new(store));

    let opts = ClientOptions {
        token: std::env::var("WSD_TOKEN").ok().map(String::into_bytes),
        peer: "push-and-run-example".into(),
        ..ClientOptions::default()
    };
    let wsd = WsdHandle::connect(addr.parse()?, opts).await?;

    // Any task on any worker thread may use the handle.
    let pushed = tokio::spawn({
        let (wsd, store) = (wsd.clone(), store.clone());
        async move { wsd.push(store).await }
    })
    .await??;
    println!(
        "pushed {} entries ({} object bytes)",
        pushed.sync.entries, pushed.sync.object_bytes
    );

    let mut events = wsd
        .exec(ExecRequest {
            command: command.clone(),
            ..ExecRequest::default()
        })
        .await?;
    let mut exit = None;
    while let Some(event) = events.next().await? {
        match event.kind {
            ExecEventKind::Stdout(b) => print!("{}", String::from_utf8_lossy(&b)),
            ExecEventKind::Stderr(b) => eprint!("{}", String::from_utf8_lossy(&b)),
            ExecEventKind::Exit(code) => exit = Some(code),
        }
    }
    println!("exit {}", exit.unwrap_or(-1));

    let pulled = wsd.pull(store).await?;
    for e in &pulled.applied {
        match e.kind {
            None => println!("deleted {}", e.path),
            Some(kind) => println!("{kind:?} {} ({} bytes, mode {:o})", e.path, e.size, e.mode),
        }
    }
    Ok(())
}

/// Copies regular files and directories under `dir` into `store`.
fn copy_tree(root: &Path, dir: &Path, store: &mut Dofs) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let rel = entry
            .path()
            .strip_prefix(root)?
            .to_string_lossy()
            .into_owned();
        let path = SyncPath::new(rel)?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            store.mkdir(&path, true)?;
            copy_tree(root, &entry.path(), store)?;
        } else if kind.is_file() {
            let file = std::fs::File::open(entry.path())?;
            let opts = WriteOptions {
                create_parents: true,
                ..WriteOptions::default()
            };
            store.write_file_with(&path, file, opts)?;
        }
    }
    Ok(())
}
