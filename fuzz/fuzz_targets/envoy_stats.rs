//! The shutdown manager's parser of Envoy's admin `/stats` text (`open_connections`) on
//! arbitrary text. Property: never a panic; a body whose every line is `name: value`
//! with no listener gauge counts 0 connections.
#![no_main]

use libfuzzer_sys::fuzz_target;
use marin3r_shutdown_manager::open_connections;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let result = open_connections(&text);
    if !text.contains("listener.")
        && !text
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim().contains(": "))
    {
        assert_eq!(result.ok(), Some(0), "{text:?}");
    }
});
