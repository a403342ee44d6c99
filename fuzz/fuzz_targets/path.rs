//! Fuzz target: path canonicalisation (SyncPath::new / SyncPath::canonicalize).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        wsd_tests::parsers::check_path(s);
    }
});
