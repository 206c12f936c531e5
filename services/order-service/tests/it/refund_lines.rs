//! Refunds by line: a return-and-refund names the units it takes back, no line gives back more
//! units than were ordered across the order's live refunds, and a return of some units leaves
//! the order partly returned instead of RETURNED.

use order_service::fulfilment::{self, ReturnReceived};
use order_service::orders::parse_order_id;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::{expect_error, TestApp};

/// A paid order of 2 × MUG (1 000) and 1 × TEA (500); returns its id.
async fn paid_two_line_order(app: &TestApp) -> String {
    app.sku("MUG", 1_000).await;
    app.sku("TEA", 500).await;
    let key = uuid::Uuid::new_v4().to_string();
    let body = json!({ "user_id": "u1", "items": [
        { "sku_id": "MUG", "quantity": 2 }, { "sku_id": "TEA", "quantity": 1 }
    ] });
    let r = app.post_order(Some(&key), &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let id = r.json::<Value>().await.unwrap()["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        app.pay(&id, &format!("tx-{id}"), 2_500).await.status(),
        StatusCode::OK
    );
    id
}

fn line_refund(refund_no: &str, cents: i64, lines: Value) -> Value {
    json!({ "refund_no": refund_no, "amount_cents": cents, "reason": "damaged",
            "kind": "RETURN_AND_REFUND", "lines": lines })
}

#[tokio::test]
async fn refund_lines_are_checked_against_the_order_and_its_other_refunds() {
    let app = TestApp::spawn().await;
    let id = paid_two_line_order(&app).await;

    // Shape errors: 422 `validation_failed` naming the field, nothing written.
    let before = app.snapshot().await;
    let refund_only_with_lines = json!({ "refund_no": "X-1", "amount_cents": 100, "reason": "r",
        "kind": "REFUND_ONLY", "lines": [{ "sku_id": "MUG", "quantity": 1 }] });
    let err = expect_error(
        app.refund_body(&id, &refund_only_with_lines).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    )
    .await;
    assert_eq!(err["field"], "lines");
    let twice = line_refund(
        "X-2",
        100,
        json!([{ "sku_id": "MUG", "quantity": 1 }, { "sku_id": "MUG", "quantity": 1 }]),
    );
    let err = expect_error(
        app.refund_body(&id, &twice).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    )
    .await;
    assert_eq!(err["field"], "lines[1].sku_id");
    let zero = line_refund("X-3", 100, json!([{ "sku_id": "MUG", "quantity": 0 }]));
    let err = expect_error(
        app.refund_body(&id, &zero).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    )
    .await;
    assert_eq!(err["field"], "lines[0].quantity");

    // State errors: 422 `refund_exceeds_line` naming the line and what is left of it, nothing written.
    let foreign = line_refund("X-4", 100, json!([{ "sku_id": "CUP", "quantity": 1 }]));
    let err = expect_error(
        app.refund_body(&id, &foreign).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_line",
    )
    .await;
    assert_eq!(
        (err["sku_id"].clone(), err["refundable_quantity"].clone()),
        (json!("CUP"), json!(0))
    );
    let too_many = line_refund("X-5", 100, json!([{ "sku_id": "MUG", "quantity": 3 }]));
    let err = expect_error(
        app.refund_body(&id, &too_many).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_line",
    )
    .await;
    assert_eq!(err["refundable_quantity"], 2);
    assert_eq!(
        app.snapshot().await,
        before,
        "refused requests write nothing"
    );

    // One MUG taken back by R-1 leaves one for R-2; a third cannot have any.
    let r1 = line_refund("R-1", 1_000, json!([{ "sku_id": "MUG", "quantity": 1 }]));
    let r = app.refund_body(&id, &r1).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["lines"], json!([{ "sku_id": "MUG", "quantity": 1 }]));
    let r2 = line_refund(
        "R-2",
        1_000,
        json!([{ "sku_id": "TEA", "quantity": 1 }, { "sku_id": "MUG", "quantity": 1 }]),
    );
    assert_eq!(
        app.refund_body(&id, &r2).await.status(),
        StatusCode::CREATED
    );
    let r3 = line_refund("R-3", 100, json!([{ "sku_id": "MUG", "quantity": 1 }]));
    let err = expect_error(
        app.refund_body(&id, &r3).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_exceeds_line",
    )
    .await;
    assert_eq!(err["refundable_quantity"], 0);

    // The same number with the same lines is a replay; with other lines it is refused.
    let r = app.refund_body(&id, &r1).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        r.headers()["idempotent-replayed"],
        "true",
        "a repeat answers the refund"
    );
    let other = line_refund("R-1", 1_000, json!([{ "sku_id": "TEA", "quantity": 1 }]));
    expect_error(
        app.refund_body(&id, &other).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refund_no_reused",
    )
    .await;

    // A closed refund gives its units back.
    assert_eq!(
        app.refund_notice("R-1", "CLOSED", 1).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.refund_body(&id, &r3).await.status(),
        StatusCode::CREATED
    );

    // The events carry the lines, sorted by SKU; the order view shows them per refund.
    let requested: Vec<Value> = app
        .events(&id)
        .await
        .into_iter()
        .filter(|(t, _)| t == "RefundRequested")
        .map(|(_, p)| p)
        .collect();
    let r2_event = requested
        .iter()
        .find(|p| p["refund"]["refund_no"] == "R-2")
        .unwrap();
    assert_eq!(
        r2_event["refund"]["lines"],
        json!([{ "sku_id": "MUG", "quantity": 1 }, { "sku_id": "TEA", "quantity": 1 }])
    );
    let detail = app.get_order(&id).await;
    let refunds = detail["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 3);
    assert!(refunds
        .iter()
        .all(|r| !r["lines"].as_array().unwrap().is_empty()));
}

/// Ships the order as the fulfilment consumer does on `OutboundShipped`.
async fn ship(app: &TestApp, id: &str) {
    let mut conn = app.pool.acquire().await.unwrap();
    let shipment = order_service::events::ShipmentView {
        outbound_no: format!("OB-{}", &id[..8]),
        carrier: "DHL".into(),
        tracking_no: format!("T-{}", &id[..8]),
    };
    fulfilment::ship(&mut conn, parse_order_id(id).unwrap(), &shipment)
        .await
        .unwrap();
}

/// The fulfilment consumer's handling of a `ReturnReceived` with this outbound status and
/// units back per line (MUG shipped 2, TEA shipped 1).
async fn returned(
    app: &TestApp,
    id: &str,
    status: &str,
    mug: i32,
    tea: i32,
) -> outbox_consumer::Effect {
    let event: ReturnReceived = serde_json::from_value(json!({
        "order_id": id, "status": status, "lines": [
            { "sku_id": "MUG", "quantity": 2, "returned_quantity": mug },
            { "sku_id": "TEA", "quantity": 1, "returned_quantity": tea }
        ]
    }))
    .unwrap();
    let mut conn = app.pool.acquire().await.unwrap();
    fulfilment::receive_return(&mut conn, &event).await.unwrap()
}

#[tokio::test]
async fn a_return_of_some_units_leaves_the_order_partly_returned_until_the_rest_comes_back() {
    use outbox_consumer::Effect;
    let app = TestApp::spawn().await;
    let id = paid_two_line_order(&app).await;
    ship(&app, &id).await;
    let r1 = line_refund("R-1", 1_000, json!([{ "sku_id": "MUG", "quantity": 1 }]));
    assert_eq!(
        app.refund_body(&id, &r1).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.refund_notice("R-1", "SUCCESS", 1).await.status(),
        StatusCode::OK
    );

    // One MUG of two is back: the order stays SHIPPED (a MUG and the TEA are with the buyer,
    // paid for), the line shows the unit back, `OrderPartlyReturned` says so once.
    assert_eq!(returned(&app, &id, "SHIPPED", 1, 0).await, Effect::Changed);
    assert_eq!(
        returned(&app, &id, "SHIPPED", 1, 0).await,
        Effect::Unchanged
    );
    assert_eq!(
        returned(&app, &id, "SHIPPED", 0, 0).await,
        Effect::Unchanged,
        "an older count never lowers what is back"
    );
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "SHIPPED");
    assert_eq!(detail["items"][0]["sku_id"], "MUG");
    assert_eq!(detail["items"][0]["returned_quantity"], 1);
    assert_eq!(detail["items"][1]["returned_quantity"], 0);
    let types = app.event_types(&id).await;
    assert_eq!(
        types.iter().filter(|t| *t == "OrderPartlyReturned").count(),
        1
    );
    assert!(!types.iter().any(|t| t == "OrderReturned"));

    // The rest comes back under a whole-order refund: RETURNED.
    assert_eq!(
        app.refund_of_kind(&id, "R-2", 1_500, "RETURN_AND_REFUND")
            .await
            .status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.refund_notice("R-2", "SUCCESS", 2).await.status(),
        StatusCode::OK
    );
    assert_eq!(returned(&app, &id, "RETURNED", 2, 1).await, Effect::Changed);
    let detail = app.get_order(&id).await;
    assert_eq!(detail["status"], "RETURNED");
    assert_eq!(detail["items"][0]["returned_quantity"], 2);
    assert_eq!(detail["items"][1]["returned_quantity"], 1);
    let types = app.event_types(&id).await;
    assert_eq!(types.iter().filter(|t| *t == "OrderReturned").count(), 1);
}
