//! `sys.mcp.*` over a real WebSocket against a real MCP server: the
//! official Python SDK's (PyPI `mcp`) streamable-HTTP server in
//! `kernel/tests/mcp/server.py`, on loopback. Without the SDK the tests
//! skip with a reason, unless `GSV_REQUIRE_MCP` is set (CI sets it).

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::harness::{TestKernel, Watcher, err_of};
use crate::proc::{Reply, answer, setup, tool};

/// The Python MCP server; killed when dropped.
pub(crate) struct McpServer {
    pub(crate) url: String,
    _child: Child,
}

impl McpServer {
    /// The server, or `None` (printed) when the SDK is not installed.
    pub(crate) async fn start() -> Option<McpServer> {
        McpServer::start_script("server.py", &[]).await
    }

    /// The server of `kernel/tests/mcp/<script>` with `env`, or `None`
    /// (printed) when the SDK is not installed.
    pub(crate) async fn start_script(script: &str, env: &[(&str, &str)]) -> Option<McpServer> {
        let has_sdk = Command::new("python3")
            .args(["-c", "import mcp.server.mcpserver, uvicorn"])
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if !has_sdk {
            assert!(
                std::env::var_os("GSV_REQUIRE_MCP").is_none(),
                "GSV_REQUIRE_MCP is set but python3 cannot import the MCP SDK (pip install mcp)"
            );
            eprintln!("skipping: python3 has no MCP SDK (pip install mcp==2.3.0)");
            return None;
        }
        let script = format!("{}/tests/mcp/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new("python3")
            .arg(script)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // The SDK logs every session at INFO; a failing test shows
            // the kernel's side.
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Importing the SDK is slow on a loaded machine; this bounds a
        // server that never starts.
        let port = tokio::time::timeout(std::time::Duration::from_secs(120), lines.next_line())
            .await
            .expect("the MCP server printed no port within 120 s")
            .unwrap()
            .expect("the MCP server exited before printing its port");
        Some(McpServer {
            url: format!("http://127.0.0.1:{}/mcp", port.trim()),
            _child: child,
        })
    }
}

fn tool_named<'a>(server: &'a Value, name: &str) -> &'a Value {
    server["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tool {name}: {server}"))
}

#[tokio::test]
async fn add_list_call_and_remove_a_real_server() {
    let Some(mcp) = McpServer::start().await else {
        return;
    };
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let added = a
        .call("sys.mcp.add", json!({"name": "Math", "url": mcp.url}))
        .await;
    let server = added["server"].clone();
    assert_eq!(server["state"], "ready", "{server}");
    assert_eq!(server["name"], "Math");
    assert_eq!(server["transport"], "auto");
    assert_eq!(server["error"], Value::Null);
    assert_eq!(server["authUrl"], Value::Null);
    assert_eq!(
        server["instructions"],
        "Arithmetic and echo tools for gsv's tests."
    );
    assert!(server["capabilities"]["tools"].is_object(), "{server}");
    assert_eq!(server["resourceCount"], 1);
    assert_eq!(server["promptCount"], 1);
    let sum = tool_named(&server, "get-sum");
    assert_eq!(sum["description"], "Adds two integers.");
    assert_eq!(sum["inputSchema"]["required"], json!(["a", "b"]));
    assert!(
        sum["outputSchema"]["properties"]["sum"].is_object(),
        "{sum}"
    );
    tool_named(&server, "echo");
    tool_named(&server, "explode");
    let id = server["serverId"].clone();
    let sig = a.signal("mcp.changed").await;
    assert_eq!(sig["serverId"], id);
    assert_eq!(sig["state"], "ready");

    let echoed = a
        .call(
            "sys.mcp.call",
            json!({"serverId": id, "name": "echo", "arguments": {"message": "hi"}}),
        )
        .await;
    assert_eq!(echoed["content"], json!([{"type": "text", "text": "hi"}]));
    assert_ne!(echoed["isError"], true);
    let summed = a
        .call(
            "sys.mcp.call",
            json!({"serverId": id, "name": "get-sum", "arguments": {"a": 2, "b": 3}}),
        )
        .await;
    assert_eq!(summed["structuredContent"], json!({"sum": 5}));
    let failed = a
        .call(
            "sys.mcp.call",
            json!({"serverId": id, "name": "explode", "arguments": {"reason": "test"}}),
        )
        .await;
    assert_eq!(failed["isError"], true, "{failed}");
    assert!(failed.to_string().contains("exploded: test"), "{failed}");

    // The same URL again is the same server.
    let again = a
        .call("sys.mcp.add", json!({"name": "Other", "url": mcp.url}))
        .await;
    assert_eq!(again["server"]["serverId"], id);
    assert_eq!(again["server"]["name"], "Math");
    let listed = a.call("sys.mcp.list", json!({})).await;
    assert_eq!(listed["servers"].as_array().unwrap().len(), 1);
    assert_eq!(listed["servers"][0]["serverId"], id);

    // Bob sees nothing of it.
    let mut b = Watcher::new(k.bob().await);
    assert_eq!(
        b.call("sys.mcp.list", json!({})).await["servers"],
        json!([])
    );
    let f = b
        .request(
            "sys.mcp.call",
            json!({"serverId": id, "name": "echo", "arguments": {"message": "x"}}),
        )
        .await;
    assert_eq!(
        err_of(&f),
        (
            404,
            format!("MCP server not found: {}", id.as_str().unwrap())
        )
    );
    assert_eq!(
        b.call("sys.mcp.remove", json!({"serverId": id})).await["removed"],
        false
    );
    assert_eq!(
        b.call("sys.mcp.refresh", json!({"serverId": id})).await["server"],
        Value::Null
    );
    let f = b.request("sys.mcp.list", json!({"uid": 1000})).await;
    assert_eq!(err_of(&f).0, 403, "{f}");

    let refreshed = a.call("sys.mcp.refresh", json!({"serverId": id})).await;
    assert_eq!(refreshed["server"]["state"], "ready");
    assert_eq!(
        a.call("sys.mcp.remove", json!({"serverId": id})).await["removed"],
        true
    );
    assert_eq!(
        a.call("sys.mcp.list", json!({})).await["servers"],
        json!([])
    );
    let f = a
        .request("sys.mcp.call", json!({"serverId": id, "name": "echo"}))
        .await;
    assert_eq!(err_of(&f).0, 404);
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_refused_and_nothing_is_stored() {
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let f = a
        .request(
            "sys.mcp.add",
            json!({"name": "x", "url": "http://mcp.example.com/mcp"}),
        )
        .await;
    let (code, msg) = err_of(&f);
    assert_eq!(code, 400);
    assert!(msg.contains("must use https"), "{msg}");
    let f = a
        .request(
            "sys.mcp.add",
            json!({"name": "x", "url": "http://127.0.0.1:9/mcp", "transport": {"type": "sse"}}),
        )
        .await;
    assert!(err_of(&f).1.contains("sse"), "{f}");
    let f = a
        .request(
            "sys.mcp.add",
            json!({"name": "", "url": "https://example.com/"}),
        )
        .await;
    assert!(err_of(&f).1.contains("name must be 1 to 80"), "{f}");
    // Nobody listens on port 9 of loopback.
    let f = a
        .request(
            "sys.mcp.add",
            json!({"name": "down", "url": "http://127.0.0.1:9/mcp"}),
        )
        .await;
    let (code, msg) = err_of(&f);
    assert_eq!(code, 503, "{msg}");
    assert!(
        msg.contains("could not connect to http://127.0.0.1:9/mcp"),
        "{msg}"
    );
    assert_eq!(
        a.call("sys.mcp.list", json!({})).await["servers"],
        json!([])
    );
}

#[tokio::test]
async fn codemode_blocks_call_mcp_tools_as_functions() {
    let Some(mcp) = McpServer::start().await else {
        return;
    };
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    a.call("sys.mcp.add", json!({"name": "Math", "url": mcp.url}))
        .await;
    let r = a
        .call(
            "codemode.run",
            json!({"code": "const s = await get_sum({a: 2, b: 3}); \
                            const e = await Math_echo({message: 'plain'}); \
                            let err; try { await explode({reason: 'js'}); } catch (x) { err = x.message; } \
                            return {s, e, err, names: mcpTools.map((t) => t.name + '/' + t.alias + '/' + t.tool)};"}),
        )
        .await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["result"]["s"], json!({"sum": 5}));
    assert_eq!(r["result"]["e"], "plain");
    assert!(
        r["result"]["err"]
            .as_str()
            .unwrap()
            .contains("exploded: js"),
        "{r}"
    );
    let names = r["result"]["names"].to_string();
    assert!(names.contains("get_sum/Math_get_sum/get-sum"), "{names}");
}

#[tokio::test]
async fn the_model_sees_mcp_declarations_and_its_mcp_calls_ask_first() {
    let Some(mcp) = McpServer::start().await else {
        return;
    };
    let code = "return await get_sum({a: 20, b: 22});";
    let (k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool("c1", "CodeMode", json!({"code": code}))]),
            answer("42"),
        ],
        &[],
    )
    .await;
    let _k = k;
    a.call("sys.mcp.add", json!({"name": "Math", "url": mcp.url}))
        .await;
    let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "add"}))
        .await;
    let req = a.signal("proc.run.hil.requested", |_| true).await;
    assert_eq!(req["syscall"], "sys.mcp.call");
    assert_eq!(req["tags"], json!(["mcp"]));
    assert_eq!(req["args"]["name"], "get-sum");
    a.call(
        "proc.hil",
        json!({"requestId": req["requestId"], "decision": "approve"}),
    )
    .await;
    let done = a
        .signal("proc.run.tool.finished", |p| p["toolCallId"] == "c1")
        .await;
    assert_eq!(done["output"]["result"], json!({"sum": 42}), "{done}");
    a.finished(&s["runId"]).await;
    let tools = &m.requests()[0]["tools"];
    let codemode = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "CodeMode")
        .unwrap();
    let description = codemode["function"]["description"].as_str().unwrap();
    assert!(
        description.contains("declare function get_sum(args: { a: number; b: number; })"),
        "{description}"
    );
}
