//! The syscall table: each call a typed handler (serde args in, serialisable
//! result out, [`KernelError`] for frame-level failures) registered by name
//! with the capability it needs beside it. The connection's [`Session`] is
//! passed in; nothing looks identity up globally.
//!
//! The table is generic over the state `K` its handlers get, so it knows
//! nothing above itself: the kernel holds a `Dispatch<Kernel>` and
//! `domains` fills it. Which calls may go to a device instead
//! ([`is_routable`]) is decided here; the routing itself, `args.target`
//! included, is `routing::run_call`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::caps::has_capability;
use crate::error::KernelError;
use crate::session::Session;

type Handler<K> = Arc<
    dyn Fn(Arc<K>, Arc<Session>, Value) -> BoxFuture<'static, Result<Value, KernelError>>
        + Send
        + Sync,
>;

/// One registered syscall.
pub struct Entry<K> {
    pub capability: &'static str,
    /// Only a process may call it (`codemode.exec`); a socket gets 403.
    pub internal: bool,
    handler: Handler<K>,
}

// A derived `Clone` would ask `K: Clone`; only the `Arc` is cloned.
impl<K> Clone for Entry<K> {
    fn clone(&self) -> Self {
        Entry {
            capability: self.capability,
            internal: self.internal,
            handler: self.handler.clone(),
        }
    }
}

impl<K> Entry<K> {
    /// Runs the handler on authorised arguments for a native call.
    pub async fn call(
        &self,
        state: Arc<K>,
        session: Arc<Session>,
        args: Value,
    ) -> Result<Value, KernelError> {
        (self.handler)(state, session, args).await
    }
}

impl<K> std::fmt::Debug for Entry<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("capability", &self.capability)
            .field("internal", &self.internal)
            .finish()
    }
}

/// The table, built once at start.
pub struct Dispatch<K> {
    table: HashMap<&'static str, Entry<K>>,
}

impl<K> Default for Dispatch<K> {
    fn default() -> Self {
        Dispatch {
            table: HashMap::new(),
        }
    }
}

impl<K> std::fmt::Debug for Dispatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut calls: Vec<_> = self.table.keys().collect();
        calls.sort();
        f.debug_struct("Dispatch").field("calls", &calls).finish()
    }
}

/// Domains whose calls may be routed to a device with `target`.
const ROUTABLE_DOMAINS: &[&str] = &["fs", "shell", "net"];

impl<K: Send + Sync + 'static> Dispatch<K> {
    /// Registers `call`, handled by `f`. The capability a call needs is
    /// its own name (matched by `has_capability`'s wildcards: `fs.*`, `*`).
    pub fn add<A, R, F, Fut>(&mut self, call: &'static str, f: F)
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        F: Fn(Arc<K>, Arc<Session>, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, KernelError>> + Send + 'static,
    {
        self.insert(call, call, false, f);
    }

    /// [`Dispatch::add`] for a call only a process may make: a socket
    /// asking for it gets 403 like a call it lacks the capability for.
    pub fn add_internal<A, R, F, Fut>(&mut self, call: &'static str, f: F)
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        F: Fn(Arc<K>, Arc<Session>, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, KernelError>> + Send + 'static,
    {
        self.insert(call, call, true, f);
    }

    fn insert<A, R, F, Fut>(
        &mut self,
        call: &'static str,
        capability: &'static str,
        internal: bool,
        f: F,
    ) where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        F: Fn(Arc<K>, Arc<Session>, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, KernelError>> + Send + 'static,
    {
        let f = Arc::new(f);
        let handler: Handler<K> = Arc::new(move |k, s, raw| {
            let f = f.clone();
            Box::pin(async move {
                // The path names the argument (`expression.everyMs: …`).
                let args: A = serde_path_to_error::deserialize(raw).map_err(|e| {
                    let path = e.path().to_string();
                    let inner = e.into_inner();
                    KernelError::InvalidArgs {
                        call: call.to_owned(),
                        reason: if path == "." {
                            inner.to_string()
                        } else {
                            format!("{path}: {inner}")
                        },
                    }
                })?;
                let out = f(k, s, args).await?;
                serde_json::to_value(out).map_err(|e| KernelError::internal(call, e))
            })
        });
        let prev = self.table.insert(
            call,
            Entry {
                capability,
                internal,
                handler,
            },
        );
        assert!(prev.is_none(), "syscall {call} registered twice");
    }

    /// The gate that runs before anything is routed or registered: the
    /// caller's capabilities must cover the call (403), then the call must
    /// exist (404). The order is the reference's (`do.ts` checks
    /// `hasCapability` before `dispatch.ts` answers "Unknown syscall"), so
    /// a user's unknown call is 403 and only a caller holding `*` (root)
    /// learns it does not exist.
    pub fn authorize(&self, session: &Session, call: &str) -> Result<&Entry<K>, KernelError> {
        if !has_capability(&session.capabilities, call) {
            return Err(KernelError::PermissionDenied(call.to_owned()));
        }
        let entry = self
            .table
            .get(call)
            .ok_or_else(|| KernelError::UnknownSyscall(call.to_owned()))?;
        if !has_capability(&session.capabilities, entry.capability)
            || (entry.internal && !session.is_process())
        {
            return Err(KernelError::PermissionDenied(call.to_owned()));
        }
        Ok(entry)
    }

    /// [`Dispatch::authorize`] for every caller (a client's request or a
    /// process's tool call): a routable call with no native handler passes
    /// as `None`, since it can still go to a device.
    pub fn gate(&self, session: &Session, call: &str) -> Result<Option<Entry<K>>, KernelError> {
        match self.authorize(session, call) {
            Ok(e) => Ok(Some(e.clone())),
            Err(KernelError::UnknownSyscall(_)) if is_routable(call) => Ok(None),
            Err(e) => Err(e),
        }
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
