//! The reverse flow through the marketplace channel: refund snapshots whose amount or kind
//! changes, a later status stamped with the same `modified`, `FAILED`, closed trades that were
//! paid, refunds of orders cancelled for lack of stock. Each sequence is pushed signed, as the
//! platform sends it, to the whole system (order service, WMS, stock, relays, broker); each
//! test checks where the three services end, then that the audit is clean. Refunds and returns
//! by line go the same way.

use std::time::Duration;

use e2e::channel::{Channel, PRICE, SKU};
use reqwest::StatusCode;

/// Asserts the audit of the settled system is clean.
async fn assert_audit_clean(ch: &Channel) {
    let audit = ch.settled_audit().await;
    assert_eq!(audit.code, 0, "audit: {}", audit.report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_amount_lowered_or_raised_before_success_is_booked_at_the_newest_amount() {
    let ch = Channel::start(10).await;
    let (lowered, raised) = (ch.tid("LOW"), ch.tid("RAISE"));
    let low_id = ch.paid_trade(&lowered, 1_000).await;
    let raise_id = ch.paid_trade(&raised, 1_000).await;
    let r = |tid: &str, status: &str, m: i64, cents: i64| {
        Channel::refund(tid, status, m, cents, "RETURN_AND_REFUND")
    };

    // Lowered: asked for everything, then for 300, which the platform pays.
    ch.pushed(&r(&lowered, "WAIT_SELLER_AGREE", 2_000, PRICE))
        .await;
    ch.sys.wait_outbound(&low_id, "INTERCEPTED").await;
    ch.pushed(&r(&lowered, "WAIT_SELLER_AGREE", 3_000, 300))
        .await;
    ch.pushed(&r(&lowered, "SUCCESS", 4_000, 300)).await;
    // Raised: asked for 300, then for everything, which the platform pays.
    ch.pushed(&r(&raised, "WAIT_SELLER_AGREE", 2_000, 300))
        .await;
    ch.sys.wait_outbound(&raise_id, "INTERCEPTED").await;
    ch.pushed(&r(&raised, "WAIT_SELLER_AGREE", 3_000, PRICE))
        .await;
    ch.pushed(&r(&raised, "SUCCESS", 4_000, PRICE)).await;

    assert_eq!(
        ch.our_refund(&lowered).await,
        (300, "RETURN_AND_REFUND".into(), "SUCCEEDED".into())
    );
    assert_eq!(
        ch.our_refund(&raised).await,
        (PRICE, "RETURN_AND_REFUND".into(), "SUCCEEDED".into())
    );
    // 300 of 1000 back before shipping: the order ships; everything back: it never ships.
    let low = ch.sys.order_of(&low_id).await;
    assert_eq!(low["status"], "PAID", "{low}");
    assert_eq!(low["refundable_cents"], PRICE - 300, "{low}");
    ch.sys.wait_outbound(&low_id, "CREATED").await;
    ch.sys.wait_order(&raise_id, "REFUNDED").await;
    ch.sys.wait_outbound(&raise_id, "CANCELLED").await;
    ch.sys.wait_stock(SKU, (10, 1)).await;
    assert_audit_clean(&ch).await;

    // A newer snapshot that contradicts the amount paid out is not applied (money does not
    // come back), and the audit names the difference.
    assert_eq!(
        ch.pushed(&r(&lowered, "SUCCESS", 5_000, 250)).await,
        "applied"
    );
    assert_eq!(ch.our_refund(&lowered).await.0, 300);
    let audit = ch.settled_audit().await;
    let found: Vec<(String, String)> = audit
        .violations()
        .iter()
        .map(|v| {
            (
                v["kind"].as_str().unwrap_or_default().to_owned(),
                v["refund_no"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [(
            "refund_amount_mismatch".to_owned(),
            format!("marketplace:R-{lowered}")
        )],
        "{}",
        audit.report
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_later_status_with_the_same_modified_is_applied_and_an_earlier_one_is_stale() {
    let ch = Channel::start(10).await;
    let tid = ch.tid("SAME");
    let id = ch.paid_trade(&tid, 1_000).await;
    let r = |status: &str| Channel::refund(&tid, status, 5_000, PRICE, "RETURN_AND_REFUND");
    assert_eq!(ch.pushed(&r("WAIT_SELLER_AGREE")).await, "applied");
    ch.sys.wait_outbound(&id, "INTERCEPTED").await;
    assert_eq!(
        ch.pushed(&r("SUCCESS")).await,
        "applied",
        "a forward move at the same modified"
    );
    // Going back at the same modified is not a forward move.
    assert_eq!(ch.pushed(&r("WAIT_BUYER_RETURN_GOODS")).await, "stale");
    assert_eq!(ch.our_refund(&tid).await.2, "SUCCEEDED");
    ch.sys.wait_order(&id, "REFUNDED").await;
    ch.sys.wait_outbound(&id, "CANCELLED").await;
    ch.sys.wait_stock(SKU, (10, 0)).await;
    assert_audit_clean(&ch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_refund_is_final_and_releases_the_hold() {
    let ch = Channel::start(10).await;
    let tid = ch.tid("FAIL");
    let id = ch.paid_trade(&tid, 1_000).await;
    let r = |status: &str, m: i64| Channel::refund(&tid, status, m, PRICE, "RETURN_AND_REFUND");
    ch.pushed(&r("WAIT_SELLER_AGREE", 2_000)).await;
    ch.sys.wait_outbound(&id, "INTERCEPTED").await;
    assert_eq!(ch.pushed(&r("FAILED", 3_000)).await, "applied");
    assert_eq!(ch.our_refund(&tid).await.2, "CLOSED");
    // Nothing went back: the hold is released, the order keeps everything and ships.
    ch.sys.wait_outbound(&id, "CREATED").await;
    let order = ch.sys.order_of(&id).await;
    assert_eq!(order["status"], "PAID", "{order}");
    assert_eq!(order["refundable_cents"], PRICE, "{order}");
    // A redelivery of the final snapshot changes nothing.
    assert_eq!(ch.pushed(&r("FAILED", 3_000)).await, "duplicate_message");
    ch.sys.wait_stock(SKU, (10, 1)).await;
    assert_audit_clean(&ch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_trade_never_starts_fulfilment_and_holds_a_paid_one_until_its_refund() {
    let ch = Channel::start(10).await;
    // First seen closed, with the money it took: the paid push was lost.
    let first_closed = ch.tid("CLOSED1");
    ch.pushed(&Channel::trade(
        &first_closed,
        "TRADE_CLOSED",
        1_000,
        Some(PRICE),
    ))
    .await;
    let closed_id = ch.order_id(&first_closed).await;
    ch.sys.wait_order(&closed_id, "CANCELLED").await;
    assert_eq!(
        ch.payments(&closed_id).await,
        [("REFUND_REQUIRED".to_owned(), Some(PRICE))],
        "the money is owed to the buyer until the refund is known"
    );
    // Its refund arrives: the money goes back through it, nothing is owed twice.
    ch.pushed(&Channel::refund(
        &first_closed,
        "SUCCESS",
        900,
        PRICE,
        "RETURN_AND_REFUND",
    ))
    .await;
    assert_eq!(ch.our_refund(&first_closed).await.2, "SUCCEEDED");
    assert_eq!(
        ch.payments(&closed_id).await,
        [("REFUND_COVERED".to_owned(), Some(0))]
    );

    // A paid trade closes while its refund push is lost: fulfilment holds.
    let paid_then_closed = ch.tid("CLOSED2");
    let held_id = ch.paid_trade(&paid_then_closed, 1_000).await;
    ch.pushed(&Channel::trade(
        &paid_then_closed,
        "TRADE_CLOSED",
        3_000,
        Some(PRICE),
    ))
    .await;
    ch.sys.wait_outbound(&held_id, "INTERCEPTED").await;
    assert_eq!(ch.sys.order_of(&held_id).await["status"], "PAID");
    ch.pushed(&Channel::refund(
        &paid_then_closed,
        "SUCCESS",
        2_000,
        PRICE,
        "RETURN_AND_REFUND",
    ))
    .await;
    ch.sys.wait_order(&held_id, "REFUNDED").await;
    ch.sys.wait_outbound(&held_id, "CANCELLED").await;

    ch.sys.wait_stock(SKU, (10, 0)).await;
    assert_audit_clean(&ch).await;
    assert!(
        ch.sys.outbounds_of(&closed_id).await.is_empty(),
        "a trade first seen closed never reaches the warehouse"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_cancelled_for_lack_of_stock_takes_the_platforms_refund_and_owes_what_a_closed_one_gave_back(
) {
    let ch = Channel::start(0).await;
    // Cancelled for lack of stock, then the platform refunds it.
    let rejected = ch.tid("NOSTOCK");
    ch.pushed(&Channel::trade(
        &rejected,
        "WAIT_SELLER_SEND_GOODS",
        1_000,
        Some(PRICE),
    ))
    .await;
    let rejected_id = ch.order_id(&rejected).await;
    ch.sys.wait_order(&rejected_id, "CANCELLED").await;
    assert_eq!(
        ch.payments(&rejected_id).await,
        [("REFUND_REQUIRED".to_owned(), Some(PRICE))]
    );
    let r = |tid: &str, status: &str, m: i64| {
        Channel::refund(tid, status, m, PRICE, "RETURN_AND_REFUND")
    };
    let (s, body) = ch.push(&r(&rejected, "WAIT_SELLER_AGREE", 2_000)).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "the cancelled order takes the refund: {body}"
    );
    ch.pushed(&r(&rejected, "SUCCESS", 3_000)).await;
    assert_eq!(ch.our_refund(&rejected).await.2, "SUCCEEDED");
    assert_eq!(
        ch.payments(&rejected_id).await,
        [("REFUND_COVERED".to_owned(), Some(0))],
        "booked by the platform's refund, not owed a second time"
    );

    // A refund asked for before the stock rejection, then closed: the buyer is owed it.
    let closed = ch.tid("NOSTOCK2");
    ch.sys.stock.kill();
    ch.pushed(&Channel::trade(
        &closed,
        "WAIT_SELLER_SEND_GOODS",
        1_000,
        Some(PRICE),
    ))
    .await;
    ch.pushed(&r(&closed, "WAIT_SELLER_AGREE", 2_000)).await;
    ch.sys.stock.start_again_until_assigned().await;
    let closed_id = ch.order_id(&closed).await;
    ch.sys.wait_order(&closed_id, "CANCELLED").await;
    ch.pushed(&r(&closed, "CLOSED", 3_000)).await;
    assert_eq!(ch.our_refund(&closed).await.2, "CLOSED");
    assert_eq!(
        ch.payments(&closed_id).await,
        [("REFUND_REQUIRED".to_owned(), Some(PRICE))],
        "what the closed refund did not give back is owed to the buyer"
    );
    assert_audit_clean(&ch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_return_received_before_the_refund_is_decided_waits_for_the_refund() {
    let ch = Channel::start(10).await;
    let (refunded, closed) = (ch.tid("RET-OK"), ch.tid("RET-NO"));
    let mut outbounds = Vec::new();
    for tid in [&refunded, &closed] {
        let id = ch.paid_trade(tid, 1_000).await;
        let no = ch.ship(&id).await;
        ch.pushed(&Channel::refund(
            tid,
            "WAIT_BUYER_RETURN_GOODS",
            2_000,
            PRICE,
            "RETURN_AND_REFUND",
        ))
        .await;
        ch.sys.wait_outbound(&id, "RECALL").await;
        // The parcel comes back while the platform has not decided the refund.
        let (s, body) = ch.sys.return_received(&no).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        ch.wait_applied(&ch.sys.wms_db, &ch.sys.order_db, "ReturnReceived", &no)
            .await;
        let order = ch.sys.order_of(&id).await;
        assert_eq!(
            order["status"], "SHIPPED",
            "not returned before the refund is decided: {order}"
        );
        outbounds.push(id);
    }
    // Paid out: the order is returned.
    ch.pushed(&Channel::refund(
        &refunded,
        "SUCCESS",
        3_000,
        PRICE,
        "RETURN_AND_REFUND",
    ))
    .await;
    ch.sys.wait_order(&outbounds[0], "RETURNED").await;
    // Closed: the buyer has the money, the warehouse the goods; the order stays shipped and the
    // audit names it for operators (send the goods back, or refund).
    ch.pushed(&Channel::refund(
        &closed,
        "CLOSED",
        3_000,
        PRICE,
        "RETURN_AND_REFUND",
    ))
    .await;
    assert_eq!(ch.our_refund(&closed).await.2, "CLOSED");
    let audit = ch.settled_audit().await;
    assert_eq!(ch.sys.order_of(&outbounds[1]).await["status"], "SHIPPED");
    let kinds: Vec<(String, String)> = audit
        .violations()
        .iter()
        .map(|v| {
            (
                v["kind"].as_str().unwrap_or_default().to_owned(),
                v["order_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [("return_without_refund".to_owned(), outbounds[1].clone())],
        "{}",
        audit.report
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_only_price_adjustment_neither_intercepts_nor_recalls() {
    let ch = Channel::start(10).await;
    let (before, after) = (ch.tid("ADJ-PAID"), ch.tid("ADJ-SHIPPED"));
    let unshipped = ch.paid_trade(&before, 1_000).await;
    let shipped = ch.paid_trade(&after, 1_000).await;
    ch.ship(&shipped).await;
    for (tid, id) in [(&before, &unshipped), (&after, &shipped)] {
        ch.pushed(&Channel::refund(
            tid,
            "WAIT_SELLER_AGREE",
            2_000,
            100,
            "REFUND_ONLY",
        ))
        .await;
        ch.wait_applied(&ch.sys.order_db, &ch.sys.wms_db, "RefundRequested", id)
            .await;
    }
    // Requested, not decided: the unshipped order still ships, the shipped one is not recalled.
    assert_eq!(ch.sys.outbounds_of(&shipped).await[0]["status"], "SHIPPED");
    ch.ship(&unshipped).await;
    for tid in [&before, &after] {
        ch.pushed(&Channel::refund(tid, "SUCCESS", 3_000, 100, "REFUND_ONLY"))
            .await;
    }
    for id in [&unshipped, &shipped] {
        let order = ch.sys.order_of(id).await;
        assert_eq!(order["status"], "SHIPPED", "{order}");
        assert_eq!(order["refundable_cents"], PRICE - 100, "{order}");
    }
    ch.sys.wait_stock(SKU, (8, 0)).await;
    assert_audit_clean(&ch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_racing_a_shipment_ends_shipped_and_recalled_in_all_three_services() {
    refund_racing_a_shipment("RETURN_AND_REFUND").await;
}

/// A full refund-only (the buyer was to keep nothing but gets all the money back) racing the
/// shipment ends the same way: the platform closed the trade, the parcel is recalled, and the
/// audit sees the recall's cause (the order refunded in full).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_refund_only_racing_a_shipment_ends_shipped_and_recalled_too() {
    refund_racing_a_shipment("REFUND_ONLY").await;
}

async fn refund_racing_a_shipment(kind: &str) {
    let ch = Channel::start(10).await;
    let tid = ch.tid("RACE");
    let id = ch.paid_trade(&tid, 1_000).await;
    ch.sys.wait_stock(SKU, (10, 1)).await;
    let outbound_no = ch.sys.wait_outbound(&id, "CREATED").await["outbound_no"]
        .as_str()
        .unwrap()
        .to_owned();
    // Hold both directions (SIGSTOP the order and WMS relays): the WMS does not hear of the
    // refund, the order service does not hear of the shipment.
    let (order_relay, wms_relay) = (ch.sys.relays[0].pid(), ch.sys.relays[1].pid());
    e2e::proc::signal(order_relay, "STOP");
    e2e::proc::signal(wms_relay, "STOP");
    let r = |status: &str, m: i64| Channel::refund(&tid, status, m, PRICE, kind);
    ch.pushed(&r("WAIT_SELLER_AGREE", 2_000)).await;
    // The warehouse ships: its outbound is still CREATED, the refund has not reached it.
    let (s, body, _) = ch
        .sys
        .ship(&outbound_no, "SF", &format!("SF-{}", &id[..8]))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    // The platform refunds in full before the order service knows of the shipment.
    assert_eq!(ch.pushed(&r("SUCCESS", 3_000)).await, "applied");
    let order = ch.sys.order_of(&id).await;
    assert_eq!(
        order["status"], "PAID",
        "the order service does not decide 'refunded before shipping' on its own: {order}"
    );
    e2e::proc::signal(order_relay, "CONT");
    e2e::proc::signal(wms_relay, "CONT");

    // The warehouse's word: shipped. The order ships, the outbound stays recalled (the money
    // went back, the goods must come back), the stock is deducted.
    ch.sys.wait_order(&id, "SHIPPED").await;
    ch.sys.wait_outbound(&id, "RECALL").await;
    ch.sys.wait_stock(SKU, (9, 0)).await;
    assert_audit_clean(&ch).await;
    let ship_backs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_ledger \
         WHERE event_type = 'ShipBackRequested' AND aggregate_id = $1",
    )
    .bind(&id)
    .fetch_one(&ch.sys.order_db.pool)
    .await
    .unwrap();
    assert_eq!(
        ship_backs, 0,
        "a trade the platform closed is not reported shipped"
    );

    // The parcel comes back: returned in all three, restocked.
    let (s, body) = ch.sys.return_received(&outbound_no).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    ch.sys.wait_order(&id, "RETURNED").await;
    ch.sys.wait_outbound(&id, "RETURNED").await;
    ch.sys.wait_stock(SKU, (10, 0)).await;
    assert_audit_clean(&ch).await;
}

/// A `TradeSync` of three units of [`SKU`], paid.
fn three_unit_trade(tid: &str, modified: i64) -> serde_json::Value {
    let mut t = Channel::trade(tid, "WAIT_SELLER_SEND_GOODS", modified, Some(3 * PRICE));
    t["trade"]["items"][0]["quantity"] = 3.into();
    t
}

/// A return-and-refund `RefundSync` taking back `units` of [`SKU`].
fn line_refund(tid: &str, status: &str, modified: i64, units: i64) -> serde_json::Value {
    let mut r = Channel::refund(tid, status, modified, units * PRICE, "RETURN_AND_REFUND");
    r["refund"]["items"] = serde_json::json!([{ "sku_id": SKU, "quantity": units }]);
    r["msg_id"] = format!("{}-{units}", r["msg_id"].as_str().unwrap()).into();
    r
}

/// The order's units of [`SKU`] back, and the outbound's `(quantity, returned_quantity)` (a
/// count a version without returns by line does not show reads 0).
async fn units(ch: &Channel, order_id: &str) -> (i64, (i64, i64)) {
    let order = ch.sys.order_of(order_id).await;
    let back = order["items"][0]["returned_quantity"].as_i64().unwrap_or(0);
    let ob = ch.sys.outbounds_of(order_id).await;
    let line = &ob[0]["lines"][0];
    (
        back,
        (
            line["quantity"].as_i64().unwrap_or(0),
            line["returned_quantity"].as_i64().unwrap_or(0),
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_and_returns_by_line_move_only_their_units_in_all_three_services() {
    let ch = Channel::start(10).await;
    let (before, after) = (ch.tid("LINE-PAID"), ch.tid("LINE-SHIPPED"));

    // Before shipping: two units of three refunded by line. The outbound ships the third, the
    // stock consumer releases two (the old code shipped all three).
    ch.pushed(&three_unit_trade(&before, 1_000)).await;
    let unshipped = ch.order_id(&before).await;
    ch.sys.wait_outbound(&unshipped, "CREATED").await;
    ch.sys.wait_stock(SKU, (10, 3)).await;
    ch.pushed(&line_refund(&before, "WAIT_SELLER_AGREE", 2_000, 2))
        .await;
    ch.sys.wait_outbound(&unshipped, "INTERCEPTED").await;
    ch.pushed(&line_refund(&before, "SUCCESS", 3_000, 2)).await;
    e2e::wait_for(
        "the refunded units out of the outbound",
        Duration::from_secs(60),
        || async { (units(&ch, &unshipped).await.1 == (1, 0)).then_some(()) },
    )
    .await;
    ch.sys.wait_stock(SKU, (10, 1)).await;
    ch.ship(&unshipped).await;
    ch.sys.wait_stock(SKU, (9, 0)).await;
    let order = ch.sys.order_of(&unshipped).await;
    assert_eq!(order["refundable_cents"], PRICE, "{order}");

    // After shipping: one unit of three returned by line. The order stays SHIPPED with one
    // unit back, the outbound ships again with one back, one unit is restocked (the old code
    // restocked all three and ended the order RETURNED).
    ch.pushed(&three_unit_trade(&after, 1_000)).await;
    let shipped = ch.order_id(&after).await;
    let no = ch.ship(&shipped).await;
    ch.sys.wait_stock(SKU, (6, 0)).await;
    ch.pushed(&line_refund(&after, "WAIT_BUYER_RETURN_GOODS", 2_000, 1))
        .await;
    ch.sys.wait_outbound(&shipped, "RECALL").await;
    ch.pushed(&line_refund(&after, "SUCCESS", 3_000, 1)).await;
    ch.wait_applied(
        &ch.sys.order_db,
        &ch.sys.wms_db,
        "RefundSucceeded",
        &shipped,
    )
    .await;
    let (s, body) = ch.sys.return_received(&no).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "SHIPPED", "one unit of three back: {body}");
    ch.wait_applied(&ch.sys.wms_db, &ch.sys.order_db, "ReturnReceived", &no)
        .await;
    ch.sys.wait_stock(SKU, (7, 0)).await;
    assert_eq!(units(&ch, &shipped).await, (1, (3, 1)));
    let order = ch.sys.order_of(&shipped).await;
    assert_eq!(order["status"], "SHIPPED", "{order}");
    // Receiving again with nothing expected back changes nothing.
    let (s, _) = ch.sys.return_received(&no).await;
    assert!(s.is_success() || s == StatusCode::CONFLICT, "{s}");
    ch.sys.wait_outboxes_drained().await;
    assert_eq!(ch.sys.stock_of(SKU).await, (7, 0));
    assert_audit_clean(&ch).await;
}
