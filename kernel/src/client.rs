//! A small client of the kernel's WebSocket protocol, used by the `gsv`
//! CLI and by the integration tests. Every wait has a deadline.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use gsv_protocol::PROTOCOL;

/// A client failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("connecting to {url}: {message}")]
    Connect { url: String, message: String },
    #[error("no answer from the kernel within {0:?}")]
    Timeout(Duration),
    #[error("the kernel closed the connection{}", .0.as_ref().map(|(c, r)| format!(" ({c}: {r})")).unwrap_or_default())]
    Closed(Option<(u16, String)>),
    #[error("websocket: {0}")]
    Socket(String),
    #[error("the kernel sent something that is not a JSON frame: {0}")]
    BadFrame(String),
    #[error("{call} failed with {code}: {message}")]
    Remote {
        call: String,
        code: i64,
        message: String,
    },
}

/// How to log in.
#[derive(Debug, Clone)]
pub enum Credentials {
    Password(String),
    Token(String),
}

/// One connection to a kernel.
#[derive(Debug)]
pub struct GsvClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Deadline for each answer.
    pub timeout: Duration,
}

impl GsvClient {
    /// Opens `url` (`ws://host:port/ws`).
    pub async fn connect(url: &str) -> Result<GsvClient, ClientError> {
        let fail = |message: String| ClientError::Connect {
            url: url.to_owned(),
            message,
        };
        let (ws, _) = tokio::time::timeout(
            Duration::from_secs(10),
            // Frames are small and latency-bound (keystrokes): no Nagle.
            tokio_tungstenite::connect_async_with_config(url, None, true),
        )
        .await
        .map_err(|_| fail("timed out".into()))?
        .map_err(|e| fail(e.to_string()))?;
        Ok(GsvClient {
            ws,
            next_id: 0,
            timeout: Duration::from_secs(60),
        })
    }

    /// Opens `url` over `stream`, a TCP connection the caller made (tests
    /// shape its socket, e.g. a small receive buffer).
    pub async fn over(url: &str, stream: TcpStream) -> Result<GsvClient, ClientError> {
        let fail = |message: String| ClientError::Connect {
            url: url.to_owned(),
            message,
        };
        stream.set_nodelay(true).map_err(|e| fail(e.to_string()))?;
        let (ws, _) = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream)),
        )
        .await
        .map_err(|_| fail("timed out".into()))?
        .map_err(|e| fail(e.to_string()))?;
        Ok(GsvClient {
            ws,
            next_id: 0,
            timeout: Duration::from_secs(60),
        })
    }

    /// Sends raw text (tests send malformed frames this way).
    pub async fn send_text(&mut self, text: impl Into<String>) -> Result<(), ClientError> {
        self.ws
            .send(Message::Text(text.into().into()))
            .await
            .map_err(|e| ClientError::Socket(e.to_string()))
    }

    /// Sends a binary message (a body chunk, reference §1.4).
    pub async fn send_binary(&mut self, bytes: Vec<u8>) -> Result<(), ClientError> {
        self.ws
            .send(Message::Binary(bytes.into()))
            .await
            .map_err(|e| ClientError::Socket(e.to_string()))
    }

    /// The next JSON frame.
    pub async fn recv(&mut self) -> Result<Value, ClientError> {
        loop {
            let msg = tokio::time::timeout(self.timeout, self.ws.next())
                .await
                .map_err(|_| ClientError::Timeout(self.timeout))?;
            match msg {
                None => return Err(ClientError::Closed(None)),
                Some(Err(e)) => return Err(ClientError::Socket(e.to_string())),
                Some(Ok(Message::Text(t))) => {
                    return serde_json::from_str(t.as_str())
                        .map_err(|_| ClientError::BadFrame(t.to_string()));
                }
                Some(Ok(Message::Close(c))) => {
                    return Err(ClientError::Closed(
                        c.map(|c| (u16::from(c.code), c.reason.to_string())),
                    ));
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// A fresh request id.
    pub fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        format!("r{}", self.next_id)
    }

    /// Sends a request with `id` without waiting.
    pub async fn send_request(
        &mut self,
        id: &str,
        call: &str,
        args: Value,
    ) -> Result<(), ClientError> {
        let frame = json!({"type": "req", "id": id, "call": call, "args": args});
        self.send_text(frame.to_string()).await
    }

    /// Waits for the response to `id`, skipping signals and other answers.
    pub async fn response_to(&mut self, id: &str) -> Result<Value, ClientError> {
        loop {
            let f = self.recv().await?;
            if f["type"] == "res" && f["id"] == id {
                return Ok(f);
            }
        }
    }

    /// Sends a request and returns the whole response frame.
    pub async fn request(&mut self, call: &str, args: Value) -> Result<Value, ClientError> {
        let id = self.fresh_id();
        self.send_request(&id, call, args).await?;
        self.response_to(&id).await
    }

    /// Sends a request and returns its `data`; `ok:false` is an error.
    pub async fn call(&mut self, call: &str, args: Value) -> Result<Value, ClientError> {
        let f = self.request(call, args).await?;
        if f["ok"] == true {
            Ok(f.get("data").cloned().unwrap_or(Value::Null))
        } else {
            Err(ClientError::Remote {
                call: call.to_owned(),
                code: f["error"]["code"].as_i64().unwrap_or(0),
                message: f["error"]["message"].as_str().unwrap_or("").to_owned(),
            })
        }
    }

    /// `sys.connect` as a user, with the client id `gsv-cli` (a second
    /// login of the same user with it replaces this one: see
    /// [`GsvClient::login_as`]).
    pub async fn login(
        &mut self,
        username: &str,
        creds: &Credentials,
    ) -> Result<Value, ClientError> {
        self.login_as("gsv-cli", Some(username), creds).await
    }

    /// `sys.connect` as a user under `client_id`. The kernel replaces an
    /// older connection of the same user and client id, so clients that
    /// must not knock each other off use ids of their own. `username` may
    /// be left out with a token, which names its account.
    pub async fn login_as(
        &mut self,
        client_id: &str,
        username: Option<&str>,
        creds: &Credentials,
    ) -> Result<Value, ClientError> {
        let mut auth = match creds {
            Credentials::Password(p) => json!({"password": p}),
            Credentials::Token(t) => json!({"token": t}),
        };
        if let Some(u) = username {
            auth["username"] = json!(u);
        }
        self.call("sys.connect", connect_args(client_id, "user", auth))
            .await
    }

    /// Closes the socket politely.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// `sys.connect` args for `role` with `auth`.
pub fn connect_args(client_id: &str, role: &str, auth: Value) -> Value {
    json!({
        "protocol": PROTOCOL,
        "client": {
            "id": client_id,
            "version": env!("CARGO_PKG_VERSION"),
            "platform": std::env::consts::OS,
            "role": role,
        },
        "auth": auth,
    })
}
