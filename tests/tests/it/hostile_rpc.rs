//! A hostile peer on a real connection: raw Cap'n Proto calls built with
//! the generated client types, carrying malformed and oversized arguments
//! (non-canonical and non-UTF-8 paths, hashes of the wrong length, 100k
//! hashes, a 300 KiB object, a lying hash, bogus cursors, contradictory
//! entries, too many entries, hostile exec requests), then garbage bytes
//! and an oversized frame on the socket. Every call must fail with its
//! typed wire code, change nothing, and leave the daemon up: a normal push
//! afterwards converges.

use std::io::Write;
use std::net::TcpStream;

use capnp_rpc::{RpcSystem, rpc_twoparty_capnp, twoparty};
use futures::AsyncReadExt;
use sha2::{Digest, Sha256};
use tokio_util::compat::TokioAsyncReadCompatExt;
use wsd_schema::workspace_capnp as wire;
use wsd_tests::hub::{Hub, block_on_local};
use wsd_tests::{Daemon, dofs_digest, tree_digest};

struct Raw {
    sync: wire::sync::Client,
    shell: wire::shell::Client,
}

async fn connect_raw(addr: &str) -> Raw {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (reader, writer) = stream.compat().split();
    let network = Box::new(twoparty::VatNetwork::new(
        futures::io::BufReader::new(reader),
        futures::io::BufWriter::new(writer),
        rpc_twoparty_capnp::Side::Client,
        capnp::message::ReaderOptions::new(),
    ));
    let mut rpc = RpcSystem::new(network, None);
    let bootstrap: wire::bootstrap::Client = rpc.bootstrap(rpc_twoparty_capnp::Side::Server);
    tokio::task::spawn_local(async move {
        let _ = rpc.await;
    });
    let mut req = bootstrap.connect_request();
    req.get().set_token(&[]);
    req.get().set_protocol_version(wire::PROTOCOL_VERSION);
    req.get().set_peer("hostile");
    let ws = req
        .send()
        .promise
        .await
        .unwrap()
        .get()
        .unwrap()
        .get_workspace()
        .unwrap();
    let sync = ws.sync_request().send().pipeline.get_sync();
    let shell = ws.shell_request().send().pipeline.get_shell();
    Raw { sync, shell }
}

/// The wire code of a failed call (`"ECODE: message"` in the reason).
fn code<T>(r: Result<T, capnp::Error>) -> String {
    let e = match r {
        Ok(_) => return "OK".into(),
        Err(e) => e,
    };
    let reason = e
        .extra
        .strip_prefix("remote exception: ")
        .unwrap_or(&e.extra);
    match reason.split_once(": ") {
        Some((c, _))
            if c.starts_with('E') && c.chars().all(|c| c.is_ascii_uppercase() || c == '_') =>
        {
            c.to_owned()
        }
        _ => format!("untyped({:?}: {reason})", e.kind),
    }
}

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// One push of a single entry built by `build`.
async fn push_one(
    raw: &Raw,
    sender_rev: u64,
    build: impl FnOnce(wire::change_entry::Builder<'_>),
) -> String {
    let mut req = raw.sync.push_request();
    {
        let mut p = req.get();
        p.reborrow().init_sender().set_rev(sender_rev);
        p.reborrow().init_sender().set_complete(());
        p.reborrow().init_sender().set_rev(sender_rev);
        build(p.init_entries(1).get(0));
    }
    code(req.send().promise.await)
}

fn dir_entry(mut e: wire::change_entry::Builder<'_>, path: &str) {
    e.set_rev(1);
    e.set_path(path);
    let mut d = e.init_dir();
    d.set_mode(0o755);
    d.set_mtime(0);
}

#[test]
fn malformed_and_oversized_rpc_arguments_get_typed_errors_and_the_daemon_stays_up() {
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    // The state directory inside the root, as by default: a push must not
    // reach it.
    let mut daemon = Daemon::start(&served, &served.join(".wsd"), None);
    let addr = daemon.addr.clone();
    let mut results: Vec<(String, String, &[&str])> = Vec::new();
    block_on_local(async {
        let raw = connect_raw(&addr).await;
        let mut check = |what: &str, got: String, want: &'static [&'static str]| {
            eprintln!("hostile: {what}: {got}");
            results.push((what.to_owned(), got, want));
        };

        // Paths.
        for bad in [
            "a//b",
            "../escape",
            "/abs",
            "a/./b",
            "a/",
            "",
            "a/\0b",
            ".wsd/index.sqlite3",
        ] {
            let got = push_one(&raw, 1, |e| dir_entry(e, bad)).await;
            check(&format!("push dir {bad:?}"), got, &["EINVAL"]);
        }
        let got = push_one(&raw, 1, |mut e| {
            e.set_rev(1);
            e.set_path(capnp::text::Reader::from(&b"bad\xff\xfeutf8"[..]));
            e.init_dir().set_mode(0o755);
        })
        .await;
        check("push with a non-UTF-8 path", got, &["EINVAL"]);
        let long = "x/".repeat(300) + "y";
        let got = push_one(&raw, 1, |e| dir_entry(e, &long)).await;
        check("push with a path 300 deep", got, &["EINVAL", "ELIMIT"]);
        let mut req = raw.sync.read_entry_request();
        req.get().set_path("../../etc/passwd");
        check(
            "readEntry ../../etc/passwd",
            code(req.send().promise.await),
            &["EINVAL"],
        );

        // Entries that contradict themselves.
        let got = push_one(&raw, 1, |mut e| {
            e.set_rev(1);
            e.set_path("f");
            let mut f = e.init_file();
            f.set_mode(0o644);
            f.set_size(999);
            let mut c = f.init_chunks(1).get(0);
            c.set_hash(&sha(b"abc"));
            c.set_size(3);
        })
        .await;
        check(
            "push file whose size is not the sum of its chunks",
            got,
            &["EINVAL"],
        );
        let got = push_one(&raw, 1, |mut e| {
            e.set_rev(1);
            e.set_path("f");
            let mut f = e.init_file();
            f.set_mode(0o644);
            f.set_size(3);
            let mut c = f.init_chunks(1).get(0);
            c.set_hash(&[7u8; 31]);
            c.set_size(3);
        })
        .await;
        check(
            "push file with a 31-byte chunk hash",
            got,
            &["EINVAL", "EPROTOCOL"],
        );
        let got = push_one(&raw, 1, |mut e| {
            e.set_rev(1);
            e.set_path("f");
            let mut f = e.init_file();
            f.set_mode(0o644);
            f.set_size(3);
            let mut c = f.init_chunks(1).get(0);
            c.set_hash(&sha(b"never sent"));
            c.set_size(3);
        })
        .await;
        check("push file with an unknown chunk", got, &["EUNKNOWN_HASH"]);
        let got = push_one(&raw, 1, |mut e| {
            e.set_rev(1);
            e.set_path("s");
            let mut s = e.init_symlink();
            s.set_target("");
            s.set_mode(0o777);
        })
        .await;
        check("push symlink with an empty target", got, &["EINVAL"]);
        let got = push_one(&raw, 1, |mut e| {
            e.set_rev(1);
            e.set_path("s");
            e.init_symlink().set_target(&*"t".repeat(5000));
        })
        .await;
        check(
            "push symlink with a 5000-byte target",
            got,
            &["EINVAL", "ELIMIT"],
        );
        let got = push_one(&raw, 1, |mut e| {
            e.set_rev(1);
            e.set_path("m");
            e.init_dir().set_mode(0o170_777);
        })
        .await;
        check("push dir with file-type bits in its mode", got, &["EINVAL"]);

        // Too many entries in one push.
        let mut req = raw.sync.push_request();
        {
            let mut p = req.get();
            p.reborrow().init_sender().set_rev(1);
            let mut list = p.init_entries(5000);
            for i in 0..5000u32 {
                dir_entry(list.reborrow().get(i), &format!("many/d{i}"));
            }
        }
        check(
            "push of 5000 entries",
            code(req.send().promise.await),
            &["ELIMIT"],
        );

        // Cursors.
        let mut req = raw.sync.fetch_changes_request();
        {
            let mut c = req.get().init_after();
            c.set_rev(5);
            c.set_after("not//canonical");
        }
        check(
            "fetchChanges after a non-canonical cursor path",
            code(req.send().promise.await),
            &["EINVAL"],
        );
        let mut req = raw.sync.fetch_changes_request();
        req.get().init_after().set_rev(u64::MAX);
        let got = code(req.send().promise.await);
        check("fetchChanges after rev u64::MAX", got, &["OK", "EINVAL"]);
        let mut req = raw.sync.fetch_changes_request();
        {
            let mut ig = req.get().init_ignore(2000);
            for i in 0..2000 {
                ig.set(i, "*.o");
            }
        }
        check(
            "fetchChanges with 2000 ignore patterns",
            code(req.send().promise.await),
            &["ELIMIT"],
        );
        let mut req = raw.sync.fetch_changes_request();
        req.get().init_ignore(1).set(0, "[");
        let got = code(req.send().promise.await);
        check(
            "fetchChanges with a malformed ignore pattern",
            got,
            &["EINVAL", "OK"],
        );
        let mut req = raw.sync.fetch_changes_request();
        req.get().init_after().set_rev(0);
        let iter = req.send().pipeline.get_changes();
        let mut next = iter.next_request();
        next.get().set_max(u32::MAX);
        let got = code(next.send().promise.await);
        check("ChangeIterator.next(u32::MAX)", got, &["OK", "ELIMIT"]);

        // Hashes.
        let mut req = raw.sync.has_objects_request();
        {
            let mut l = req.get().init_hashes(100_000);
            for i in 0..100_000u32 {
                l.set(i, &sha(&i.to_le_bytes()));
            }
        }
        check(
            "hasObjects with 100k hashes",
            code(req.send().promise.await),
            &["ELIMIT"],
        );
        let mut req = raw.sync.has_objects_request();
        req.get().init_hashes(1).set(0, &[1u8; 33]);
        check(
            "hasObjects with a 33-byte hash",
            code(req.send().promise.await),
            &["EINVAL", "EPROTOCOL"],
        );
        let mut req = raw.sync.fetch_objects_request();
        req.get().init_hashes(1).set(0, &sha(b"not held"));
        let sink = raw.sync.push_objects_request().send().pipeline.get_sink();
        req.get().set_sink(sink);
        check(
            "fetchObjects of a hash not held",
            code(req.send().promise.await),
            &["EUNKNOWN_HASH"],
        );

        // Objects.
        let sink = raw.sync.push_objects_request().send().pipeline.get_sink();
        let big = vec![0x5au8; 300 * 1024];
        let mut w = sink.write_request();
        {
            let mut o = w.get().init_objects(1).get(0);
            o.set_hash(&sha(&big));
            o.set_bytes(&big);
        }
        let first = code(w.send().await);
        let done = code(sink.done_request().send().promise.await);
        check(
            "pushObjects of a 300 KiB object",
            if first == "OK" { done } else { first },
            &["ELIMIT"],
        );
        let sink = raw.sync.push_objects_request().send().pipeline.get_sink();
        let mut w = sink.write_request();
        {
            let mut o = w.get().init_objects(1).get(0);
            o.set_hash(&sha(b"something else"));
            o.set_bytes(b"these bytes");
        }
        let first = code(w.send().await);
        let done = code(sink.done_request().send().promise.await);
        check(
            "pushObjects whose hash lies",
            if first == "OK" { done } else { first },
            &["EPROTOCOL"],
        );
        let mut req = raw.sync.has_objects_request();
        {
            let mut l = req.get().init_hashes(2);
            l.set(0, &sha(b"something else"));
            l.set(1, &sha(b"these bytes"));
        }
        let held = req
            .send()
            .promise
            .await
            .unwrap()
            .get()
            .unwrap()
            .get_held()
            .unwrap()
            .len();
        check(
            "the lying object was not kept",
            if held == 0 {
                "OK".into()
            } else {
                format!("held {held}")
            },
            &["OK"],
        );

        // Exec.
        let sink: wire::exec_event_sink::Client = capnp_rpc::new_client(NullSink);
        let mut req = raw.shell.exec_request();
        {
            let mut r = req.get().init_request();
            r.set_command("true");
            r.set_cwd("../..");
        }
        req.get().set_events(sink.clone());
        check(
            "exec with cwd ../..",
            code(req.send().promise.await),
            &["EINVAL"],
        );
        let mut req = raw.shell.exec_request();
        req.get()
            .init_request()
            .set_command(&*"x".repeat(2 * 1024 * 1024));
        req.get().set_events(sink.clone());
        check(
            "exec of a 2 MiB command",
            code(req.send().promise.await),
            &["ELIMIT"],
        );
        let mut req = raw.shell.get_exec_request();
        req.get().set_id("no-such-exec");
        req.get().set_events(sink.clone());
        check(
            "getExec of an unknown id",
            code(req.send().promise.await),
            &["ENOENT"],
        );
        let mut req = raw.shell.kill_exec_request();
        req.get().set_id("no-such-exec");
        check(
            "killExec of an unknown id",
            code(req.send().promise.await),
            &["ENOENT"],
        );

        // The connection that carried all of that still serves.
        let got = code(raw.sync.watermarks_request().send().promise.await);
        check("watermarks on the same connection afterwards", got, &["OK"]);
    });

    // Garbage and an oversized frame on raw sockets: the daemon drops those
    // connections and stays up.
    let mut s = TcpStream::connect(&addr).unwrap();
    let _ = s.write_all(&[0xffu8; 4096]);
    drop(s);
    let mut s = TcpStream::connect(&addr).unwrap();
    // A segment table announcing one 64 MiB segment.
    let mut frame = vec![0u8, 0, 0, 0];
    frame.extend_from_slice(&(8u32 * 1024 * 1024).to_le_bytes());
    let _ = s.write_all(&frame);
    let _ = s.write_all(&vec![0u8; 1 << 20]);
    drop(s);

    let failures: Vec<String> = results
        .iter()
        .filter(|(_, got, want)| !want.contains(&got.as_str()))
        .map(|(what, got, want)| format!("{what}: got {got}, want one of {want:?}"))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(daemon.is_running(), "the daemon died");

    // Nothing partial landed, and a normal push still works.
    let before: Vec<_> = tree_digest(&served).into_keys().collect();
    assert!(
        before.is_empty(),
        "hostile calls changed the tree: {before:?}"
    );
    block_on_local(async {
        let mut hub = Hub::open(&tmp.path().join("authority.dofs"), &addr);
        hub.put("after/hostile.txt", b"still serving", 0o644);
        hub.push().await.unwrap();
        hub.converge().await.unwrap();
        assert_eq!(dofs_digest(&hub.dofs), tree_digest(&served));
    });
    assert!(daemon.is_running());
    daemon.stop();
}

struct NullSink;

impl wire::exec_event_sink::Server for NullSink {
    async fn event(
        self: std::rc::Rc<Self>,
        _: wire::exec_event_sink::EventParams,
    ) -> Result<(), capnp::Error> {
        Ok(())
    }

    async fn end(
        self: std::rc::Rc<Self>,
        _: wire::exec_event_sink::EndParams,
        _: wire::exec_event_sink::EndResults,
    ) -> Result<(), capnp::Error> {
        Ok(())
    }
}
