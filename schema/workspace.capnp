# The wsd wire: one bootstrap capability per connection, handing out a
# workspace with a `sync` half and a `shell` half.
#
# Semantics follow shared/design/sync-protocol.md and exec.md (method names
# are the seed interface's). This file states what each method promises on
# the wire; the Rust domain types it maps to live in `wsd_sync`, and the
# one conversion edge is `wsd_client::convert`.
#
# Conventions that hold for every method below:
#
# * Errors. Every failure is a Cap'n Proto exception (type `failed`) whose
#   reason starts with a stable wire code, a colon and a space:
#   "EUNKNOWN_HASH: object 3fa2... is not held". When the error has one
#   path, hash, exec id or limit at fault, the reason ends with a line
#   "\nsubject: " followed by it ("ENOENT: no such file\nsubject: a/b"), so
#   a client gets it without parsing the message. The codes are ENOENT,
#   EUNKNOWN_HASH, EEXEC_BUSY, ELOG_TRUNCATED, ESHUTDOWN, EAUTH, EPROTOCOL,
#   EINVAL, ELIMIT and EIO (ETIMEDOUT exists only on the client side: a
#   deadline that passed there). Each method's "Errors:" line lists the
#   codes it answers besides the ones every method may (EPROTOCOL for an
#   undecodable message, ESHUTDOWN, ELIMIT "in-flight calls per
#   connection"). A reason without a known code (a transport-level
#   failure inside the RPC library) is read as EPROTOCOL by our client; an
#   exception of type `disconnected` means the connection is gone. A
#   message that cannot be decoded is EPROTOCOL; a path that is not
#   canonical is EINVAL; a request over a documented limit is ELIMIT naming
#   the limit, and the connection stays usable.
# * Paths are canonical workspace-relative UTF-8 (no leading or trailing
#   `/`, no empty, `.` or `..` segments, no NUL) and compared byte-wise.
# * Hashes are SHA-256 digests: `Data` of exactly 32 bytes.
# * Streams are capabilities with flow control, never one giant list:
#   change entries come from a pull iterator (`ChangeIterator`), objects and
#   exec events go into `-> stream` sinks. Memory on both ends is bounded by
#   the per-call limits, whatever the size of the tree or the output.
# * Dropping a capability releases what it holds on the server (an open
#   change window, an object upload, an exec subscription). Dropping the
#   connection drops every capability it carried; nothing a dropped
#   capability did is rolled back, and nothing it had not finished is kept.
# * In-flight calls per connection are bounded (ELIMIT "in-flight calls per
#   connection" beyond it); calls on streams count too. A message larger
#   than 32 MiB is refused by the reader and breaks the connection.
# * ESHUTDOWN: the daemon is shutting down (calls already queued still
#   complete); reconnect after it restarts.

@0xc5b02dc4832bd523;

# The only protocol version this schema describes. A change that an older
# peer would misread bumps it; additive changes that old peers ignore
# safely (new methods, new trailing fields with harmless defaults) do not.
const protocolVersion :UInt32 = 1;

# ---------------------------------------------------------------------------
# Bootstrap and workspace

interface Bootstrap {
  # The bootstrap capability of every connection. Nothing else is reachable
  # before `connect` succeeds.

  connect @0 (token :Data, protocolVersion :UInt32, peer :Text)
      -> (workspace :Workspace);
  # Checks `token` in constant time against the daemon's token (EAUTH on a
  # mismatch; a daemon without a token accepts any token but admits only
  # loopback and unix-socket peers) and `protocolVersion` (EPROTOCOL unless
  # it equals the `protocolVersion` constant above). `peer` is the caller's
  # stable name (1..=255 bytes, no control characters, else EINVAL): the
  # server keeps the watermarks of that name (the fetch cursor a `push`
  # advances, the echo suppression of `fetchChanges`), so a caller must use
  # the same name on every connection. Idempotent; each call returns a
  # fresh workspace capability for the same workspace.
  # Errors: EAUTH (token, origin), EPROTOCOL (version), EINVAL (peer).
}

interface Workspace {
  sync @0 () -> (sync :Sync);
  # The sync half, bound to the `peer` named in `connect`.
  # Errors: none of its own.

  shell @1 () -> (shell :Shell);
  # The shell half. A daemon without an exec runner still returns it; every
  # call on it then fails with "EIO: exec not available".
  # Errors: none of its own.

  status @2 () -> (status :Status);
  # A health snapshot for humans and container probes (`wsd status`). It
  # reads the store, so a wedged store fails it (EIO) instead of answering.
  # Errors: EIO (the store cannot be read).
}

struct Status {
  version @0 :Text;           # the daemon's package version, e.g. "0.1.0"
  root @1 :Text;              # the workspace root, absolute
  currentRev @2 :UInt64;      # the store's latest rev
  uptimeMs @3 :UInt64;        # since the server started serving
  liveExecs @4 :List(Text);   # ids of commands still running, sorted
  peers @5 :List(PeerStatus); # peers that connected since the daemon
                              # started, by name
}

struct PeerStatus {
  peer @0 :Text;
  pushCursor @1 :Cursor;      # how far that peer acknowledged our changes
  fetchCursor @2 :Cursor;     # how far we consumed that peer's changes
}

# ---------------------------------------------------------------------------
# Sync: data types

struct Cursor {
  # A resume point in one store's rev space.
  #   {rev, complete}: every change committed at or before `rev` was offered.
  #   {rev, after p}: rev `rev` was offered up to and including path `p`.
  # Order: by rev, then `after p` < `complete` within one rev, paths
  # byte-wise.
  rev @0 :UInt64;
  union {
    complete @1 :Void;
    after @2 :Text;
  }
}

struct ChunkRef {
  hash @0 :Data;     # 32 bytes
  size @1 :UInt32;   # 1 ..= the chunker's maximum chunk size (256 KiB)
}

struct ChangeEntry {
  # The state *now* of one path, stamped with the sender's rev. Bytes are
  # never inline: a file lists its chunks, which move with the *Objects
  # methods. `mtime` is milliseconds since the Unix epoch; `mode` holds only
  # permission bits (0o7777).
  rev @0 :UInt64;
  path @1 :Text;
  union {
    file :group {
      mode @2 :UInt32;
      mtime @3 :Int64;
      size @4 :UInt64;            # equals the sum of the chunk sizes
      chunks @5 :List(ChunkRef);  # in file order; empty for an empty file
    }
    dir :group {
      mode @6 :UInt32;
      mtime @7 :Int64;
    }
    symlink :group {
      target @8 :Text;
      mode @9 :UInt32;
      mtime @10 :Int64;
    }
    delete @11 :Void;             # a tombstone
  }
}

struct MaybeEntry {
  union {
    none @0 :Void;
    entry @1 :ChangeEntry;
  }
}

struct Object {
  # A content-addressed object in transit. The receiver verifies
  # sha256(bytes) == hash before it stores or links anything.
  hash @0 :Data;
  bytes @1 :Data;   # at most the maximum chunk size (256 KiB)
}

enum Baseline {
  # How an applied batch takes part in a full baseline (sync rule 10).
  off @0;     # an ordinary incremental batch
  mark @1;    # part of a baseline: the receiver remembers the listed paths
  sweep @2;   # the baseline's last batch: remember its paths, then delete
              # every live path the baseline did not list
}

# ---------------------------------------------------------------------------
# Sync: the interface

interface Sync {
  # Every method here acts for the `peer` named in `Bootstrap.connect`.
  # Mutating calls (`push`, `ObjectSink.write` of `pushObjects`) are applied
  # in arrival order on one writer; reads see only committed state.

  push @0 (sender :Cursor, baseline :Baseline, entries :List(ChangeEntry),
           ignore :List(Text))
      -> (rev :UInt64, appliedPushCursor :Cursor);
  # Applies one batch atomically: all entries or none. At most 4096 entries
  # (ELIMIT "entries per push"); every entry is checked first (EINVAL for a
  # non-canonical path, a mode outside 0o7777, a size that disagrees with
  # the chunks; ELIMIT for over-long paths or targets) and a bad one
  # rejects the whole batch. Every chunk an entry references must already
  # be held (sent earlier with `pushObjects`) or the push fails with
  # EUNKNOWN_HASH naming the hash and the path, and changes nothing.
  #
  # `sender.rev` is the wire's senderRev. senderRev > 0: the caller is a
  # sync peer replicating its own log, `sender` is its cursor once this
  # batch is applied; entries already matching local state are skipped
  # (idempotent, so a retried push is harmless) and the peer's fetch
  # cursor advances to `sender` (never backwards) in the same transaction.
  # senderRev == 0: an external writer; entries become ordinary local
  # writes with fresh local revs and no watermark moves (so a retry is
  # re-applied, not skipped).
  #
  # `ignore` is the sender's exclusions (gitignore syntax, as for
  # `fetchChanges`; at most 1024, each at most 4096 bytes and 64 KiB in
  # all, else ELIMIT; EINVAL for a malformed one). The sender
  # never lists what they match, so nothing they match is deleted here: a
  # `sweep` leaves every such path alone, and its ancestors, and the delete
  # of a directory removes only what below it holds nothing excluded (the
  # directory stays). A file or symlink replacing a directory that holds
  # anything excluded fails with EINVAL naming both. Null or empty: none.
  #
  # Returns the receiver's current rev after the batch and its stored fetch
  # cursor for this peer (`appliedPushCursor`), which the sender checks
  # covers what it pushed.
  # Errors: ELIMIT (entries, path length or depth, chunks per file),
  # EINVAL (entry, cursor), EUNKNOWN_HASH (hash and path), EIO (storage).

  fetchChanges @1 (after :Cursor, ignore :List(Text))
      -> (currentCursor :Cursor, appliedPushCursor :Cursor, baseline :Bool,
          changes :ChangeIterator);
  # Opens a change window after `after` (a null `after` is {0, complete}: a
  # full baseline). `currentCursor` is {currentRev at open, complete}; the
  # iterator yields every path whose state changed in (after,
  # currentCursor], one entry per path with its state now, ordered by
  # (rev, path). A path rewritten after the window opened is deferred to a
  # later fetch (its rev is past `currentCursor`). Paths whose current
  # state this peer pushed and that did not change locally since are left
  # out (no echo). `ignore` holds gitignore-style patterns (at most 1024,
  # each at most 4096 bytes and 64 KiB in all, ELIMIT; a malformed one is
  # EINVAL); ignored paths are left out.
  #
  # `baseline` is true when `after` is older than the receiver's tombstone
  # prune horizon: the iterator then starts from zero instead, and the
  # caller applies it as a baseline (mark every batch, sweep at the end).
  # `appliedPushCursor` is the receiver's fetch cursor for this peer.
  # Read-only; dropping the iterator closes the window.
  # Errors: ELIMIT (patterns), EINVAL (cursor path, pattern), EIO.

  watermarks @2 () -> (currentRev :UInt64, pushCursor :Cursor,
                       fetchCursor :Cursor);
  # The receiver's watermarks with respect to this peer: its latest rev,
  # how far its changes are acknowledged by this peer (pushRev is
  # pushCursor's last complete rev), and how far it has consumed this
  # peer's changes. On wsd this settles local changes first. Read-only.
  # Errors: EIO (storage or the settle).

  readEntry @3 (path :Text) -> (entry :MaybeEntry);
  # One path's current state: the live entry, else its newest tombstone,
  # else none. Read-only.
  # Errors: EINVAL (path), ELIMIT (path length or depth), EIO.

  hasObjects @4 (hashes :List(Data)) -> (held :List(Data));
  # The subset of `hashes` the receiver holds as complete objects, in input
  # order. At most 16384 hashes (ELIMIT "hashes per call"). Read-only.
  # Errors: ELIMIT, EINVAL (a hash not of 32 bytes), EIO.

  fetchObjects @5 (hashes :List(Data), sink :ObjectSink) -> ();
  # Writes the objects named by `hashes` (at most 16384) into the caller's
  # `sink`, in request order, in `write` calls of about 1 MiB of object
  # bytes, paced by the sink's stream flow control, then calls `sink.done`;
  # the call returns after `done` answered, so every write was processed.
  # An unknown hash fails the call with EUNKNOWN_HASH naming it (objects
  # before it may already have been written). If a write fails (the caller
  # dropped the sink or rejected an object) the call fails with that
  # error. Read-only.
  # Errors: ELIMIT, EINVAL (hash), EUNKNOWN_HASH (the hash), EIO, or
  # the sink's own error.

  pushObjects @6 () -> (sink :ObjectSink);
  # Opens an upload: the caller streams objects into the returned sink with
  # `write` and finishes with `done`. Each write is verified (sha256 of
  # every object; a mismatch is EPROTOCOL and stores nothing from the bad
  # object) and staged before it is acknowledged, so flow control paces
  # the caller at the receiver's storage speed. Staged objects are held
  # whether or not `done` is called; staging the same object twice is
  # harmless (idempotent).
  # Errors: none when opening; see `ObjectSink` for the writes.

  waitChanges @7 (after :UInt64, timeoutMs :UInt32) -> (currentRev :UInt64);
  # Long poll: returns the receiver's current rev as soon as it exceeds
  # `after`, or when `timeoutMs` has passed (whichever comes first; the
  # receiver caps the wait at 60 s, and a `timeoutMs` of 0 answers at once).
  # Local changes to the receiver's tree count once they are noticed (wsd
  # settles what its watcher reports, so they show within moments). A
  # watcher (`wsd sync --watch`) passes the rev it last synced and syncs
  # again when this returns a larger one. Read-only; waiting holds no
  # store lock, so other calls go on meanwhile.
  # Errors: EIO (storage).
}

interface ChangeIterator {
  # A pull iterator over an open change window. Calls are served one at a
  # time in arrival order (pipelining a second `next` is allowed and
  # returns the following batch).

  next @0 (max :UInt32) -> (entries :List(ChangeEntry));
  # Up to `max` (1 ..= 4096, else ELIMIT "entries per next") next entries.
  # An empty list means the window is drained; further calls return empty
  # lists.
  # Errors: ELIMIT (`max` 0 or over 4096), EIO (storage).
}

interface ObjectSink {
  # A flow-controlled object stream. Writes are processed in order; once
  # one fails, every later write and `done` fail with the same error.

  write @0 (objects :List(Object)) -> stream;
  # At most 4 MiB of object bytes per call (ELIMIT "object bytes per
  # write"; senders aim at 1 MiB), each object at most the maximum chunk
  # size (ELIMIT "object size (bytes)"), hashes of 32 bytes (EINVAL).
  # Errors: ELIMIT, EINVAL, EPROTOCOL (bytes that do not match their
  # hash), EIO (staging); on `fetchObjects`' sink: EPROTOCOL (more objects
  # than requested).

  done @1 () -> ();
  # Returns once every earlier write has been processed; fails with the
  # first write error if there was one.
  # Errors: the first write's.
}

# ---------------------------------------------------------------------------
# Shell

struct EnvVar {
  name @0 :Text;
  value @1 :Text;
}

struct ExecRequest {
  command @0 :Text;     # run as /bin/sh -c command
  cwd @1 :Text;         # relative to the workspace root; null = the root
  id @2 :Text;          # null = a fresh unique id chosen by the server
  env @3 :List(EnvVar); # added to the daemon's allowlisted environment
  stdin @4 :Data;       # null = no stdin; else written, then the pipe closed
  timeoutMs @5 :UInt64; # 0 = no timeout
  stdinOpen @6 :Bool;   # keep stdin open after `stdin` (null = nothing yet)
                        # for `writeStdin` / `closeStdin`; false: as above
}

struct ExecEvent {
  # `seq` starts at 1 and grows by one per event of that exec, across
  # stdout and stderr. `exit` is the last event of an exec.
  id @0 :Text;
  seq @1 :UInt64;
  union {
    stdout @2 :Data;
    stderr @3 :Data;
    exit @4 :Int32;
  }
  rev @5 :UInt64;
  # With `exit`: the store's rev once the command's writes were settled
  # (the settle's, or for an exit replayed from the log the one when it
  # was sent), so every change it made is at or below it (a caller whose
  # fetch cursor covers it has nothing to pull).
  # 0 on other events, and from a daemon that does not say.
}

struct PtyRequest {
  # A program on a new pseudo-terminal (`Shell.startPty`). Its output (the
  # terminal's, one stream) arrives as `stdout` events in the exec log.
  argv @0 :List(Text);  # program and arguments; null or empty = /bin/sh
  cwd @1 :Text;         # relative to the workspace root; null = the root
  id @2 :Text;          # null = a fresh unique id chosen by the server
  env @3 :List(EnvVar); # added to the allowlisted environment (TERM is
                        # xterm-256color unless given here)
  cols @4 :UInt16;      # the window size, 1 ..= 1000 each
  rows @5 :UInt16;
}

struct ResumePoint {
  union {
    start @0 :Void;     # every retained event from the beginning
    after @1 :UInt64;   # events with seq > after
    tail @2 :Void;      # only events logged from now on
  }
}

enum Signal {
  term @0;
  kill @1;
  int @2;
  hup @3;
}

struct WireError {
  code @0 :Text;        # a wire code such as "ELOG_TRUNCATED"
  message @1 :Text;     # as an exception's text after "CODE: " (see the
                        # top of this file), subject trailer included
}

interface Shell {
  # Starting, killing and disposing are applied in arrival order by the
  # exec runner; event delivery is flow-controlled by the caller's sink: a
  # caller that stops acknowledging `event` slows the runner's reading of
  # the command's pipes (the command then blocks on write, as under a slow
  # pipe). With no subscriber the runner keeps logging, so a detached
  # command still finishes.

  exec @0 (request :ExecRequest, events :ExecEventSink)
      -> (id :Text, subscription :ExecSubscription);
  # Starts `/bin/sh -c command` and delivers its events into `events` from
  # seq 1. An id that is still live is EEXEC_BUSY; a cwd outside the root
  # is EINVAL; over the runner's command, env, stdin or concurrency limits
  # is ELIMIT. Delivery lasts while the caller holds `subscription` and the
  # sink accepts writes; afterwards `getExec` re-attaches.
  # Errors: EINVAL (empty command, id, env name, cwd), ELIMIT,
  # EEXEC_BUSY (the id), EIO (spawn, log, or no exec runner).

  getExec @1 (id :Text, after :ResumePoint, events :ExecEventSink)
      -> (id :Text, subscription :ExecSubscription);
  # Re-attaches to a live or finished exec and delivers its events from
  # `after` (null = start). Unknown or disposed id: ENOENT. A resume point
  # older than the retained log: ELOG_TRUNCATED.
  # Errors: ENOENT, ELOG_TRUNCATED, ELIMIT (subscribers per exec), EIO.

  killExec @2 (id :Text, signal :Signal) -> ();
  # Signals the exec's whole process group (the default is `term`).
  # Unknown id: ENOENT. An exec that is no longer running (exited, or lost
  # with a previous daemon): ENOENT "... is not running", since nothing was
  # signalled.
  # Errors: ENOENT, EINVAL (a signal this build does not know), EIO.

  disposeExec @3 (id :Text) -> ();
  # Drops the log of an exec (killing it first if still live); a later
  # `getExec` gets ENOENT. Unknown id: ENOENT.
  # Errors: ENOENT, EIO.

  writeStdin @4 (id :Text, data :Data) -> ();
  # Queues `data` (at most 1 MiB per call, else ELIMIT "stdin bytes per
  # write") for the stdin of an exec started with `stdinOpen`. Writes reach
  # the command in call order; the call returns once `data` is queued, and
  # waits while 4 earlier writes are still queued (a command that does not
  # read its stdin slows its writer, it does not buffer without bound).
  # Unknown id: ENOENT. An exec started without `stdinOpen`, or whose stdin
  # was closed, or that exited: EINVAL "stdin of exec ... is closed".
  # Not idempotent: a retry may deliver `data` twice.
  # Errors: ENOENT, EINVAL, ELIMIT, EIO.

  closeStdin @5 (id :Text) -> ();
  # Closes the stdin of a live exec after the queued writes (the command
  # reads end of file). Idempotent: closing a closed stdin, or the stdin of
  # an exited exec, succeeds. Unknown id: ENOENT.
  # Errors: ENOENT, EIO.

  startPty @6 (request :PtyRequest, events :ExecEventSink)
      -> (id :Text, subscription :ExecSubscription);
  # Starts `argv` on a new pseudo-terminal as the leader of a session of
  # its own (the terminal is its controlling terminal), with no timeout.
  # Everything it writes to the terminal is logged as `stdout` events, so
  # `getExec` replays and resumes it like any exec; the last event is
  # `exit`. `killExec` on it signals every process of that session (an
  # interactive shell puts jobs in groups of their own), not one group;
  # `hup` is what closing a terminal sends. Limits and ids as `exec`.
  # Errors: EINVAL (argv with NUL, id, env name, cwd, cols or rows 0),
  # ELIMIT (cols or rows over 1000, argv, env, concurrency), EEXEC_BUSY,
  # EIO (no pty could be opened, spawn, log).

  ptyWrite @7 (id :Text, data :Data) -> ();
  # Queues `data` (at most 1 MiB, ELIMIT "terminal input bytes per write")
  # as typed input of terminal `id`, in call order with `ptyResize`; waits
  # while 4 earlier inputs are queued. Unknown id: ENOENT. An exec that is
  # not a terminal, or a terminal that exited: EINVAL.
  # Errors: ENOENT, EINVAL, ELIMIT, EIO.

  ptyResize @8 (id :Text, cols :UInt16, rows :UInt16) -> ();
  # Sets the window size of terminal `id` (the program gets SIGWINCH),
  # queued in order with `ptyWrite`. 0 is EINVAL, over 1000 ELIMIT.
  # Errors: ENOENT, EINVAL, ELIMIT, EIO.
}

interface ExecEventSink {
  # Implemented by the caller. Events arrive in seq order.

  event @0 (event :ExecEvent) -> stream;

  end @1 (error :WireError) -> ();
  # The delivery is over: after the `exit` event with a null `error`, or
  # early with the error that stopped it (for example EIO when the log
  # could not be read). Not called when the caller dropped `subscription`.
}

interface ExecSubscription {
  # Holds a live event delivery. It has no methods: dropping it stops the
  # delivery (the exec itself keeps running and logging).
}
