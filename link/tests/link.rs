//! `gsv-link` against a scripted kernel: a real WebSocket server on
//! loopback that speaks the frames by hand, one script per connection.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use gsv_link::{CallError, Client, Connection, Incoming, LinkConfig};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

type Ws = WebSocketStream<TcpStream>;

/// Every test ends within this, whatever the code under test does.
const DEADLINE: Duration = Duration::from_secs(20);

/// `f`'s output, or a failed test past [`DEADLINE`].
async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(DEADLINE, f)
        .await
        .expect("within the deadline")
}

/// A kernel on `127.0.0.1:0` running `script(socket, n)` for its n-th
/// connection; how many it accepted.
async fn scripted_kernel<F, Fut>(script: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(Ws, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            let ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
            tokio::spawn(script(ws, n));
        }
    });
    (url, accepted)
}

fn config(url: String) -> LinkConfig {
    LinkConfig {
        url,
        hello: json!({"protocol": 2, "client": {"id": "t", "role": "driver"}, "auth": {"token": "k"}}),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
    }
}

async fn next_json(ws: &mut Ws) -> Option<Value> {
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Text(t) = m {
            return Some(serde_json::from_str(t.as_str()).unwrap());
        }
    }
    None
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

/// Reads `sys.connect` and answers it.
async fn handshake(ws: &mut Ws, answer: Value) -> Value {
    let hello = next_json(ws).await.unwrap();
    let mut res = answer;
    res["type"] = json!("res");
    res["id"] = json!("connect");
    send(ws, res).await;
    hello
}

/// A client that never serves (its connections are refused) or ends
/// each connection at once.
struct Idle {
    final_code: i64,
    served: mpsc::UnboundedSender<()>,
}

impl Client for Idle {
    fn refusal_is_final(&self, code: i64) -> bool {
        code == self.final_code
    }

    async fn serve(&mut self, _: &mut Connection, _: &CancellationToken) -> Option<String> {
        let _ = self.served.send(());
        Some("done".into())
    }
}

#[tokio::test]
async fn a_refusal_the_client_calls_final_ends_the_run_and_any_other_is_retried() {
    let (url, accepted) = scripted_kernel(|mut ws, n| async move {
        let code = if n == 0 { 503 } else { 425 };
        handshake(
            &mut ws,
            json!({"ok": false, "error": {"code": code, "message": "not now"}}),
        )
        .await;
    })
    .await;
    let (served, mut serves) = mpsc::unbounded_channel();
    let mut client = Idle {
        final_code: 425,
        served,
    };
    let stop = CancellationToken::new();
    let r = tokio::time::timeout(DEADLINE, gsv_link::run(&config(url), &mut client, &stop))
        .await
        .expect("the run ends");
    let refused = r.unwrap_err();
    assert_eq!((refused.code, refused.message.as_str()), (425, "not now"));
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert!(
        serves.try_recv().is_err(),
        "a refused connection is never served"
    );
}

#[tokio::test]
async fn the_hello_is_sent_as_sys_connect_and_a_dropped_connection_is_opened_again() {
    let (hellos_tx, mut hellos) = mpsc::unbounded_channel();
    let (url, _) = scripted_kernel(move |mut ws, _| {
        let hellos = hellos_tx.clone();
        async move {
            let hello = handshake(&mut ws, json!({"ok": true, "data": {}})).await;
            let _ = hellos.send(hello);
        }
    })
    .await;
    let (served, mut serves) = mpsc::unbounded_channel();
    let mut client = Idle {
        final_code: 425,
        served,
    };
    let stop = CancellationToken::new();
    let cfg = config(url);
    let run = gsv_link::run(&cfg, &mut client, &stop);
    let watch = async {
        for _ in 0..2 {
            serves.recv().await.unwrap();
        }
        stop.cancel();
    };
    let (r, ()) = tokio::time::timeout(DEADLINE, async { tokio::join!(run, watch) })
        .await
        .expect("the run stops");
    assert!(r.is_ok());
    let hello = hellos.recv().await.unwrap();
    assert_eq!(
        (&hello["type"], &hello["id"], &hello["call"], &hello["args"]),
        (
            &json!("req"),
            &json!("connect"),
            &json!("sys.connect"),
            &cfg.hello
        )
    );
}

/// Answers each request with its arguments and, on the first, calls
/// `ping` on the kernel (from its own task: the answer arrives through
/// the connection this task is reading) and reports what came back.
struct Echo {
    results: mpsc::UnboundedSender<Result<Value, String>>,
}

impl Client for Echo {
    fn refusal_is_final(&self, _: i64) -> bool {
        true
    }

    async fn serve(
        &mut self,
        connection: &mut Connection,
        stop: &CancellationToken,
    ) -> Option<String> {
        let sender = connection.sender();
        loop {
            let incoming = tokio::select! {
                () = stop.cancelled() => return None,
                m = connection.next() => m,
            };
            match incoming {
                Err(why) => return why,
                Ok(Incoming::Request { id, call, args }) => {
                    let (sender, results) = (sender.clone(), self.results.clone());
                    tokio::spawn(async move {
                        sender.respond(id, Ok(Value::Object(args))).await.unwrap();
                        let r = sender
                            .call::<_, Value>("ping", &json!({"from": call}))
                            .await
                            .map_err(|e| match e {
                                CallError::Lost => "lost".to_owned(),
                                other => other.to_string(),
                            });
                        let _ = results.send(r);
                    });
                }
                Ok(Incoming::Signal { signal, payload }) => {
                    let _ = self
                        .results
                        .send(Ok(json!({"signal": signal, "payload": payload})));
                }
            }
        }
    }
}

#[tokio::test]
async fn requests_are_answered_by_id_and_our_calls_get_their_own_answer_or_lost() {
    let (frames_tx, mut frames) = mpsc::unbounded_channel();
    let (url, _) = scripted_kernel(move |mut ws, n| {
        let frames = frames_tx.clone();
        async move {
            handshake(&mut ws, json!({"ok": true, "data": {}})).await;
            send(
                &mut ws,
                json!({"type": "sig", "signal": "hello", "payload": {"n": n}}),
            )
            .await;
            send(
                &mut ws,
                json!({"type": "req", "id": "r1", "call": "echo", "args": {"x": n}}),
            )
            .await;
            // The answer to r1 and the client's own call, in either order.
            let mut call_id = None;
            for _ in 0..2 {
                let f = next_json(&mut ws).await.unwrap();
                if f["type"] == "req" {
                    call_id = f["id"].as_str().map(str::to_owned);
                }
                let _ = frames.send(f);
            }
            if n == 0 {
                // An answer to nothing first: it must not reach the call.
                send(
                    &mut ws,
                    json!({"type": "res", "id": "m999", "ok": true, "data": "wrong"}),
                )
                .await;
                send(
                    &mut ws,
                    json!({"type": "res", "id": call_id, "ok": true, "data": {"pong": true}}),
                )
                .await;
                // Keep the connection open until the client is stopped.
                let _ = next_json(&mut ws).await;
            }
            // The second connection drops with the call unanswered.
        }
    })
    .await;
    let (results_tx, mut results) = mpsc::unbounded_channel();
    let mut client = Echo {
        results: results_tx,
    };
    let stop = CancellationToken::new();
    let cfg = config(url);
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { gsv_link::run(&cfg, &mut client, &stop).await }
    });
    let signal = within(results.recv()).await.unwrap().unwrap();
    assert_eq!(signal, json!({"signal": "hello", "payload": {"n": 0}}));
    let mut seen: Vec<Value> = vec![
        within(frames.recv()).await.unwrap(),
        within(frames.recv()).await.unwrap(),
    ];
    seen.sort_by_key(|f| f["type"].to_string());
    assert_eq!(
        (&seen[0]["call"], &seen[0]["args"]),
        (&json!("ping"), &json!({"from": "echo"}))
    );
    assert_eq!(
        (&seen[1]["id"], &seen[1]["ok"], &seen[1]["data"]),
        (&json!("r1"), &json!(true), &json!({"x": 0}))
    );
    let answer = within(results.recv()).await.unwrap();
    assert_eq!(answer, Ok(json!({"pong": true})));
    stop.cancel();
    assert!(within(run).await.unwrap().is_ok());
}

#[tokio::test]
async fn a_call_waiting_when_its_connection_drops_is_lost() {
    let (url, _) = scripted_kernel(|mut ws, _| async move {
        handshake(&mut ws, json!({"ok": true, "data": {}})).await;
        send(
            &mut ws,
            json!({"type": "req", "id": "r1", "call": "echo", "args": {}}),
        )
        .await;
        // Read the answer and the client's call, then drop the socket.
        let _ = next_json(&mut ws).await;
        let _ = next_json(&mut ws).await;
    })
    .await;
    let (results_tx, mut results) = mpsc::unbounded_channel();
    let mut client = Echo {
        results: results_tx,
    };
    let stop = CancellationToken::new();
    let cfg = config(url);
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { gsv_link::run(&cfg, &mut client, &stop).await }
    });
    let r = tokio::time::timeout(DEADLINE, results.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r, Err("lost".to_owned()));
    stop.cancel();
    assert!(
        tokio::time::timeout(DEADLINE, run)
            .await
            .unwrap()
            .unwrap()
            .is_ok()
    );
}
