//! Attack 2 of docs/reliability.md round 4, measured: one mTLS connection opens 128 ADS
//! streams, each sending all but the last byte of a 4 MiB request, and holds them; the
//! process's resident memory before, at its peak and after the client left, with the
//! listener's bounds (`ConnectionLimits::default()`) and without them (no stream limit,
//! no request budgets: the server before round 4).
//!
//! A measurement (it prints its figures, run with `--ignored --nocapture`), in a test
//! binary of its own: RSS is the whole process's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::attack as limits;

use std::time::Duration;

use bytes::Bytes;
use marin3r_xds::limits::ConnectionLimits;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kb / 1024.0
}

/// `(before, peak, after)` in MiB.
async fn attack(limits: ConnectionLimits) -> (f64, f64, f64) {
    let pki = limits::pki();
    let server = limits::Server::start(&pki, limits).await;
    let message = limits::request_of(4 * 1024 * 1024 - 64);
    let held: Bytes = message.slice(..message.len() - 1);
    let before = rss_mib();
    let mut conn = limits::h2(server.addr, &pki).await;
    let mut calls = Vec::new();
    for _ in 0..128 {
        calls.push(conn.call(held.clone()).await);
    }
    let mut peak = before;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(rss_mib());
    }
    drop(calls);
    drop(conn);
    tokio::time::sleep(Duration::from_secs(2)).await;
    (before, peak, rss_mib())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn attack_2_memory_with_and_without_the_bounds() {
    let bounded = attack(ConnectionLimits::default()).await;
    let unbounded = attack(ConnectionLimits {
        max_streams_per_connection: u32::MAX,
        stream_window: 1024 * 1024,
        connection_window: 1024 * 1024,
        connection_request_bytes: u64::MAX,
        total_request_bytes: u64::MAX,
        ..ConnectionLimits::default()
    })
    .await;
    println!("bounded   (before, peak, after) MiB: {bounded:.1?}");
    println!("unbounded (before, peak, after) MiB: {unbounded:.1?}");
    assert!(bounded.1 - bounded.0 < 64.0, "{bounded:?}");
}
