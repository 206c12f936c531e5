//! The business state gauges (which make the wrong states visible) against the state they
//! describe: a refund requested holds the outbound and shows as an open refund and an
//! intercepted outbound with an age, until the platform decides it; a paid order cancelled for
//! lack of stock shows the money owed to the buyer until the platform's refund covers it. The
//! whole system runs with the gauges read every 200 ms; each step waits for the gauges' values
//! with a deadline.

use std::time::Duration;

use e2e::channel::{Channel, PRICE, SKU};
use e2e::fulfilment::{metric, Service};

/// Waits until `service`'s `/metrics` has `name{labels}` satisfying `ok`; the value.
async fn wait_gauge(
    service: &Service,
    name: &str,
    labels: &[(&str, &str)],
    what: &str,
    ok: impl Fn(f64) -> bool,
) -> f64 {
    e2e::wait_for(
        &format!("{name}{labels:?} {what}"),
        Duration::from_secs(30),
        || async {
            let text = service.metrics().await;
            let exported = text.lines().any(|l| l.starts_with(name));
            let v = metric(&text, name, labels);
            (exported && ok(v)).then_some(v)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_gauges_show_open_refunds_held_outbounds_and_money_owed_until_they_are_settled() {
    let ch = Channel::start_with_env(
        10,
        Vec::new(),
        vec![("STATE_METRICS_INTERVAL_MS".into(), "200".into())],
    )
    .await;
    let (order, wms) = (&ch.sys.order, &ch.sys.wms);
    let intercepted = [("status", "INTERCEPTED")];
    wait_gauge(order, "order_refunds_open", &[], "0 at first", |v| v == 0.0).await;
    wait_gauge(
        wms,
        "wms_outbounds_waiting",
        &intercepted,
        "0 at first",
        |v| v == 0.0,
    )
    .await;

    // A refund requested: open, and the outbound held.
    let tid = ch.tid("GAUGE");
    let id = ch.paid_trade(&tid, 1_000).await;
    let r = |status: &str, m: i64| Channel::refund(&tid, status, m, PRICE, "RETURN_AND_REFUND");
    ch.pushed(&r("WAIT_SELLER_AGREE", 2_000)).await;
    ch.sys.wait_outbound(&id, "INTERCEPTED").await;
    wait_gauge(order, "order_refunds_open", &[], "1", |v| v == 1.0).await;
    wait_gauge(
        order,
        "order_refund_oldest_open_age_seconds",
        &[],
        "above 0",
        |v| v > 0.0,
    )
    .await;
    wait_gauge(wms, "wms_outbounds_waiting", &intercepted, "1", |v| {
        v == 1.0
    })
    .await;
    wait_gauge(
        wms,
        "wms_outbound_oldest_waiting_age_seconds",
        &intercepted,
        "above 0",
        |v| v > 0.0,
    )
    .await;

    // Decided: nothing open, nothing held.
    ch.pushed(&r("SUCCESS", 3_000)).await;
    ch.sys.wait_outbound(&id, "CANCELLED").await;
    wait_gauge(order, "order_refunds_open", &[], "0 again", |v| v == 0.0).await;
    wait_gauge(
        order,
        "order_refund_oldest_open_age_seconds",
        &[],
        "0 again",
        |v| v == 0.0,
    )
    .await;
    wait_gauge(wms, "wms_outbounds_waiting", &intercepted, "0 again", |v| {
        v == 0.0
    })
    .await;

    // Paid, then cancelled for lack of stock: the money is owed to the buyer ...
    ch.sys.wait_stock(SKU, (10, 0)).await;
    ch.sys.set_stock(SKU, 0).await;
    let owed = ch.tid("OWED");
    ch.pushed(&Channel::trade(
        &owed,
        "WAIT_SELLER_SEND_GOODS",
        1_000,
        Some(PRICE),
    ))
    .await;
    let owed_id = ch.order_id(&owed).await;
    ch.sys.wait_order(&owed_id, "CANCELLED").await;
    wait_gauge(order, "order_payments_refund_required", &[], "1", |v| {
        v == 1.0
    })
    .await;
    #[allow(clippy::cast_precision_loss)]
    let price = PRICE as f64;
    wait_gauge(
        order,
        "order_payments_refund_due_cents",
        &[],
        "the price",
        |v| (v - price).abs() < 0.5,
    )
    .await;
    // ... until the platform's refund covers it.
    let refund =
        |status: &str, m: i64| Channel::refund(&owed, status, m, PRICE, "RETURN_AND_REFUND");
    ch.pushed(&refund("WAIT_SELLER_AGREE", 2_000)).await;
    ch.pushed(&refund("SUCCESS", 3_000)).await;
    wait_gauge(order, "order_payments_refund_required", &[], "0", |v| {
        v == 0.0
    })
    .await;
    wait_gauge(order, "order_payments_refund_due_cents", &[], "0", |v| {
        v == 0.0
    })
    .await;
    // No platform amount differs from ours, and no ship-back is waiting.
    wait_gauge(
        order,
        "order_channel_refund_amount_mismatches",
        &[],
        "0",
        |v| v == 0.0,
    )
    .await;
    wait_gauge(order, "order_shipbacks_unreported", &[], "0", |v| v == 0.0).await;
}
