//! The store rev an exit event carries (`ExecEvent.rev`), against a real
//! daemon child: what a caller compares with its fetch cursor to skip the
//! pull after a command that changed nothing.

use std::time::Duration;

use wsd_client::{ClientOptions, Endpoint, ExecRequest, WsdHandle};
use wsd_test_support::Daemon;

/// Runs `command` to its end on `h` and returns its exit's rev.
async fn exit_rev(h: &WsdHandle, command: &str) -> u64 {
    let mut events = h
        .exec(ExecRequest {
            command: command.to_owned(),
            ..ExecRequest::default()
        })
        .await
        .unwrap();
    loop {
        let ev = events
            .next()
            .await
            .unwrap()
            .expect("an exit before the end");
        if ev.is_exit() {
            return ev.rev;
        }
    }
}

#[test]
fn an_exit_carries_the_store_rev_after_the_commands_writes_were_settled() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let daemon = Daemon::start(&root, &dir.path().join("state"), None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), async {
            let endpoint: Endpoint = daemon.addr.parse().unwrap();
            let opts = ClientOptions {
                peer: "exit-rev-test".into(),
                ..ClientOptions::default()
            };
            let h = WsdHandle::connect(endpoint, opts).await.unwrap();
            let wrote = exit_rev(&h, "echo one > a.txt").await;
            assert!(wrote > 0, "the write is at a rev of its own");
            assert_eq!(
                wrote,
                h.status().await.unwrap().current_rev,
                "settled before the exit: nothing comes after it"
            );
            let quiet = exit_rev(&h, "true").await;
            assert_eq!(quiet, wrote, "a command that writes nothing moves no rev");
            let again = exit_rev(&h, "echo two > a.txt; mkdir d").await;
            assert!(again > quiet, "{again} > {quiet}");
            assert_eq!(again, h.status().await.unwrap().current_rev);
        })
        .await
        .expect("the test hung");
    });
}
