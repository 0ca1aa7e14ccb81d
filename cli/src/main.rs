//! `marin3r`: one binary for every MARIN3R role. Parsing and wiring only; the work is in
//! the library crates.
#![forbid(unsafe_code)]

mod args;
mod commands;
mod logging;

use clap::Parser as _;

/// mimalloc instead of glibc malloc: the webhook and xDS paths allocate many small JSON
/// and protobuf objects (README "Allocator" has the measurements).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = args::Cli::parse();
    logging::init(cli.log_format, &cli.log_level);
    match commands::run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
