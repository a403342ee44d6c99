//! The `wsd` command: the daemon (`serve`) and its clients (`push`, `pull`,
//! `sync`, `watermarks`, `status`, `exec`, `attach`, `kill`), and `exclude`.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing(&args);
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("wsd: {}", cli::render_error(&e));
            ExitCode::FAILURE
        }
    }
}
