//! The Matrix adapter against a real Synapse on loopback and a scripted
//! kernel WebSocket: people DM the bot and talk in rooms and threads; the
//! kernel must see `adapter.inbound` with the right surface, actor and
//! ids, and what the kernel sends must appear where it asked. Skipped
//! without Synapse unless `GSV_REQUIRE_SYNAPSE=1`.

mod support;

use matrix_sdk::ruma::OwnedEventId;
use matrix_sdk::ruma::events::relation::Thread;
use matrix_sdk::ruma::events::room::message::{Relation, RoomMessageEventContent};
use serde_json::{Value, json};

use gsv_adapter_matrix::AdapterError;
use support::kernel::FakeKernel;
use support::synapse::Synapse;
use support::{Adapter, Person, config};

fn in_thread(text: &str, root: &OwnedEventId) -> RoomMessageEventContent {
    let mut c = RoomMessageEventContent::text_plain(text);
    c.relates_to = Some(Relation::Thread(Thread::plain(root.clone(), root.clone())));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_reaches_the_kernel_and_the_kernels_answers_reach_the_dm() {
    let Some(synapse) = Synapse::start().await else {
        return;
    };
    let bot = Person::register(&synapse, "bot").await.user_id;
    let alice = Person::register(&synapse, "alice").await;
    let mut kernel = FakeKernel::start(support::SERVICE_TOKEN).await;
    let adapter = Adapter::start(config(&synapse, &kernel.url, &bot));

    let mut conn = kernel.connection().await;
    assert_eq!(conn.hello["client"]["role"], "service");
    assert_eq!(conn.hello["client"]["channel"], "matrix");
    conn.wait_connected().await;
    let ready = conn.states.last().unwrap().clone();
    assert_eq!(
        (&ready["accountId"], &ready["authenticated"]),
        (&json!(bot.as_str()), &json!(true))
    );

    // A first DM: the kernel sees who said what where, and answers with a
    // link challenge, which the adapter posts as a reply in the DM.
    let room = alice.dm_with(&bot).await;
    let hello = alice
        .say(&room, RoomMessageEventContent::text_plain("hello bot"))
        .await;
    let (id, inbound) = conn.request("adapter.inbound").await;
    assert_eq!(inbound["adapter"], "matrix");
    assert_eq!(inbound["accountId"], bot.as_str());
    assert_eq!(inbound["deliveryId"], hello.as_str());
    let message = &inbound["message"];
    assert_eq!(message["messageId"], hello.as_str());
    assert_eq!(
        message["surface"],
        json!({"kind": "dm", "id": room.room_id().as_str()})
    );
    assert_eq!(message["actor"]["id"], alice.user_id.as_str());
    assert_eq!(message["text"], "hello bot");
    assert!(message.get("replyToId").is_none(), "{message}");
    let prompt = "Run `gsv auth link ABCD-EFGH` to link this chat.";
    conn.answer(
        &id,
        json!({"ok": true, "challenge": {"code": "ABCD-EFGH", "prompt": prompt,
                                         "expiresAt": 4_102_444_800_000_i64}}),
    )
    .await;
    let posted = alice.next_message_from(&room, &bot).await;
    assert_eq!(posted["content"]["body"], prompt);
    assert_eq!(
        posted["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
        hello.as_str()
    );

    // In a thread: the thread root comes along, the surface stays the DM.
    let question = alice.say(&room, in_thread("what is 2+2?", &hello)).await;
    let (id, inbound) = conn.request("adapter.inbound").await;
    let message = &inbound["message"];
    assert_eq!(message["messageId"], question.as_str());
    assert_eq!(message["surface"]["kind"], "dm");
    assert_eq!(message["surface"]["threadId"], hello.as_str());
    assert!(
        message.get("replyToId").is_none(),
        "a fallback is no reply: {message}"
    );
    conn.answer(
        &id,
        json!({"ok": true, "delivered": {"uid": 1000, "pid": "p1", "runId": "r1", "queued": false}}),
    )
    .await;

    // The kernel's answer goes into that thread, as a reply to the question.
    let send = json!({
        "adapter": "matrix", "accountId": bot.as_str(), "deliveryId": "delivery-1",
        "surface": {"kind": "dm", "id": room.room_id().as_str(), "threadId": hello.as_str()},
        "text": "4", "replyToId": question.as_str(),
    });
    let res = conn.call("adapter.send", send.clone()).await;
    assert_eq!(res["ok"], true, "{res}");
    let data = &res["data"];
    assert_eq!(data["ok"], true, "{data}");
    assert_eq!(data["surfaceId"], room.room_id().as_str());
    assert_eq!(data["deliveryId"], "delivery-1");
    let answer_id = data["messageId"].as_str().unwrap().to_owned();
    let seen = alice.event(&room, &answer_id).await;
    assert_eq!(seen["sender"], bot.as_str());
    assert_eq!(seen["content"]["body"], "4");
    let relation = &seen["content"]["m.relates_to"];
    assert_eq!(relation["rel_type"], "m.thread");
    assert_eq!(relation["event_id"], hello.as_str());
    assert_eq!(relation["m.in_reply_to"]["event_id"], question.as_str());

    // The same delivery again posts nothing new (the delivery id is the
    // Matrix transaction id).
    let again = conn.call("adapter.send", send).await;
    assert_eq!(again["data"]["messageId"], answer_id.as_str(), "{again}");

    // A plain answer, outside any thread.
    let res = conn
        .call(
            "adapter.send",
            json!({"adapter": "matrix", "accountId": bot.as_str(), "deliveryId": "delivery-2",
                   "surface": {"kind": "dm", "id": room.room_id().as_str()}, "text": "bye"}),
        )
        .await;
    let plain = alice
        .event(&room, res["data"]["messageId"].as_str().unwrap())
        .await;
    assert_eq!(plain["content"]["body"], "bye");
    assert!(plain["content"].get("m.relates_to").is_none(), "{plain}");

    // Bad requests: a clear answer, nothing posted, the adapter stays up.
    let elsewhere = conn
        .call(
            "adapter.send",
            json!({"adapter": "matrix", "accountId": bot.as_str(), "deliveryId": "delivery-3",
                   "surface": {"kind": "dm", "id": "!nowhere:localhost"}, "text": "x"}),
        )
        .await;
    assert_eq!(elsewhere["data"]["ok"], false, "{elsewhere}");
    assert!(
        elsewhere["data"]["error"]
            .as_str()
            .unwrap()
            .contains("!nowhere:localhost"),
        "{elsewhere}"
    );
    let bad_kind = conn
        .call(
            "adapter.send",
            json!({"adapter": "matrix", "accountId": bot.as_str(),
                   "surface": {"kind": "forum", "id": room.room_id().as_str()}, "text": "x"}),
        )
        .await;
    assert_eq!(bad_kind["ok"], false);
    assert_eq!(bad_kind["error"]["code"], 400, "{bad_kind}");
    let other_account = conn
        .call(
            "adapter.send",
            json!({"adapter": "matrix", "accountId": "@someone:localhost",
                   "surface": {"kind": "dm", "id": room.room_id().as_str()}, "text": "x"}),
        )
        .await;
    assert_eq!(other_account["data"]["ok"], false, "{other_account}");
    let unknown = conn.call("adapter.nonsense", json!({})).await;
    assert_eq!(unknown["error"]["code"], 404, "{unknown}");

    let status = conn
        .call("adapter.status", json!({"adapter": "matrix"}))
        .await;
    let accounts = status["data"]["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 1, "{status}");
    assert_eq!(accounts[0]["accountId"], bot.as_str());
    assert_eq!(accounts[0]["connected"], true);

    adapter.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_and_their_threads_are_group_and_thread_surfaces_and_nothing_is_lost_across_reconnects()
 {
    let Some(synapse) = Synapse::start().await else {
        return;
    };
    let bot = Person::register(&synapse, "bot").await.user_id;
    let alice = Person::register(&synapse, "alice").await;
    let carol = Person::register(&synapse, "carol").await;
    let mut kernel = FakeKernel::start(support::SERVICE_TOKEN).await;
    let adapter = Adapter::start(config(&synapse, &kernel.url, &bot));
    let mut conn = kernel.connection().await;
    conn.wait_connected().await;

    let room = alice.group_with(&bot, &[&carol.user_id]).await;
    let carols_room = carol.join(&room).await;
    let hi = carol
        .say(&carols_room, RoomMessageEventContent::text_plain("hi all"))
        .await;
    let (id, inbound) = conn.request("adapter.inbound").await;
    let message = &inbound["message"];
    assert_eq!(message["messageId"], hi.as_str());
    assert_eq!(message["surface"]["kind"], "group");
    assert_eq!(message["surface"]["id"], room.room_id().as_str());
    assert_eq!(message["actor"]["id"], carol.user_id.as_str());
    conn.answer(&id, json!({"ok": false, "droppedReason": "unlinked actor"}))
        .await;

    // A reply in the room names the message it answers.
    let mut reply = RoomMessageEventContent::text_plain("hello carol");
    reply.relates_to = Some(Relation::Reply(
        matrix_sdk::ruma::events::relation::Reply::with_event_id(hi.clone()),
    ));
    let reply_id = alice.say(&room, reply).await;
    let (id, inbound) = conn.request("adapter.inbound").await;
    assert_eq!(inbound["message"]["messageId"], reply_id.as_str());
    assert_eq!(inbound["message"]["replyToId"], hi.as_str());
    assert_eq!(inbound["message"]["surface"]["kind"], "group");
    conn.answer(&id, json!({"ok": true})).await;

    // A thread in the room is a thread surface of that room.
    let in_t = alice.say(&room, in_thread("about that", &hi)).await;
    let (_unanswered, inbound) = conn.request("adapter.inbound").await;
    assert_eq!(inbound["message"]["messageId"], in_t.as_str());
    assert_eq!(
        inbound["message"]["surface"],
        json!({"kind": "thread", "id": room.room_id().as_str(), "threadId": hi.as_str()})
    );

    // The kernel goes away without answering: the same message comes again,
    // with the same delivery id, on the next connection.
    conn.close().await;
    let mut conn = kernel.connection().await;
    let (id, again) = conn.request("adapter.inbound").await;
    assert_eq!(again, inbound);
    conn.answer(&id, json!({"ok": true})).await;
    conn.wait_connected().await;

    // And what is said while the kernel is away arrives once it is back.
    conn.close().await;
    let later = alice
        .say(&room, RoomMessageEventContent::text_plain("anyone?"))
        .await;
    let mut conn = kernel.connection().await;
    let (_, inbound) = conn.request("adapter.inbound").await;
    assert_eq!(inbound["message"]["messageId"], later.as_str());

    // The kernel's answer in the room's thread.
    let res = conn
        .call(
            "adapter.send",
            json!({"adapter": "matrix", "accountId": bot.as_str(), "deliveryId": "t-1",
                   "surface": {"kind": "thread", "id": room.room_id().as_str(), "threadId": hi.as_str()},
                   "text": "noted"}),
        )
        .await;
    let seen = carol
        .event(&carols_room, res["data"]["messageId"].as_str().unwrap())
        .await;
    assert_eq!(seen["content"]["body"], "noted");
    assert_eq!(seen["content"]["m.relates_to"]["rel_type"], "m.thread");
    assert_eq!(seen["content"]["m.relates_to"]["event_id"], hi.as_str());

    adapter.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_state_dir_a_restart_keeps_the_device_and_relays_what_was_said_meanwhile_and_refusals_stop_it()
 {
    let Some(synapse) = Synapse::start().await else {
        return;
    };
    let bot = Person::register(&synapse, "bot").await.user_id;
    let alice = Person::register(&synapse, "alice").await;
    let state = tempfile::tempdir().unwrap();
    let session_file = state.path().join("matrix-session.json");
    let mut kernel = FakeKernel::start(support::SERVICE_TOKEN).await;
    let mut cfg = config(&synapse, &kernel.url, &bot);
    cfg.state_dir = Some(state.path().to_owned());

    let adapter = Adapter::start(cfg.clone());
    let mut conn = kernel.connection().await;
    conn.wait_connected().await;
    let room = alice.dm_with(&bot).await;
    let first = alice
        .say(&room, RoomMessageEventContent::text_plain("first"))
        .await;
    let (id, inbound) = conn.request("adapter.inbound").await;
    assert_eq!(inbound["message"]["messageId"], first.as_str());
    conn.answer(&id, json!({"ok": true})).await;
    adapter.stop().await.unwrap();
    let saved: Value = serde_json::from_slice(&std::fs::read(&session_file).unwrap()).unwrap();
    let device = saved["session"]["device_id"].clone();
    assert!(device.is_string(), "{saved}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&session_file)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the session file holds a token: {mode:o}");

    let meanwhile = alice
        .say(
            &room,
            RoomMessageEventContent::text_plain("while you were away"),
        )
        .await;
    let adapter = Adapter::start(cfg.clone());
    let mut conn = kernel.connection().await;
    let (id, inbound) = conn.request("adapter.inbound").await;
    assert_eq!(inbound["message"]["messageId"], meanwhile.as_str());
    assert_eq!(inbound["message"]["text"], "while you were away");
    conn.answer(&id, json!({"ok": true})).await;
    adapter.stop().await.unwrap();
    let saved: Value = serde_json::from_slice(&std::fs::read(&session_file).unwrap()).unwrap();
    assert_eq!(
        saved["session"]["device_id"], device,
        "a restart reuses the device"
    );

    // A service token the kernel refuses stops the adapter with the reason.
    let mut refused = cfg;
    refused.service_token = "not-the-token".into();
    let r = Adapter::start(refused).finished().await;
    assert!(
        matches!(&r, Err(AdapterError::KernelRefused { code: 401, .. })),
        "{r:?}"
    );

    // So does a password the homeserver refuses (with no saved session).
    let mut wrong = config(&synapse, &kernel.url, &bot);
    wrong.password = "wrong".into();
    let r = Adapter::start(wrong).finished().await;
    assert!(
        matches!(&r, Err(AdapterError::LoginRefused { .. })),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_user_that_is_no_matrix_id_is_refused_before_anything_connects() {
    let bad_user = gsv_adapter_matrix::Config::new(
        "ws://127.0.0.1:9/ws".into(),
        "t".into(),
        "http://127.0.0.1:9".into(),
        "bot".into(),
        "pw".into(),
    );
    let r = Adapter::start(bad_user).finished().await;
    assert!(
        matches!(&r, Err(AdapterError::BadUser { user, .. }) if user == "bot"),
        "{r:?}"
    );
}
