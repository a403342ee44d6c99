//! `notification.*` over the WebSocket: the seed's defaults, TTLs and
//! clamps at their edges, signals to every socket of the owner and no one
//! else, another user's ids answered with `null`, and expiry driven by
//! the timer table (across a restart too).

use gsv_kernel::domains::notification::store;
use serde_json::{Value, json};

use crate::harness::{ALICE_PW, BOB_PW, TestKernel, Watcher, err_of, eventually};

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

async fn exists(k: &TestKernel, id: &Value) -> bool {
    let id = id.as_str().unwrap().to_owned();
    k.kernel
        .db()
        .call(move |c| store::exists(c, &id))
        .await
        .unwrap()
}

async fn timer_due(k: &TestKernel, id: &Value) -> Option<i64> {
    let id = format!("notification:{}", id.as_str().unwrap());
    k.kernel
        .db()
        .call(move |c| {
            use rusqlite::OptionalExtension;
            Ok(
                c.query_row("SELECT due_at FROM timers WHERE id = ?1", [id], |r| {
                    r.get(0)
                })
                .optional()?,
            )
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn notifications_are_signalled_to_every_socket_of_the_owner_and_no_one_else() {
    let k = TestKernel::with_users().await;
    let mut a1 = Watcher::new(k.alice().await);
    let mut a2 = Watcher::new(k.login_from("second", "alice", ALICE_PW).await);
    let mut b = Watcher::new(k.login_from("bobs", "bob", BOB_PW).await);

    let n = a1
        .call(
            "notification.create",
            json!({"title": "  Build finished ", "body": " all green ", "level": "success",
                   "actions": [{"kind": " open ", "label": "Open", "target": "/x", "args": {"a": 1}},
                               {"kind": "", "label": "dropped"}]}),
        )
        .await["notification"]
        .clone();
    assert_eq!(n["title"], "Build finished");
    assert_eq!(n["body"], "all green");
    assert_eq!(n["level"], "success");
    assert_eq!(n["source"], json!({"kind": "user"}));
    assert_eq!(
        n["actions"],
        json!([{"kind": "open", "label": "Open", "target": "/x", "args": {"a": 1}}])
    );
    assert_eq!(
        (n["readAt"].clone(), n["dismissedAt"].clone()),
        (Value::Null, Value::Null)
    );
    let created = n["createdAt"].as_i64().unwrap();
    assert_eq!(n["expiresAt"].as_i64().unwrap() - created, 30 * DAY_MS);
    for w in [&mut a1, &mut a2] {
        assert_eq!(w.signal("notification.created").await["notification"], n);
    }

    let read = a2
        .call(
            "notification.mark_read",
            json!({"notificationId": n["notificationId"]}),
        )
        .await["notification"]
        .clone();
    let read_at = read["readAt"].as_i64().unwrap();
    assert_eq!(read["expiresAt"].as_i64().unwrap() - read_at, 7 * DAY_MS);
    assert_eq!(
        timer_due(&k, &n["notificationId"]).await,
        read["expiresAt"].as_i64()
    );
    for w in [&mut a1, &mut a2] {
        assert_eq!(w.signal("notification.updated").await["notification"], read);
    }
    let unread = a1
        .call("notification.list", json!({"includeRead": false}))
        .await;
    assert_eq!(unread["notifications"], json!([]));

    let gone = a1
        .call(
            "notification.dismiss",
            json!({"notificationId": n["notificationId"]}),
        )
        .await["notification"]
        .clone();
    let dismissed_at = gone["dismissedAt"].as_i64().unwrap();
    assert_eq!(gone["readAt"], read_at);
    assert_eq!(
        gone["expiresAt"].as_i64().unwrap() - dismissed_at,
        3 * DAY_MS
    );
    for w in [&mut a1, &mut a2] {
        assert_eq!(
            w.signal("notification.dismissed").await["notification"],
            gone
        );
    }
    let l = a1.call("notification.list", json!({})).await;
    assert_eq!(l["notifications"], json!([]));
    let l = a1
        .call("notification.list", json!({"includeDismissed": true}))
        .await;
    assert_eq!(l["notifications"], json!([gone]));

    // Bob: another user's id is null, like a missing one, and changes
    // nothing; his socket saw none of alice's signals (anything sent to
    // it would have been queued before this answer).
    for id in [n["notificationId"].clone(), json!("no-such-id")] {
        for call in ["notification.mark_read", "notification.dismiss"] {
            let r = b.call(call, json!({"notificationId": id})).await;
            assert_eq!(r, json!({"notification": null}), "{call}");
        }
    }
    assert_eq!(
        b.call("notification.list", json!({"includeDismissed": true}))
            .await,
        json!({"notifications": []})
    );
    assert!(b.seen.is_empty(), "bob saw {:?}", b.seen_names());
    let l = a1
        .call("notification.list", json!({"includeDismissed": true}))
        .await;
    assert_eq!(l["notifications"], json!([gone]));
    // And alice's other socket saw no signal for bob's attempts.
    a2.call("notification.list", json!({})).await;
    assert!(a2.seen.is_empty(), "{:?}", a2.seen_names());

    let f = a1
        .request("notification.create", json!({"title": "   "}))
        .await;
    let (code, msg) = err_of(&f);
    assert_eq!(code, 400);
    assert!(msg.contains("title"), "{msg}");
    let f = a1
        .request(
            "notification.create",
            json!({"title": "x", "level": "fatal"}),
        )
        .await;
    assert_eq!(err_of(&f).0, 400);
    let f = a1.request("notification.mark_read", json!({})).await;
    assert!(err_of(&f).1.contains("notificationId"));
}

#[tokio::test]
async fn ttl_and_limit_clamp_at_their_edges() {
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let ttl = |n: &Value| n["expiresAt"].as_i64().unwrap() - n["createdAt"].as_i64().unwrap();
    for (asked, got) in [
        (json!(10), 1000),
        (json!(1000), 1000),
        (json!(1500.7), 1500),
        (json!(90 * DAY_MS), 90 * DAY_MS),
        (json!(90 * DAY_MS + 1), 90 * DAY_MS),
    ] {
        let n = a
            .call("notification.create", json!({"title": "t", "ttlMs": asked}))
            .await["notification"]
            .clone();
        assert_eq!(ttl(&n), got, "ttlMs {asked}");
    }
    for i in 0..500 {
        a.call(
            "notification.create",
            json!({"title": format!("n{i}"), "ttlMs": DAY_MS}),
        )
        .await;
        // Signals are read as they come, so the socket's queue never fills.
        a.seen.clear();
    }
    let count = |l: &Value| l["notifications"].as_array().unwrap().len();
    let l = a.call("notification.list", json!({"limit": 1000})).await;
    assert_eq!(count(&l), 500);
    assert_eq!(l["notifications"][0]["title"], "n499", "newest first");
    assert_eq!(count(&a.call("notification.list", json!({})).await), 100);
    assert_eq!(
        count(&a.call("notification.list", json!({"limit": 0})).await),
        1
    );
    assert_eq!(
        count(&a.call("notification.list", json!({"limit": 7})).await),
        7
    );
}

#[tokio::test]
async fn the_timer_table_expires_notifications_even_across_a_restart() {
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let short = a
        .call(
            "notification.create",
            json!({"title": "brief", "ttlMs": 10}),
        )
        .await["notification"]
        .clone();
    let id = short["notificationId"].clone();
    assert_eq!(timer_due(&k, &id).await, short["expiresAt"].as_i64());
    // Nobody lists (listing prunes too): the timer alone removes it.
    eventually("the expiry timer", || async {
        (!exists(&k, &id).await).then_some(())
    })
    .await;
    assert_eq!(timer_due(&k, &id).await, None);

    let n = a
        .call(
            "notification.create",
            json!({"title": "outlives", "ttlMs": 3000}),
        )
        .await["notification"]
        .clone();
    let expires = n["expiresAt"].as_i64().unwrap();
    a.c.close().await;
    let stopped = k.stop().await;
    let wait = (expires + 200 - gsv_kernel::db::now_ms()).max(0) as u64;
    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    let k = stopped.start().await;
    eventually("the expiry after the restart", || async {
        (!exists(&k, &n["notificationId"]).await).then_some(())
    })
    .await;
}
