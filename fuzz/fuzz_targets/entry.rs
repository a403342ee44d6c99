//! Fuzz target: ChangeEntry::validate.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wsd_tests::parsers::check_entry(data);
});
