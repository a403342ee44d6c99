//! `codemode.exec` and `codemode.run`: a block's host calls are the
//! process's own syscalls, through the gate and dispatch the agent loop's
//! tool calls use (`proc::calls::run`: cwd, approval, capability, device
//! routing).

use std::sync::Arc;

use gsv_protocol::ai::ConfigResult;
use gsv_protocol::codemode::{CodeModeResult, ExecArgs, RunArgs};
use serde_json::{Map, Value, json};

use super::sandbox::{self, Globals, Host, Limits};
use crate::domains::accounts;
use crate::domains::mcp;
use crate::domains::proc::calls::run as proc_run;
use crate::domains::proc::hil::{self, Policy};
use crate::domains::proc::store::{self as proc_store, ProcRow};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// Whom a block's calls are asked for.
#[derive(Debug, Clone)]
enum Approval {
    /// The model wrote the block: the process's approval policy applies,
    /// asked in its active run.
    Policy {
        row: Box<ProcRow>,
        run_id: Option<String>,
        policy: Option<Policy>,
    },
    /// A user wrote it (`codemode.run`): running it is their approval.
    Author,
}

/// `codemode.exec`: the model's `CodeMode` tool, called by a process.
pub async fn exec(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ExecArgs,
) -> Result<CodeModeResult, KernelError> {
    let pid = s.client_id.clone();
    let p = pid.clone();
    let row =
        k.db.call(move |c| proc_store::get(c, &p))
            .await?
            .ok_or_else(|| KernelError::AccessDenied {
                kind: "process",
                id: pid.clone(),
            })?;
    let run_id = k.procs.active_run(&pid);
    let cwd = row.cwd.clone();
    let config: ConfigResult =
        serde_json::from_value(proc_run::dispatch_call(&k, &s, "ai.config", Map::new()).await?)
            .map_err(|e| KernelError::Internal(format!("ai.config: {e}")))?;
    let policy = hil::approval_policy(&config, row.run_as_uid).map_err(KernelError::Internal)?;
    let approval = Approval::Policy {
        row: Box::new(row),
        run_id,
        policy,
    };
    let globals = Globals {
        args: json!({}),
        mcp_tools: mcp::calls::codemode_bindings(&k, s.identity.uid).await,
        ..Globals::default()
    };
    Ok(run_block(&k, s, cwd, approval, &a.code, globals).await)
}

/// `codemode.run`: a user's block, in one of their processes (`pid`) or
/// as themselves in their home.
pub async fn run(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: RunArgs,
) -> Result<CodeModeResult, KernelError> {
    let (session, cwd) = match &a.pid {
        Some(pid) => {
            let p = pid.clone();
            let row = k.db.call(move |c| proc_store::get(c, &p)).await?;
            let row = match row {
                Some(r) if s.identity.is_root() || r.owner_uid == s.identity.uid => r,
                _ => {
                    return Err(KernelError::AccessDenied {
                        kind: "process",
                        id: pid.clone(),
                    });
                }
            };
            let session = proc_run::process_session(&k, &row).await?;
            (Arc::new(session), row.cwd)
        }
        None => {
            let home = s.identity.home.clone();
            (s, home)
        }
    };
    let globals = Globals {
        argv: a.argv,
        args: a.args.unwrap_or_else(|| json!({})),
        target: a.target,
        cwd: a.cwd,
        mcp_tools: mcp::calls::codemode_bindings(&k, session.identity.uid).await,
    };
    Ok(run_block(&k, session, cwd, Approval::Author, &a.code, globals).await)
}

async fn run_block(
    k: &Arc<Kernel>,
    session: Arc<Session>,
    cwd: String,
    approval: Approval,
    code: &str,
    globals: Globals,
) -> CodeModeResult {
    let limits = Limits {
        deadline: k.config.codemode_deadline,
        ..Limits::default()
    };
    let host = host(k.clone(), session, cwd, approval);
    sandbox::run(code, globals, host, limits).await
}

/// The block's one way out: each call is a syscall of the session.
fn host(k: Arc<Kernel>, session: Arc<Session>, cwd: String, approval: Approval) -> Host {
    let shared = Arc::new((k, session, cwd, approval));
    Arc::new(move |call: String, args: Map<String, Value>| {
        let shared = shared.clone();
        Box::pin(async move {
            let (k, session, cwd, approval) = &*shared;
            if call.starts_with("codemode.") {
                return Err(format!("{call} cannot be called from inside CodeMode"));
            }
            let args = proc_run::with_cwd(args, &call, cwd);
            if let Approval::Policy {
                row,
                run_id,
                policy,
            } = approval
            {
                let tool_call_id = format!("codemode_{}", accounts::random_hex(6));
                proc_run::approve(
                    k,
                    row,
                    session,
                    run_id.as_deref(),
                    policy.as_ref(),
                    proc_run::ToolRef {
                        call_id: &tool_call_id,
                        name: "CodeMode",
                    },
                    &call,
                    &args,
                )
                .await?;
            }
            proc_run::syscall(k, session, &call, args).await
        })
    })
}
