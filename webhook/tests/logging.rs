//! What the webhook logs about a request stays bounded, and JSON log lines carry one
//! `message` each.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;

mod common;

use marin3r_webhook::MUTATE_PATH;

#[tokio::test]
async fn a_denial_of_a_huge_annotation_logs_a_bounded_line_with_one_message() {
    let buf = common::LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let huge = "x".repeat(1_500_000);
    let mut pod = common::labelled_pod();
    pod["metadata"]["annotations"]["marin3r.3scale.net/ports"] = json!(huge);
    let uid = "u".repeat(100_000);
    let body = common::pod_review(&uid, pod).to_string().into_bytes();
    let (_, out) = common::post(common::state(), MUTATE_PATH, body).await;
    assert_eq!(out["response"]["allowed"], false);

    let logged = buf.text();
    let denial = logged
        .lines()
        .find(|l| l.contains("denied pod"))
        .unwrap_or_else(|| panic!("no denial logged in {logged:?}"));
    assert!(
        denial.len() < 4 * marin3r_wire::quote::MAX_QUOTED_BYTES,
        "{} bytes",
        denial.len()
    );
    assert!(denial.contains("bytes)"), "{denial}");
    assert_eq!(denial.matches("\"message\":").count(), 1, "{denial}");
}
