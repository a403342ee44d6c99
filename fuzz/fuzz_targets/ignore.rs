//! Fuzz target: IgnoreRules::new and matching.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wsd_tests::parsers::check_ignore(data);
});
