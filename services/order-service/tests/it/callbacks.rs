//! `POST /payments/callback`: exactly-once payment, duplicates, money for orders that cannot
//! take it.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::{expect_error, TestApp};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_parallel_duplicate_callbacks_pay_once_and_emit_one_event() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let order = app.order("u1", "MUG", 3).await;
    let id = order["order_id"].as_str().unwrap();

    let responses = join_all((0..5).map(|_| app.pay(id, "wx-4200001", 3_000))).await;
    for r in responses {
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.json::<Value>().await.unwrap(),
            json!({ "result": "success" })
        );
    }

    assert_eq!(app.event_types(id).await, ["OrderCreated", "OrderPaid"]);
    let (_, paid) = app.events(id).await.remove(1);
    assert_eq!(paid["order_id"], id);
    assert_eq!(paid["user_id"], "u1");
    assert_eq!(paid["status"], "PAID");
    assert_eq!(paid["amount_cents"], 3_000);
    assert_eq!(paid["paid_cents"], 3_000);
    assert_eq!(paid["items"][0]["sku_id"], "MUG");
    assert_eq!(paid["items"][0]["quantity"], 3);
    assert_eq!(paid["items"][0]["unit_price_cents"], 1_000);
    assert_eq!(paid["payment"]["transaction_id"], "wx-4200001");

    let detail = app.get_order(id).await;
    assert_eq!(detail["status"], "PAID");
    assert_eq!(detail["payments"].as_array().unwrap().len(), 1);
    assert_eq!(detail["payments"][0]["disposition"], "APPLIED");
    let metrics = app.metrics().await;
    assert!(metrics.contains("order_payment_callbacks_total{outcome=\"applied\"} 1"));
    assert!(metrics.contains("order_payment_callbacks_total{outcome=\"duplicate\"} 4"));

    // Much later, the provider repeats itself once more: still nothing changes.
    let before = app.snapshot().await;
    assert_eq!(
        app.pay(id, "wx-4200001", 3_000).await.status(),
        StatusCode::OK
    );
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test]
async fn a_payment_for_a_cancelled_order_is_recorded_flagged_and_does_not_revive_it() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let order = app.order("u1", "MUG", 1).await;
    let id = order["order_id"].as_str().unwrap();
    assert_eq!(app.cancel(id).await.status(), StatusCode::OK);

    let r = app.pay(id, "late-tx", 1_000).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({ "result": "success" })
    );
    // A duplicate of the late notification is just a duplicate.
    assert_eq!(app.pay(id, "late-tx", 1_000).await.status(), StatusCode::OK);

    let detail = app.get_order(id).await;
    assert_eq!(detail["status"], "CANCELLED");
    assert_eq!(detail["paid_cents"], 0);
    assert_eq!(
        detail["payments"],
        json!([{
            "transaction_id": "late-tx",
            "amount_cents": 1_000,
            "disposition": "REFUND_REQUIRED",
            "flag_reason": "order_cancelled",
            "refund_due_cents": 1_000,
            "received_at": detail["payments"][0]["received_at"]
        }])
    );
    assert_eq!(
        app.event_types(id).await,
        ["OrderCreated", "OrderCancelled"]
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("order_payments_flagged_for_refund_total{reason=\"order_cancelled\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_second_transaction_for_a_paid_order_is_flagged_not_applied() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, amount) = app.paid_order("u1", "MUG", 1).await;
    assert_eq!(
        app.pay(&id, "another-tx", amount).await.status(),
        StatusCode::OK
    );
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "PAID");
    assert_eq!(detail["paid_cents"], amount);
    let dispositions: Vec<&str> = detail["payments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["disposition"].as_str().unwrap())
        .collect();
    assert_eq!(dispositions.iter().filter(|d| **d == "APPLIED").count(), 1);
    assert_eq!(
        dispositions
            .iter()
            .filter(|d| **d == "REFUND_REQUIRED")
            .count(),
        1
    );
    assert_eq!(app.event_types(&id).await, ["OrderCreated", "OrderPaid"]);
    assert!(app
        .metrics()
        .await
        .contains("order_payments_flagged_for_refund_total{reason=\"already_paid\"} 1"));
}

#[tokio::test]
async fn a_transaction_id_cannot_pay_two_orders() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (_, amount) = app.paid_order("u1", "MUG", 1).await;
    let first_tx = {
        let r: (String,) = sqlx::query_as("SELECT transaction_id FROM payments")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        r.0
    };
    let other = app.order("u2", "MUG", 1).await;
    let other_id = other["order_id"].as_str().unwrap();
    let before = app.snapshot().await;
    expect_error(
        app.pay(other_id, &first_tx, amount).await,
        StatusCode::CONFLICT,
        "transaction_id_reused",
    )
    .await;
    assert_eq!(app.snapshot().await, before);
    assert_eq!(app.get_order(other_id).await["status"], "PENDING_PAYMENT");
}
