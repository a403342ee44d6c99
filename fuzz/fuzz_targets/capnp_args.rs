//! Fuzz target: the server's decoding of every call's Cap'n Proto arguments.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wsd_tests::parsers::check_capnp_arguments(data);
});
