//! `gsv`: the gateway kernel (`gsv serve`) and a small user CLI.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
