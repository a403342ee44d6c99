//! Inbound binary bodies (reference §1.4). A frame that carries a body
//! names it with `body:{streamId, length?}`; the bytes follow as binary
//! WebSocket messages: a 5-byte header (stream id as little-endian u32,
//! never zero; one flags byte) and a payload. Each connection has its own
//! [`BodyInbox`]; a stream is collected only once someone expects it, so
//! stray chunks cost nothing. Dropping the inbox (the connection closed)
//! fails every stream still open.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::oneshot;

/// More bytes follow in this chunk's payload.
pub const FLAG_DATA: u8 = 1;
/// The stream is complete.
pub const FLAG_END: u8 = 2;
/// The sender gave up; the payload is a UTF-8 reason.
pub const FLAG_ERROR: u8 = 4;
/// The receiver no longer wants the stream.
pub const FLAG_CANCEL: u8 = 8;
const HEADER_BYTES: usize = 5;

/// Why a body could not be collected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("invalid body descriptor: {0}")]
    Descriptor(String),
    #[error("body stream {0} is already open on this connection")]
    Duplicate(u32),
    #[error("body stream {stream} sent more than its declared {declared} bytes")]
    TooLong { stream: u32, declared: u64 },
    #[error("body stream {stream} ended after {got} of its declared {declared} bytes")]
    Short {
        stream: u32,
        declared: u64,
        got: u64,
    },
    #[error("body stream {stream} failed at the sender: {reason}")]
    Sender { stream: u32, reason: String },
    #[error("the connection closed before body stream {0} ended")]
    Closed(u32),
}

/// The `body` descriptor of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub stream_id: u32,
    pub length: Option<u64>,
}

impl Descriptor {
    /// Reads `{streamId: u32 > 0, length?: u64}`.
    pub fn parse(v: &Value) -> Result<Descriptor, BodyError> {
        let stream_id = v
            .get("streamId")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                BodyError::Descriptor("streamId must be an integer in 1..2^32".into())
            })?;
        let length = match v.get("length") {
            None | Some(Value::Null) => None,
            Some(l) => Some(l.as_u64().ok_or_else(|| {
                BodyError::Descriptor("length must be a non-negative integer".into())
            })?),
        };
        Ok(Descriptor { stream_id, length })
    }
}

/// A collected body: at most the `keep` bytes asked for, and how many the
/// sender sent in all (more than `bytes.len()` means it was cut).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    pub bytes: Vec<u8>,
    pub total: u64,
}

impl Body {
    pub fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }
}

#[derive(Debug)]
struct Open {
    declared: Option<u64>,
    keep: usize,
    bytes: Vec<u8>,
    total: u64,
    done: oneshot::Sender<Result<Body, BodyError>>,
}

/// Splits a binary message into stream id, flags and payload.
pub fn parse_chunk(msg: &[u8]) -> Option<(u32, u8, &[u8])> {
    if msg.len() < HEADER_BYTES {
        return None;
    }
    let id = u32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]);
    (id != 0).then_some((id, msg[4], &msg[HEADER_BYTES..]))
}

/// Builds a binary message (header + payload).
pub fn chunk(stream_id: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&stream_id.to_le_bytes());
    out.push(flags);
    out.extend_from_slice(payload);
    out
}

/// The inbound streams of one connection.
#[derive(Debug, Default)]
pub struct BodyInbox {
    open: Mutex<HashMap<u32, Open>>,
}

impl BodyInbox {
    /// Starts collecting stream `d.stream_id`, keeping at most `keep` bytes
    /// (the rest is counted, not stored). The receiver yields once the
    /// stream ends, fails, or the inbox is dropped.
    pub fn expect(
        &self,
        d: Descriptor,
        keep: usize,
    ) -> Result<oneshot::Receiver<Result<Body, BodyError>>, BodyError> {
        let mut open = self.open.lock().unwrap();
        if open.contains_key(&d.stream_id) {
            return Err(BodyError::Duplicate(d.stream_id));
        }
        let (tx, rx) = oneshot::channel();
        open.insert(
            d.stream_id,
            Open {
                declared: d.length,
                keep,
                bytes: Vec::new(),
                total: 0,
                done: tx,
            },
        );
        Ok(rx)
    }

    /// Fails every open stream (the connection closed): their waiters see
    /// the sender dropped.
    pub fn close_all(&self) {
        self.open.lock().unwrap().clear();
    }

    /// Stops collecting a stream nobody waits for any more.
    pub fn forget(&self, stream_id: u32) {
        self.open.lock().unwrap().remove(&stream_id);
    }

    /// Feeds one binary message. Chunks of streams nobody expects (or
    /// malformed ones) are dropped: they answer nothing.
    pub fn on_binary(&self, msg: &[u8]) {
        let Some((id, flags, payload)) = parse_chunk(msg) else {
            tracing::debug!(len = msg.len(), "dropping a malformed body chunk");
            return;
        };
        let mut open = self.open.lock().unwrap();
        let Some(s) = open.get_mut(&id) else {
            tracing::debug!(
                stream = id,
                flags,
                "dropping a chunk of an unexpected body stream"
            );
            return;
        };
        let result = if flags & (FLAG_ERROR | FLAG_CANCEL) != 0 {
            let reason = String::from_utf8_lossy(payload).trim().to_owned();
            Some(Err(BodyError::Sender {
                stream: id,
                reason: if reason.is_empty() {
                    "stream cancelled".into()
                } else {
                    reason
                },
            }))
        } else {
            s.total += payload.len() as u64;
            let room = s.keep.saturating_sub(s.bytes.len());
            s.bytes
                .extend_from_slice(&payload[..payload.len().min(room)]);
            match s.declared {
                Some(declared) if s.total > declared => Some(Err(BodyError::TooLong {
                    stream: id,
                    declared,
                })),
                Some(declared) if flags & FLAG_END != 0 && s.total != declared => {
                    Some(Err(BodyError::Short {
                        stream: id,
                        declared,
                        got: s.total,
                    }))
                }
                _ if flags & FLAG_END != 0 => Some(Ok(Body {
                    bytes: std::mem::take(&mut s.bytes),
                    total: s.total,
                })),
                _ => None,
            }
        };
        if let Some(r) = result {
            let s = open.remove(&id).expect("present above");
            // The waiter may have given up (caller cancelled); nothing to do.
            let _ = s.done.send(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn desc(id: u32, length: Option<u64>) -> Descriptor {
        Descriptor {
            stream_id: id,
            length,
        }
    }

    #[test]
    fn chunks_across_messages_are_joined_and_end_completes_the_body() {
        let inbox = BodyInbox::default();
        let mut rx = inbox.expect(desc(7, Some(5)), 100).unwrap();
        inbox.on_binary(&chunk(7, FLAG_DATA, b"he"));
        assert!(rx.try_recv().is_err(), "not complete before END");
        inbox.on_binary(&chunk(7, FLAG_DATA | FLAG_END, b"llo"));
        let body = rx.try_recv().unwrap().unwrap();
        assert_eq!(body.bytes, b"hello");
        assert!(!body.truncated());
    }

    #[test]
    fn bytes_past_keep_are_counted_but_not_stored() {
        let inbox = BodyInbox::default();
        let mut rx = inbox.expect(desc(1, None), 3).unwrap();
        inbox.on_binary(&chunk(1, FLAG_DATA, b"abcdef"));
        inbox.on_binary(&chunk(1, FLAG_END, b""));
        let body = rx.try_recv().unwrap().unwrap();
        assert_eq!((body.bytes.as_slice(), body.total), (&b"abc"[..], 6));
        assert!(body.truncated());
    }

    #[test]
    fn a_stream_longer_or_shorter_than_declared_fails() {
        let inbox = BodyInbox::default();
        let mut long = inbox.expect(desc(1, Some(2)), 10).unwrap();
        inbox.on_binary(&chunk(1, FLAG_DATA, b"abc"));
        assert!(matches!(
            long.try_recv().unwrap(),
            Err(BodyError::TooLong { stream: 1, .. })
        ));
        let mut short = inbox.expect(desc(2, Some(4)), 10).unwrap();
        inbox.on_binary(&chunk(2, FLAG_DATA | FLAG_END, b"ab"));
        assert!(matches!(
            short.try_recv().unwrap(),
            Err(BodyError::Short { got: 2, .. })
        ));
    }

    #[test]
    fn an_error_chunk_fails_the_stream_with_the_senders_reason() {
        let inbox = BodyInbox::default();
        let mut rx = inbox.expect(desc(3, None), 10).unwrap();
        inbox.on_binary(&chunk(3, FLAG_ERROR, b"disk gone"));
        assert_eq!(
            rx.try_recv().unwrap(),
            Err(BodyError::Sender {
                stream: 3,
                reason: "disk gone".into()
            })
        );
    }

    #[test]
    fn dropping_the_inbox_fails_open_streams_and_stray_chunks_are_ignored() {
        let inbox = BodyInbox::default();
        let mut rx = inbox.expect(desc(4, None), 10).unwrap();
        inbox.on_binary(&chunk(9, FLAG_DATA | FLAG_END, b"stray"));
        inbox.on_binary(&[1, 2]);
        assert!(rx.try_recv().is_err());
        drop(inbox);
        assert!(matches!(
            rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }

    #[test]
    fn descriptors_need_a_nonzero_u32_stream_id() {
        assert_eq!(
            Descriptor::parse(&json!({"streamId": 5, "length": 3})).unwrap(),
            desc(5, Some(3))
        );
        for bad in [
            json!({"streamId": 0}),
            json!({"streamId": 4294967296u64}),
            json!({"streamId": "1"}),
            json!({"streamId": 1, "length": -1}),
        ] {
            assert!(Descriptor::parse(&bad).is_err(), "{bad}");
        }
    }
}
