//! Limits of the RPC layer both sides share, on top of the protocol limits
//! in [`wsd_sync::limits`]. Over any of them a call fails with `ELIMIT`
//! naming the limit and the connection stays usable.

/// Most entries one `ChangeIterator.next` may ask for (the same bound as
/// a push batch, so one message stays well under the size limit).
pub const MAX_CHANGES_PER_NEXT: usize = wsd_sync::limits::MAX_PUSH_ENTRIES;
/// Object bytes a sender puts in one `ObjectSink.write`: large enough to
/// amortise the per-call cost (capnp streaming reached 1.5–1.7 GB/s
/// with 64 KiB writes on the reference machine), small enough that the
/// stream window keeps only a few MiB in flight.
pub const OBJECT_WRITE_BYTES: usize = 1024 * 1024;
/// Bytes of streaming calls (`ObjectSink.write`) a client keeps in
/// flight per stream before it waits for acknowledgements (the server's
/// streams keep capnp-rpc's default). capnp-rpc's
/// default (64 KiB, plus one message) let a push upload only about one
/// 1 MiB write ahead of the receiver's store thread, so the upload of
/// the next batch stalled while the previous batch was applied. 8 MiB
/// holds two push batches (4 MiB of objects each).
pub const STREAM_WINDOW_BYTES: usize = 8 * 1024 * 1024;
/// Most object bytes a receiving sink accepts in one `write` (a sender
/// may overshoot [`OBJECT_WRITE_BYTES`] by one object).
pub const MAX_OBJECT_WRITE_BYTES: usize = 4 * 1024 * 1024;
/// Largest Cap'n Proto message either side reads. It bounds the memory
/// one call can pin: a push of 4096 entries, 16384 hashes or a 4 MiB
/// object write are each far below it; a single file entry of about
/// 40 GiB (700k chunks) is the largest that fits.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;
/// Longest `peer` name in `Bootstrap.connect`, in bytes.
pub const MAX_PEER_NAME_BYTES: usize = 255;
/// Events a client buffers per exec stream before it stops
/// acknowledging `ExecEventSink.event` (which in turn slows the runner).
pub const CLIENT_EXEC_EVENT_BUFFER: usize = 16;
/// Most bytes one `Shell.writeStdin` may carry (the daemon checks it
/// before decoding further).
pub const MAX_STDIN_WRITE_BYTES: usize = 1024 * 1024;

/// The longest `Sync.waitChanges` waits before answering; a longer
/// `timeoutMs` is cut to it, so a forgotten long poll ends by itself.
pub const MAX_WAIT_CHANGES: std::time::Duration = std::time::Duration::from_secs(60);
/// Most bytes one `Shell.ptyWrite` may carry.
pub const MAX_PTY_WRITE_BYTES: usize = 1024 * 1024;
/// Largest terminal width or height (`startPty`, `ptyResize`); 0 is
/// `EINVAL`, more is `ELIMIT`.
pub const MAX_PTY_DIMENSION: u16 = 1000;
/// Most `argv` entries of one `startPty`.
pub const MAX_PTY_ARGV: usize = 4096;
