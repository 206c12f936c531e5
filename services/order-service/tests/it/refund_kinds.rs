//! The reverse lifecycle: refund kinds, full refunds before shipping, the refund cap across
//! every path, and the forward moves past shipping.

use order_service::fulfilment;
use order_service::orders::parse_order_id;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::{expect_error, TestApp};

/// Ships a paid order as the fulfilment consumer does on `OutboundShipped`.
async fn ship(app: &TestApp, id: &str) {
    let mut conn = app.pool.acquire().await.unwrap();
    let shipment = order_service::events::ShipmentView {
        outbound_no: format!("OB-{id}"),
        carrier: "DHL".into(),
        tracking_no: format!("T-{}", &id[..8]),
    };
    fulfilment::ship(&mut conn, parse_order_id(id).unwrap(), &shipment)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_partial_refund_only_keeps_the_order_shipping() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, _) = app.paid_order("u1", "MUG", 2).await;

    let r = app.refund_of_kind(&id, "ADJ-1", 1, "REFUND_ONLY").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.json::<Value>().await.unwrap()["kind"], "REFUND_ONLY");
    assert_eq!(
        app.refund_notice("ADJ-1", "SUCCESS", 1).await.status(),
        StatusCode::OK
    );
    let detail = app.get_order(&id).await;
    assert_eq!(
        detail["status"], "PAID",
        "a 1-cent adjustment stops nothing"
    );
    assert_eq!(detail["refunded_cents"], 1);
    let (_, succeeded) = app.events(&id).await.pop().unwrap();
    assert_eq!(succeeded["event_type"], "RefundSucceeded");
    assert_eq!(succeeded["status"], "PAID");
    assert_eq!(succeeded["refund"]["kind"], "REFUND_ONLY");

    // The order goes on: shipped, delivered, completed, each once.
    ship(&app, &id).await;
    assert_eq!(app.act(&id, "deliver").await.status(), StatusCode::OK);
    let r = app.act(&id, "complete").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "COMPLETED");
    let before = app.snapshot().await;
    assert_eq!(app.act(&id, "complete").await.status(), StatusCode::OK);
    assert_eq!(
        app.snapshot().await,
        before,
        "completing again changes nothing"
    );
    assert_eq!(
        app.event_types(&id).await,
        [
            "OrderCreated",
            "OrderPaid",
            "RefundRequested",
            "RefundSucceeded",
            "OrderShipped",
            "OrderDelivered",
            "OrderCompleted"
        ]
    );
}

#[tokio::test]
async fn a_full_refund_before_shipping_ends_refunded_and_nothing_moves_it_again() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, amount) = app.paid_order("u1", "MUG", 1).await;

    // Two partial refunds adding up to everything paid: the second one ends the order.
    assert_eq!(
        app.refund(&id, "RF-1", 400).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.refund_of_kind(&id, "RF-2", amount - 400, "REFUND_ONLY")
            .await
            .status(),
        StatusCode::CREATED
    );
    app.refund_notice("RF-1", "SUCCESS", 1).await;
    assert_eq!(app.get_order(&id).await["status"], "PAID");
    app.refund_notice("RF-2", "SUCCESS", 1).await;
    // Refunded in full: the order waits for the warehouse's word.
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "PAID");
    assert_eq!(detail["refunded_cents"], amount);
    let events = app.events(&id).await;
    let (last_type, last) = events.last().unwrap();
    assert_eq!(last_type, "RefundSucceeded");
    assert_eq!(last["refunded_in_full"], true, "{last}");
    assert_eq!(
        events[events.len() - 2].1.get("refunded_in_full"),
        None,
        "the partial success is not in full"
    );
    // The WMS cancelled the outbound: the goods never left.
    let order_id = parse_order_id(&id).unwrap();
    let mut conn = app.pool.acquire().await.unwrap();
    fulfilment::outbound_cancelled(&mut conn, order_id)
        .await
        .unwrap();
    drop(conn);
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "REFUNDED");
    let events = app.events(&id).await;
    let (last_type, last) = events.last().unwrap();
    assert_eq!(last_type, "OrderRefunded", "the move emits its one event");
    assert_eq!(last["status"], "REFUNDED");
    assert_eq!(events.len(), 7);

    // A refunded order cannot ship, be delivered or cancelled: 409 with the current state.
    for action in ["deliver", "complete", "cancel"] {
        let before = app.snapshot().await;
        let err = expect_error(
            app.act(&id, action).await,
            StatusCode::CONFLICT,
            "illegal_transition",
        )
        .await;
        assert_eq!(err["current_status"], "REFUNDED", "{action}");
        assert_eq!(app.snapshot().await, before);
    }
    let mut conn = app.pool.acquire().await.unwrap();
    let shipment = order_service::events::ShipmentView {
        outbound_no: "OB-x".into(),
        carrier: "DHL".into(),
        tracking_no: "T-x".into(),
    };
    assert!(
        fulfilment::ship(&mut conn, parse_order_id(&id).unwrap(), &shipment)
            .await
            .is_err(),
        "a refunded order is never shipped"
    );
}

#[tokio::test]
async fn a_parcel_shipped_while_a_full_refund_succeeded_ships_the_order_on_the_warehouses_word() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, amount) = app.paid_order("u1", "MUG", 1).await;
    assert_eq!(
        app.refund(&id, "RR-1", amount).await.status(),
        StatusCode::CREATED
    );
    app.refund_notice("RR-1", "SUCCESS", 1).await;
    assert_eq!(app.get_order(&id).await["status"], "PAID");
    // The warehouse had shipped before it heard of the refund.
    ship(&app, &id).await;
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "SHIPPED", "{detail}");
    assert_eq!(detail["refunded_cents"], amount);
    let types: Vec<String> = app.events(&id).await.into_iter().map(|(t, _)| t).collect();
    assert_eq!(types.last().map(String::as_str), Some("OrderShipped"));
    // Its outbound's cancellation can no longer come; if one did, nothing would move.
    let mut conn = app.pool.acquire().await.unwrap();
    let effect = fulfilment::outbound_cancelled(&mut conn, parse_order_id(&id).unwrap())
        .await
        .unwrap();
    assert_eq!(effect, outbox_consumer::Effect::Unchanged);
}

#[tokio::test]
async fn a_return_after_shipping_ends_returned() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, amount) = app.paid_order("u1", "MUG", 1).await;
    ship(&app, &id).await;
    assert_eq!(
        app.refund(&id, "RT-1", amount).await.status(),
        StatusCode::CREATED
    );
    app.refund_notice("RT-1", "SUCCESS", 1).await;
    assert_eq!(
        app.get_order(&id).await["status"],
        "SHIPPED",
        "after shipping the refund waits for the goods"
    );
    let mut conn = app.pool.acquire().await.unwrap();
    // As an older WMS sent it: no status, no lines (a return was always whole).
    let returned: fulfilment::ReturnReceived =
        serde_json::from_value(serde_json::json!({ "order_id": id })).unwrap();
    fulfilment::receive_return(&mut conn, &returned)
        .await
        .unwrap();
    fulfilment::receive_return(&mut conn, &returned)
        .await
        .unwrap();
    assert_eq!(app.get_order(&id).await["status"], "RETURNED");
    let types = app.event_types(&id).await;
    assert_eq!(types.iter().filter(|t| *t == "OrderReturned").count(), 1);
}

#[tokio::test]
async fn refunds_never_exceed_what_was_paid_whichever_path_asks() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let (id, amount) = app.paid_order("u1", "MUG", 1).await;
    assert_eq!(
        app.refund(&id, "RF-1", 300).await.status(),
        StatusCode::CREATED
    );

    // The stock consumer cancels the paid order: the payment is flagged for what no refund
    // reserved, not for all of it.
    let mut conn = app.pool.acquire().await.unwrap();
    let order_id = parse_order_id(&id).unwrap();
    fulfilment::cancel_for_lack_of_stock(&mut conn, order_id)
        .await
        .unwrap();
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "CANCELLED");
    assert_eq!(detail["payments"][0]["disposition"], "REFUND_REQUIRED");
    assert_eq!(detail["payments"][0]["refund_due_cents"], amount - 300);
    assert_eq!(detail["refundable_cents"], 0);

    // The open refund still finishes (its money), the order stays cancelled. A further refund
    // draws on what the flag owes, never beyond it: then nothing is owed twice.
    app.refund_notice("RF-1", "SUCCESS", 1).await;
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "CANCELLED");
    assert_eq!(detail["refunded_cents"], 300);
    let before = app.snapshot().await;
    let refused = expect_error(
        app.refund(&id, "RF-2", amount - 300 + 1).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_paid",
    )
    .await;
    assert_eq!(refused["refundable_cents"], amount - 300);
    assert_eq!(app.snapshot().await, before);
    assert_eq!(
        app.refund(&id, "RF-2", amount - 300).await.status(),
        StatusCode::CREATED
    );
    let detail = app.get_order(&id).await;
    assert_eq!(detail["payments"][0]["disposition"], "REFUND_COVERED");
    assert_eq!(detail["payments"][0]["refund_due_cents"], 0);

    // The database refuses any path that would reserve more than was paid.
    let err =
        sqlx::query("UPDATE orders SET refund_reserved_cents = paid_cents + 1 WHERE order_id = $1")
            .bind(order_id.uuid())
            .execute(&app.pool)
            .await
            .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("orders_refunds_within_paid")
    );
}
