//! The property-test stand-in for the `cargo fuzz` targets in `fuzz/`
//! (which need a nightly-only sanitizer flag; see `fuzz/README.md`): the
//! same properties (`wsd_tests::parsers`) over arbitrary strings and bytes,
//! plus valid Cap'n Proto call arguments with random bytes flipped, so the
//! decoder sees deep structure and not only garbage headers.
//!
//! Cases: `PROPTEST_CASES` (CI sets 256) times the multipliers below.

use proptest::prelude::*;
use wsd_tests::parsers::{
    check_capnp_arguments, check_entry, check_ignore, check_manifest, check_path,
};

fn cases(mult: u32) -> ProptestConfig {
    let base = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256u32);
    ProptestConfig::with_cases(base * mult)
}

/// A valid message of call arguments for each parser, as bytes.
fn sample_messages() -> Vec<Vec<u8>> {
    use wsd_schema::workspace_capnp as wire;
    let mut out = Vec::new();
    let mut m = capnp::message::Builder::new_default();
    {
        let mut p = m.init_root::<wire::sync::push_params::Builder<'_>>();
        p.reborrow().init_sender().set_after("a/b");
        let mut list = p.init_entries(3);
        let mut e = list.reborrow().get(0);
        e.set_rev(3);
        e.set_path("dir/file.txt");
        let mut f = e.init_file();
        f.set_mode(0o644);
        f.set_size(5);
        let mut c = f.init_chunks(1).get(0);
        c.set_hash(&[9u8; 32]);
        c.set_size(5);
        let mut e = list.reborrow().get(1);
        e.set_path("link");
        e.init_symlink().set_target("../t");
        list.get(2).set_path("gone");
    }
    out.push(capnp::serialize::write_message_to_words(&m));
    let mut m = capnp::message::Builder::new_default();
    {
        let mut p = m.init_root::<wire::sync::fetch_changes_params::Builder<'_>>();
        p.reborrow().init_after().set_rev(7);
        let mut ig = p.init_ignore(2);
        ig.set(0, "*.o");
        ig.set(1, "!keep/**");
    }
    out.push(capnp::serialize::write_message_to_words(&m));
    let mut m = capnp::message::Builder::new_default();
    {
        let mut p = m.init_root::<wire::object_sink::write_params::Builder<'_>>();
        let mut o = p.reborrow().init_objects(1).get(0);
        o.set_hash(&[1u8; 32]);
        o.set_bytes(b"object bytes");
    }
    out.push(capnp::serialize::write_message_to_words(&m));
    let mut m = capnp::message::Builder::new_default();
    {
        let p = m.init_root::<wire::shell::exec_params::Builder<'_>>();
        let mut r = p.init_request();
        r.set_command("echo hi");
        r.set_cwd("sub");
        let mut env = r.reborrow().init_env(1).get(0);
        env.set_name("K");
        env.set_value("V");
        r.set_stdin(b"in");
    }
    out.push(capnp::serialize::write_message_to_words(&m));
    out
}

proptest! {
    #![proptest_config(cases(8))]

    #[test]
    fn path_canonicalisation_holds_its_properties(s in "[a-z./\\\\\\x00é ]{0,24}") {
        check_path(&s);
    }

    #[test]
    fn path_canonicalisation_survives_any_string(s in any::<String>()) {
        check_path(&s);
    }

    #[test]
    fn manifest_decoding_is_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        check_manifest(&bytes);
    }

    #[test]
    fn manifests_that_decode_come_from_whole_records(n in 0usize..5, size in 1u32..300_000, flip in any::<(usize, u8)>()) {
        let chunks: Vec<_> = (0..n)
            .map(|i| wsd_sync::ChunkRef { hash: wsd_sync::Hash::from_slice(&[i as u8; 32]).unwrap(), size })
            .collect();
        let mut bytes = wsd_sync::manifest::encode(&chunks);
        check_manifest(&bytes);
        if !bytes.is_empty() {
            let i = flip.0 % bytes.len();
            bytes[i] ^= flip.1;
            check_manifest(&bytes);
            bytes.truncate(i);
            check_manifest(&bytes);
        }
    }

    #[test]
    fn entry_validation_holds_its_properties(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        check_entry(&bytes);
    }

    #[test]
    fn ignore_rules_survive_any_patterns(s in "[a-z*?!/\\[\\]\\\\#. \n]{0,60}") {
        check_ignore(s.as_bytes());
    }

    #[test]
    fn capnp_argument_decoding_survives_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        check_capnp_arguments(&bytes);
    }

    #[test]
    fn capnp_argument_decoding_survives_mutated_messages(
        which in 0usize..4,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<Option<usize>>(),
    ) {
        let mut bytes = sample_messages().swap_remove(which);
        for (i, x) in flips {
            let i = i % bytes.len();
            bytes[i] ^= x;
        }
        if let Some(c) = cut {
            bytes.truncate(c % (bytes.len() + 1));
        }
        check_capnp_arguments(&bytes);
    }
}

#[test]
fn the_sample_messages_decode_as_their_calls() {
    // Guards the stand-in itself: unmutated samples must decode, so the
    // mutation test starts from messages that reach the deep checks.
    for m in sample_messages() {
        assert!(wsd::rpc::fuzzing::decode_call_arguments(&m) >= 1);
    }
}
