//! Frames, handshake, tokens, config and capabilities.

use gsv_kernel::client::connect_args;
use serde_json::json;

use crate::harness::{ALICE_PW, TestKernel, err_of, user_connect};

#[tokio::test]
async fn health_answers_200_with_a_small_json_status() {
    let k = TestKernel::start().await;
    let url = k.url.replace("ws://", "").replace("/ws", "");
    let mut s = tokio::net::TcpStream::connect(&url).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"status\":\"ok\""), "{out}");
}

#[tokio::test]
async fn malformed_json_and_invalid_frames_get_400_with_id_question_mark_and_the_socket_stays_open()
{
    let k = TestKernel::start().await;
    let mut c = k.raw().await;
    c.send_text("{not json").await.unwrap();
    let f = c.recv().await.unwrap();
    assert_eq!(f["id"], "?");
    assert_eq!(err_of(&f).0, 400);
    c.send_text(r#"{"type":"req","id":5,"call":"x"}"#)
        .await
        .unwrap();
    let f = c.recv().await.unwrap();
    assert_eq!((f["id"].as_str(), err_of(&f).0), (Some("?"), 400));
    // Still open: a real call on the same socket is answered.
    let f = c
        .request("sys.connect", user_connect(json!({})))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 425);
}

#[tokio::test]
async fn before_setup_connect_answers_425_and_setup_creates_the_first_user_once() {
    let k = TestKernel::start().await;
    let mut c = k.raw().await;
    let f = c
        .request(
            "sys.connect",
            user_connect(json!({"username": "alice", "password": ALICE_PW})),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 425);
    assert_eq!(f["error"]["details"]["next"], "sys.setup");
    let f = c.request("fs.read", json!({"path": "/"})).await.unwrap();
    assert_eq!(err_of(&f).0, 425, "any call before connect in setup mode");
    k.setup().await;
    let f = c
        .request(
            "sys.setup",
            json!({"username": "eve", "password": "eve-password"}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f), (409, "System already initialized".into()));
    let f = c.request("fs.read", json!({"path": "/"})).await.unwrap();
    assert_eq!(
        err_of(&f).0,
        403,
        "after setup, calls before connect are 403"
    );
    let d = c
        .call(
            "sys.connect",
            user_connect(json!({"username": "alice", "password": ALICE_PW})),
        )
        .await
        .unwrap();
    assert_eq!(d["protocol"], 2);
    assert_eq!(d["identity"]["role"], "user");
    assert_eq!(d["identity"]["process"]["home"], "/home/alice");
    assert!(d["syscalls"].as_array().unwrap().contains(&json!("fs.*")));
    let f = c
        .request(
            "sys.connect",
            user_connect(json!({"username": "alice", "password": ALICE_PW})),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 409, "a second connect on one socket");
}

#[tokio::test]
async fn connect_checks_protocol_role_and_credentials_in_order() {
    let k = TestKernel::start().await;
    k.setup().await;
    let mut c = k.raw().await;
    let mut args = user_connect(json!({"username": "alice", "password": ALICE_PW}));
    args["protocol"] = json!(1);
    assert_eq!(
        err_of(&c.request("sys.connect", args).await.unwrap()).0,
        102
    );
    let args = connect_args(
        "x",
        "admin",
        json!({"username": "alice", "password": ALICE_PW}),
    );
    assert_eq!(
        err_of(&c.request("sys.connect", args).await.unwrap()).0,
        103
    );
    let bad = user_connect(json!({"username": "alice", "password": "wrong-password"}));
    assert_eq!(err_of(&c.request("sys.connect", bad).await.unwrap()).0, 401);
    let nobody = user_connect(json!({"username": "nobody", "password": "whatever1"}));
    assert_eq!(
        err_of(&c.request("sys.connect", nobody).await.unwrap()).0,
        401
    );
    let both = user_connect(json!({"username": "alice", "password": ALICE_PW, "token": "t"}));
    assert_eq!(
        err_of(&c.request("sys.connect", both).await.unwrap()).0,
        401
    );
    // A driver must use a token.
    let mut drv = connect_args(
        "dev1",
        "driver",
        json!({"username": "alice", "password": ALICE_PW}),
    );
    drv["driver"] = json!({"implements": ["fs.*"]});
    assert_eq!(err_of(&c.request("sys.connect", drv).await.unwrap()).0, 401);
    // Failures never lock out the right password.
    let ok = user_connect(json!({"username": "alice", "password": ALICE_PW}));
    c.call("sys.connect", ok).await.unwrap();
}

#[tokio::test]
async fn tokens_are_shown_once_log_in_with_their_role_and_stop_working_when_revoked() {
    let k = TestKernel::start().await;
    k.setup().await;
    let mut alice = k.alice().await;
    let d = alice
        .call("sys.token.create", json!({"kind": "user", "label": "cli"}))
        .await
        .unwrap();
    let raw = d["token"]["token"].as_str().unwrap().to_owned();
    let id = d["token"]["tokenId"].as_str().unwrap().to_owned();
    let node = alice
        .call(
            "sys.token.create",
            json!({"kind": "node", "allowedRole": "driver", "allowedDeviceId": "laptop"}),
        )
        .await
        .unwrap();
    let node_raw = node["token"]["token"].as_str().unwrap().to_owned();
    let list = alice.call("sys.token.list", json!({})).await.unwrap();
    assert_eq!(list["tokens"].as_array().unwrap().len(), 2);
    assert!(
        !list.to_string().contains(&raw),
        "list never shows raw tokens"
    );

    let mut c = k.raw().await;
    let tok = user_connect(json!({"username": "alice", "token": raw}));
    c.call("sys.connect", tok.clone()).await.unwrap();

    // The token names its account: without a username it logs in as that
    // account; with another account's name it does not log in at all.
    let mut by_token = k.raw().await;
    let d = by_token
        .call("sys.connect", user_connect(json!({"token": raw})))
        .await
        .unwrap();
    assert_eq!(d["identity"]["process"]["username"], "alice");
    let f = k
        .raw()
        .await
        .request(
            "sys.connect",
            user_connect(json!({"username": "root", "token": raw})),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 401);
    let f = k
        .raw()
        .await
        .request("sys.connect", user_connect(json!({"password": ALICE_PW})))
        .await
        .unwrap();
    assert_eq!(err_of(&f), (401, "Username required".to_owned()));

    // A node token cannot log in as a user, nor as another device.
    let mut c2 = k.raw().await;
    let f = c2
        .request(
            "sys.connect",
            user_connect(json!({"username": "alice", "token": node_raw})),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 401);
    let mut other = connect_args(
        "desktop",
        "driver",
        json!({"username": "alice", "token": node_raw}),
    );
    other["driver"] = json!({"implements": ["fs.*"]});
    assert_eq!(
        err_of(&c2.request("sys.connect", other).await.unwrap()).0,
        401
    );
    let mut drv = connect_args(
        "laptop",
        "driver",
        json!({"username": "alice", "token": node_raw}),
    );
    drv["driver"] = json!({"implements": ["fs.*", "shell.exec"]});
    let d = c2.call("sys.connect", drv).await.unwrap();
    assert_eq!(d["identity"]["device"], "laptop");
    assert_eq!(d["syscalls"], json!([]), "drivers call nothing");
    let f = c2.request("fs.read", json!({"path": "/"})).await.unwrap();
    assert_eq!(err_of(&f).0, 403);

    let r = alice
        .call("sys.token.revoke", json!({"tokenId": id, "reason": "lost"}))
        .await
        .unwrap();
    assert_eq!(r["revoked"], true);
    let mut c3 = k.raw().await;
    assert_eq!(
        err_of(&c3.request("sys.connect", tok).await.unwrap()).0,
        401
    );
}

#[tokio::test]
async fn capabilities_are_checked_before_a_call_runs() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let f = alice
        .request(
            "account.create",
            json!({"kind": "human", "username": "mallory", "password": "mallory-pw"}),
        )
        .await
        .unwrap();
    assert_eq!(
        err_of(&f),
        (403, "Permission denied: account.create".into())
    );
    let f = alice.request("no.such.call", json!({})).await.unwrap();
    assert_eq!(
        err_of(&f).0,
        403,
        "a user lacks the capability for unknown calls too"
    );
    let mut root = k.login("root", "root-password").await;
    let f = root.request("no.such.call", json!({})).await.unwrap();
    assert_eq!(err_of(&f).0, 404);
    let accounts = alice.call("account.list", json!({})).await.unwrap();
    let names: Vec<_> = accounts["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["username"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, vec!["root", "alice", "bob"]);
    // Another user's tokens are out of reach.
    let f = alice
        .request("sys.token.list", json!({"uid": 1001}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403);
    // A routed call to an unknown device is 403, like an invisible one.
    let f = alice
        .request("fs.read", json!({"path": "/", "target": "nowhere"}))
        .await
        .unwrap();
    assert_eq!(err_of(&f), (403, "Access denied to device: nowhere".into()));
}

#[tokio::test]
async fn sensitive_config_is_hidden_from_users_and_only_root_writes_system_keys() {
    let k = TestKernel::with_users().await;
    let mut root = k.login("root", "root-password").await;
    root.call(
        "sys.config.set",
        json!({"key": "config/shell/timeout_ms", "value": 30000}),
    )
    .await
    .unwrap();
    root.call(
        "sys.config.set",
        json!({"key": "config/ai/api_key", "value": "sk-secret"}),
    )
    .await
    .unwrap();
    let mut alice = k.alice().await;
    let d = alice
        .call("sys.config.get", json!({"key": "config"}))
        .await
        .unwrap();
    assert_eq!(
        d["entries"],
        json!([{"key": "config/shell/timeout_ms", "value": "30000"}])
    );
    let f = alice
        .request(
            "sys.config.set",
            json!({"key": "config/shell/timeout_ms", "value": "1"}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403);
    alice
        .call(
            "sys.config.set",
            json!({"key": "users/1000/ai/model", "value": "m1"}),
        )
        .await
        .unwrap();
    let all = root.call("sys.config.get", json!({})).await.unwrap();
    assert_eq!(all["entries"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_socket_that_never_connects_is_closed_at_the_handshake_deadline() {
    let k = TestKernel::start_with(|c| c.handshake_timeout = std::time::Duration::from_millis(300))
        .await;
    let mut c = k.raw().await;
    match c.recv().await {
        Err(gsv_kernel::client::ClientError::Closed(Some((code, _)))) => assert_eq!(code, 1008),
        other => panic!("expected a close, got {other:?}"),
    }
}

#[tokio::test]
async fn a_frame_over_the_size_limit_closes_the_socket_with_1009() {
    let k = TestKernel::start_with(|c| c.max_frame_bytes = 4096).await;
    let mut c = k.raw().await;
    let big = format!(
        r#"{{"type":"req","id":"1","call":"x","args":{{"a":"{}"}}}}"#,
        "x".repeat(10_000)
    );
    c.send_text(big).await.unwrap();
    match c.recv().await {
        Err(gsv_kernel::client::ClientError::Closed(Some((code, reason)))) => {
            assert_eq!(code, 1009, "{reason}");
        }
        other => panic!("expected a 1009 close, got {other:?}"),
    }
}

#[tokio::test]
async fn unauthenticated_sockets_have_their_own_small_cap() {
    let k = TestKernel::start_with(|c| c.max_pending = 2).await;
    k.setup().await;
    let _a = k.raw().await;
    let _b = k.raw().await;
    assert!(
        gsv_kernel::client::GsvClient::connect(&k.url)
            .await
            .is_err()
    );
    drop(_a);
    // An authenticated socket does not count against the pending cap. The
    // dropped socket's permit returns once the server sees the close.
    let mut ok = None;
    for _ in 0..200 {
        if let Ok(c) = gsv_kernel::client::GsvClient::connect(&k.url).await {
            ok = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let mut c = ok.expect("a permit came back");
    c.login(
        "alice",
        &gsv_kernel::client::Credentials::Password(ALICE_PW.into()),
    )
    .await
    .unwrap();
    let _d = k.raw().await;
}

#[tokio::test]
async fn a_newer_connection_of_the_same_client_replaces_the_older_one() {
    let k = TestKernel::start().await;
    k.setup().await;
    let mut first = k.alice().await;
    let mut second = k.alice().await;
    match first.recv().await {
        Err(gsv_kernel::client::ClientError::Closed(Some((code, reason)))) => {
            assert_eq!(
                (code, reason.as_str()),
                (1000, "Replaced by newer connection")
            );
        }
        other => panic!("expected the older socket to close, got {other:?}"),
    }
    second.call("fs.read", json!({"path": "~"})).await.unwrap();
}
