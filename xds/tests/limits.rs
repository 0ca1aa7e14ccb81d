//! Every bound of the ADS/CSDS listener (`marin3r_xds::limits`) attacked over real
//! sockets (mTLS on 127.0.0.1): one test per bound, each failing without it.
//!
//! - streams per connection: the server announces its limit, and a stream opened past
//!   it is refused (`RST_STREAM` `REFUSED_STREAM`) while the others go on; streams over
//!   all connections: one past the limit ends `RESOURCE_EXHAUSTED`;
//! - bytes of unfinished requests, per connection and overall: a stream that would hold
//!   more ends with `RESOURCE_EXHAUSTED`, the others keep what they hold and complete
//!   their request later; a connection that leaves gives its bytes back;
//! - connections: one past the cap is closed at once, and accepted again once a slot
//!   is free;
//! - idle time: a connection without any stream is closed with a GOAWAY; one with a
//!   stream open is not;
//! - HTTP/2 rapid reset and CONTINUATION floods: the attacking connection is closed or
//!   bounded, and the server keeps serving new connections.
//!
//! Socket tests run on the real clock and assert what happens, never how fast.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::attack::*;
use hyper::body::Frame;
use marin3r_xds::limits::ConnectionLimits;

#[tokio::test]
async fn streams_past_the_limit_per_connection_are_refused() {
    let pki = pki();
    let server = Server::start(&pki, ConnectionLimits::default()).await;
    let max = marin3r_xds::limits::MAX_STREAMS_PER_CONNECTION;
    let mut raw = Raw::open(server.addr, &pki).await;
    let settings = raw
        .until(|f| f.0 == SETTINGS && f.1 & ACK == 0)
        .await
        .unwrap();
    assert_eq!(max_concurrent_streams(&settings.3), Some(max));
    raw.send(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
    // One stream more than announced (client streams are odd: 1, 3, 5, …).
    for i in 0..=max {
        raw.send(&frame(HEADERS, END_HEADERS, 2 * i + 1, &ads_headers()))
            .await
            .unwrap();
    }
    let past = 2 * max + 1;
    let refused = raw
        .until(|f| f.0 == RST_STREAM || f.0 == GOAWAY)
        .await
        .expect("the stream past the limit is refused");
    assert_eq!(refused.0, RST_STREAM, "{refused:?}");
    assert_eq!(refused.2, past, "{refused:?}");
    assert_eq!(refused.3, 7u32.to_be_bytes(), "REFUSED_STREAM");
    // The streams within the limit go on; so does the server.
    still_serves(server.addr, &pki).await;
}

/// Two streams of one connection each hold 600 KiB of a 900 KiB request under a 1 MiB
/// connection budget: one is refused with `RESOURCE_EXHAUSTED` naming the connection,
/// the other completes its request and is answered.
#[tokio::test]
async fn unfinished_request_bytes_are_bounded_per_connection() {
    let pki = pki();
    let limits = small(|l| l.connection_request_bytes = 1024 * KIB as u64);
    let server = Server::start(&pki, limits).await;
    let mut conn = h2(server.addr, &pki).await;
    let request = request_of(900 * KIB);
    let a = conn.call(request.slice(..600 * KIB)).await;
    let b = conn.call(request.slice(..600 * KIB)).await;
    let (mut refused, mut served) = (Vec::new(), 0);
    // Finish both: the one still held is served, the other already ended.
    for call in [a, b] {
        let _ = call
            .requests
            .send(Ok(Frame::data(request.slice(600 * KIB..))))
            .await;
        match outcome(call).await {
            Ok(_) => served += 1,
            Err(status) => refused.push(status),
        }
    }
    assert_eq!(served, 1, "{refused:?}");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].0, 8, "RESOURCE_EXHAUSTED: {refused:?}");
    assert!(refused[0].1.contains("connection"), "{refused:?}");
}

/// Two connections hold 600 KiB each under a 1 MiB server budget: one is refused naming
/// the server; once the holder leaves, a new connection is served.
#[tokio::test]
async fn unfinished_request_bytes_are_bounded_overall_and_given_back() {
    let pki = pki();
    let limits = small(|l| l.total_request_bytes = 1024 * KIB as u64);
    let server = Server::start(&pki, limits).await;
    let request = request_of(900 * KIB);
    let mut first = h2(server.addr, &pki).await;
    let mut second = h2(server.addr, &pki).await;
    let a = first.call(request.slice(..600 * KIB)).await;
    let b = second.call(request.slice(..600 * KIB)).await;
    // Their request bodies stay open: the holder never finishes its request.
    let keep = (a.requests.clone(), b.requests.clone());
    // Whichever was charged second is refused (the other, still holding its
    // unfinished request, has nothing to answer).
    let refused = tokio::select! {
        r = outcome(a) => r,
        r = outcome(b) => r,
    };
    let (code, message) = refused.expect_err("one stream is refused");
    assert_eq!(code, 8, "RESOURCE_EXHAUSTED: {message}");
    assert!(message.contains("server"), "{message}");
    // The holder leaves: its bytes are given back, and a new client is served.
    drop((keep, first, second));
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let mut third = h2(server.addr, &pki).await;
        let call = third.call(request.slice(..600 * KIB)).await;
        let _ = call
            .requests
            .send(Ok(Frame::data(request.slice(600 * KIB..))))
            .await;
        match outcome(call).await {
            Ok(_) => break,
            Err(status) if tokio::time::Instant::now() < deadline => {
                assert_eq!(status.0, 8, "{status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("never given back: {status:?}"),
        }
    }
}

/// Streams over all connections: past `max_streams` a new stream ends at once with
/// `RESOURCE_EXHAUSTED`; once one ends, a new one is served.
#[tokio::test]
async fn streams_past_the_server_limit_end_resource_exhausted_until_one_ends() {
    let pki = pki();
    let server = Server::start(&pki, small(|l| l.max_streams = 2)).await;
    let request = request_of(1000);
    let partial = || request.slice(..500);
    let mut first = h2(server.addr, &pki).await;
    let mut second = h2(server.addr, &pki).await;
    // Each admitted (its response headers came) before the next is opened.
    let admitted = |call: Call| async move {
        let response = tokio::time::timeout(LONG, call.response)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!response.headers().contains_key("grpc-status"));
        (call.requests, response)
    };
    let held = admitted(first.call(partial()).await).await;
    let _also_held = admitted(second.call(partial()).await).await;
    let (code, message) = outcome(second.call(partial()).await)
        .await
        .expect_err("a third stream is refused");
    assert_eq!(code, 8, "RESOURCE_EXHAUSTED: {message}");
    assert!(message.contains("2 streams"), "{message}");
    drop(held);
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        match outcome(second.call(request.clone()).await).await {
            Ok(_) => break,
            Err(status) => {
                assert!(tokio::time::Instant::now() < deadline, "{status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_at_once_and_accepted_again_when_one_leaves() {
    let pki = pki();
    let server = Server::start(&pki, small(|l| l.max_connections = 2)).await;
    let one = Raw::open(server.addr, &pki).await;
    let mut two = Raw::open(server.addr, &pki).await;
    // Both were accepted (their SETTINGS came).
    two.until(|f| f.0 == SETTINGS).await.unwrap();
    // The third is closed before its handshake completes.
    assert!(tls(server.addr, &pki).await.is_err());
    drop(one);
    let deadline = tokio::time::Instant::now() + LONG;
    while tls(server.addr, &pki).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no slot came free");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_idle_connection_is_closed_with_a_goaway_and_one_with_a_stream_is_not() {
    let pki = pki();
    let idle = Duration::from_millis(300);
    let server = Server::start(&pki, small(|l| l.idle_timeout = idle)).await;
    let mut busy = Raw::open(server.addr, &pki).await;
    busy.send(&frame(HEADERS, END_HEADERS, 1, &ads_headers()))
        .await
        .unwrap();
    let mut quiet = Raw::open(server.addr, &pki).await;
    let goaway = quiet.until(|f| f.0 == GOAWAY).await;
    assert!(goaway.is_some(), "the idle connection got a GOAWAY");
    assert!(quiet.until(|_| false).await.is_none(), "and was closed");
    // The busy one, a stream open all along: still served after several idle periods.
    tokio::time::sleep(idle * 3).await;
    busy.send(&frame(PING, 0, 0, b"12345678")).await.unwrap();
    let pong = busy
        .until(|f| (f.0 == PING && f.1 & ACK != 0) || f.0 == GOAWAY)
        .await
        .unwrap();
    assert_eq!(pong.0, PING, "{pong:?}");
}

/// HTTP/2 rapid reset (CVE-2023-44487): streams opened and reset at once, many times
/// over on one connection. The connection is cut off (GOAWAY) or keeps within its
/// bounds; the server keeps serving.
#[tokio::test]
async fn rapid_reset_floods_leave_the_server_serving() {
    let pki = pki();
    let server = Server::start(&pki, ConnectionLimits::default()).await;
    let mut raw = Raw::open(server.addr, &pki).await;
    let headers = ads_headers();
    let mut burst = Vec::new();
    for i in 0..20_000u32 {
        let id = 2 * i + 1;
        burst.extend(frame(HEADERS, END_HEADERS, id, &headers));
        burst.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        if burst.len() > 64 * KIB {
            if raw.send(&burst).await.is_err() {
                break;
            }
            burst.clear();
        }
    }
    // h2 counts streams reset before they were served: past 20, a GOAWAY
    // (ENHANCE_YOUR_CALM) and the connection ends.
    let goaway = raw.until(|f| f.0 == GOAWAY).await.expect("a GOAWAY");
    assert_eq!(
        goaway.3[4..8],
        11u32.to_be_bytes(),
        "ENHANCE_YOUR_CALM: {goaway:?}"
    );
    still_serves(server.addr, &pki).await;
}

/// A CONTINUATION flood: one request's headers that never end. The connection is
/// closed once they pass the header list limit; the server keeps serving.
#[tokio::test]
async fn continuation_floods_are_cut_off() {
    let pki = pki();
    let server = Server::start(&pki, ConnectionLimits::default()).await;
    let mut raw = Raw::open(server.addr, &pki).await;
    raw.send(&frame(HEADERS, 0, 1, &ads_headers()))
        .await
        .unwrap();
    let filler = hpack(&[("x-flood", &"a".repeat(100))]);
    let mut sent = 0usize;
    let chunk: Vec<u8> = (0..100)
        .flat_map(|_| frame(CONTINUATION, 0, 1, &filler))
        .collect();
    // At most 64 MiB: the server must close long before.
    while sent < 64 * 1024 * KIB {
        if raw.send(&chunk).await.is_err() {
            break;
        }
        sent += chunk.len();
    }
    assert!(
        sent < 64 * 1024 * KIB,
        "the server took 64 MiB of headers of one request"
    );
    // A GOAWAY, or the socket just closes.
    let _ = raw.until(|f| f.0 == GOAWAY).await;
    still_serves(server.addr, &pki).await;
}
