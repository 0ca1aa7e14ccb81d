//! The `marin3r` command line: argument parsing and wiring, shared by the `marin3r` binary
//! (every role) and `marin3r-shutdown-manager` (the shutdown manager alone). The work is in
//! the library crates.
#![forbid(unsafe_code)]

pub mod args;
pub mod commands;
pub mod logging;
pub mod status;
pub mod terminal;
