//! Refunds and returns by order line, with hand-written events: the stock consumer moves
//! stock by line as lines are cut before shipping, shipped and partly returned (redeliveries
//! under new event ids change nothing); the WMS takes refunded lines out before shipping and
//! expects only them back after.

use std::time::Duration;

use e2e::fulfilment::{dump_topics, in_inbox, produce_all, System};
use e2e::verify::event_type;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

/// Sends a hand-written event (`payload` plus `event_type`, keyed `key`) on the topic of
/// `aggregate` under a fresh event id, and waits until the consumer on `consumer`'s database
/// (`who`, for the message) took it.
async fn hand_written_event(
    sys: &System,
    (aggregate, key): (&str, &str),
    event_type: &str,
    payload: Value,
    (who, consumer): (&str, &e2e::db::TestDb),
) {
    let id = Uuid::new_v4();
    let mut payload = payload;
    payload["event_type"] = json!(event_type);
    let headers = [
        ("event_id", id.to_string()),
        ("event_type", event_type.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    produce_all(
        &sys.brokers,
        vec![(
            sys.topic(aggregate),
            key.to_owned(),
            payload.to_string(),
            headers,
            None,
        )],
    )
    .await;
    e2e::wait_for(
        &format!("the {who} to take {event_type} {id}"),
        Duration::from_secs(60),
        || async {
            in_inbox(&consumer.pool, &id.to_string())
                .await
                .then_some(())
        },
    )
    .await;
}

/// A hand-written WMS event about outbound `no` (the WMS's shape: the outbound view plus
/// `event_type`), taken by the stock consumer.
async fn outbound_event(sys: &System, no: &str, event_type: &str, payload: Value) {
    let consumer = ("stock consumer", &sys.stock_db);
    hand_written_event(sys, ("outbound", no), event_type, payload, consumer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stock_moves_by_line_as_lines_are_cut_shipped_and_partly_returned() {
    let sys = System::start().await;
    for (sku, on_hand) in [("L1", 10), ("L2", 5)] {
        sys.sku(sku, 100).await;
        sys.set_stock(sku, on_hand).await;
    }
    let order = sys.paid_order("judy", &[("L1", 3), ("L2", 2)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    let no = outbound["outbound_no"].as_str().unwrap().to_owned();
    sys.wait_stock("L1", (10, 3)).await;
    sys.wait_stock("L2", (5, 2)).await;
    let view = |status: &str, lines: Value| json!({"outbound_no": no, "order_id": order, "status": status, "lines": lines});
    let stock = || async { (sys.stock_of("L1").await, sys.stock_of("L2").await) };

    // One unit of L1 and all of L2 refunded before shipping: only they are released. The same
    // view again (a redelivery under a new event id) changes nothing.
    let mut cut = view(
        "CREATED",
        json!([{"sku_id": "L1", "quantity": 2, "returned_quantity": 0}]),
    );
    cut["cancelled_lines"] =
        json!([{"sku_id": "L1", "quantity": 1}, {"sku_id": "L2", "quantity": 2}]);
    cut["refund_no"] = json!("R-judy-1");
    for _ in 0..2 {
        outbound_event(&sys, &no, "OutboundLinesCancelled", cut.clone()).await;
        assert_eq!(stock().await, ((10, 2), (5, 0)));
    }

    // The rest ships.
    let shipped = json!([{"sku_id": "L1", "quantity": 2, "returned_quantity": 0}]);
    outbound_event(&sys, &no, "OutboundShipped", view("SHIPPED", shipped)).await;
    assert_eq!(stock().await, ((8, 0), (5, 0)));

    // One of the two shipped units comes back: only it is restocked, also when the receipt
    // arrives again; the outbound is still SHIPPED.
    let mut partial = view(
        "SHIPPED",
        json!([{"sku_id": "L1", "quantity": 2, "returned_quantity": 1}]),
    );
    partial["received_lines"] = json!([{"sku_id": "L1", "quantity": 1}]);
    for _ in 0..2 {
        outbound_event(&sys, &no, "ReturnReceived", partial.clone()).await;
        assert_eq!(stock().await, ((9, 0), (5, 0)));
    }
    // The lines refunded before shipping stay released however late their event comes again.
    outbound_event(&sys, &no, "OutboundLinesCancelled", cut).await;
    assert_eq!(stock().await, ((9, 0), (5, 0)));

    // An older WMS's receipt (no `returned_quantity`): the whole line is back.
    let whole = view("RETURNED", json!([{"sku_id": "L1", "quantity": 2}]));
    outbound_event(&sys, &no, "ReturnReceived", whole).await;
    assert_eq!(stock().await, ((10, 0), (5, 0)));

    // The stock API shows where each line's units went.
    let r = sys
        .http
        .get(sys.stock.url(&format!("/reservations/{order}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let reservation: Value = r.json().await.unwrap();
    assert_eq!(
        reservation,
        json!({"order_id": order, "status": "RESTOCKED", "lines": [
            {"sku_id": "L1", "reserved": 3, "released": 1, "deducted": 2, "restocked": 2},
            {"sku_id": "L2", "reserved": 2, "released": 2, "deducted": 0, "restocked": 0},
        ]}),
        "every shipped unit is back"
    );
    let sql = format!(
        "SELECT string_agg(sku_id || ':' || kind || ':' || quantity, ',' ORDER BY id) \
         FROM stock_movements WHERE order_id = '{order}'"
    );
    let movements: String = sqlx::query_scalar(&sql)
        .fetch_one(&sys.stock_db.pool)
        .await
        .unwrap();
    assert_eq!(
        movements,
        "L1:RESERVE:3,L2:RESERVE:2,L1:RELEASE:1,L2:RELEASE:2,L1:DEDUCT:2,L1:RESTOCK:1,L1:RESTOCK:1"
    );
}

/// A hand-written order event (the order service's shape, what the WMS reads of it) about
/// `order`, taken by the WMS.
async fn order_event(sys: &System, order: &str, event_type: &str, payload: Value) {
    hand_written_event(
        sys,
        ("order", order),
        event_type,
        payload,
        ("WMS", &sys.wms_db),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wms_takes_refunded_lines_out_before_shipping_and_expects_only_them_back_after() {
    let sys = System::start().await;
    for (sku, on_hand) in [("W1", 10), ("W2", 5)] {
        sys.sku(sku, 100).await;
        sys.set_stock(sku, on_hand).await;
    }
    let order = sys.paid_order("ivan", &[("W1", 3), ("W2", 1)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    let no = outbound["outbound_no"].as_str().unwrap().to_owned();
    sys.wait_stock("W1", (10, 3)).await;
    let refund = |refund_no: &str, lines: Value| {
        json!({"order_id": order, "status": "PAID", "refundable_cents": 100,
               "refunded_in_full": false,
               "refund": {"refund_no": refund_no, "kind": "RETURN_AND_REFUND", "lines": lines}})
    };
    let lines = |w1: (i64, i64), w2: (i64, i64)| {
        json!([
            {"sku_id": "W1", "quantity": w1.0, "returned_quantity": w1.1},
            {"sku_id": "W2", "quantity": w2.0, "returned_quantity": w2.1},
        ])
    };
    let one_w1 = json!([{"sku_id": "W1", "quantity": 1}]);
    let outbound_now = || async { sys.outbounds_of(&order).await.remove(0) };

    // Before shipping: one W1 of three refunded by line. Its request intercepts, its success
    // takes the unit out and the rest goes on; the same success again changes nothing.
    order_event(
        &sys,
        &order,
        "RefundRequested",
        refund("R-a", one_w1.clone()),
    )
    .await;
    assert_eq!(outbound_now().await["status"], "INTERCEPTED");
    for _ in 0..2 {
        order_event(
            &sys,
            &order,
            "RefundSucceeded",
            refund("R-a", one_w1.clone()),
        )
        .await;
        let ob = outbound_now().await;
        assert_eq!(
            (&ob["status"], &ob["lines"]),
            (&json!("CREATED"), &lines((2, 0), (1, 0)))
        );
    }
    sys.wait_stock("W1", (10, 2)).await;

    // The rest ships. The success copied again afterwards recalls nothing: its unit never left.
    let (status, body, _) = sys.ship(&no, "DHL", &format!("T-{}", &order[..8])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    sys.wait_stock("W1", (8, 0)).await;
    sys.wait_stock("W2", (4, 0)).await;
    order_event(
        &sys,
        &order,
        "RefundSucceeded",
        refund("R-a", one_w1.clone()),
    )
    .await;
    assert_eq!(outbound_now().await["status"], "SHIPPED");

    // After shipping: one W1 refunded by line. Its return brings that unit only; the outbound
    // is SHIPPED again, a second receipt is a replay, and the refund's success recalls nothing.
    order_event(
        &sys,
        &order,
        "RefundRequested",
        refund("R-b", one_w1.clone()),
    )
    .await;
    assert_eq!(outbound_now().await["status"], "RECALL");
    let (status, body) = sys.return_received(&no).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["status"], &body["lines"]),
        (&json!("SHIPPED"), &lines((2, 1), (1, 0)))
    );
    let r = sys
        .http
        .post(sys.wms.url(&format!("/outbounds/{no}/return-received")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("idempotent-replayed").is_some());
    assert_eq!(r.json::<Value>().await.unwrap(), body, "the same outbound");
    sys.wait_stock("W1", (9, 0)).await;
    order_event(
        &sys,
        &order,
        "RefundSucceeded",
        refund("R-b", one_w1.clone()),
    )
    .await;
    assert_eq!(
        outbound_now().await["status"],
        "SHIPPED",
        "a received hold recalls nothing"
    );

    // A refund of the whole order (no lines): every unit not back yet comes back.
    order_event(&sys, &order, "RefundRequested", refund("R-c", json!([]))).await;
    assert_eq!(outbound_now().await["status"], "RECALL");
    let (status, body) = sys.return_received(&no).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["status"], &body["lines"]),
        (&json!("RETURNED"), &lines((2, 2), (1, 1)))
    );
    sys.wait_stock("W1", (10, 0)).await;
    sys.wait_stock("W2", (5, 0)).await;

    // What the WMS published about the outbound, in order.
    sys.wait_outboxes_drained().await;
    let published: Vec<(String, Value)> = dump_topics(&sys, &["outbound"])
        .await
        .iter()
        .filter(|r| r.key.as_deref() == Some(no.as_str()))
        .map(|r| {
            let value = serde_json::from_str(r.value.as_deref().unwrap()).unwrap();
            (event_type(r).to_owned(), value)
        })
        .collect();
    let types: Vec<&str> = published.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "OutboundCreated",
            "OutboundIntercepted",
            "OutboundLinesCancelled",
            "OutboundResumed",
            "OutboundShipped",
            "OutboundRecalled",
            "ReturnReceived",
            "OutboundRecalled",
            "ReturnReceived",
        ]
    );
    let cut = &published[2].1;
    assert_eq!(cut["lines"], lines((2, 0), (1, 0)));
    assert_eq!(cut["cancelled_lines"], one_w1);
    assert_eq!(cut["refund_no"], "R-a");
    let (partial, whole) = (&published[6].1, &published[8].1);
    assert_eq!(
        (&partial["status"], &partial["lines"]),
        (&json!("SHIPPED"), &lines((2, 1), (1, 0)))
    );
    assert_eq!(partial["received_lines"], one_w1);
    assert_eq!(whole["status"], "RETURNED");
    assert_eq!(
        whole["received_lines"],
        json!([{"sku_id": "W1", "quantity": 1}, {"sku_id": "W2", "quantity": 1}])
    );
}
