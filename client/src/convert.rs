//! The one edge between generated Cap'n Proto types and domain types:
//! `*_to` fills a builder from a domain value, `*_from` checks and decodes a
//! reader. Everything arriving from the wire is untrusted: paths go through
//! [`SyncPath::new`] (`EINVAL`), lists are length-checked before anything
//! is allocated for them (`ELIMIT`), hashes must be 32 bytes (`EINVAL`).

use wsd_schema::workspace_capnp as wire;
use wsd_sync::limits::MAX_CHUNKS_PER_FILE;
use wsd_sync::{
    Baseline, ChangeCursor, ChangeEntry, ChunkRef, EntryState, ErrorCode, Hash, Object, SyncPath,
    Watermarks, chunk,
};

use crate::WsdError;
use crate::exec::{ExecEvent, ExecEventKind, ExecRequest, PtyRequest, ResumeFrom, Signal};
use crate::limits::MAX_OBJECT_WRITE_BYTES;
use crate::status::{DaemonStatus, PeerStatus};

// ---------------------------------------------------------------------------
// Errors

/// Capnp-rpc prefixes the reason of an exception that crossed the wire.
const REMOTE_PREFIX: &str = "remote exception: ";

/// Encodes an error as the exception the schema promises:
/// reason `"{code}: {message}"`.
pub fn error_to(e: &WsdError) -> capnp::Error {
    match &e.subject {
        None => capnp::Error::failed(format!("{}: {}", e.code, e.message)),
        Some(s) => capnp::Error::failed(format!("{}: {}{SUBJECT_SEP}{s}", e.code, e.message)),
    }
}

/// Separates the optional subject from the message in an exception's
/// reason (`"{code}: {message}\nsubject: {subject}"`). A reader that knows
/// only `"{code}: {message}"` still gets the code right.
const SUBJECT_SEP: &str = "\nsubject: ";

/// Splits `"{message}\nsubject: {subject}"`.
fn split_subject(reason: &str) -> (&str, Option<&str>) {
    match reason.rsplit_once(SUBJECT_SEP) {
        Some((message, subject)) => (message, Some(subject)),
        None => (reason, None),
    }
}

/// Decodes any capnp error: a `disconnected` exception, or a stream that
/// ended in the middle of a message (the connection was cut), is a lost
/// connection; a reason that starts with a known code keeps it; anything
/// else (a malformed message, a library-level failure) is `EPROTOCOL`.
impl From<capnp::Error> for WsdError {
    fn from(e: capnp::Error) -> WsdError {
        let reason = e.extra.strip_prefix(REMOTE_PREFIX).unwrap_or(&e.extra);
        if matches!(
            e.kind,
            capnp::ErrorKind::Disconnected | capnp::ErrorKind::PrematureEndOfFile
        ) {
            return WsdError::connection_lost(reason);
        }
        if let Some((code, rest)) = reason.split_once(": ")
            && let Some(code) = ErrorCode::parse(code)
        {
            let (message, subject) = split_subject(rest);
            let e = WsdError::new(code, message);
            return match subject {
                Some(s) => e.with_subject(s),
                None => e,
            };
        }
        WsdError::new(
            ErrorCode::Protocol,
            format!("malformed or failed RPC: {reason}"),
        )
    }
}

/// A union discriminant this build does not know: the peer speaks a newer
/// schema than it announced.
impl From<capnp::NotInSchema> for WsdError {
    fn from(e: capnp::NotInSchema) -> WsdError {
        WsdError::new(ErrorCode::Protocol, format!("unknown union member: {e}"))
    }
}

pub fn text(r: capnp::Result<capnp::text::Reader<'_>>, what: &str) -> Result<String, WsdError> {
    r?.to_string()
        .map_err(|e| WsdError::new(ErrorCode::Invalid, format!("{what} is not UTF-8: {e}")))
}

/// An optional text field: a null pointer is `None`.
fn opt_text(
    has: bool,
    r: capnp::Result<capnp::text::Reader<'_>>,
    what: &str,
) -> Result<Option<String>, WsdError> {
    if has {
        text(r, what).map(Some)
    } else {
        Ok(None)
    }
}

pub fn path_from(r: capnp::Result<capnp::text::Reader<'_>>) -> Result<SyncPath, WsdError> {
    Ok(SyncPath::new(text(r, "path")?)?)
}

// ---------------------------------------------------------------------------
// Sync types

/// Exclusion patterns (`fetchChanges.ignore`, `push.ignore`).
pub fn ignore_to(mut b: capnp::text_list::Builder<'_>, patterns: &[String]) {
    for (i, pat) in patterns.iter().enumerate() {
        b.set(i as u32, pat.as_str());
    }
}

/// Decodes exclusion patterns (a null list is none), checking the count
/// first. They are compiled by [`wsd_sync::IgnoreRules::new`].
pub fn ignore_from(
    has: bool,
    r: capnp::Result<capnp::text_list::Reader<'_>>,
) -> Result<Vec<String>, WsdError> {
    if !has {
        return Ok(Vec::new());
    }
    let list = r?;
    WsdError::check_limit(
        "ignore patterns",
        wsd_sync::limits::MAX_IGNORE_PATTERNS,
        list.len() as usize,
    )?;
    list.iter().map(|p| text(p, "ignore pattern")).collect()
}

pub fn hash_from(bytes: &[u8]) -> Result<Hash, WsdError> {
    Ok(Hash::from_slice(bytes)?)
}

pub fn hashes_to(mut b: capnp::data_list::Builder<'_>, hashes: &[Hash]) {
    for (i, h) in hashes.iter().enumerate() {
        b.set(i as u32, h.as_bytes());
    }
}

/// Decodes a hash list, checking its length against `max` first.
pub fn hashes_from(r: capnp::data_list::Reader<'_>, max: usize) -> Result<Vec<Hash>, WsdError> {
    WsdError::check_limit("hashes per call", max, r.len() as usize)?;
    r.iter().map(|h| hash_from(h?)).collect()
}

pub fn cursor_to(mut b: wire::cursor::Builder<'_>, c: &ChangeCursor) {
    b.set_rev(c.rev);
    match &c.path {
        None => b.set_complete(()),
        Some(p) => b.set_after(p.as_str()),
    }
}

pub fn cursor_from(r: wire::cursor::Reader<'_>) -> Result<ChangeCursor, WsdError> {
    let rev = r.get_rev();
    Ok(match r.which()? {
        wire::cursor::Which::Complete(()) => ChangeCursor::at(rev),
        wire::cursor::Which::After(p) => ChangeCursor::within(rev, path_from(p)?),
    })
}

/// A cursor field that may be absent (null pointer): absent is
/// [`ChangeCursor::ZERO`].
pub fn opt_cursor_from(
    has: bool,
    r: capnp::Result<wire::cursor::Reader<'_>>,
) -> Result<ChangeCursor, WsdError> {
    if has {
        cursor_from(r?)
    } else {
        Ok(ChangeCursor::ZERO)
    }
}

pub fn baseline_to(b: Baseline) -> wire::Baseline {
    match b {
        Baseline::Off => wire::Baseline::Off,
        Baseline::Mark => wire::Baseline::Mark,
        Baseline::Sweep => wire::Baseline::Sweep,
    }
}

pub fn baseline_from(r: Result<wire::Baseline, capnp::NotInSchema>) -> Result<Baseline, WsdError> {
    match r {
        Ok(wire::Baseline::Off) => Ok(Baseline::Off),
        Ok(wire::Baseline::Mark) => Ok(Baseline::Mark),
        Ok(wire::Baseline::Sweep) => Ok(Baseline::Sweep),
        Err(e) => Err(WsdError::new(
            ErrorCode::Invalid,
            format!("unknown baseline value: {e}"),
        )),
    }
}

pub fn entry_to(mut b: wire::change_entry::Builder<'_>, e: &ChangeEntry) {
    b.set_rev(e.rev);
    b.set_path(e.path.as_str());
    match &e.state {
        EntryState::File {
            mode,
            mtime,
            size,
            chunks,
        } => {
            let mut f = b.init_file();
            f.set_mode(*mode);
            f.set_mtime(*mtime);
            f.set_size(*size);
            let mut list = f.init_chunks(chunks.len() as u32);
            for (i, c) in chunks.iter().enumerate() {
                let mut cb = list.reborrow().get(i as u32);
                cb.set_hash(c.hash.as_bytes());
                cb.set_size(c.size);
            }
        }
        EntryState::Dir { mode, mtime } => {
            let mut d = b.init_dir();
            d.set_mode(*mode);
            d.set_mtime(*mtime);
        }
        EntryState::Symlink {
            target,
            mode,
            mtime,
        } => {
            let mut s = b.init_symlink();
            s.set_target(target.as_str());
            s.set_mode(*mode);
            s.set_mtime(*mtime);
        }
        EntryState::Delete => b.set_delete(()),
    }
}

/// Decodes one entry and runs [`ChangeEntry::validate`] on it.
pub fn entry_from(r: wire::change_entry::Reader<'_>) -> Result<ChangeEntry, WsdError> {
    let path = path_from(r.get_path())?;
    let state = match r.which()? {
        wire::change_entry::Which::File(f) => {
            let list = f.get_chunks()?;
            WsdError::check_limit("chunks per file", MAX_CHUNKS_PER_FILE, list.len() as usize)?;
            let chunks = list
                .iter()
                .map(|c| {
                    Ok(ChunkRef {
                        hash: hash_from(c.get_hash()?)?,
                        size: c.get_size(),
                    })
                })
                .collect::<Result<Vec<_>, WsdError>>()?;
            EntryState::File {
                mode: f.get_mode(),
                mtime: f.get_mtime(),
                size: f.get_size(),
                chunks,
            }
        }
        wire::change_entry::Which::Dir(d) => EntryState::Dir {
            mode: d.get_mode(),
            mtime: d.get_mtime(),
        },
        wire::change_entry::Which::Symlink(s) => EntryState::Symlink {
            target: text(s.get_target(), "symlink target")?,
            mode: s.get_mode(),
            mtime: s.get_mtime(),
        },
        wire::change_entry::Which::Delete(()) => EntryState::Delete,
    };
    let entry = ChangeEntry {
        rev: r.get_rev(),
        path,
        state,
    };
    entry.validate()?;
    Ok(entry)
}

pub fn entries_to(
    mut b: capnp::struct_list::Builder<'_, wire::change_entry::Owned>,
    entries: &[ChangeEntry],
) {
    for (i, e) in entries.iter().enumerate() {
        entry_to(b.reborrow().get(i as u32), e);
    }
}

/// Decodes an entry list, checking its length against `max` (named `limit`)
/// before decoding anything.
pub fn entries_from(
    r: capnp::struct_list::Reader<'_, wire::change_entry::Owned>,
    limit: &str,
    max: usize,
) -> Result<Vec<ChangeEntry>, WsdError> {
    WsdError::check_limit(limit, max, r.len() as usize)?;
    r.iter().map(entry_from).collect()
}

pub fn maybe_entry_to(mut b: wire::maybe_entry::Builder<'_>, e: Option<&ChangeEntry>) {
    match e {
        None => b.set_none(()),
        Some(e) => entry_to(b.init_entry(), e),
    }
}

pub fn maybe_entry_from(r: wire::maybe_entry::Reader<'_>) -> Result<Option<ChangeEntry>, WsdError> {
    match r.which()? {
        wire::maybe_entry::Which::None(()) => Ok(None),
        wire::maybe_entry::Which::Entry(e) => entry_from(e?).map(Some),
    }
}

pub fn objects_to(mut b: capnp::struct_list::Builder<'_, wire::object::Owned>, objects: &[Object]) {
    for (i, o) in objects.iter().enumerate() {
        let mut ob = b.reborrow().get(i as u32);
        ob.set_hash(o.hash.as_bytes());
        ob.set_bytes(&o.bytes);
    }
}

/// Decodes one `ObjectSink.write`: each object at most one maximum chunk,
/// all together at most [`MAX_OBJECT_WRITE_BYTES`]. Hashes are *not*
/// verified here; the store verifies them before keeping anything.
pub fn objects_from(
    r: capnp::struct_list::Reader<'_, wire::object::Owned>,
) -> Result<Vec<Object>, WsdError> {
    let mut total = 0usize;
    let mut out = Vec::with_capacity(r.len() as usize);
    for o in r.iter() {
        let bytes = o.get_bytes()?;
        WsdError::check_limit("object size (bytes)", chunk::MAX_CHUNK, bytes.len())?;
        total += bytes.len();
        WsdError::check_limit("object bytes per write", MAX_OBJECT_WRITE_BYTES, total)?;
        out.push(Object {
            hash: hash_from(o.get_hash()?)?,
            bytes: bytes.to_vec(),
        });
    }
    Ok(out)
}

/// The parts of `Sync.watermarks`' results.
pub fn watermarks_from(
    current_rev: u64,
    push: wire::cursor::Reader<'_>,
    fetch: wire::cursor::Reader<'_>,
) -> Result<Watermarks, WsdError> {
    Ok(Watermarks {
        current_rev,
        push_cursor: cursor_from(push)?,
        fetch_cursor: cursor_from(fetch)?,
    })
}

/// `Workspace.status`' results. The lists are bounded by the message size
/// limit of the transport, so they are not length-checked here.
pub fn status_from(r: wire::status::Reader<'_>) -> Result<DaemonStatus, WsdError> {
    let live = r.get_live_execs()?;
    let mut live_execs = Vec::with_capacity(live.len() as usize);
    for id in live.iter() {
        live_execs.push(text(id, "exec id")?);
    }
    let list = r.get_peers()?;
    let mut peers = Vec::with_capacity(list.len() as usize);
    for p in list.iter() {
        peers.push(PeerStatus {
            peer: text(p.get_peer(), "peer name")?,
            push_cursor: cursor_from(p.get_push_cursor()?)?,
            fetch_cursor: cursor_from(p.get_fetch_cursor()?)?,
        });
    }
    Ok(DaemonStatus {
        version: text(r.get_version(), "version")?,
        root: text(r.get_root(), "root")?,
        current_rev: r.get_current_rev(),
        uptime_ms: r.get_uptime_ms(),
        live_execs,
        peers,
    })
}

pub fn status_to(mut b: wire::status::Builder<'_>, s: &DaemonStatus) {
    b.set_version(s.version.as_str());
    b.set_root(s.root.as_str());
    b.set_current_rev(s.current_rev);
    b.set_uptime_ms(s.uptime_ms);
    let mut live = b.reborrow().init_live_execs(s.live_execs.len() as u32);
    for (i, id) in s.live_execs.iter().enumerate() {
        live.set(i as u32, id.as_str());
    }
    let mut peers = b.init_peers(s.peers.len() as u32);
    for (i, p) in s.peers.iter().enumerate() {
        let mut pb = peers.reborrow().get(i as u32);
        pb.set_peer(p.peer.as_str());
        cursor_to(pb.reborrow().init_push_cursor(), &p.push_cursor);
        cursor_to(pb.init_fetch_cursor(), &p.fetch_cursor);
    }
}

// ---------------------------------------------------------------------------
// Shell types

pub fn exec_request_to(mut b: wire::exec_request::Builder<'_>, r: &ExecRequest) {
    b.set_command(r.command.as_str());
    if let Some(cwd) = &r.cwd {
        b.set_cwd(cwd.as_str());
    }
    if let Some(id) = &r.id {
        b.set_id(id.as_str());
    }
    if !r.env.is_empty() {
        env_to(b.reborrow().init_env(r.env.len() as u32), &r.env);
    }
    if let Some(stdin) = &r.stdin {
        b.set_stdin(stdin);
    }
    b.set_timeout_ms(r.timeout_ms.unwrap_or(0));
    b.set_stdin_open(r.stdin_open);
}

fn env_to(b: capnp::struct_list::Builder<'_, wire::env_var::Owned>, env: &[(String, String)]) {
    let mut b = b;
    for (i, (name, value)) in env.iter().enumerate() {
        let mut v = b.reborrow().get(i as u32);
        v.set_name(name.as_str());
        v.set_value(value.as_str());
    }
}

fn env_from(
    has: bool,
    r: capnp::Result<capnp::struct_list::Reader<'_, wire::env_var::Owned>>,
) -> Result<Vec<(String, String)>, WsdError> {
    if !has {
        return Ok(Vec::new());
    }
    r?.iter()
        .map(|v| {
            Ok((
                text(v.get_name(), "env name")?,
                text(v.get_value(), "env value")?,
            ))
        })
        .collect()
}

pub fn exec_request_from(r: wire::exec_request::Reader<'_>) -> Result<ExecRequest, WsdError> {
    let env = env_from(r.has_env(), r.get_env())?;
    Ok(ExecRequest {
        command: text(r.get_command(), "command")?,
        cwd: opt_text(r.has_cwd(), r.get_cwd(), "cwd")?,
        id: opt_text(r.has_id(), r.get_id(), "exec id")?,
        env,
        stdin: if r.has_stdin() {
            Some(r.get_stdin()?.to_vec())
        } else {
            None
        },
        timeout_ms: match r.get_timeout_ms() {
            0 => None,
            ms => Some(ms),
        },
        stdin_open: r.get_stdin_open(),
    })
}

pub fn pty_request_to(mut b: wire::pty_request::Builder<'_>, r: &PtyRequest) {
    if !r.argv.is_empty() {
        let mut argv = b.reborrow().init_argv(r.argv.len() as u32);
        for (i, arg) in r.argv.iter().enumerate() {
            argv.set(i as u32, arg.as_str());
        }
    }
    if let Some(cwd) = &r.cwd {
        b.set_cwd(cwd.as_str());
    }
    if let Some(id) = &r.id {
        b.set_id(id.as_str());
    }
    if !r.env.is_empty() {
        env_to(b.reborrow().init_env(r.env.len() as u32), &r.env);
    }
    b.set_cols(r.cols);
    b.set_rows(r.rows);
}

/// Decodes a terminal request; the argv count is checked before the
/// arguments are read (the runner checks their sizes).
pub fn pty_request_from(r: wire::pty_request::Reader<'_>) -> Result<PtyRequest, WsdError> {
    let argv = if r.has_argv() {
        let list = r.get_argv()?;
        WsdError::check_limit(
            "argv entries",
            crate::limits::MAX_PTY_ARGV,
            list.len() as usize,
        )?;
        list.iter()
            .map(|a| text(a, "argv entry"))
            .collect::<Result<Vec<_>, WsdError>>()?
    } else {
        Vec::new()
    };
    Ok(PtyRequest {
        argv,
        cwd: opt_text(r.has_cwd(), r.get_cwd(), "cwd")?,
        id: opt_text(r.has_id(), r.get_id(), "exec id")?,
        env: env_from(r.has_env(), r.get_env())?,
        cols: r.get_cols(),
        rows: r.get_rows(),
    })
}

pub fn exec_event_to(mut b: wire::exec_event::Builder<'_>, e: &ExecEvent) {
    b.set_id(e.id.as_str());
    b.set_seq(e.seq);
    b.set_rev(e.rev);
    match &e.kind {
        ExecEventKind::Stdout(bytes) => b.set_stdout(bytes),
        ExecEventKind::Stderr(bytes) => b.set_stderr(bytes),
        ExecEventKind::Exit(code) => b.set_exit(*code),
    }
}

pub fn exec_event_from(r: wire::exec_event::Reader<'_>) -> Result<ExecEvent, WsdError> {
    let kind = match r.which()? {
        wire::exec_event::Which::Stdout(b) => ExecEventKind::Stdout(b?.to_vec()),
        wire::exec_event::Which::Stderr(b) => ExecEventKind::Stderr(b?.to_vec()),
        wire::exec_event::Which::Exit(code) => ExecEventKind::Exit(code),
    };
    Ok(ExecEvent {
        id: text(r.get_id(), "exec id")?,
        seq: r.get_seq(),
        kind,
        rev: r.get_rev(),
    })
}

pub fn resume_to(mut b: wire::resume_point::Builder<'_>, from: ResumeFrom) {
    match from {
        ResumeFrom::Start => b.set_start(()),
        ResumeFrom::After(n) => b.set_after(n),
        ResumeFrom::Tail => b.set_tail(()),
    }
}

pub fn resume_from(
    has: bool,
    r: capnp::Result<wire::resume_point::Reader<'_>>,
) -> Result<ResumeFrom, WsdError> {
    if !has {
        return Ok(ResumeFrom::Start);
    }
    Ok(match r?.which()? {
        wire::resume_point::Which::Start(()) => ResumeFrom::Start,
        wire::resume_point::Which::After(n) => ResumeFrom::After(n),
        wire::resume_point::Which::Tail(()) => ResumeFrom::Tail,
    })
}

pub fn signal_to(s: Signal) -> wire::Signal {
    match s {
        Signal::Term => wire::Signal::Term,
        Signal::Kill => wire::Signal::Kill,
        Signal::Int => wire::Signal::Int,
        Signal::Hup => wire::Signal::Hup,
    }
}

pub fn signal_from(r: Result<wire::Signal, capnp::NotInSchema>) -> Result<Signal, WsdError> {
    match r {
        Ok(wire::Signal::Term) => Ok(Signal::Term),
        Ok(wire::Signal::Kill) => Ok(Signal::Kill),
        Ok(wire::Signal::Int) => Ok(Signal::Int),
        Ok(wire::Signal::Hup) => Ok(Signal::Hup),
        Err(e) => Err(WsdError::new(
            ErrorCode::Invalid,
            format!("unknown signal: {e}"),
        )),
    }
}

pub fn wire_error_to(mut b: wire::wire_error::Builder<'_>, e: &WsdError) {
    b.set_code(e.code.as_str());
    match &e.subject {
        None => b.set_message(e.message.as_str()),
        Some(s) => b.set_message(format!("{}{SUBJECT_SEP}{s}", e.message).as_str()),
    }
}

pub fn wire_error_from(r: wire::wire_error::Reader<'_>) -> Result<WsdError, WsdError> {
    let code = text(r.get_code(), "error code")?;
    let text = text(r.get_message(), "error message")?;
    let (message, subject) = split_subject(&text);
    Ok(match ErrorCode::parse(&code) {
        Some(code) => {
            let e = WsdError::new(code, message);
            match subject {
                Some(s) => e.with_subject(s),
                None => e,
            }
        }
        None => WsdError::new(
            ErrorCode::Protocol,
            format!("unknown error code {code}: {message}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip_entry(e: &ChangeEntry) -> Result<ChangeEntry, WsdError> {
        let mut msg = capnp::message::Builder::new_default();
        entry_to(msg.init_root::<wire::change_entry::Builder<'_>>(), e);
        entry_from(msg.get_root_as_reader::<wire::change_entry::Reader<'_>>()?)
    }

    #[test]
    fn every_entry_kind_survives_the_wire() {
        let p = SyncPath::new("a/b").unwrap();
        let c = ChunkRef {
            hash: Hash::of(b"x"),
            size: 1,
        };
        for state in [
            EntryState::File {
                mode: 0o644,
                mtime: -5,
                size: 1,
                chunks: vec![c],
            },
            EntryState::File {
                mode: 0o600,
                mtime: 0,
                size: 0,
                chunks: vec![],
            },
            EntryState::Dir {
                mode: 0o755,
                mtime: 7,
            },
            EntryState::Symlink {
                target: "../t".into(),
                mode: 0o777,
                mtime: 9,
            },
            EntryState::Delete,
        ] {
            let e = ChangeEntry {
                rev: 42,
                path: p.clone(),
                state,
            };
            assert_eq!(roundtrip_entry(&e).unwrap(), e);
        }
    }

    #[test]
    fn cursors_survive_the_wire() {
        for c in [
            ChangeCursor::ZERO,
            ChangeCursor::at(9),
            ChangeCursor::within(3, SyncPath::new("z").unwrap()),
        ] {
            let mut msg = capnp::message::Builder::new_default();
            cursor_to(msg.init_root::<wire::cursor::Builder<'_>>(), &c);
            let back = cursor_from(
                msg.get_root_as_reader::<wire::cursor::Reader<'_>>()
                    .unwrap(),
            );
            assert_eq!(back.unwrap(), c);
        }
    }

    #[test]
    fn a_hostile_wire_path_is_einval() {
        let mut msg = capnp::message::Builder::new_default();
        let mut b = msg.init_root::<wire::change_entry::Builder<'_>>();
        b.set_path("../etc/passwd");
        b.set_delete(());
        let err = entry_from(
            msg.get_root_as_reader::<wire::change_entry::Reader<'_>>()
                .unwrap(),
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::Invalid);
    }

    #[test]
    fn every_error_code_survives_encoding() {
        for (code, subject) in ErrorCode::ALL
            .into_iter()
            .zip([None, Some("a/b")].into_iter().cycle())
        {
            let mut e = WsdError::new(code, "it: broke");
            e.subject = subject.map(str::to_owned);
            let mut local = error_to(&e);
            assert_eq!(WsdError::from(local.clone()), e);
            // What the peer sees after capnp-rpc carried the exception.
            local.extra = format!("{REMOTE_PREFIX}{}", local.extra);
            assert_eq!(WsdError::from(local), e);
        }
    }

    #[test]
    fn an_uncoded_or_disconnected_error_gets_a_code() {
        let e = WsdError::from(capnp::Error::failed("Message ends prematurely".into()));
        assert_eq!(e.code, ErrorCode::Protocol);
        let e = WsdError::from(capnp::Error::disconnected("Peer disconnected.".into()));
        assert_eq!(e.code, ErrorCode::Shutdown);
        assert!(e.message.starts_with("connection lost"));
    }

    #[test]
    fn a_connection_cut_in_the_middle_of_a_message_is_a_lost_connection() {
        // What capnp reports when the socket closes mid-frame (found by the
        // connection-cut sweep in tests/tests/faults.rs): retryable, not
        // EPROTOCOL.
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "unexpected end of file");
        let e = WsdError::from(capnp::Error::from(io));
        assert_eq!(e.code, ErrorCode::Shutdown, "{e}");
        assert!(e.is_retryable());
    }
}
