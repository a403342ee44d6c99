//! End to end through Matrix: a real Synapse on loopback, the real
//! adapter (`gsv adapter matrix`, the binary), the real kernel (in this
//! process) with the scripted model server, the real CLI (`gsv auth link`)
//! and people with Matrix clients of their own. Skipped without Synapse
//! unless `GSV_REQUIRE_SYNAPSE=1` (the Synapse harness and the Matrix
//! people are the adapter crate's test support, shared).

use std::process::{Child, Command, Stdio};

use matrix_sdk::Room;
use matrix_sdk::ruma::UserId;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use serde_json::{Value, json};
use wsd_test_support::run_bounded;

use crate::harness::{ALICE_PW, BOB_PW, TestKernel};
use crate::matrix_support::synapse::Synapse;
use crate::matrix_support::{PASSWORD, Person};
use crate::proc::{ModelServer, Reply, answer, configure, tool};

/// `gsv adapter matrix` as a child process; stopped (SIGTERM, then
/// SIGKILL) when dropped.
struct AdapterProcess {
    child: Child,
    log: std::path::PathBuf,
}

impl AdapterProcess {
    /// Starts the adapter for `bot` against kernel `k` with a service
    /// token of root's; files go in `dir`.
    async fn start(k: &TestKernel, synapse: &Synapse, bot: &UserId, dir: &std::path::Path) -> Self {
        let token = service_token(k).await;
        let (token_file, password_file) = (dir.join("service-token"), dir.join("bot-password"));
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        std::fs::write(&password_file, PASSWORD).unwrap();
        let log = dir.join("adapter.log");
        let child = Command::new(env!("CARGO_BIN_EXE_gsv"))
            .args([
                "adapter",
                "matrix",
                "--kernel",
                k.url.as_str(),
                "--homeserver",
                synapse.url.as_str(),
            ])
            .arg("--user")
            .arg(bot.as_str())
            .arg("--token-file")
            .arg(&token_file)
            .arg("--password-file")
            .arg(&password_file)
            .arg("--state")
            .arg(dir.join("state"))
            .env_remove("GSV_URL")
            .env_remove("GSV_USER")
            .env_remove("GSV_PASSWORD")
            .env_remove("GSV_TOKEN")
            .env("RUST_LOG", "gsv_adapter_matrix=debug,info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("starting gsv adapter matrix");
        AdapterProcess { child, log }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for AdapterProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("gsv adapter matrix log:\n{}", self.log_tail());
        }
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..300 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn service_token(k: &TestKernel) -> String {
    let mut root = k.login("root", "root-password").await;
    let d = root
        .call(
            "sys.token.create",
            json!({"kind": "service", "label": "matrix"}),
        )
        .await
        .unwrap();
    root.close().await;
    d["token"]["token"].as_str().unwrap().to_owned()
}

/// The real CLI as `user` against `k`: (success, stdout and stderr). On
/// a blocking thread: the kernel it talks to runs on this runtime.
async fn gsv_cli(
    k: &TestKernel,
    dir: &std::path::Path,
    user: &str,
    pw: &str,
    args: &[&str],
) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gsv"));
    cmd.args(args)
        .env("GSV_URL", &k.url)
        .env("GSV_USER", user)
        .env("GSV_PASSWORD", pw)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env_remove("GSV_TOKEN");
    let out =
        tokio::task::spawn_blocking(move || run_bounded(&mut cmd, None, wsd_test_support::STEP))
            .await
            .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn body(event: &Value) -> &str {
    event["content"]["body"].as_str().unwrap_or_default()
}

/// The `gsv auth link CODE` code in a challenge prompt.
fn code_in(prompt: &str) -> String {
    let at = prompt
        .find("gsv auth link ")
        .unwrap_or_else(|| panic!("no link command in {prompt:?}"));
    prompt[at + "gsv auth link ".len()..]
        .chars()
        .take(9)
        .collect()
}

async fn say(person: &Person, room: &Room, text: &str) -> String {
    person
        .say(room, RoomMessageEventContent::text_plain(text))
        .await
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matrix_user_links_talks_to_their_agent_and_answers_its_approvals_from_the_dm() {
    let Some(synapse) = Synapse::start().await else {
        return;
    };
    let bot = Person::register(&synapse, "bot").await.user_id;
    let alice_mx = Person::register(&synapse, "alice").await;
    let carol_mx = Person::register(&synapse, "carol").await;
    let k = TestKernel::with_users().await;
    let model = ModelServer::start(vec![
        answer("hello alice, this is your agent"),
        Reply::Sse(vec![tool("c1", "Delete", json!({"path": "doomed.txt"}))]),
        answer("deleted it"),
        Reply::Sse(vec![tool("c2", "Delete", json!({"path": "keep.txt"}))]),
        answer("left it alone"),
        answer("hi room"),
    ])
    .await;
    configure(&k, &model.base_url, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let _adapter = AdapterProcess::start(&k, &synapse, &bot, dir.path()).await;

    // A first DM from a stranger: the bot answers with a link code.
    let dm = alice_mx.dm_with(&bot).await;
    let hello = say(&alice_mx, &dm, "hello bot").await;
    let challenge = alice_mx.next_message_from(&dm, &bot).await;
    let code = code_in(body(&challenge));
    assert_eq!(
        challenge["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
        hello.as_str()
    );
    assert!(model.requests().is_empty(), "nothing reached a model");

    // Alice links it with the real CLI; bob cannot take the used code.
    let (ok, out) = gsv_cli(&k, dir.path(), "alice", ALICE_PW, &["auth", "link", &code]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("matrix:{bot}:{}", alice_mx.user_id)),
        "{out}"
    );
    let (ok, out) = gsv_cli(&k, dir.path(), "bob", BOB_PW, &["auth", "link", &code]).await;
    assert!(!ok && out.contains("already used"), "{out}");

    // The next DM reaches alice's agent; its answer comes back to the DM,
    // as a reply to the question.
    let question = say(&alice_mx, &dm, "what's up?").await;
    let answered = alice_mx.next_message_from(&dm, &bot).await;
    assert_eq!(body(&answered), "hello alice, this is your agent");
    assert_eq!(
        answered["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
        question.as_str()
    );
    let asked = model.requests()[0]["messages"].to_string();
    assert!(asked.contains("what's up?"), "{asked}");

    // The agent's Delete asks for approval in the DM; "approve" deletes.
    let mut alice = k.alice().await;
    for f in ["doomed.txt", "keep.txt"] {
        alice
            .call(
                "fs.write",
                json!({"path": format!("~/{f}"), "content": "x"}),
            )
            .await
            .unwrap();
    }
    say(&alice_mx, &dm, "please delete doomed.txt").await;
    let prompt = alice_mx.next_message_from(&dm, &bot).await;
    assert!(
        body(&prompt).contains("Approval needed") && body(&prompt).contains("doomed.txt"),
        "{prompt}"
    );
    say(&alice_mx, &dm, "approve").await;
    let mut replies: Vec<String> = alice_mx
        .messages_from(&dm, &bot, 2)
        .await
        .iter()
        .map(|m| body(m).to_owned())
        .collect();
    replies.sort();
    assert_eq!(replies[1], "deleted it", "the run's answer: {replies:?}");
    assert!(
        replies[0].starts_with("Approved: Delete (") && replies[0].ends_with("doomed.txt)"),
        "the decision: {replies:?}"
    );
    let gone = alice
        .call("fs.read", json!({"path": "~/doomed.txt"}))
        .await
        .unwrap();
    assert_eq!(gone["ok"], false, "{gone}");

    // "deny": the file stays.
    say(&alice_mx, &dm, "now delete keep.txt").await;
    let prompt = alice_mx.next_message_from(&dm, &bot).await;
    assert!(body(&prompt).contains("keep.txt"), "{prompt}");
    say(&alice_mx, &dm, "deny").await;
    let mut replies: Vec<String> = alice_mx
        .messages_from(&dm, &bot, 2)
        .await
        .iter()
        .map(|m| body(m).to_owned())
        .collect();
    replies.sort();
    assert_eq!(replies[1], "left it alone", "{replies:?}");
    assert!(
        replies[0].starts_with("Denied: Delete (") && replies[0].ends_with("keep.txt)"),
        "{replies:?}"
    );
    let kept = alice
        .call("fs.read", json!({"path": "~/keep.txt"}))
        .await
        .unwrap();
    assert_eq!(kept["ok"], true, "{kept}");

    // In a room: carol (unlinked) is dropped, alice (linked) is answered.
    // The adapter relays a room's messages in order, so by the time the
    // answer to alice arrives carol's message was handled.
    let room = alice_mx.group_with(&bot, &[&carol_mx.user_id]).await;
    let carols_room = carol_mx.join(&room).await;
    let carols = say(&carol_mx, &carols_room, "hello all, carol here").await;
    let alices = say(&alice_mx, &room, "hi everyone").await;
    let answer = alice_mx.next_message_from(&room, &bot).await;
    assert_eq!(body(&answer), "hi room");
    assert_eq!(
        answer["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
        alices.as_str()
    );
    let requests = model.requests();
    assert_eq!(requests.len(), 6, "one model call per scripted reply");
    let last = requests[5]["messages"].to_string();
    assert!(last.contains("hi everyone"), "{last}");
    assert!(
        requests
            .iter()
            .all(|r| !r.to_string().contains("carol here")),
        "an unlinked member's message reached no agent"
    );
    let receipt = k
        .kernel
        .db()
        .call(move |c| {
            Ok(c.query_row(
                "SELECT result_json FROM adapter_ingress_receipts WHERE message_id = ?1",
                [&carols],
                |r| r.get::<_, String>(0),
            )?)
        })
        .await
        .unwrap();
    let receipt: Value = serde_json::from_str(&receipt).unwrap();
    assert_eq!(receipt["droppedReason"], "unlinked_actor", "{receipt}");
}
