//! The syscall table: each call a typed handler (serde args in, serialisable
//! result out, [`KernelError`] for frame-level failures) registered by name
//! with the capability it needs beside it. The connection's [`Session`] is
//! passed in; nothing looks identity up globally.
//!
//! `args.target` is handled here and only here: absent, empty or `"gsv"`
//! means native; any other value on a routable call (`fs.*`, `shell.*`,
//! `net.*`) is a device route ([`crate::routing`]), as is a `shell.exec`
//! continuing a device's shell session. A routed call needs no native
//! handler: only the caller's capability is checked before routing.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::caps::has_capability;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

type Handler = Arc<
    dyn Fn(Arc<Kernel>, Arc<Session>, Value) -> BoxFuture<'static, Result<Value, KernelError>>
        + Send
        + Sync,
>;

/// One registered syscall.
#[derive(Clone)]
pub struct Entry {
    pub capability: &'static str,
    handler: Handler,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("capability", &self.capability)
            .finish()
    }
}

/// The table, built once at start.
#[derive(Debug, Default)]
pub struct Dispatch {
    table: HashMap<&'static str, Entry>,
}

/// Domains whose calls may be routed to a device with `target`.
const ROUTABLE_DOMAINS: &[&str] = &["fs", "shell", "net"];

impl Dispatch {
    /// Registers `call`, needing `capability`, handled by `f`.
    pub fn add<A, R, F, Fut>(&mut self, call: &'static str, capability: &'static str, f: F)
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        F: Fn(Arc<Kernel>, Arc<Session>, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, KernelError>> + Send + 'static,
    {
        let f = Arc::new(f);
        let handler: Handler = Arc::new(move |k, s, raw| {
            let f = f.clone();
            Box::pin(async move {
                let args: A =
                    serde_json::from_value(raw).map_err(|e| KernelError::InvalidArgs {
                        call: call.to_owned(),
                        reason: e.to_string(),
                    })?;
                let out = f(k, s, args).await?;
                serde_json::to_value(out).map_err(|e| KernelError::internal(call, e))
            })
        });
        let prev = self.table.insert(
            call,
            Entry {
                capability,
                handler,
            },
        );
        assert!(prev.is_none(), "syscall {call} registered twice");
    }

    /// The gate that runs before anything is routed or registered: the
    /// caller's capabilities must cover the call (403), then the call must
    /// exist (404).
    pub fn authorize(&self, session: &Session, call: &str) -> Result<&Entry, KernelError> {
        if !has_capability(&session.capabilities, call) {
            return Err(KernelError::PermissionDenied(call.to_owned()));
        }
        let entry = self
            .table
            .get(call)
            .ok_or_else(|| KernelError::UnknownSyscall(call.to_owned()))?;
        if !has_capability(&session.capabilities, entry.capability) {
            return Err(KernelError::PermissionDenied(call.to_owned()));
        }
        Ok(entry)
    }

    /// [`Dispatch::authorize`] for every caller (a client's request or a
    /// process's tool call): a routable call with no native handler passes
    /// as `None`, since it can still go to a device.
    pub fn gate(&self, session: &Session, call: &str) -> Result<Option<Entry>, KernelError> {
        match self.authorize(session, call) {
            Ok(e) => Ok(Some(e.clone())),
            Err(KernelError::UnknownSyscall(_)) if is_routable(call) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Runs an authorised call; `entry` is `None` for a routable call with
    /// no native handler (it can only be routed).
    pub async fn run(
        entry: Option<Entry>,
        kernel: Arc<Kernel>,
        session: Arc<Session>,
        call: &str,
        mut args: Map<String, Value>,
    ) -> Result<Value, KernelError> {
        let target = args.remove("target");
        if let Some(s) = crate::routing::device_session(&kernel, call, &args).await? {
            let target = target.and_then(|t| t.as_str().map(str::to_owned));
            return crate::routing::continue_session(&kernel, &session, s, target, args).await;
        }
        match target {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t.is_empty() || t == "gsv" => {}
            Some(Value::String(t)) if is_routable(call) => {
                return crate::routing::route_to_target(&kernel, &session, call, t, args).await;
            }
            Some(Value::String(_)) => {}
            Some(_) => {
                return Err(KernelError::InvalidArgs {
                    call: call.to_owned(),
                    reason: "target must be a string".into(),
                });
            }
        }
        let Some(entry) = entry else {
            return Err(KernelError::UnknownSyscall(call.to_owned()));
        };
        (entry.handler)(kernel, session, Value::Object(args)).await
    }

    /// Registered call names, sorted (for diagnostics).
    pub fn calls(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.table.keys().copied().collect();
        v.sort();
        v
    }
}

/// Whether `call` may be routed to a device with `target`.
pub fn is_routable(call: &str) -> bool {
    call.split_once('.')
        .is_some_and(|(domain, _)| ROUTABLE_DOMAINS.contains(&domain))
}

/// The whole table.
pub fn table() -> Dispatch {
    let mut d = Dispatch::default();
    crate::syscalls::register(&mut d);
    d
}
