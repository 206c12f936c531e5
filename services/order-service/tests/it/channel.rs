//! The marketplace channel: signed pushes, the two dedupe layers, refund snapshot order.

use order_service::CallbackSecret;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};

use crate::support::{expect_error, TestApp, MARKETPLACE_SECRET};

const PUSH: &str = "/channels/marketplace/push";

fn trade(msg_id: &str, tid: &str, status: &str, modified: i64) -> Value {
    json!({
        "msg_id": msg_id, "type": "TradeSync", "modified": modified,
        "trade": {"tid": tid, "status": status, "buyer_id": "buyer-1",
                  "items": [{"sku_id": "MUG", "quantity": 2}], "paid_cents": 2_000}
    })
}

fn refund(
    msg_id: &str,
    tid: &str,
    refund_id: &str,
    status: &str,
    modified: i64,
    cents: i64,
) -> Value {
    json!({
        "msg_id": msg_id, "type": "RefundSync", "modified": modified,
        "refund": {"tid": tid, "refund_id": refund_id, "status": status,
                   "refund_cents": cents, "kind": "REFUND_ONLY"}
    })
}

async fn push(app: &TestApp, body: &Value) -> Response {
    let raw = serde_json::to_vec(body).unwrap();
    let sig = CallbackSecret::new(MARKETPLACE_SECRET).unwrap().sign(&raw);
    app.post_raw(PUSH, &raw, Some(&sig)).await
}

async fn pushed(app: &TestApp, body: &Value) -> String {
    let r = push(app, body).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["result"], "success");
    body["outcome"].as_str().unwrap().to_owned()
}

async fn our_order(app: &TestApp, tid: &str) -> String {
    let id: uuid::Uuid = sqlx::query_scalar(
        "SELECT order_id FROM channel_orders WHERE channel = 'marketplace' AND external_order_id = $1",
    )
    .bind(tid)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    id.to_string()
}

async fn dedupe_counts(app: &TestApp) -> (i64, i64, i64) {
    let mut conn = app.pool.acquire().await.unwrap();
    order_service::channel::store::dedupe_counts(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn bad_signatures_unknown_types_and_malformed_bodies_write_nothing() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let before = app.snapshot().await;
    let raw = serde_json::to_vec(&trade("m1", "T1", "WAIT_BUYER_PAY", 1)).unwrap();
    let forged = CallbackSecret::new("wrong").unwrap().sign(&raw);
    for sig in [None, Some("00"), Some(forged.as_str())] {
        expect_error(
            app.post_raw(PUSH, &raw, sig).await,
            StatusCode::UNAUTHORIZED,
            "invalid_signature",
        )
        .await;
    }
    let err = expect_error(
        push(
            &app,
            &json!({"msg_id": "m2", "type": "ItemSync", "modified": 1}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_message_type",
    )
    .await;
    assert!(err["message"].as_str().unwrap().contains("ItemSync"));
    let raw = b"{not json";
    let sig = CallbackSecret::new(MARKETPLACE_SECRET).unwrap().sign(raw);
    expect_error(
        app.post_raw(PUSH, raw, Some(&sig)).await,
        StatusCode::BAD_REQUEST,
        "malformed_json",
    )
    .await;
    let err = expect_error(
        push(
            &app,
            &json!({"msg_id": "m3", "type": "TradeSync", "modified": 1,
            "trade": {"tid": "T1", "status": "LOST", "buyer_id": "b", "items": []}}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    )
    .await;
    assert_eq!(err["field"], "trade.status");
    // A refund of a trade we never saw, and a payment that does not match our prices.
    expect_error(
        push(&app, &refund("m4", "T9", "R9", "SUCCESS", 1, 100)).await,
        StatusCode::CONFLICT,
        "unknown_channel_order",
    )
    .await;
    let mut wrong_price = trade("m5", "T1", "WAIT_SELLER_SEND_GOODS", 1);
    wrong_price["trade"]["paid_cents"] = json!(1);
    expect_error(
        push(&app, &wrong_price).await,
        StatusCode::BAD_REQUEST,
        "amount_mismatch",
    )
    .await;
    assert_eq!(
        app.snapshot().await,
        before,
        "refused messages change nothing"
    );
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM channel_messages")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(messages, 0);
}

#[tokio::test]
async fn duplicates_are_absorbed_by_msg_id_then_by_the_change_itself() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    assert_eq!(
        pushed(&app, &trade("m1", "T1", "WAIT_BUYER_PAY", 1)).await,
        "applied"
    );
    assert_eq!(
        pushed(&app, &trade("m2", "T1", "WAIT_SELLER_SEND_GOODS", 2)).await,
        "applied"
    );
    let id = our_order(&app, "T1").await;
    let before = app.snapshot().await;

    // Layer 1: the same msg_id again, three times, concurrently.
    let m2 = trade("m2", "T1", "WAIT_SELLER_SEND_GOODS", 2);
    let outcomes = futures::future::join_all((0..3).map(|_| pushed(&app, &m2))).await;
    assert_eq!(outcomes, ["duplicate_message"; 3]);
    // Layer 2: the same change under new msg_ids.
    assert_eq!(
        pushed(&app, &trade("m2-bis", "T1", "WAIT_SELLER_SEND_GOODS", 2)).await,
        "duplicate_change"
    );
    assert_eq!(
        pushed(&app, &trade("m1-bis", "T1", "WAIT_BUYER_PAY", 1)).await,
        "duplicate_change"
    );
    assert_eq!(
        app.snapshot().await.outbox,
        before.outbox,
        "no second effect"
    );
    assert_eq!(app.snapshot().await.orders, 1);

    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "PAID");
    assert_eq!(detail["user_id"], "marketplace:buyer-1");
    assert_eq!(detail["payments"][0]["transaction_id"], "marketplace:T1");
    assert_eq!(app.event_types(&id).await, ["OrderCreated", "OrderPaid"]);
    assert_eq!(dedupe_counts(&app).await, (3, 2, 0));
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            "order_channel_messages_total{outcome=\"duplicate_message\",source=\"push\"} 3"
        ),
        "{metrics}"
    );
    assert!(metrics
        .contains("order_channel_messages_total{outcome=\"duplicate_change\",source=\"push\"} 2"));
}

#[tokio::test]
async fn refund_snapshots_apply_only_when_newer() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    pushed(&app, &trade("m1", "T1", "WAIT_SELLER_SEND_GOODS", 1)).await;
    let id = our_order(&app, "T1").await;

    // The final snapshot arrives first; the older "requested" one comes late.
    assert_eq!(
        pushed(&app, &refund("r2", "T1", "R1", "SUCCESS", 20, 50)).await,
        "applied"
    );
    let before = app.snapshot().await;
    assert_eq!(
        pushed(&app, &refund("r1", "T1", "R1", "WAIT_SELLER_AGREE", 10, 50)).await,
        "stale"
    );
    assert_eq!(
        pushed(&app, &refund("r0", "T1", "R1", "CLOSED", 15, 50)).await,
        "stale"
    );
    let after = app.snapshot().await;
    assert_eq!(
        (after.outbox, after.refunds, after.state.clone()),
        (before.outbox, before.refunds, before.state)
    );

    let detail = app.get_order(&id).await;
    assert_eq!(
        detail["status"], "PAID",
        "a partial refund-only keeps the order"
    );
    assert_eq!(detail["refunds"][0]["refund_no"], "marketplace:R1");
    assert_eq!(detail["refunds"][0]["status"], "SUCCEEDED");
    assert_eq!(detail["refunds"][0]["kind"], "REFUND_ONLY");
    assert_eq!(detail["refunded_cents"], 50);
    assert_eq!(dedupe_counts(&app).await, (0, 0, 2));

    // A refund above what is left is refused through this path too, writing nothing.
    let before = app.snapshot().await;
    expect_error(
        push(
            &app,
            &refund("r9", "T1", "R2", "WAIT_SELLER_AGREE", 30, 1_951),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_paid",
    )
    .await;
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test]
async fn a_closed_unpaid_trade_cancels_and_a_full_refund_before_shipping_refunds() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    pushed(&app, &trade("a1", "TA", "WAIT_BUYER_PAY", 1)).await;
    let mut closed = trade("a2", "TA", "TRADE_CLOSED", 2);
    closed["trade"]["paid_cents"] = Value::Null;
    pushed(&app, &closed).await;
    assert_eq!(
        app.get_order(&our_order(&app, "TA").await).await["status"],
        "CANCELLED"
    );

    pushed(&app, &trade("b1", "TB", "WAIT_SELLER_SEND_GOODS", 1)).await;
    let mut full = refund("b2", "TB", "RB", "SUCCESS", 5, 2_000);
    full["refund"]["kind"] = json!("RETURN_AND_REFUND");
    pushed(&app, &full).await;
    let id = our_order(&app, "TB").await;
    // Refunded in full: the order waits for the warehouse's word (no WMS here: applied by hand).
    assert_eq!(app.get_order(&id).await["status"], "PAID");
    let mut conn = app.pool.acquire().await.unwrap();
    let order_id = order_service::orders::parse_order_id(&id).unwrap();
    order_service::fulfilment::outbound_cancelled(&mut conn, order_id)
        .await
        .unwrap();
    assert_eq!(app.get_order(&id).await["status"], "REFUNDED");
    assert_eq!(
        app.event_types(&id).await,
        [
            "OrderCreated",
            "OrderPaid",
            "RefundRequested",
            "RefundSucceeded",
            "OrderRefunded"
        ]
    );
}

#[tokio::test]
async fn a_change_recovered_by_compensation_has_no_second_effect_when_its_push_arrives_late() {
    use order_service::channel::{apply, ChannelMessage, Outcome, PushBody, Source};
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    // The compensation poller fetched the change (its push was delayed).
    let fetched = trade(
        "q-T1-WAIT_SELLER_SEND_GOODS-5",
        "T1",
        "WAIT_SELLER_SEND_GOODS",
        5,
    );
    let msg =
        ChannelMessage::try_from(serde_json::from_value::<PushBody>(fetched).unwrap()).unwrap();
    assert_eq!(
        apply(&app.pool, &msg, Source::Query).await.unwrap(),
        Outcome::Applied
    );
    let id = our_order(&app, "T1").await;
    let before = app.snapshot().await;
    // The push arrives afterwards, under the platform's own msg_id.
    assert_eq!(
        pushed(&app, &trade("push-77", "T1", "WAIT_SELLER_SEND_GOODS", 5)).await,
        "duplicate_change"
    );
    let after = app.snapshot().await;
    assert_eq!(
        (after.outbox, after.orders, after.payments),
        (before.outbox, before.orders, before.payments)
    );
    assert_eq!(app.event_types(&id).await, ["OrderCreated", "OrderPaid"]);
    let source: String =
        sqlx::query_scalar("SELECT source FROM channel_messages WHERE outcome = 'applied'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(source, "query");
}

#[tokio::test]
async fn a_customer_whose_sub_equals_a_buyer_id_gets_404_on_the_buyers_order() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    assert_eq!(
        pushed(&app, &trade("ns-1", "T-NS", "WAIT_SELLER_SEND_GOODS", 1)).await,
        "applied"
    );
    let id = our_order(&app, "T-NS").await;
    assert_eq!(app.owner_of(&id).await, "marketplace:buyer-1");
    let before = app.snapshot().await;
    for sub in ["buyer-1", "marketplace:buyer-1"] {
        let token = app.customer_token(sub);
        let get = app
            .client
            .get(app.url(&format!("/orders/{id}")))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        let refund = app
            .client
            .post(app.url(&format!("/orders/{id}/refunds")))
            .bearer_auth(&token)
            .json(&json!({"refund_no": "rf-ns", "amount_cents": 100, "reason": "mine"}))
            .send()
            .await
            .unwrap();
        let cancel = app
            .client
            .post(app.url(&format!("/orders/{id}/cancel")))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        if sub == "buyer-1" {
            // The buyer's id as a local customer owns nothing of the buyer's.
            expect_error(get, StatusCode::NOT_FOUND, "order_not_found").await;
            expect_error(refund, StatusCode::NOT_FOUND, "order_not_found").await;
            expect_error(cancel, StatusCode::NOT_FOUND, "order_not_found").await;
        } else {
            // No token puts its bearer into the channel's namespace.
            expect_error(get, StatusCode::UNAUTHORIZED, "invalid_token").await;
            expect_error(refund, StatusCode::UNAUTHORIZED, "invalid_token").await;
            expect_error(cancel, StatusCode::UNAUTHORIZED, "invalid_token").await;
        }
    }
    assert_eq!(app.snapshot().await, before, "nothing written");
    // The operator still sees it, owned by the namespaced buyer.
    let detail = app.get_order(&id).await;
    assert_eq!(detail["user_id"], "marketplace:buyer-1");
}

#[tokio::test]
async fn a_customer_refund_number_with_the_channel_prefix_is_400_and_writes_nothing() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, amount) = app.paid_order("u-prefix", "MUG", 2).await;
    let before = app.snapshot().await;
    let r = app.refund(&id, "marketplace:R1", amount).await;
    let err = expect_error(r, StatusCode::BAD_REQUEST, "reserved_namespace").await;
    assert_eq!(err["field"], "refund_no", "{err}");
    assert_eq!(app.snapshot().await, before, "nothing written");
    // Any other number is the customer's to choose.
    let r = app.refund(&id, "R1", amount).await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_refund_snapshots_items_are_its_lines_and_the_newest_snapshot_replaces_them() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    pushed(&app, &trade("m1", "T1", "WAIT_SELLER_SEND_GOODS", 1)).await;
    let id = our_order(&app, "T1").await;
    let with_items = |msg_id: &str, status: &str, modified: i64, cents: i64, units: i64| {
        json!({
            "msg_id": msg_id, "type": "RefundSync", "modified": modified,
            "refund": {"tid": "T1", "refund_id": "R1", "status": status, "refund_cents": cents,
                       "kind": "RETURN_AND_REFUND", "items": [{"sku_id": "MUG", "quantity": units}]}
        })
    };
    assert_eq!(
        pushed(&app, &with_items("r1", "WAIT_SELLER_AGREE", 10, 2_000, 2)).await,
        "applied"
    );
    assert_eq!(
        app.get_order(&id).await["refunds"][0]["lines"],
        json!([{"sku_id": "MUG", "quantity": 2}])
    );
    // The buyer keeps one mug: the newest snapshot's amount and lines are the refund's, and
    // the WMS hears the new terms (`RefundRequested` again, with the new lines).
    assert_eq!(
        pushed(&app, &with_items("r2", "WAIT_SELLER_AGREE", 11, 1_000, 1)).await,
        "applied"
    );
    let detail = app.get_order(&id).await;
    assert_eq!(detail["refunds"][0]["amount_cents"], 1_000);
    assert_eq!(
        detail["refunds"][0]["lines"],
        json!([{"sku_id": "MUG", "quantity": 1}])
    );
    let (event_type, last) = app.events(&id).await.pop().unwrap();
    assert_eq!(event_type, "RefundRequested");
    assert_eq!(
        last["refund"]["lines"],
        json!([{"sku_id": "MUG", "quantity": 1}])
    );

    // More units than the trade has: 422 naming the item, nothing written.
    let before = app.snapshot().await;
    let err = expect_error(
        push(&app, &with_items("r3", "WAIT_SELLER_AGREE", 12, 1_000, 3)).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_line",
    )
    .await;
    assert_eq!(err["sku_id"], "MUG");
    assert_eq!(err["refundable_quantity"], 2);
    assert_eq!(app.snapshot().await, before);
}

#[tokio::test]
async fn a_refund_snapshot_may_change_the_kind_but_never_raise_the_amount_above_what_is_left() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    pushed(&app, &trade("m1", "T1", "WAIT_SELLER_SEND_GOODS", 1)).await;
    let id = our_order(&app, "T1").await;
    let snapshot = |msg_id: &str, modified: i64, cents: i64, kind: &str| {
        json!({
            "msg_id": msg_id, "type": "RefundSync", "modified": modified,
            "refund": {"tid": "T1", "refund_id": "R1", "status": "WAIT_SELLER_AGREE",
                       "refund_cents": cents, "kind": kind}
        })
    };
    assert_eq!(
        pushed(&app, &snapshot("r1", 10, 500, "RETURN_AND_REFUND")).await,
        "applied"
    );
    // The buyer keeps the goods: the kind follows the newest snapshot, and the WMS hears it.
    assert_eq!(
        pushed(&app, &snapshot("r2", 11, 500, "REFUND_ONLY")).await,
        "applied"
    );
    assert_eq!(
        app.get_order(&id).await["refunds"][0]["kind"],
        "REFUND_ONLY"
    );
    let (event_type, last) = app.events(&id).await.pop().unwrap();
    assert_eq!(event_type, "RefundRequested");
    assert_eq!(last["refund"]["kind"], "REFUND_ONLY");

    // A second refund takes 1 200 of the 2 000 paid; raising the first to 1 000 would exceed
    // what is left (800): 422 with what is refundable, and nothing changes.
    let other = json!({
        "msg_id": "o1", "type": "RefundSync", "modified": 12,
        "refund": {"tid": "T1", "refund_id": "R2", "status": "WAIT_SELLER_AGREE",
                   "refund_cents": 1_200, "kind": "REFUND_ONLY"}
    });
    assert_eq!(pushed(&app, &other).await, "applied");
    let before = app.snapshot().await;
    let err = expect_error(
        push(&app, &snapshot("r3", 13, 1_000, "REFUND_ONLY")).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_paid",
    )
    .await;
    assert_eq!(err["refundable_cents"], 800);
    assert_eq!(app.snapshot().await, before);
    assert_eq!(app.get_order(&id).await["refunds"][0]["amount_cents"], 500);
    // Raised to exactly what is left, it applies.
    assert_eq!(
        pushed(&app, &snapshot("r4", 14, 800, "REFUND_ONLY")).await,
        "applied"
    );
    assert_eq!(app.get_order(&id).await["refundable_cents"], 0);
}
