//! The kernel side: one connection as `role:"service"`,
//! `client.channel:"matrix"`, authenticated by a service token (the
//! connection itself, reconnecting with backoff, is `gsv_link`'s).
//!
//! The adapter calls `adapter.inbound` for each queued Matrix message, one
//! at a time and in order (a message whose answer did not arrive is sent
//! again, with the same `deliveryId`, on the next connection), and
//! `adapter.state.update` whenever the Matrix side's state changes. The
//! kernel's `adapter.send|connect|disconnect|status` requests are answered
//! concurrently. A refused handshake (bad token, setup required) stops the
//! adapter; overload (429, 503) is retried.

use futures::FutureExt as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use gsv_link::{CallError, Client, Connection, Incoming, LinkConfig, Sender};
use gsv_protocol::adapter::{
    self, AccountStatus, ConnectArgs, ConnectResult, Connected, DisconnectArgs, Disconnected,
    InboundArgs, InboundResult, SendArgs, StateUpdateArgs, StatusArgs, StatusResult,
};
use gsv_protocol::error::code;
use gsv_protocol::{OpResult, PROTOCOL, WireError};

use crate::{ADAPTER, AdapterError, Config, MatrixBot};

/// The connection to the kernel and what it serves.
#[derive(Debug)]
pub struct Link {
    config: LinkConfig,
    bot: MatrixBot,
    /// Whether the Matrix sync runs (`adapter.connect|disconnect`).
    enabled: watch::Sender<bool>,
    status: watch::Receiver<AccountStatus>,
}

impl Link {
    pub fn new(
        config: &Config,
        bot: MatrixBot,
        enabled: watch::Sender<bool>,
        status: watch::Receiver<AccountStatus>,
    ) -> Self {
        let hello = json!({
            "protocol": PROTOCOL,
            "client": {
                "id": format!("{ADAPTER}:{}", bot.account_id()),
                "version": env!("CARGO_PKG_VERSION"),
                "platform": std::env::consts::OS,
                "role": "service",
                "channel": ADAPTER,
            },
            "auth": {"token": config.service_token},
        });
        Link {
            config: LinkConfig {
                url: config.kernel_url.clone(),
                hello,
                min_backoff: config.min_backoff,
                max_backoff: config.max_backoff,
            },
            bot,
            enabled,
            status,
        }
    }

    /// Serves the kernel until `stop` or a refused handshake.
    pub async fn run(
        self,
        inbound: mpsc::Receiver<InboundArgs>,
        stop: CancellationToken,
    ) -> Result<(), AdapterError> {
        let mut service = Service {
            bot: self.bot,
            enabled: self.enabled,
            status: self.status,
            inbound,
            carry: None,
        };
        gsv_link::run(&self.config, &mut service, &stop)
            .await
            .map_err(|r| AdapterError::KernelRefused {
                url: r.url,
                code: r.code,
                message: r.message,
            })
    }
}

/// The adapter on one connection after another.
struct Service {
    bot: MatrixBot,
    enabled: watch::Sender<bool>,
    status: watch::Receiver<AccountStatus>,
    inbound: mpsc::Receiver<InboundArgs>,
    /// The message whose `adapter.inbound` got no answer yet.
    carry: Option<InboundArgs>,
}

impl Client for Service {
    /// Overload passes; a bad token or a kernel in setup does not.
    fn refusal_is_final(&self, code: i64) -> bool {
        code != code::UNAVAILABLE && code != TOO_MANY_REQUESTS
    }

    /// Pumps Matrix messages in, state updates and answers out, until the
    /// connection ends or a call of ours goes unanswered.
    async fn serve(
        &mut self,
        connection: &mut Connection,
        stop: &CancellationToken,
    ) -> Option<String> {
        let calls = connection.sender();
        // The kernel learns the current state first on every connection.
        let mut status = self.status.clone();
        status.mark_changed();
        let pump = pump_inbound(calls.clone(), &self.bot, &mut self.inbound, &mut self.carry);
        tokio::pin!(pump);
        loop {
            tokio::select! {
                () = stop.cancelled() => return None,
                why = &mut pump => return Some(why),
                r = status.changed() => {
                    if r.is_err() {
                        return Some("the Matrix side stopped".into());
                    }
                    let current = status.borrow_and_update().clone();
                    let calls = calls.clone();
                    tokio::spawn(async move { update_state(&calls, current).await });
                }
                m = connection.next() => match m {
                    Err(why) => {
                        // An answer read just before the end still counts:
                        // the call waiting for it takes it now, so its
                        // message is not sent again.
                        let _ = (&mut pump).now_or_never();
                        return why;
                    }
                    Ok(Incoming::Request { id, call, args }) => {
                        let (bot, enabled, status) =
                            (self.bot.clone(), self.enabled.clone(), self.status.clone());
                        let calls = calls.clone();
                        tokio::spawn(async move {
                            let r = serve(&bot, &enabled, &status, &call, Value::Object(args)).await;
                            let _ = calls.respond(id, r).await;
                        });
                    }
                    // `adapter.status` broadcasts and the like: nothing to do.
                    Ok(Incoming::Signal { .. }) => {}
                },
            }
        }
    }
}

/// The kernel's "too many connections" answer (its permits are full).
const TOO_MANY_REQUESTS: i64 = 429;

/// Sends the queued Matrix messages to the kernel one at a time, in order,
/// and posts the kernel's immediate answers. Returns (to drop the
/// connection) when a call goes unanswered; the message stays in `carry`.
async fn pump_inbound(
    calls: Sender,
    bot: &MatrixBot,
    inbound: &mut mpsc::Receiver<InboundArgs>,
    carry: &mut Option<InboundArgs>,
) -> String {
    loop {
        let args = match carry {
            Some(a) => a.clone(),
            None => match inbound.recv().await {
                Some(a) => carry.insert(a).clone(),
                None => return "the Matrix side stopped".into(),
            },
        };
        match calls
            .call::<_, InboundResult>(adapter::INBOUND, &args)
            .await
        {
            Ok(result) => {
                *carry = None;
                tracing::debug!(message = %args.message.message_id, ?result, "delivered to the kernel");
                if let Some(reason) = &result.dropped_reason {
                    tracing::info!(message = %args.message.message_id, %reason, "the kernel dropped a message");
                }
                if result.challenge.is_some() || result.reply.is_some() {
                    let bot = bot.clone();
                    tokio::spawn(async move { bot.post_inbound_result(&args, &result).await });
                }
            }
            Err(e @ (CallError::Lost | CallError::Timeout { .. })) => return e.to_string(),
            // The kernel refused this message (bad input, too large…):
            // sending it again would fail the same way.
            Err(e) => {
                *carry = None;
                tracing::warn!(message = %args.message.message_id, error = %e, "the kernel refused a message");
            }
        }
    }
}

async fn update_state(calls: &Sender, status: AccountStatus) {
    tracing::debug!(?status, "adapter.state.update");
    let args = StateUpdateArgs {
        adapter: ADAPTER.into(),
        account_id: status.account_id.clone(),
        status,
    };
    if let Err(e) = calls.call::<_, Value>(adapter::STATE_UPDATE, &args).await {
        tracing::warn!(error = %e, "adapter.state.update failed");
    }
}

/// Answers one kernel request.
async fn serve(
    bot: &MatrixBot,
    enabled: &watch::Sender<bool>,
    status: &watch::Receiver<AccountStatus>,
    call: &str,
    args: Value,
) -> Result<Value, WireError> {
    let account = bot.account_id();
    let unknown = |adapter_name: &str, account_id: &str| {
        (adapter_name != ADAPTER || account_id != account).then(|| {
            format!("this adapter serves {ADAPTER} account {account}, not {adapter_name} account {account_id}")
        })
    };
    let value = match call {
        adapter::SEND => {
            let a: SendArgs = parse(call, args)?;
            let r = match unknown(&a.adapter, &a.account_id) {
                Some(e) => gsv_protocol::adapter::SendResult::failed(e, false),
                None => bot.send(&a).await,
            };
            to_value(&r)
        }
        adapter::CONNECT => {
            let a: ConnectArgs = parse(call, args)?;
            let r = match unknown(&a.adapter, &a.account_id) {
                Some(e) => ConnectResult::failed(e),
                None => {
                    enabled.send_replace(true);
                    ConnectResult::connected(Connected {
                        adapter: ADAPTER.into(),
                        account_id: account.into(),
                        connected: true,
                        authenticated: true,
                        message: Some("syncing".into()),
                        challenge: None,
                    })
                }
            };
            to_value(&r)
        }
        adapter::DISCONNECT => {
            let a: DisconnectArgs = parse(call, args)?;
            let r = match unknown(&a.adapter, &a.account_id) {
                Some(e) => OpResult::failed(e),
                None => {
                    enabled.send_replace(false);
                    OpResult::done(Disconnected {
                        adapter: ADAPTER.into(),
                        account_id: account.into(),
                        message: Some("sync paused".into()),
                    })
                }
            };
            to_value(&r)
        }
        adapter::STATUS => {
            let a: StatusArgs = parse(call, args)?;
            let current = status.borrow().clone();
            let accounts = match &a.account_id {
                Some(id) if id != account => vec![],
                _ => vec![current],
            };
            to_value(&StatusResult {
                adapter: ADAPTER.into(),
                accounts,
            })
        }
        _ => {
            return Err(WireError {
                code: 404,
                message: format!("the {ADAPTER} adapter does not serve {call}"),
                details: None,
            });
        }
    };
    Ok(value)
}

fn parse<T: DeserializeOwned>(call: &str, args: Value) -> Result<T, WireError> {
    serde_json::from_value(args).map_err(|e| WireError {
        code: 400,
        message: format!("{call}: invalid arguments: {e}"),
        details: None,
    })
}

fn to_value<T: Serialize>(v: &T) -> Value {
    // The protocol types serialise to JSON objects without fail.
    serde_json::to_value(v).expect("protocol types serialise")
}
