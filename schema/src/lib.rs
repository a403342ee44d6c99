//! Cap'n Proto schema of the wsd wire and its generated Rust code.
