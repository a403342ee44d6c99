//! Calls to `-> stream` methods (`ExecEventSink.event`, `ObjectSink.write`)
//! sent as ordinary calls under a window kept here, instead of through
//! capnp-rpc's `StreamingRequest`.
//!
//! Why: capnp-rpc 0.27 gives every capability that receives a streaming call
//! its own flow controller, whose task set is added to the connection's task
//! set and never completes (its `TaskSet` always holds a `pending()` future),
//! so about 450 bytes stay allocated per sink until the connection closes.
//! The daemon gets a fresh sink for every exec and every `fetchObjects`, over
//! long-lived connections: its memory grew without bound under the soak.
//! A streaming call is wire-compatible with an ordinary call returning empty
//! results, so the receiving side is unchanged.

use std::collections::VecDeque;

use capnp::capability::{Promise, Request, Response};
use capnp::traits::HasTypeId;
use wsd_schema::workspace_capnp as wire;

/// Bytes of calls in flight before `send` waits for acknowledgements (plus
/// the largest message, as capnp-rpc's fixed window does, so one large
/// message cannot stall the stream). capnp-rpc's twoparty default.
pub const STREAM_WINDOW_BYTES: usize = 64 * 1024;

type Ack = Promise<Response<capnp::any_pointer::Owned>, capnp::Error>;

/// The sender side of one stream: calls are sent at once (in order); `send`
/// returns when the window has room, `finish` when every call is
/// acknowledged. A failed call fails the next `send` or `finish`.
pub struct StreamWindow {
    acks: VecDeque<(usize, Ack)>,
    in_flight: usize,
    max_message: usize,
}

impl Default for StreamWindow {
    fn default() -> StreamWindow {
        StreamWindow::new()
    }
}

impl std::fmt::Debug for StreamWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWindow")
            .field("calls_in_flight", &self.acks.len())
            .field("bytes_in_flight", &self.in_flight)
            .finish()
    }
}

impl StreamWindow {
    pub fn new() -> StreamWindow {
        StreamWindow {
            acks: VecDeque::new(),
            in_flight: 0,
            max_message: 0,
        }
    }

    /// Sends `req` (`size` bytes) and waits while the window is full.
    pub async fn send<P>(
        &mut self,
        req: Request<P, capnp::any_pointer::Owned>,
        size: usize,
    ) -> Result<(), capnp::Error>
    where
        P: capnp::traits::Owned,
    {
        self.max_message = self.max_message.max(size);
        self.in_flight += size;
        self.acks.push_back((size, req.send().promise));
        while self.in_flight >= STREAM_WINDOW_BYTES + self.max_message {
            self.ack_one().await?;
        }
        Ok(())
    }

    /// Waits until every call sent is acknowledged.
    pub async fn finish(&mut self) -> Result<(), capnp::Error> {
        while !self.acks.is_empty() {
            self.ack_one().await?;
        }
        Ok(())
    }

    async fn ack_one(&mut self) -> Result<(), capnp::Error> {
        if let Some((size, ack)) = self.acks.pop_front() {
            self.in_flight -= size;
            ack.await?;
        }
        Ok(())
    }
}

/// `ExecEventSink.event` as an ordinary call.
pub fn exec_event_call(
    sink: &wire::exec_event_sink::Client,
) -> Request<wire::exec_event_sink::event_params::Owned, capnp::any_pointer::Owned> {
    sink.client
        .new_call(wire::exec_event_sink::Client::TYPE_ID, 0, None)
}

/// `ObjectSink.write` as an ordinary call.
pub fn object_write_call(
    sink: &wire::object_sink::Client,
) -> Request<wire::object_sink::write_params::Owned, capnp::any_pointer::Owned> {
    sink.client
        .new_call(wire::object_sink::Client::TYPE_ID, 0, None)
}

/// The size of a call's params for the window (0 if it cannot be measured).
pub fn message_bytes(size: capnp::Result<capnp::MessageSize>) -> usize {
    size.map_or(0, |s| s.word_count as usize * 8)
}
