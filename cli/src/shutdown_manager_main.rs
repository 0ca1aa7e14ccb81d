//! `marin3r-shutdown-manager`: the shutdown manager alone, with exactly the command line of
//! `marin3r shutdown-manager` (`marin3r-shutdown-manager [--log-format …] shutdown-manager
//! --port …`). `marin3r shutdown-manager` replaces itself by this binary when it is
//! installed next to `marin3r`: an idle sidecar then maps the pages of a small binary, not
//! those of the multi-role one (README "Shutdown manager", BENCHMARKS.md).
//!
//! It uses the system allocator: an idle HTTP server allocates almost nothing.
#![forbid(unsafe_code)]

use clap::Parser as _;
use marin3r_cli::{args, commands, logging};

#[derive(Debug, clap::Parser)]
#[command(
    name = "marin3r",
    version,
    about = "MARIN3R shutdown manager: drains Envoy's connections before the pod stops"
)]
struct Cli {
    #[command(flatten)]
    global: args::GlobalArgs,
    #[command(subcommand)]
    command: Only,
}

#[derive(Debug, clap::Subcommand)]
enum Only {
    /// Drain Envoy's connections before the pod stops (sidecar).
    ShutdownManager(args::ShutdownManagerArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    logging::init(cli.global.log_format, &cli.global.log_level);
    let Only::ShutdownManager(a) = cli.command;
    match commands::run_shutdown_manager(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", marin3r_cli::terminal::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn cli_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
