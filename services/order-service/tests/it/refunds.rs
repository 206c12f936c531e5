//! Refund requests and refund notifications.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::{expect_error, TestApp};

#[tokio::test]
async fn refund_snapshots_the_newest_wins_and_each_outcome_emits_once() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, _) = app.paid_order("u1", "MUG", 2).await;

    let r = app.refund(&id, "RF-1", 700).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund: Value = r.json().await.unwrap();
    assert_eq!(refund["status"], "REQUESTED");

    let r = app.refund_notice("RF-1", "SUCCESS", 2).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["result"], "success");
    let before = app.snapshot().await;
    // An older snapshot arrives late, then a duplicate of the applied one.
    assert_eq!(
        app.refund_notice("RF-1", "CLOSED", 1).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.refund_notice("RF-1", "SUCCESS", 2).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.snapshot().await,
        before,
        "stale and duplicate snapshots change nothing"
    );

    let detail = app.get_order(&id).await;
    assert_eq!(detail["refunds"][0]["status"], "SUCCEEDED");
    assert_eq!(detail["refunds"][0]["provider_modified_ms"], 2);
    assert_eq!(detail["refunded_cents"], 700);
    assert_eq!(detail["refundable_cents"], 1_300);
    assert_eq!(
        app.event_types(&id).await,
        [
            "OrderCreated",
            "OrderPaid",
            "RefundRequested",
            "RefundSucceeded"
        ]
    );
    let (_, succeeded) = app.events(&id).await.remove(3);
    assert_eq!(succeeded["refund"]["refund_no"], "RF-1");
    assert_eq!(succeeded["refund"]["amount_cents"], 700);
    assert_eq!(succeeded["refund"]["status"], "SUCCEEDED");
    assert_eq!(succeeded["user_id"], "u1");
    assert_eq!(succeeded["items"][0]["quantity"], 2);
    let metrics = app.metrics().await;
    assert!(metrics.contains("order_refund_callbacks_total{outcome=\"stale\"} 1"));
    assert!(metrics.contains("order_refund_callbacks_total{outcome=\"duplicate\"} 1"));
}

#[tokio::test]
async fn a_newer_snapshot_never_leaves_a_final_state() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, _) = app.paid_order("u1", "MUG", 1).await;
    assert_eq!(
        app.refund(&id, "RF-1", 1_000).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.refund_notice("RF-1", "SUCCESS", 5).await.status(),
        StatusCode::OK
    );
    let before = app.snapshot().await;
    assert_eq!(
        app.refund_notice("RF-1", "CLOSED", 9).await.status(),
        StatusCode::OK
    );
    assert_eq!(app.snapshot().await, before);
    assert_eq!(
        app.get_order(&id).await["refunds"][0]["status"],
        "SUCCEEDED"
    );
    assert!(app
        .metrics()
        .await
        .contains("order_refund_callbacks_total{outcome=\"conflicting\"} 1"));
}

#[tokio::test]
async fn refunds_may_not_exceed_what_was_paid_minus_earlier_refunds() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 500).await;
    let (id, paid) = app.paid_order("u1", "MUG", 2).await;
    assert_eq!(paid, 1_000);

    assert_eq!(
        app.refund(&id, "A", 600).await.status(),
        StatusCode::CREATED
    );
    let before = app.snapshot().await;
    let err = expect_error(
        app.refund(&id, "B", 401).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_paid",
    )
    .await;
    assert_eq!(err["refundable_cents"], 400);
    assert_eq!(app.snapshot().await, before);
    assert_eq!(
        app.refund(&id, "B", 400).await.status(),
        StatusCode::CREATED
    );
    expect_error(
        app.refund(&id, "C", 1).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_paid",
    )
    .await;

    // A closed refund gives its amount back.
    assert_eq!(
        app.refund_notice("A", "CLOSED", 10).await.status(),
        StatusCode::OK
    );
    assert_eq!(app.get_order(&id).await["refundable_cents"], 600);
    assert_eq!(
        app.refund(&id, "C", 600).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(app.get_order(&id).await["refundable_cents"], 0);
    assert_eq!(
        app.event_types(&id).await,
        [
            "OrderCreated",
            "OrderPaid",
            "RefundRequested",
            "RefundRequested",
            "RefundClosed",
            "RefundRequested"
        ]
    );
}

#[tokio::test]
async fn repeating_a_refund_no_returns_the_same_refund() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, _) = app.paid_order("u1", "MUG", 1).await;
    let first = app.refund(&id, "RF-7", 300).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();

    let before = app.snapshot().await;
    let again = app.refund(&id, "RF-7", 300).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(app.snapshot().await, before);

    expect_error(
        app.refund(&id, "RF-7", 301).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_no_reused",
    )
    .await;
    let (other, _) = app.paid_order("u2", "MUG", 1).await;
    let before = app.snapshot().await;
    expect_error(
        app.refund(&other, "RF-7", 300).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_no_reused",
    )
    .await;
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_refunds_never_exceed_the_paid_amount() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, _) = app.paid_order("u1", "MUG", 1).await;
    let numbers: Vec<String> = (0..6).map(|i| format!("P-{i}")).collect();
    let responses = join_all(numbers.iter().map(|n| app.refund(&id, n, 300))).await;
    let created = responses
        .iter()
        .filter(|r| r.status() == StatusCode::CREATED)
        .count();
    let refused = responses
        .iter()
        .filter(|r| r.status() == StatusCode::UNPROCESSABLE_ENTITY)
        .count();
    assert_eq!((created, refused), (3, 3));
    let detail = app.get_order(&id).await;
    assert_eq!(detail["refundable_cents"], 100);
    let requested = app
        .event_types(&id)
        .await
        .iter()
        .filter(|t| *t == "RefundRequested")
        .count();
    assert_eq!(requested, 3);
}
