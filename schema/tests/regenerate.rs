//! Checks that `src/workspace_capnp.rs` is exactly what the schema compiles
//! to, so the committed code never drifts from `workspace.capnp`.
//!
//! Needs the external `capnp` compiler (and `/usr/include/capnp/stream.capnp`
//! from `libcapnp-dev`); without it the check prints why and passes, since
//! an ordinary build must need only the Rust toolchain. With
//! `WSD_SCHEMA_BLESS=1` (see `regen.sh`) it rewrites the committed file
//! instead of comparing.

use std::path::Path;
use std::process::Command;

/// The generated file starts with lines naming the compiler and capnpc
/// versions; regenerating with another toolchain changes only those.
fn without_version_header(code: &str) -> String {
    code.lines()
        .filter(|l| {
            !l.starts_with("// capnp binary version") && !l.starts_with("// capnpc crate version")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn committed_generated_code_matches_the_schema() {
    if Command::new("capnp").arg("--version").output().is_err() {
        println!(
            "skipping: the `capnp` compiler is not installed (apt-get install capnproto libcapnp-dev)"
        );
        return;
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    capnpc::CompilerCommand::new()
        .src_prefix(crate_dir)
        .file(crate_dir.join("workspace.capnp"))
        .output_path(out.path())
        .run()
        .expect("capnp compile");
    let fresh = std::fs::read_to_string(out.path().join("workspace_capnp.rs")).unwrap();
    let committed_path = crate_dir.join("src/workspace_capnp.rs");
    if std::env::var_os("WSD_SCHEMA_BLESS").is_some() {
        std::fs::write(&committed_path, &fresh).unwrap();
        println!("rewrote {}", committed_path.display());
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        without_version_header(&committed) == without_version_header(&fresh),
        "schema/src/workspace_capnp.rs is stale: run schema/regen.sh and commit the result"
    );
}
