//! Device routing end to end, against a scripted driver that speaks raw
//! JSON frames (not `gsv node`): it proves the documented driver protocol
//! (`kernel/PROTOCOL.md`) is all a driver needs, and lets each test decide
//! exactly when (and whether) the device answers.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{
    ScriptedDriver, TestKernel, err_of, node_token, with_driver, with_driver_tuned,
};

async fn route_rows(k: &TestKernel, id: &str) -> i64 {
    let id = id.to_owned();
    k.kernel
        .db()
        .call(move |c| {
            Ok(c.query_row(
                "SELECT count(*) FROM routing_table WHERE id = ?1",
                [&id],
                |r| r.get(0),
            )?)
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_routed_call_reaches_the_driver_under_a_kernel_id_and_its_answer_comes_back() {
    let (k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request(
            "r1",
            "fs.read",
            json!({"target": "dev1", "path": "notes.txt"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    assert_eq!(req["call"], "fs.read");
    assert_ne!(req["id"], "r1", "the driver sees the kernel's own id");
    assert_eq!(
        req["args"],
        json!({"path": "notes.txt"}),
        "target is removed"
    );
    let rid = req["id"].as_str().unwrap().to_owned();
    assert_eq!(
        route_rows(&k, &rid).await,
        1,
        "the route row exists before the answer"
    );
    drv.reply(&req["id"], json!({"ok": true, "content": "1\thello"}))
        .await;
    let res = alice.response_to("r1").await.unwrap();
    assert_eq!(res["ok"], true, "{res}");
    assert_eq!(res["data"]["content"], "1\thello");
    assert_eq!(route_rows(&k, &rid).await, 0, "an answered route is gone");
}

#[tokio::test]
async fn two_callers_with_the_same_request_id_get_their_own_answers() {
    let (k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    // A second client id: the same one would supersede the first socket.
    let mut alice2 = k.raw().await;
    alice2
        .call(
            "sys.connect",
            crate::harness::user_connect(
                json!({"username": "alice", "password": crate::harness::ALICE_PW}),
            ),
        )
        .await
        .unwrap();
    alice
        .send_request("same", "fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    alice2
        .send_request("same", "fs.read", json!({"target": "dev1", "path": "b"}))
        .await
        .unwrap();
    let (r1, r2) = (drv.next_req().await, drv.next_req().await);
    assert_ne!(r1["id"], r2["id"]);
    for r in [&r1, &r2] {
        let path = r["args"]["path"].clone();
        drv.reply(&r["id"], json!({"ok": true, "content": path}))
            .await;
    }
    assert_eq!(
        alice.response_to("same").await.unwrap()["data"]["content"],
        "a"
    );
    assert_eq!(
        alice2.response_to("same").await.unwrap()["data"]["content"],
        "b"
    );
}

#[tokio::test]
async fn an_unknown_device_and_another_users_device_are_both_403() {
    let (k, mut alice, _drv) = with_driver(&["fs.*"]).await;
    let f = alice
        .request("fs.read", json!({"target": "nope", "path": "a"}))
        .await
        .unwrap();
    assert_eq!(err_of(&f), (403, "Access denied to device: nope".into()));
    let mut bob = k.bob().await;
    let f = bob
        .request("fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    assert_eq!(err_of(&f), (403, "Access denied to device: dev1".into()));
}

#[tokio::test]
async fn a_call_the_device_does_not_implement_is_400_and_never_sent() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.read"]).await;
    let f = alice
        .request(
            "fs.write",
            json!({"target": "dev1", "path": "a", "content": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(
        err_of(&f),
        (400, "Device dev1 does not implement fs.write".into())
    );
    // The next thing the driver sees is the call it does implement.
    alice
        .send_request("r2", "fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    assert_eq!(drv.next_req().await["call"], "fs.read");
}

#[tokio::test]
async fn a_device_whose_driver_left_is_offline_503() {
    let (k, mut alice, drv) = with_driver(&["fs.*"]).await;
    drv.ws.close().await;
    // The disconnect is processed asynchronously; wait (bounded) until the
    // row says offline.
    let mut last = Value::Null;
    for _ in 0..200 {
        last = alice
            .call("sys.device.get", json!({"deviceId": "dev1"}))
            .await
            .unwrap();
        if last["device"]["online"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last["device"]["online"], false, "{last}");
    let f = alice
        .request("fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    assert_eq!(err_of(&f), (503, "Device offline: dev1".into()));
    drop(k);
}

#[tokio::test]
async fn a_device_marked_online_without_a_live_connection_is_503_no_active_connection() {
    let (k, mut alice, drv) = with_driver(&["fs.*"]).await;
    drv.ws.close().await;
    for _ in 0..200 {
        let d = alice
            .call("sys.device.get", json!({"deviceId": "dev1"}))
            .await
            .unwrap();
        if d["device"]["online"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // As a row left behind by a kernel that stopped with the device online.
    k.kernel
        .db()
        .call(|c| {
            c.execute("UPDATE devices SET online = 1 WHERE device_id = 'dev1'", [])?;
            Ok(())
        })
        .await
        .unwrap();
    let f = alice
        .request("fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    assert_eq!(
        err_of(&f),
        (503, "No active connection for device: dev1".into())
    );
}

#[tokio::test]
async fn a_device_that_never_answers_gives_504_and_is_told_to_stop() {
    let (k, mut alice, mut drv) = with_driver_tuned(&["fs.*"], |c| {
        c.routed_call_ttl = Duration::from_millis(300)
    })
    .await;
    alice
        .send_request("slow", "fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    let res = alice.response_to("slow").await.unwrap();
    assert_eq!(
        err_of(&res),
        (504, "Syscall fs.read timed out (device: dev1)".into())
    );
    let cancel = drv.next_sig("request.cancel").await;
    assert_eq!(cancel["payload"]["id"], req["id"]);
    assert_eq!(cancel["payload"]["reason"], "Request timed out");
    // A late answer is dropped, and the connection stays usable.
    drv.reply(&req["id"], json!({"ok": true, "content": "late"}))
        .await;
    alice
        .send_request("next", "fs.read", json!({"target": "dev1", "path": "b"}))
        .await
        .unwrap();
    let req2 = drv.next_req().await;
    drv.reply(&req2["id"], json!({"ok": true, "content": "b"}))
        .await;
    let f = alice.recv().await.unwrap();
    assert_eq!(f["id"], "next", "no late answer to the timed-out call: {f}");
    assert_eq!(f["data"]["content"], "b");
    drop(k);
}

#[tokio::test]
async fn a_driver_that_disconnects_mid_call_fails_its_routes_with_503() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request("r1", "fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    drv.next_req().await;
    drv.ws.close().await;
    let res = alice.response_to("r1").await.unwrap();
    assert_eq!(err_of(&res), (503, "Device disconnected: dev1".into()));
}

#[tokio::test]
async fn a_newer_driver_connection_supersedes_the_old_one_and_takes_its_calls() {
    let (k, mut alice, mut old) = with_driver(&["fs.*"]).await;
    alice
        .send_request("r1", "fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    old.next_req().await;
    let token = node_token(&mut alice, "dev1").await;
    let mut new = ScriptedDriver::connect(&k, "alice", &token, "dev1", &["fs.*"]).await;
    // The old connection is closed with the reference's reason...
    let closed = loop {
        match old.ws.recv().await {
            Ok(_) => continue,
            Err(e) => break e.to_string(),
        }
    };
    assert!(closed.contains("Replaced by newer connection"), "{closed}");
    // ...and its route fails now, not at its TTL.
    let res = alice.response_to("r1").await.unwrap();
    assert_eq!(err_of(&res), (503, "Device disconnected: dev1".into()));
    alice
        .send_request("r2", "fs.read", json!({"target": "dev1", "path": "b"}))
        .await
        .unwrap();
    let req = new.next_req().await;
    new.reply(&req["id"], json!({"ok": true, "content": "new"}))
        .await;
    assert_eq!(
        alice.response_to("r2").await.unwrap()["data"]["content"],
        "new"
    );
    let d = alice
        .call("sys.device.get", json!({"deviceId": "dev1"}))
        .await
        .unwrap();
    assert_eq!(
        d["device"]["online"], true,
        "the old close does not take it offline"
    );
}

#[tokio::test]
async fn a_cancelled_call_is_cancelled_at_the_device_and_never_answered() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request("c1", "fs.read", json!({"target": "dev1", "path": "a"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    alice
        .send_text(
            json!({"type": "sig", "signal": "request.cancel", "payload": {"id": "c1"}}).to_string(),
        )
        .await
        .unwrap();
    let cancel = drv.next_sig("request.cancel").await;
    assert_eq!(cancel["payload"]["id"], req["id"]);
    drv.reply(&req["id"], json!({"ok": true, "content": "too late"}))
        .await;
    alice
        .send_request("c2", "fs.read", json!({"target": "dev1", "path": "b"}))
        .await
        .unwrap();
    let req2 = drv.next_req().await;
    drv.reply(&req2["id"], json!({"ok": true, "content": "b"}))
        .await;
    let f = alice.recv().await.unwrap();
    assert_eq!(f["id"], "c2", "the cancelled call got an answer: {f}");
}

#[tokio::test]
async fn a_devices_frame_level_failure_is_relayed_with_its_code() {
    let (_k, mut alice, mut drv) = with_driver(&["shell.exec"]).await;
    alice
        .send_request(
            "x",
            "shell.exec",
            json!({"target": "dev1", "input": "true"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    let res = json!({"type": "res", "id": req["id"], "ok": false,
        "error": {"code": -1, "message": "spawn failed"}});
    drv.ws.send_text(res.to_string()).await.unwrap();
    let f = alice.response_to("x").await.unwrap();
    assert_eq!(err_of(&f), (-1, "spawn failed".into()));
}

#[tokio::test]
async fn a_shell_session_continues_on_its_device_for_its_owner_only() {
    let (k, mut alice, mut drv) = with_driver(&["shell.exec"]).await;
    alice
        .send_request(
            "s",
            "shell.exec",
            json!({"target": "dev1", "input": "sleep 5", "timeout": 1000}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    drv.reply(
        &req["id"],
        json!({"status": "running", "sessionId": "sess1", "output": ""}),
    )
    .await;
    assert_eq!(
        alice.response_to("s").await.unwrap()["data"]["status"],
        "running"
    );

    // Without target, the continuation goes to the session's device.
    alice
        .send_request(
            "p",
            "shell.exec",
            json!({"sessionId": "sess1", "input": ""}),
        )
        .await
        .unwrap();
    let poll = drv.next_req().await;
    assert_eq!(poll["args"]["sessionId"], "sess1");
    drv.reply(
        &poll["id"],
        json!({"status": "running", "sessionId": "sess1", "output": "tick"}),
    )
    .await;
    assert_eq!(
        alice.response_to("p").await.unwrap()["data"]["output"],
        "tick"
    );

    // Someone else's continuation is refused before reaching the device.
    let mut bob = k.bob().await;
    let f = bob
        .request(
            "shell.exec",
            json!({"sessionId": "sess1", "input": "rm -rf ~"}),
        )
        .await
        .unwrap();
    assert_eq!(
        err_of(&f),
        (403, "Access denied to shell session: sess1".into())
    );
    // A target that is not the session's device is a 400.
    let f = alice
        .request(
            "shell.exec",
            json!({"sessionId": "sess1", "target": "other", "input": ""}),
        )
        .await
        .unwrap();
    assert_eq!(
        err_of(&f),
        (
            400,
            "Shell session target does not match the requested target".into()
        )
    );
}

#[tokio::test]
async fn a_driver_reconnect_keeps_running_sessions_and_exec_status_records_their_end() {
    let (k, mut alice, mut drv) = with_driver(&["shell.exec"]).await;
    alice
        .send_request("s", "shell.exec", json!({"target": "dev1", "input": "x"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    drv.reply(
        &req["id"],
        json!({"status": "running", "sessionId": "bg1", "output": ""}),
    )
    .await;
    alice.response_to("s").await.unwrap();
    drv.ws.close().await;
    let token = node_token(&mut alice, "dev1").await;
    let mut drv = ScriptedDriver::connect(&k, "alice", &token, "dev1", &["shell.exec"]).await;
    // Still running: the poll reaches the new connection.
    alice
        .send_request("p", "shell.exec", json!({"sessionId": "bg1"}))
        .await
        .unwrap();
    let poll = drv.next_req().await;
    drv.reply(
        &poll["id"],
        json!({"status": "running", "sessionId": "bg1", "output": ""}),
    )
    .await;
    assert_eq!(
        alice.response_to("p").await.unwrap()["data"]["status"],
        "running"
    );
    // The device reports the end; the next continuation is answered from
    // the row without reaching the device.
    let sig = json!({"type": "sig", "signal": "exec.status", "payload": {
        "eventId": "e1", "sessionId": "bg1", "event": "failed", "signal": "SIGKILL"}});
    drv.ws.send_text(sig.to_string()).await.unwrap();
    // Signals on one socket are handled in order, so a ping after it is
    // answered only once the status is stored.
    let ping = json!({"type": "sig", "signal": "device.ping", "payload": {"n": 1}});
    drv.ws.send_text(ping.to_string()).await.unwrap();
    assert_eq!(drv.next_sig("device.pong").await["payload"]["n"], 1);
    let d = alice
        .call("shell.exec", json!({"sessionId": "bg1"}))
        .await
        .unwrap();
    assert_eq!(d["status"], "failed", "{d}");
    assert_eq!(d["error"], "SIGKILL");
}

#[tokio::test]
async fn expired_device_sessions_are_pruned_and_unknown() {
    let (k, mut alice, _drv) = with_driver(&["shell.exec"]).await;
    k.kernel.db()
        .call(|c| {
            c.execute(
                "INSERT INTO device_shell_sessions(session_id, device_id, owner_uid, status,
                     created_at, updated_at, expires_at) VALUES ('old', 'dev1', 1000, 'running', 1, 1, 2)",
                [],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let f = alice
        .request("shell.exec", json!({"sessionId": "old"}))
        .await
        .unwrap();
    assert_eq!(err_of(&f), (404, "Unknown shell session: old".into()));
    let left: i64 = k
        .kernel
        .db()
        .call(|c| {
            Ok(c.query_row(
                "SELECT count(*) FROM device_shell_sessions WHERE session_id = 'old'",
                [],
                |r| r.get(0),
            )?)
        })
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn devices_are_listed_to_those_who_can_see_them_and_updated_by_their_owner() {
    let (k, mut alice, _drv) = with_driver(&["fs.*"]).await;
    let l = alice.call("sys.device.list", json!({})).await.unwrap();
    let devices = l["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0]["deviceId"], "dev1");
    assert_eq!(devices[0]["implements"], json!(["fs.*"]));
    assert_eq!(devices[0]["platform"], "scripted");
    let mut bob = k.bob().await;
    let l = bob
        .call("sys.device.list", json!({"includeOffline": true}))
        .await
        .unwrap();
    assert_eq!(l["devices"], json!([]));
    let g = bob
        .call("sys.device.get", json!({"deviceId": "dev1"}))
        .await
        .unwrap();
    assert_eq!(g["device"], Value::Null);
    let f = bob
        .request(
            "sys.device.update",
            json!({"deviceId": "dev1", "label": "mine"}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403);
    let u = alice
        .call(
            "sys.device.update",
            json!({"deviceId": "dev1", "label": "  laptop  ", "description": "desk"}),
        )
        .await
        .unwrap();
    assert_eq!(u["device"]["label"], "laptop");
    assert_eq!(u["device"]["description"], "desk");
}

#[tokio::test]
async fn a_device_id_owned_by_another_user_is_refused_at_connect() {
    let (k, _alice, _drv) = with_driver(&["fs.*"]).await;
    let mut bob = k.bob().await;
    let token = node_token(&mut bob, "dev1").await;
    let (_d, res) = ScriptedDriver::try_connect(&k, "bob", &token, "dev1", &["fs.*"]).await;
    assert_eq!(
        err_of(&res),
        (
            103,
            "Device id already belongs to another user: dev1".into()
        )
    );
}

#[tokio::test]
async fn a_node_token_for_another_device_is_refused() {
    let (k, mut alice, _drv) = with_driver(&["fs.*"]).await;
    let token = node_token(&mut alice, "dev2").await;
    let (_d, res) = ScriptedDriver::try_connect(&k, "alice", &token, "dev3", &["fs.*"]).await;
    assert_eq!(err_of(&res).0, 401);
}
