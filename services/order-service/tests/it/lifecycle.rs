//! The order state machine: cancel, illegal transitions, races between writers of one order.

use futures::join;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::{expect_error, TestApp};

#[tokio::test]
async fn cancel_before_payment_emits_once_and_a_repeat_returns_the_current_state() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let order = app.order("u1", "MUG", 1).await;
    let id = order["order_id"].as_str().unwrap();

    let r = app.cancel(id).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "CANCELLED");
    assert!(body["cancelled_at"].is_string());

    let before = app.snapshot().await;
    let again = app.cancel(id).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.json::<Value>().await.unwrap()["status"], "CANCELLED");
    assert_eq!(app.snapshot().await, before);

    let events = app.events(id).await;
    assert_eq!(
        events.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
        ["OrderCreated", "OrderCancelled"]
    );
    assert_eq!(events[1].1["status"], "CANCELLED");
    assert_eq!(events[1].1["items"][0]["sku_id"], "MUG");
}

#[tokio::test]
async fn illegal_transitions_are_409_with_the_current_state_and_no_event() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;

    let (paid, _) = app.paid_order("u1", "MUG", 1).await;
    let before = app.snapshot().await;
    let err = expect_error(
        app.cancel(&paid).await,
        StatusCode::CONFLICT,
        "illegal_transition",
    )
    .await;
    assert_eq!(err["current_status"], "PAID");
    assert_eq!(app.snapshot().await, before);

    let pending = app.order("u1", "MUG", 1).await;
    let pending = pending["order_id"].as_str().unwrap();
    let before = app.snapshot().await;
    let err = expect_error(
        app.refund(pending, "R-pending", 100).await,
        StatusCode::CONFLICT,
        "illegal_transition",
    )
    .await;
    assert_eq!(err["current_status"], "PENDING_PAYMENT");
    assert_eq!(app.snapshot().await, before);

    assert_eq!(app.cancel(pending).await.status(), StatusCode::OK);
    let before = app.snapshot().await;
    let err = expect_error(
        app.refund(pending, "R-cancelled", 100).await,
        StatusCode::CONFLICT,
        "illegal_transition",
    )
    .await;
    assert_eq!(err["current_status"], "CANCELLED");
    assert_eq!(app.snapshot().await, before);
    assert_eq!(app.event_types(&paid).await, ["OrderCreated", "OrderPaid"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_a_payment_leaves_exactly_one_outcome() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    for round in 0..5 {
        let order = app.order("u1", "MUG", 1).await;
        let id = order["order_id"].as_str().unwrap();
        let tx = format!("race-{round}");
        let (cancel, pay) = join!(app.cancel(id), app.pay(id, &tx, 1_000));
        assert_eq!(
            pay.status(),
            StatusCode::OK,
            "the provider always gets success"
        );
        let detail = app.get_order(id).await;
        let events = app.event_types(id).await;
        match detail["status"].as_str().unwrap() {
            "PAID" => {
                assert_eq!(cancel.status(), StatusCode::CONFLICT);
                assert_eq!(events, ["OrderCreated", "OrderPaid"]);
                assert_eq!(detail["payments"][0]["disposition"], "APPLIED");
            }
            "CANCELLED" => {
                assert_eq!(cancel.status(), StatusCode::OK);
                assert_eq!(events, ["OrderCreated", "OrderCancelled"]);
                assert_eq!(detail["payments"][0]["disposition"], "REFUND_REQUIRED");
            }
            other => panic!("unexpected status {other}"),
        }
    }
}
