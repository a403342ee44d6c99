//! Binary bodies from drivers (reference §1.4), as the reference CLI's
//! device sends them: `fs.read` answers with `data` describing the file
//! and the selected text (or image bytes) as a body that follows the JSON
//! frame in binary chunks. The scripted driver writes the chunks byte by
//! byte as the reference does: stream id (u32 little-endian), one flags
//! byte (DATA=1, END=2, ERROR=4), payload.

use base64::Engine as _;
use serde_json::{Value, json};

use crate::harness::{ScriptedDriver, err_of, with_driver};

fn chunk(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = stream.to_le_bytes().to_vec();
    out.push(flags);
    out.extend_from_slice(payload);
    out
}

/// Answers `req` with `data` and a body descriptor, as the reference does.
async fn reply_with_body(drv: &mut ScriptedDriver, req: &Value, data: Value, body: Value) {
    let res = json!({"type": "res", "id": req["id"], "ok": true, "data": data, "body": body});
    drv.ws.send_text(res.to_string()).await.unwrap();
}

#[tokio::test]
async fn a_text_body_from_the_device_reaches_the_caller_as_numbered_inline_content() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request(
            "r1",
            "fs.read",
            json!({"target": "dev1", "path": "notes.txt", "offset": 2, "limit": 2}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    let text = b"third\nfourth";
    let data = json!({"ok": true, "path": "/root/notes.txt", "size": 40, "kind": "text",
        "contentType": "text/plain", "lines": 2});
    reply_with_body(
        &mut drv,
        &req,
        data,
        json!({"streamId": 1, "length": text.len()}),
    )
    .await;
    drv.ws.send_binary(chunk(1, 1, &text[..4])).await.unwrap();
    drv.ws
        .send_binary(chunk(1, 1 | 2, &text[4..]))
        .await
        .unwrap();
    let res = alice.response_to("r1").await.unwrap();
    assert_eq!(res["ok"], true, "{res}");
    let d = &res["data"];
    assert_eq!(d["content"], "3\tthird\n4\tfourth", "{d}");
    assert_eq!(
        (&d["ok"], &d["path"], &d["lines"], &d["kind"]),
        (
            &json!(true),
            &json!("/root/notes.txt"),
            &json!(2),
            &json!("text")
        )
    );
    assert!(d.get("truncated").is_none(), "{d}");
}

#[tokio::test]
async fn an_image_body_becomes_an_inline_base64_image_block() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request("i", "fs.read", json!({"target": "dev1", "path": "a.png"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    let png = [0x89u8, b'P', b'N', b'G', 0, 1, 2, 3];
    let data = json!({"ok": true, "path": "/root/a.png", "size": png.len(),
        "kind": "image", "contentType": "image/png"});
    reply_with_body(&mut drv, &req, data, json!({"streamId": 9})).await;
    drv.ws.send_binary(chunk(9, 1, &png)).await.unwrap();
    drv.ws.send_binary(chunk(9, 2, b"")).await.unwrap();
    let res = alice.response_to("i").await.unwrap();
    assert_eq!(
        res["data"]["content"],
        json!([{"type": "image", "mimeType": "image/png",
            "data": base64::engine::general_purpose::STANDARD.encode(png)}]),
        "{res}"
    );
}

#[tokio::test]
async fn a_body_shorter_than_declared_is_502_naming_the_device_and_the_link_stays_usable() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request("s", "fs.read", json!({"target": "dev1", "path": "x"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    reply_with_body(
        &mut drv,
        &req,
        json!({"ok": true, "kind": "text"}),
        json!({"streamId": 1, "length": 10}),
    )
    .await;
    drv.ws.send_binary(chunk(1, 1 | 2, b"abc")).await.unwrap();
    let (code, message) = err_of(&alice.response_to("s").await.unwrap());
    assert_eq!(code, 502);
    assert!(
        message.contains("dev1") && message.contains("3 of its declared 10"),
        "{message}"
    );
    // The same driver connection still serves the next call.
    alice
        .send_request("t", "fs.read", json!({"target": "dev1", "path": "y"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    drv.reply(&req["id"], json!({"ok": true, "content": "1\ty"}))
        .await;
    let res = alice.response_to("t").await.unwrap();
    assert_eq!(res["data"]["content"], "1\ty", "{res}");
}

#[tokio::test]
async fn a_stream_the_device_aborts_and_a_body_on_another_call_are_both_502() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*", "shell.exec"]).await;
    alice
        .send_request("a", "fs.read", json!({"target": "dev1", "path": "x"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    reply_with_body(
        &mut drv,
        &req,
        json!({"ok": true, "kind": "text"}),
        json!({"streamId": 2}),
    )
    .await;
    drv.ws.send_binary(chunk(2, 4, b"disk gone")).await.unwrap();
    let (code, message) = err_of(&alice.response_to("a").await.unwrap());
    assert_eq!(code, 502);
    assert!(message.contains("disk gone"), "{message}");

    alice
        .send_request(
            "b",
            "shell.exec",
            json!({"target": "dev1", "input": "true"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    reply_with_body(&mut drv, &req, json!({}), json!({"streamId": 3})).await;
    let (code, message) = err_of(&alice.response_to("b").await.unwrap());
    assert_eq!(code, 502);
    assert!(message.contains("only for fs.read"), "{message}");
}

#[tokio::test]
async fn a_driver_that_leaves_mid_body_fails_the_call_with_503() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request("d", "fs.read", json!({"target": "dev1", "path": "x"}))
        .await
        .unwrap();
    let req = drv.next_req().await;
    reply_with_body(
        &mut drv,
        &req,
        json!({"ok": true, "kind": "text"}),
        json!({"streamId": 1, "length": 100}),
    )
    .await;
    drv.ws.send_binary(chunk(1, 1, b"partial")).await.unwrap();
    drv.ws.close().await;
    let (code, message) = err_of(&alice.response_to("d").await.unwrap());
    assert_eq!((code, message.as_str()), (503, "Device disconnected: dev1"));
}

/// The reference device answers `net.fetch` with the response's status
/// and headers as `data` and the response body as a binary stream.
#[tokio::test]
async fn a_fetched_body_reaches_the_caller_inline_as_text_or_base64() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*", "net.fetch"]).await;
    alice
        .send_request(
            "f1",
            "net.fetch",
            json!({"target": "dev1", "url": "http://example.test/a"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    assert_eq!(req["call"], "net.fetch");
    assert_eq!(req["args"], json!({"url": "http://example.test/a"}));
    let data = json!({"ok": true, "url": "http://example.test/a", "status": 200,
        "statusText": "OK", "headers": {"content-type": "text/plain"}, "redirected": false});
    reply_with_body(&mut drv, &req, data, json!({"streamId": 5, "length": 9})).await;
    drv.ws.send_binary(chunk(5, 1, b"hello ")).await.unwrap();
    drv.ws.send_binary(chunk(5, 1 | 2, b"you")).await.unwrap();
    let d = alice.response_to("f1").await.unwrap()["data"].clone();
    assert_eq!(d["status"], 200, "{d}");
    assert_eq!(d["headers"]["content-type"], "text/plain");
    assert_eq!(d["body"], "hello you");
    assert_eq!(d["bodyBytes"], 9);
    assert!(
        d.get("truncated").is_none() && d.get("bodyBase64").is_none(),
        "{d}"
    );

    alice
        .send_request(
            "f2",
            "net.fetch",
            json!({"target": "dev1", "url": "http://example.test/png"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    reply_with_body(
        &mut drv,
        &req,
        json!({"ok": true, "status": 200}),
        json!({"streamId": 6}),
    )
    .await;
    drv.ws
        .send_binary(chunk(6, 1 | 2, &[0x89, 0xff, 0x00]))
        .await
        .unwrap();
    let d = alice.response_to("f2").await.unwrap()["data"].clone();
    assert!(d.get("body").is_none(), "{d}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(d["bodyBase64"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, [0x89, 0xff, 0x00]);
}

#[tokio::test]
async fn a_fetched_body_longer_than_a_mebibyte_is_cut_and_marked_truncated() {
    let (_k, mut alice, mut drv) = with_driver(&["net.*"]).await;
    alice
        .send_request(
            "f",
            "net.fetch",
            json!({"target": "dev1", "url": "http://x.test/"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    reply_with_body(
        &mut drv,
        &req,
        json!({"ok": true, "status": 200}),
        json!({"streamId": 1}),
    )
    .await;
    let part = vec![b'a'; 700 * 1024];
    drv.ws.send_binary(chunk(1, 1, &part)).await.unwrap();
    drv.ws.send_binary(chunk(1, 1 | 2, &part)).await.unwrap();
    let d = alice.response_to("f").await.unwrap()["data"].clone();
    assert_eq!(d["truncated"], true);
    assert_eq!(d["bodyBytes"], 2 * 700 * 1024);
    assert_eq!(d["body"].as_str().unwrap().len(), 1 << 20);
}

/// `fs.transfer.send` is the reference's read-a-file-as-bytes primitive
/// (its gateway builds `fs.copy` on it): `data{ok, path, size,
/// contentType}` and the file as a body.
#[tokio::test]
async fn a_transferred_file_reaches_the_caller_as_base64_and_is_never_cut() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    alice
        .send_request(
            "t1",
            "fs.transfer.send",
            json!({"target": "dev1", "path": "a.bin"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    assert_eq!(req["call"], "fs.transfer.send");
    let data = json!({"ok": true, "path": "/w/a.bin", "size": 4,
        "contentType": "application/octet-stream"});
    reply_with_body(&mut drv, &req, data, json!({"streamId": 8, "length": 4})).await;
    drv.ws
        .send_binary(chunk(8, 1 | 2, &[0, 1, 2, 255]))
        .await
        .unwrap();
    let d = alice.response_to("t1").await.unwrap()["data"].clone();
    assert_eq!(d["path"], "/w/a.bin", "{d}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(d["contentBase64"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, [0, 1, 2, 255]);

    alice
        .send_request(
            "t2",
            "fs.transfer.send",
            json!({"target": "dev1", "path": "big.bin"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    reply_with_body(
        &mut drv,
        &req,
        json!({"ok": true, "path": "/w/big.bin"}),
        json!({"streamId": 9}),
    )
    .await;
    let mib = vec![7u8; 1 << 20];
    for _ in 0..10 {
        drv.ws.send_binary(chunk(9, 1, &mib)).await.unwrap();
    }
    drv.ws.send_binary(chunk(9, 1 | 2, b"x")).await.unwrap();
    let d = alice.response_to("t2").await.unwrap()["data"].clone();
    assert_eq!(d["ok"], false, "an oversized file is refused, not cut");
    let error = d["error"].as_str().unwrap();
    assert!(
        error.contains("/w/big.bin") && error.contains("limit"),
        "{error}"
    );
    assert!(d.get("contentBase64").is_none());
}

#[tokio::test]
async fn a_transfer_receive_is_refused_before_the_device_sees_it() {
    let (_k, mut alice, mut drv) = with_driver(&["fs.*"]).await;
    let (code, message) = err_of(
        &alice
            .request(
                "fs.transfer.receive",
                json!({"target": "dev1", "path": "dest.bin"}),
            )
            .await
            .unwrap(),
    );
    assert_eq!(code, 400);
    assert!(
        message.contains("fs.transfer.receive") && message.contains("dev1"),
        "{message}"
    );
    alice
        .send_request(
            "n",
            "fs.transfer.stat",
            json!({"target": "dev1", "path": "a"}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    assert_eq!(
        req["call"], "fs.transfer.stat",
        "the receive never reached the device"
    );
    drv.reply(
        &req["id"],
        json!({"ok": true, "path": "/w/a", "size": 1, "isFile": true}),
    )
    .await;
    let d = alice.response_to("n").await.unwrap()["data"].clone();
    assert_eq!(
        d["isFile"], true,
        "stat is plain JSON and relays as is: {d}"
    );
}
