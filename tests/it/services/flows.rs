//! The shop's fulfilment flows end to end: the order service, the WMS consumer and the stock
//! consumer as processes, each with its own database and relay, on a real broker. A paid order
//! is reserved, gets an outbound, ships and is deducted (and the consumer drains on SIGTERM);
//! refunds before and after shipping intercept and release, or recall and restock, and a
//! closed refund resumes; a paid order without the stock is cancelled with no outbound.

use std::time::{Duration, Instant};

use e2e::fulfilment::{count, dump_topics, metric, System};
use e2e::verify::event_type;
use reqwest::StatusCode;
use serde_json::json;

use crate::common::secs;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forward_flow_reserves_creates_the_outbound_ships_and_deducts() {
    let started = Instant::now();
    let sys = System::start().await;
    let ready = started.elapsed();
    sys.sku("A", 500).await;
    sys.sku("B", 300).await;
    sys.set_stock("A", 10).await;
    sys.set_stock("B", 5).await;

    let order = sys.paid_order("alice", &[("A", 2), ("B", 1)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    assert_eq!(
        outbound["lines"],
        json!([
            {"sku_id": "A", "quantity": 2, "returned_quantity": 0},
            {"sku_id": "B", "quantity": 1, "returned_quantity": 0}
        ])
    );
    sys.wait_stock("A", (10, 2)).await;
    sys.wait_stock("B", (5, 1)).await;
    let reserved_after = started.elapsed();

    let no = outbound["outbound_no"].as_str().unwrap();
    let (status, shipped, replayed) = sys.ship(no, "DHL", "TRACK-1").await;
    assert_eq!((status, replayed), (StatusCode::OK, false), "{shipped}");
    assert_eq!(shipped["status"], "SHIPPED");
    let (status, _, replayed) = sys.ship(no, "DHL", "TRACK-1").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::OK, true),
        "shipping again with the same tracking number is a replay"
    );
    let (status, body, _) = sys.ship(no, "DHL", "TRACK-2").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "already_shipped");

    let o = sys.wait_order(&order, "SHIPPED").await;
    assert_eq!(o["payments"][0]["disposition"], "APPLIED");
    sys.wait_stock("A", (8, 0)).await;
    sys.wait_stock("B", (4, 0)).await;
    let shipped_after = started.elapsed();

    // One inbox row per applied event: stock (OrderPaid, OutboundShipped), WMS (StockReserved),
    // order (OutboundShipped).
    assert_eq!(
        count(
            &sys.stock_db.pool,
            "SELECT count(*) FROM inbox WHERE consumer_name = 'stock'"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &sys.wms_db.pool,
            "SELECT count(*) FROM inbox WHERE consumer_name = 'wms'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &sys.order_db.pool,
            "SELECT count(*) FROM inbox WHERE consumer_name = 'order'"
        )
        .await,
        1
    );
    sys.wait_outboxes_drained().await;
    let order_events: Vec<String> = dump_topics(&sys, &["order"])
        .await
        .iter()
        .filter(|r| r.key.as_deref() == Some(order.as_str()))
        .map(|r| event_type(r).to_owned())
        .collect();
    assert_eq!(order_events, ["OrderCreated", "OrderPaid", "OrderShipped"]);

    // SIGTERM: the consumer drains, commits and leaves the group.
    let (took, exit) = sys
        .wms
        .terminate(Duration::from_secs(20))
        .expect("wms-consumer exits on SIGTERM");
    assert!(exit.success(), "{exit:?}");
    assert!(sys.wms.log_text().contains("Consumer stopped"));
    eprintln!(
        "forward flow: ready {}, reserved+outbound {}, shipped+deducted {}, SIGTERM exit {}",
        secs(ready),
        secs(reserved_after),
        secs(shipped_after),
        secs(took)
    );
}

async fn refund_before_shipping(sys: &System) {
    let order = sys.paid_order("bob", &[("R1", 3)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    sys.wait_stock("R1", (10, 3)).await;
    let refund_no = format!("RF1-{}", &order[..8]);
    sys.request_refund(&order, &refund_no).await;
    sys.wait_outbound(&order, "INTERCEPTED").await;
    let (status, body, _) = sys
        .ship(
            outbound["outbound_no"].as_str().unwrap(),
            "DHL",
            &format!("T-{}", &order[..8]),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "an intercepted outbound must not ship"
    );
    assert_eq!(body["error"]["code"], "outbound_intercepted");
    assert_eq!(
        sys.stock_of("R1").await,
        (10, 3),
        "the goods stay reserved until the refund is decided"
    );
    sys.refund_outcome(&refund_no, "SUCCESS").await;
    sys.wait_outbound(&order, "CANCELLED").await;
    sys.wait_stock("R1", (10, 0)).await;
    // The order ends REFUNDED on the warehouse's word: once the order service has consumed
    // the WMS's OutboundCancelled, which may come after the outbound is seen cancelled.
    let o = sys.wait_order(&order, "REFUNDED").await;
    assert_eq!(
        o["refunds"][0]["status"].as_str(),
        Some("SUCCEEDED"),
        "a full refund before shipping ends the order"
    );
}

async fn refund_after_shipping(sys: &System) {
    let order = sys.paid_order("carol", &[("R2", 2)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    let no = outbound["outbound_no"].as_str().unwrap();
    assert_eq!(
        sys.ship(no, "UPS", &format!("T-{}", &order[..8])).await.0,
        StatusCode::OK
    );
    sys.wait_order(&order, "SHIPPED").await;
    sys.wait_stock("R2", (8, 0)).await;
    assert_eq!(
        sys.return_received(no).await.0,
        StatusCode::CONFLICT,
        "no return expected before a refund"
    );
    let refund_no = format!("RF2-{}", &order[..8]);
    sys.request_refund(&order, &refund_no).await;
    sys.wait_outbound(&order, "RECALL").await;
    let (status, body) = sys.return_received(no).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "RETURNED");
    sys.wait_stock("R2", (10, 0)).await;
    // The goods are back but the refund is not decided: the order waits for it (a closed
    // refund would leave the buyer neither goods nor money); `reverse_flow` checks the wait
    // once the order service has applied the return.
    sys.refund_outcome(&refund_no, "SUCCESS").await;
    let o = sys.wait_order(&order, "RETURNED").await;
    assert_eq!(
        o["status"], "RETURNED",
        "the refund ends the returned order"
    );
    assert_eq!(sys.outbounds_of(&order).await[0]["status"], "RETURNED");
}

async fn refund_closed_resumes(sys: &System) {
    let order = sys.paid_order("dave", &[("R3", 4)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    let refund_no = format!("RF3-{}", &order[..8]);
    sys.request_refund(&order, &refund_no).await;
    sys.wait_outbound(&order, "INTERCEPTED").await;
    sys.refund_outcome(&refund_no, "CLOSED").await;
    sys.wait_outbound(&order, "CREATED").await;
    assert_eq!(
        sys.stock_of("R3").await,
        (10, 4),
        "a closed refund keeps the reservation"
    );
    let (status, body, _) = sys
        .ship(
            outbound["outbound_no"].as_str().unwrap(),
            "DHL",
            &format!("T-{}", &order[..8]),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    sys.wait_order(&order, "SHIPPED").await;
    sys.wait_stock("R3", (6, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reverse_flows_intercept_release_recall_restock_and_resume() {
    let started = Instant::now();
    let sys = System::start().await;
    for sku in ["R1", "R2", "R3"] {
        sys.sku(sku, 1_000).await;
        sys.set_stock(sku, 10).await;
    }
    tokio::join!(
        refund_before_shipping(&sys),
        refund_after_shipping(&sys),
        refund_closed_resumes(&sys)
    );
    eprintln!("reverse flows: {}", secs(started.elapsed()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn insufficient_stock_cancels_the_order_and_creates_no_outbound() {
    let sys = System::start().await;
    sys.sku("S1", 100).await;
    sys.sku("S2", 100).await;
    sys.set_stock("S1", 1).await;
    sys.set_stock("S2", 5).await;
    let order = sys.paid_order("erin", &[("S1", 2), ("S2", 1)]).await;

    let o = sys.wait_order(&order, "CANCELLED").await;
    assert_eq!(o["payments"][0]["disposition"], "REFUND_REQUIRED", "{o}");
    assert_eq!(o["payments"][0]["flag_reason"], "stock_rejected");
    // The WMS has seen the cancellation (its hold is recorded) and still has no outbound.
    e2e::wait_for("the WMS to record the cancellation", Duration::from_secs(60), || async {
        let sql = format!("SELECT count(*) FROM order_holds WHERE order_id = '{order}' AND hold = 'order-cancelled'");
        (count(&sys.wms_db.pool, &sql).await == 1).then_some(())
    })
    .await;
    assert!(
        sys.outbounds_of(&order).await.is_empty(),
        "no outbound for an order whose stock was rejected"
    );
    assert_eq!(
        count(&sys.wms_db.pool, "SELECT count(*) FROM outbounds").await,
        0
    );
    assert_eq!(sys.stock_of("S1").await, (1, 0), "nothing reserved");
    assert_eq!(sys.stock_of("S2").await, (5, 0), "all lines or none");
    assert_eq!(
        count(
            &sys.stock_db.pool,
            "SELECT count(*) FROM reservations WHERE status = 'REJECTED'"
        )
        .await,
        1
    );
    assert_eq!(
        count(&sys.stock_db.pool, "SELECT count(*) FROM stock_movements").await,
        0
    );
    let m = sys.order.metrics().await;
    assert_eq!(
        metric(
            &m,
            "order_payments_flagged_for_refund_total",
            &[("reason", "stock_rejected")]
        ),
        1.0
    );
}
