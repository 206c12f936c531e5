//! Unpaid orders close after the payment timeout (as the platform closes a `WAIT_PAY` trade
//! after a timeout): the order service as a process with a short timeout, the relay, the
//! broker, the consumers. A payment arriving after the close is recorded and owed back, never
//! revives the order; paid orders and marketplace orders (the platform closes those with
//! `TRADE_CLOSED`) are left alone.

use e2e::channel::{Channel, PRICE, SKU};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unpaid_order_closes_after_the_payment_timeout_and_a_late_payment_is_owed_back() {
    let ch = Channel::start_with(
        10,
        vec![
            ("PAYMENT_TIMEOUT_SECS".into(), "2".into()),
            ("PAYMENT_TIMEOUT_INTERVAL_MS".into(), "200".into()),
        ],
    )
    .await;
    let sys = &ch.sys;
    // Older than the unpaid order below: a marketplace trade waiting for payment, and a paid
    // order.
    let tid = ch.tid("WAITPAY");
    ch.pushed(&Channel::trade(&tid, "WAIT_BUYER_PAY", 1_000, None))
        .await;
    let channel_order = ch.order_id(&tid).await;
    let paid = sys.paid_order("alice", &[(SKU, 1)]).await;
    let (unpaid, amount) = sys.create_order("bob", &[(SKU, 1)]).await;
    assert_eq!(amount, PRICE);

    let closed = sys.wait_order(&unpaid, "CANCELLED").await;
    assert!(closed["cancelled_at"].is_string(), "{closed}");
    // Closed oldest first: both older orders were looked at before it, and stay.
    assert_eq!(sys.order_of(&paid).await["status"], "PAID");
    assert_eq!(
        sys.order_of(&channel_order).await["status"],
        "PENDING_PAYMENT"
    );

    // The buyer pays after all: the money is recorded and owed back, the order stays closed.
    sys.pay(&unpaid, amount).await;
    let after = sys.order_of(&unpaid).await;
    assert_eq!(after["status"], "CANCELLED", "{after}");
    assert_eq!(
        after["payments"][0]["disposition"], "REFUND_REQUIRED",
        "{after}"
    );
    assert_eq!(after["payments"][0]["refund_due_cents"], amount, "{after}");

    // Nothing was reserved for the closed order: only the paid one holds stock.
    sys.wait_stock(SKU, (10, 1)).await;
    let audit = ch.settled_audit().await;
    assert_eq!(audit.code, 0, "audit: {}", audit.report);
    assert!(sys.outbounds_of(&unpaid).await.is_empty());
}
