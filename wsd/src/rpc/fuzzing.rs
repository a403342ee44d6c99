//! Fuzzing entry point (not an API; `#[doc(hidden)]`): decodes arbitrary
//! bytes as a Cap'n Proto message and runs the server's argument decoding
//! for every call on it, exactly as the server does before touching the
//! store. Used by the `fuzz/` targets and the property-test stand-in in
//! `tests/tests/it/parsers.rs`. It must never panic, whatever the bytes.

use wsd_schema::workspace_capnp as wire;
use wsd_sync::IgnoreRules;
use wsd_sync::limits::{MAX_HASHES_PER_CALL, MAX_PUSH_ENTRIES};

use super::WireError;
use super::convert::{
    baseline_from, entries_from, exec_request_from, hashes_from, ignore_from, objects_from,
    opt_cursor_from, path_from, resume_from, signal_from, text,
};
use super::transport::reader_options;

/// Decodes `bytes` as one message and its root as each call's parameters.
/// Returns how many decodings succeeded (so the work is not optimised out).
pub fn decode_call_arguments(bytes: &[u8]) -> usize {
    let mut slice = bytes;
    let Ok(msg) = capnp::serialize::read_message_from_flat_slice(&mut slice, reader_options())
    else {
        return 0;
    };
    let ok = |r: Result<(), WireError>| usize::from(r.is_ok());
    let mut n = 0;
    n += ok((|| {
        let p = msg.get_root::<wire::sync::push_params::Reader<'_>>()?;
        opt_cursor_from(p.has_sender(), p.get_sender())?;
        baseline_from(p.get_baseline())?;
        entries_from(p.get_entries()?, "entries per push", MAX_PUSH_ENTRIES)?;
        IgnoreRules::new(&ignore_from(p.has_ignore(), p.get_ignore())?)?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::sync::fetch_changes_params::Reader<'_>>()?;
        opt_cursor_from(p.has_after(), p.get_after())?;
        IgnoreRules::new(&ignore_from(p.has_ignore(), p.get_ignore())?)?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::sync::read_entry_params::Reader<'_>>()?;
        path_from(p.get_path())?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::sync::has_objects_params::Reader<'_>>()?;
        hashes_from(p.get_hashes()?, MAX_HASHES_PER_CALL)?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::object_sink::write_params::Reader<'_>>()?;
        objects_from(p.get_objects()?)?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::shell::exec_params::Reader<'_>>()?;
        exec_request_from(p.get_request()?)?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::shell::get_exec_params::Reader<'_>>()?;
        text(p.get_id(), "exec id")?;
        resume_from(p.has_after(), p.get_after())?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::shell::kill_exec_params::Reader<'_>>()?;
        text(p.get_id(), "exec id")?;
        signal_from(p.get_signal())?;
        Ok(())
    })());
    n += ok((|| {
        let p = msg.get_root::<wire::bootstrap::connect_params::Reader<'_>>()?;
        p.get_token()?;
        text(p.get_peer(), "peer name")?;
        Ok(())
    })());
    n
}
