//! `POST /orders`: idempotency keys, concurrency, replays, pricing.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::{expect_error, TestApp};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_parallel_identical_requests_create_one_order_and_one_event() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_250).await;
    app.sku("TEA", 499).await;
    let body = json!({
        "user_id": "u-1001",
        "items": [{ "sku_id": "MUG", "quantity": 2 }, { "sku_id": "TEA", "quantity": 3 }]
    });

    let responses = join_all((0..20).map(|_| app.post_order(Some("checkout-abc123"), &body))).await;

    let mut replayed = 0;
    let mut bodies = Vec::new();
    for r in responses {
        assert_eq!(r.status(), StatusCode::CREATED);
        if r.headers().get("idempotent-replayed").is_some() {
            assert_eq!(r.headers()["idempotent-replayed"], "true");
            replayed += 1;
        }
        bodies.push(r.json::<Value>().await.unwrap());
    }
    assert_eq!(replayed, 19, "all but the first are replays");
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "every answer is the original response"
    );
    let order_id = bodies[0]["order_id"].as_str().unwrap();
    assert_eq!(bodies[0]["status"], "PENDING_PAYMENT");
    assert_eq!(bodies[0]["amount_cents"], 2 * 1_250 + 3 * 499);

    let s = app.snapshot().await;
    assert_eq!(
        (s.orders, s.order_items, s.idempotency_keys, s.outbox),
        (1, 2, 1, 1)
    );
    let events = app.events(order_id).await;
    assert_eq!(events.len(), 1);
    let (event_type, payload) = &events[0];
    assert_eq!(event_type, "OrderCreated");
    assert_eq!(payload["order_id"], order_id);
    assert_eq!(payload["user_id"], "u-1001");
    assert_eq!(payload["amount_cents"], 3_997);
    assert_eq!(
        payload["items"],
        json!([
            { "sku_id": "MUG", "name": "Item MUG", "quantity": 2, "unit_price_cents": 1_250, "line_total_cents": 2_500, "returned_quantity": 0 },
            { "sku_id": "TEA", "name": "Item TEA", "quantity": 3, "unit_price_cents": 499, "line_total_cents": 1_497, "returned_quantity": 0 }
        ])
    );
    assert!(app
        .metrics()
        .await
        .contains("order_idempotent_replays_total 19"));
}

#[tokio::test]
async fn a_later_retry_replays_the_original_response_even_after_a_price_change() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let body = json!({ "user_id": "u1", "items": [{ "sku_id": "MUG", "quantity": 1 }] });
    let first = app.post_order(Some("k-1"), &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.unwrap();

    app.sku("MUG", 2_000).await;
    let before = app.snapshot().await;
    // Same request, other JSON formatting and field order: still the same request.
    let again = app
        .client
        .post(app.url("/orders"))
        .header("Idempotency-Key", "k-1")
        .header("content-type", "application/json")
        .body(r#"{ "items": [ { "quantity": 1, "sku_id": "MUG" } ] }"#)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(first["amount_cents"], 1_000);
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test]
async fn the_same_key_with_a_different_body_is_refused() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let one = json!({ "user_id": "u1", "items": [{ "sku_id": "MUG", "quantity": 1 }] });
    let two = json!({ "user_id": "u1", "items": [{ "sku_id": "MUG", "quantity": 2 }] });
    assert_eq!(
        app.post_order(Some("k"), &one).await.status(),
        StatusCode::CREATED
    );
    let before = app.snapshot().await;
    expect_error(
        app.post_order(Some("k"), &two).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test]
async fn keys_are_scoped_per_user() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let mut ids = Vec::new();
    for user in ["alice", "bob"] {
        let body = json!({ "user_id": user, "items": [{ "sku_id": "MUG", "quantity": 1 }] });
        let r = app.post_order(Some("shared-key"), &body).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(r.headers().get("idempotent-replayed").is_none());
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["user_id"], user);
        ids.push(b["order_id"].as_str().unwrap().to_owned());
    }
    assert_ne!(ids[0], ids[1]);
    let s = app.snapshot().await;
    assert_eq!((s.orders, s.idempotency_keys, s.outbox), (2, 2, 2));
}

#[tokio::test]
async fn a_failed_request_does_not_poison_its_key() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let body = json!({
        "user_id": "u1",
        "items": [{ "sku_id": "MUG", "quantity": 1 }, { "sku_id": "NEW", "quantity": 1 }]
    });
    let before = app.snapshot().await;
    // Fails inside the transaction, after the key row was claimed.
    let err = expect_error(
        app.post_order(Some("retry-me"), &body).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_sku",
    )
    .await;
    assert!(err["message"].as_str().unwrap().contains("NEW"));
    assert_eq!(
        app.snapshot().await,
        before,
        "the failed request left nothing behind"
    );

    app.sku("NEW", 250).await;
    let r = app.post_order(Some("retry-me"), &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(
        r.headers().get("idempotent-replayed").is_none(),
        "a real creation, not a replay"
    );
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["amount_cents"], 1_250);
    assert_eq!(app.snapshot().await.orders, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_with_distinct_keys_each_create_an_order() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let body = json!({ "user_id": "u1", "items": [{ "sku_id": "MUG", "quantity": 1 }] });
    let keys: Vec<String> = (0..10).map(|i| format!("key-{i}")).collect();
    let responses = join_all(keys.iter().map(|k| app.post_order(Some(k), &body))).await;
    assert!(responses.iter().all(|r| r.status() == StatusCode::CREATED));
    let s = app.snapshot().await;
    assert_eq!((s.orders, s.idempotency_keys, s.outbox), (10, 10, 10));
}
