//! CodeMode's JavaScript engine: QuickJS through `rquickjs`, one runtime
//! per block, run on a blocking thread of its own so that a block spinning
//! its CPU costs that thread, not a worker of the kernel's runtime.
//!
//! Bounds: a memory limit, a stack limit, and a deadline enforced twice:
//! QuickJS's interrupt handler stops running JavaScript, and every host
//! call is awaited with the time left. No module loader is installed and
//! no network object exists (`fetch`, `XMLHttpRequest`, `require` are
//! undefined): the block reaches the world only through [`Host`].

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use gsv_protocol::codemode::CodeModeResult;
use rquickjs::prelude::Async;
use rquickjs::{AsyncContext, AsyncRuntime, CatchResultExt, CaughtError, Ctx, Function, Promise};
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Performs one syscall for the block: `(call, args)` → result or error
/// text (thrown in JavaScript as an `Error`).
pub type Host = Arc<
    dyn Fn(String, Map<String, Value>) -> BoxFuture<'static, Result<Value, String>> + Send + Sync,
>;

/// What one block may use.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory_bytes: usize,
    pub stack_bytes: usize,
    pub deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            stack_bytes: 1 << 20,
            deadline: Duration::from_secs(60),
        }
    }
}

/// `console.*` lines kept at most, and their bytes.
const MAX_LOG_LINES: usize = 500;
const MAX_LOG_BYTES: usize = 64 << 10;
const MAX_LOG_LINE: usize = 4 << 10;

/// One MCP tool as a function of the block (`mcpTools` entries).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct McpBinding {
    /// `lookup-record` → `lookup_record`; `None` when two servers share
    /// the tool name (then only the aliases exist).
    pub name: Option<String>,
    /// `<Server>_<tool>`, always present.
    pub alias: String,
    pub server_id: String,
    pub server_name: String,
    /// The tool's name as its server declares it.
    pub tool: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
    pub output_schema: Option<Value>,
}

/// The block's globals besides the fixed ones.
#[derive(Debug, Clone, Default)]
pub struct Globals {
    pub argv: Vec<String>,
    pub args: Value,
    /// Default `target` of `shell` and `fs.*`.
    pub target: Option<String>,
    /// Default `cwd` of `shell`.
    pub cwd: Option<String>,
    pub mcp_tools: Vec<McpBinding>,
}

/// Runs `code` as the body of an async function and says how it ended.
/// Dropping the returned future stops the block at its next instruction
/// or host call.
pub async fn run(code: &str, globals: Globals, host: Host, limits: Limits) -> CodeModeResult {
    let code = clean(code);
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel_on_drop = CancelOnDrop(cancelled.clone());
    let handle = tokio::runtime::Handle::current();
    let flag = cancelled.clone();
    let job = tokio::task::spawn_blocking(move || {
        handle.block_on(run_here(code, globals, host, limits, flag))
    });
    job.await.unwrap_or_else(|e| CodeModeResult::Failed {
        error: format!("CodeMode's engine stopped: {e}"),
        logs: Vec::new(),
    })
}

struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Code fences, NULs, and zero-width characters a model tends to add.
fn clean(code: &str) -> String {
    let mut s = code.trim();
    if let Some(rest) = s.strip_prefix("```") {
        let body = rest.split_once('\n').map_or("", |(_, b)| b);
        s = body.trim_end().strip_suffix("```").unwrap_or(body);
    }
    s.chars()
        .filter(|c| !matches!(c, '\0' | '\u{200b}' | '\u{200c}' | '\u{200d}' | '\u{feff}'))
        .collect()
}

#[derive(Debug, Default)]
struct Logs {
    lines: Vec<String>,
    bytes: usize,
    dropped: usize,
}

impl Logs {
    fn push(&mut self, mut line: String) {
        if line.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        if self.lines.len() >= MAX_LOG_LINES || self.bytes + line.len() > MAX_LOG_BYTES {
            self.dropped += 1;
            return;
        }
        self.bytes += line.len();
        self.lines.push(line);
    }

    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.lines
                .push(format!("[{} more log lines dropped]", self.dropped));
        }
        self.lines
    }
}

/// Why the interrupt handler stopped the block, if it did.
#[derive(Debug, Default)]
struct Stop {
    timed_out: AtomicBool,
}

async fn run_here(
    code: String,
    globals: Globals,
    host: Host,
    limits: Limits,
    cancelled: Arc<AtomicBool>,
) -> CodeModeResult {
    let logs = Rc::new(RefCell::new(Logs::default()));
    let deadline = Instant::now() + limits.deadline;
    let outcome = evaluate(
        &code,
        &globals,
        host,
        limits,
        deadline,
        cancelled.clone(),
        logs.clone(),
    )
    .await;
    let logs = Rc::try_unwrap(logs)
        .map(RefCell::into_inner)
        .unwrap_or_else(|rc| std::mem::take(&mut *rc.borrow_mut()))
        .finish();
    match outcome {
        Ok(result) => CodeModeResult::Completed { result, logs },
        Err(error) => CodeModeResult::Failed { error, logs },
    }
}

async fn evaluate(
    code: &str,
    globals: &Globals,
    host: Host,
    limits: Limits,
    deadline: Instant,
    cancelled: Arc<AtomicBool>,
    logs: Rc<RefCell<Logs>>,
) -> Result<Value, String> {
    let rt = AsyncRuntime::new().map_err(|e| format!("CodeMode could not start: {e}"))?;
    rt.set_memory_limit(limits.memory_bytes).await;
    rt.set_max_stack_size(limits.stack_bytes).await;
    let stop = Arc::new(Stop::default());
    let (s, c) = (stop.clone(), cancelled.clone());
    rt.set_interrupt_handler(Some(Box::new(move || {
        if c.load(Ordering::Relaxed) {
            return true;
        }
        if Instant::now() >= deadline {
            s.timed_out.store(true, Ordering::Relaxed);
            return true;
        }
        false
    })))
    .await;
    let ctx = AsyncContext::full(&rt)
        .await
        .map_err(|e| format!("CodeMode could not start: {e}"))?;
    let meta = json!({
        "argv": globals.argv,
        "args": globals.args,
        "target": globals.target,
        "cwd": globals.cwd,
        "mcpTools": globals.mcp_tools,
    })
    .to_string();
    let outcome = ctx
        .async_with(async |ctx| {
            let r = block(&ctx, code, meta, host, deadline, cancelled, logs).await;
            r.map_err(|e| describe(&ctx, e))
        })
        .await;
    let out = outcome.map_err(|e| {
        if stop.timed_out.load(Ordering::Relaxed) || Instant::now() >= deadline {
            format!(
                "CodeMode stopped: the block ran past its time limit of {} ms",
                limits.deadline.as_millis()
            )
        } else if is_out_of_memory(&e) {
            format!(
                "CodeMode stopped: the block ran out of memory (limit {} MiB): {e}",
                limits.memory_bytes >> 20
            )
        } else if is_stack_overflow(&e) {
            format!("CodeMode stopped: the block overflowed its stack: {e}")
        } else {
            e
        }
    });
    drop(ctx);
    rt.run_gc().await;
    out
}

fn is_out_of_memory(e: &str) -> bool {
    e.contains("out of memory") || e.contains("Allocation failed")
}

fn is_stack_overflow(e: &str) -> bool {
    e.contains("stack overflow") || e.contains("call stack size")
}

/// The prelude: defines the globals, then runs the block.
const PRELUDE: &str = include_str!("prelude.js");

async fn block<'js>(
    ctx: &Ctx<'js>,
    code: &str,
    meta: String,
    host: Host,
    deadline: Instant,
    cancelled: Arc<AtomicBool>,
    logs: Rc<RefCell<Logs>>,
) -> Result<Value, CaughtError<'js>> {
    let host_fn = Function::new(
        ctx.clone(),
        Async(move |call: String, args: String| {
            let (host, cancelled) = (host.clone(), cancelled.clone());
            async move { host_call(host, call, args, deadline, cancelled).await }
        }),
    )
    .catch(ctx)?;
    let log_fn = Function::new(ctx.clone(), move |line: String| {
        logs.borrow_mut().push(line)
    })
    .catch(ctx)?;
    let prelude: Function<'js> = ctx.eval(PRELUDE).catch(ctx)?;
    let promise: Promise<'js> = prelude
        .call((host_fn, log_fn, meta, code.to_owned()))
        .catch(ctx)?;
    let value: rquickjs::Value<'js> = promise.into_future().await.catch(ctx)?;
    let json = ctx.json_stringify(value).catch(ctx)?;
    match json {
        None => Ok(Value::Null),
        Some(s) => {
            let s = s.to_string().catch(ctx)?;
            Ok(serde_json::from_str(&s).unwrap_or(Value::String(s)))
        }
    }
}

/// One host call, answered to the prelude as `{"value":…}` or
/// `{"error":"…"}`: the prelude throws the error as an `Error`.
async fn host_call(
    host: Host,
    call: String,
    args: String,
    deadline: Instant,
    cancelled: Arc<AtomicBool>,
) -> String {
    let outcome = match serde_json::from_str::<Value>(&args) {
        Ok(Value::Object(m)) => {
            let left = deadline.saturating_duration_since(Instant::now());
            if cancelled.load(Ordering::Relaxed) {
                Err(format!("{call}: the block was cancelled"))
            } else {
                match tokio::time::timeout(left, host(call.clone(), m)).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("{call}: the block's time limit ran out")),
                }
            }
        }
        _ => Err(format!("{call}: arguments must be an object")),
    };
    match outcome {
        Ok(v) => json!({ "value": v }).to_string(),
        Err(e) => json!({ "error": e }).to_string(),
    }
}

/// A thrown value as one line: `Name: message` for errors.
fn describe<'js>(ctx: &Ctx<'js>, e: CaughtError<'js>) -> String {
    match e {
        CaughtError::Error(e) => e.to_string(),
        CaughtError::Exception(ex) => {
            let name = ex
                .get::<_, Option<String>>("name")
                .ok()
                .flatten()
                .unwrap_or_else(|| "Error".into());
            match ex.message() {
                Some(m) if !m.is_empty() => format!("{name}: {m}"),
                _ => name,
            }
        }
        CaughtError::Value(v) => {
            if let Some(s) = v.as_string().and_then(|s| s.to_string().ok()) {
                return s;
            }
            ctx.json_stringify(v)
                .ok()
                .flatten()
                .and_then(|s| s.to_string().ok())
                .unwrap_or_else(|| "the block threw a value that is not an Error".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_host() -> Host {
        Arc::new(|call, _| Box::pin(async move { Err(format!("{call}: no host in this test")) }))
    }

    fn echo_host() -> Host {
        Arc::new(|call, args| Box::pin(async move { Ok(json!({"call": call, "args": args})) }))
    }

    async fn run_code(code: &str) -> CodeModeResult {
        run(code, Globals::default(), no_host(), Limits::default()).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_returned_value_and_logs_come_back() {
        let r = run_code("console.log('a', 1, {b: 2}); return 1 + 1;").await;
        assert_eq!(
            r,
            CodeModeResult::Completed {
                result: json!(2),
                logs: vec![r#"a 1 {"b":2}"#.into()]
            }
        );
        let r = run_code("```js\nreturn undefined;\n```").await;
        assert_eq!(
            r,
            CodeModeResult::Completed {
                result: Value::Null,
                logs: vec![]
            }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thrown_error_fails_with_its_message_and_the_logs_so_far() {
        let r = run_code("console.log('before'); throw new TypeError('nope');").await;
        assert_eq!(
            r,
            CodeModeResult::Failed {
                error: "TypeError: nope".into(),
                logs: vec!["before".into()]
            }
        );
        let r = run_code("throw 'plain';").await;
        assert!(
            matches!(r, CodeModeResult::Failed { ref error, .. } if error == "plain"),
            "{r:?}"
        );
        let r = run_code("return (").await;
        assert!(
            matches!(r, CodeModeResult::Failed { ref error, .. } if error.starts_with("SyntaxError")),
            "{r:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_network_or_module_loader_exists() {
        let r = run_code(
            "return [typeof fetch, typeof XMLHttpRequest, typeof WebSocket, typeof require, typeof process];",
        )
        .await;
        assert_eq!(
            r,
            CodeModeResult::Completed {
                result: json!(vec!["undefined"; 5]),
                logs: vec![]
            }
        );
        let r = run_code("return await import('os');").await;
        assert!(r.is_failed(), "{r:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_runaway_loop_stops_at_the_deadline() {
        let limits = Limits {
            deadline: Duration::from_millis(300),
            ..Limits::default()
        };
        let r = run("while (true) {}", Globals::default(), no_host(), limits).await;
        let CodeModeResult::Failed { error, .. } = r else {
            panic!("{r:?}")
        };
        assert!(error.contains("time limit of 300 ms"), "{error}");
        // A loop that catches the interruption is stopped all the same.
        let r = run(
            "for (;;) { try { while (true) {} } catch (e) {} }",
            Globals::default(),
            no_host(),
            limits,
        )
        .await;
        assert!(r.is_failed(), "{r:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_memory_bomb_and_a_stack_overflow_fail_clearly() {
        let r = run_code("const a = []; for (;;) a.push('x'.repeat(1 << 20) + a.length);").await;
        let CodeModeResult::Failed { error, .. } = r else {
            panic!("{r:?}")
        };
        assert!(error.contains("out of memory"), "{error}");
        let r = run_code("const f = (n) => f(n + 1) + 1; return f(0);").await;
        let CodeModeResult::Failed { error, .. } = r else {
            panic!("{r:?}")
        };
        assert!(error.contains("stack"), "{error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn host_calls_are_awaited_and_their_errors_thrown() {
        let g = Globals {
            argv: vec!["x".into()],
            args: json!({"k": 1}),
            target: Some("laptop".into()),
            ..Globals::default()
        };
        let r = run(
            "const a = await fs.read('a.txt'); const b = await shell('ls', {timeout: 5}); \
             const c = await syscall('sys.config.get', {key: 'k'}); return {a, b, c, argv, args};",
            g,
            echo_host(),
            Limits::default(),
        )
        .await;
        let CodeModeResult::Completed { result, .. } = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            result["a"],
            json!({"call": "fs.read", "args": {"path": "a.txt", "target": "laptop"}})
        );
        assert_eq!(
            result["b"]["args"],
            json!({"input": "ls", "timeout": 5, "target": "laptop"})
        );
        assert_eq!(result["c"]["call"], "sys.config.get");
        assert_eq!(result["argv"], json!(["x"]));
        assert_eq!(result["args"], json!({"k": 1}));
        let r = run_code("try { await fs.read('x'); } catch (e) { return e.message; }").await;
        assert_eq!(
            r,
            CodeModeResult::Completed {
                result: json!("fs.read: no host in this test"),
                logs: vec![]
            }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_call_past_the_deadline_fails_the_block() {
        let slow: Host = Arc::new(|_, _| {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Value::Null)
            })
        });
        let limits = Limits {
            deadline: Duration::from_millis(200),
            ..Limits::default()
        };
        let r = run(
            "await syscall('x.y', {}); return 1;",
            Globals::default(),
            slow,
            limits,
        )
        .await;
        let CodeModeResult::Failed { error, .. } = r else {
            panic!("{r:?}")
        };
        assert!(error.contains("time limit"), "{error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn logs_are_capped() {
        let r = run_code("for (let i = 0; i < 2000; i++) console.log(i); return 0;").await;
        let CodeModeResult::Completed { logs, .. } = r else {
            panic!("{r:?}")
        };
        assert_eq!(logs.len(), MAX_LOG_LINES + 1);
        assert_eq!(logs.last().unwrap(), "[1500 more log lines dropped]");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mcp_tools_are_functions_that_unwrap_their_results() {
        let host: Host = Arc::new(|call, args| {
            Box::pin(async move {
                assert_eq!(call, "sys.mcp.call");
                Ok(match args["arguments"]["mode"].as_str() {
                    Some("structured") => json!({"content": [], "structuredContent": {"sum": 5}}),
                    Some("json") => json!({"content": [{"type": "text", "text": "{\"a\":1}"}]}),
                    Some("text") => json!({"content": [{"type": "text", "text": "plain"}]}),
                    _ => {
                        json!({"content": [{"type": "text", "text": "it broke"}], "isError": true})
                    }
                })
            })
        });
        let tool = McpBinding {
            name: Some("get_sum".into()),
            alias: "Math_get_sum".into(),
            server_id: "mcp_1".into(),
            server_name: "Math".into(),
            tool: "get-sum".into(),
            description: None,
            input_schema: None,
            output_schema: None,
        };
        let g = Globals {
            mcp_tools: vec![tool],
            ..Globals::default()
        };
        let r = run(
            "let err; try { await get_sum({mode: 'x'}); } catch (e) { err = e.message; } \
             return [await get_sum({mode: 'structured'}), await Math_get_sum({mode: 'json'}), \
                     await get_sum({mode: 'text'}), err, mcpTools[0].tool];",
            g,
            host,
            Limits::default(),
        )
        .await;
        assert_eq!(
            r,
            CodeModeResult::Completed {
                result: json!([{"sum": 5}, {"a": 1}, "plain", "it broke", "get-sum"]),
                logs: vec![]
            }
        );
    }
}
