//! `marin3r`: one binary for every MARIN3R role. Parsing and wiring only; the work is in
//! the library crates.
#![forbid(unsafe_code)]

use clap::Parser as _;
use marin3r_cli::{args, commands, logging};

/// mimalloc instead of glibc malloc: the webhook and xDS paths allocate many small JSON
/// and protobuf objects (README "Allocator" has the measurements).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = args::Cli::parse();
    logging::init(cli.global.log_format, &cli.global.log_level);
    match commands::run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", marin3r_cli::terminal::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
