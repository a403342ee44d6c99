//! The byte transport under capnp-rpc, shared by server and client.

use capnp_rpc::{rpc_twoparty_capnp, twoparty};
use futures::AsyncReadExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::compat::TokioAsyncReadCompatExt;

use crate::limits::{MAX_MESSAGE_BYTES, STREAM_WINDOW_BYTES};

/// The reader options both sides use: messages above
/// [`MAX_MESSAGE_BYTES`] are refused before they are buffered.
pub fn reader_options() -> capnp::message::ReaderOptions {
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(Some(MAX_MESSAGE_BYTES / 8));
    options
}

/// Wraps a byte stream in a two-party capnp network.
pub fn network(
    stream: impl AsyncRead + AsyncWrite + Unpin + 'static,
    side: rpc_twoparty_capnp::Side,
) -> Box<dyn capnp_rpc::VatNetwork<rpc_twoparty_capnp::Side>> {
    let (reader, writer) = stream.compat().split();
    let mut network = twoparty::VatNetwork::new(
        futures::io::BufReader::new(reader),
        futures::io::BufWriter::new(writer),
        side,
        reader_options(),
    );
    // The window bounds the streaming calls this side makes. A client's
    // only stream is a push's object upload; the server's streams are
    // fetchObjects and exec events, whose backpressure (a stalled reader
    // stalls the runner) keeps capnp-rpc's small default.
    if side == rpc_twoparty_capnp::Side::Client {
        network.set_window_size(STREAM_WINDOW_BYTES);
    }
    Box::new(network)
}
