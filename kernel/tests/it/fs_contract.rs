//! The one `fs.*` contract (`gsv_protocol::fs::testkit`) as a kernel
//! caller sees it over the real WebSocket: natively on the system store
//! (dofs), and routed to a `gsv node` driver (disk) connected to the same
//! kernel. Then a native and a routed `fs.read` of the same content, and
//! a reference device's body, compared shape for shape.

use std::path::Path;

use gsv_kernel::client::GsvClient;
use gsv_protocol::fs::testkit::FsTarget;
use gsv_protocol::fs::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use wsd_dofs::WriteOptions;
use wsd_sync::SyncPath;

use crate::harness::{ScriptedDriver, TestKernel, node_token};
use crate::node::{Node, start_node};

/// Alice's calls, natively (`target` absent) or on a device.
struct Caller {
    client: Mutex<GsvClient>,
    target: Option<&'static str>,
}

impl Caller {
    async fn call<A: Serialize, T: DeserializeOwned>(&self, call: &str, args: A) -> FsResult<T> {
        let mut args = serde_json::to_value(args).unwrap();
        if let Some(t) = self.target {
            args["target"] = json!(t);
        }
        let v = self.client.lock().await.call(call, args).await.unwrap();
        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{call} answered {v}: {e}"))
    }
}

/// The kernel's native `fs.*` in alice's home.
struct Native {
    k: TestKernel,
    alice: Caller,
}

/// `fs.*` routed to alice's node `node1`, whose root is the scratch dir.
struct Routed {
    _k: TestKernel,
    node: Node,
    alice: Caller,
}

async fn native() -> Native {
    let k = TestKernel::with_users().await;
    let alice = Caller {
        client: Mutex::new(k.alice().await),
        target: None,
    };
    Native { k, alice }
}

async fn routed() -> Routed {
    let k = TestKernel::with_users().await;
    let mut client = k.alice().await;
    let node = start_node(&k, &mut client, "node1").await;
    let alice = Caller {
        client: Mutex::new(client),
        target: Some("node1"),
    };
    Routed { _k: k, node, alice }
}

/// Implements the target's calls through its `alice` caller.
macro_rules! calls_through_alice {
    () => {
        async fn read(&self, a: ReadArgs) -> FsResult<ReadResult> {
            self.alice.call("fs.read", a).await
        }
        async fn write(&self, a: WriteArgs) -> FsResult<WriteResult> {
            self.alice.call("fs.write", a).await
        }
        async fn edit(&self, a: EditArgs) -> FsResult<EditResult> {
            self.alice.call("fs.edit", a).await
        }
        async fn delete(&self, a: DeleteArgs) -> FsResult<DeleteResult> {
            self.alice.call("fs.delete", a).await
        }
        async fn search(&self, a: SearchArgs) -> FsResult<SearchResult> {
            self.alice.call("fs.search", a).await
        }
    };
}

impl FsTarget for Native {
    fn path(&self, rel: &str) -> String {
        format!("/home/alice/{rel}")
    }
    async fn put(&self, rel: &str, bytes: &[u8]) {
        let p = SyncPath::new(format!("home/alice/{rel}")).unwrap();
        let opts = WriteOptions {
            create_parents: true,
            ..WriteOptions::default()
        };
        let mut d = self.k.kernel.system().lock().unwrap();
        d.write_file_with(&p, bytes, opts).unwrap();
    }
    calls_through_alice!();
}

impl FsTarget for Routed {
    fn path(&self, rel: &str) -> String {
        rel.to_owned()
    }
    async fn put(&self, rel: &str, bytes: &[u8]) {
        let p = self.node.root.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap_or(Path::new("."))).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    calls_through_alice!();
}

mod native {
    gsv_protocol::fs_contract_tests!(super::native);
}

mod routed {
    gsv_protocol::fs_contract_tests!(super::routed);
}

/// The fields of a `data` object, and its values but `path` (each target
/// shows paths in its own spelling).
fn shape(v: &Value) -> (Vec<String>, Value) {
    let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    let mut rest = v.clone();
    rest.as_object_mut().unwrap().remove("path");
    (keys, rest)
}

#[tokio::test]
async fn a_routed_and_a_native_read_of_the_same_file_have_the_same_shape() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = start_node(&k, &mut alice, "node1").await;
    // Long enough to be cut at the read cap, so `truncated` and
    // `nextOffset` are compared too.
    let line = "é ".repeat(40);
    let text: String = (0..5000).map(|i| format!("{i} {line}\n")).collect();
    alice
        .call("fs.write", json!({"path": "~/same.txt", "content": text}))
        .await
        .unwrap();
    std::fs::write(node.root.path().join("same.txt"), &text).unwrap();
    for args in [
        json!({}),
        json!({"offset": 3, "limit": 2}),
        json!({"offset": 4990}),
    ] {
        let mut native = args.clone();
        native["path"] = json!("~/same.txt");
        let mut on_node = args.clone();
        on_node["path"] = json!("same.txt");
        on_node["target"] = json!("node1");
        let n = alice.call("fs.read", native).await.unwrap();
        let r = alice.call("fs.read", on_node).await.unwrap();
        assert_eq!(shape(&n), shape(&r), "{args}");
        assert_eq!(n["kind"], "text");
    }
    let whole = alice
        .call("fs.read", json!({"path": "~/same.txt"}))
        .await
        .unwrap();
    assert_eq!(whole["truncated"], true, "{}", whole["lines"]);
    // The same failure is the same code.
    let n = alice
        .call("fs.read", json!({"path": "~/absent.txt"}))
        .await
        .unwrap();
    let r = alice
        .call("fs.read", json!({"path": "absent.txt", "target": "node1"}))
        .await
        .unwrap();
    assert_eq!(
        (&n["ok"], &n["code"]),
        (&json!(false), &json!("not_found")),
        "{n}"
    );
    assert_eq!((&r["ok"], &r["code"]), (&n["ok"], &n["code"]), "{r}");
}

/// The reference CLI's device answers `fs.read` with the selected lines
/// bare as a binary body; the kernel relays it in the same shape as a
/// native read of the same content.
#[tokio::test]
async fn a_reference_device_body_is_relayed_in_the_native_shape() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let token = node_token(&mut alice, "dev1").await;
    let mut drv = ScriptedDriver::connect(&k, "alice", &token, "dev1", &["fs.*"]).await;
    let text = "alpha\nbeta\ngamma\ndelta\n";
    alice
        .call("fs.write", json!({"path": "~/ref.txt", "content": text}))
        .await
        .unwrap();
    let native = alice
        .call(
            "fs.read",
            json!({"path": "~/ref.txt", "offset": 1, "limit": 2}),
        )
        .await
        .unwrap();
    alice
        .send_request(
            "r",
            "fs.read",
            json!({"target": "dev1", "path": "ref.txt", "offset": 1, "limit": 2}),
        )
        .await
        .unwrap();
    let req = drv.next_req().await;
    let selected = b"beta\ngamma";
    let data = json!({"ok": true, "path": "/root/ref.txt", "size": text.len(),
        "kind": "text", "contentType": "text/plain", "lines": 2});
    let res = json!({"type": "res", "id": req["id"], "ok": true, "data": data,
        "body": {"streamId": 1, "length": selected.len()}});
    drv.ws.send_text(res.to_string()).await.unwrap();
    let mut chunk = 1u32.to_le_bytes().to_vec();
    chunk.push(1 | 2);
    chunk.extend_from_slice(selected);
    drv.ws.send_binary(chunk).await.unwrap();
    let relayed = alice.response_to("r").await.unwrap();
    assert_eq!(relayed["ok"], true, "{relayed}");
    assert_eq!(shape(&relayed["data"]), shape(&native));
    assert_eq!(native["content"], "2\tbeta\n3\tgamma");
}
