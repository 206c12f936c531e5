//! The marketplace channel end to end: the simulator as a process pushing to the order
//! service (duplicates, new msg_ids, out-of-order refund snapshots, dropped pushes), one
//! compensation pass, the WMS shipping, ship-backs to the platform: every order ends in the
//! platform's state, one outbound per order, one ship-back per shippable order.

use std::time::{Duration, Instant};

use e2e::fulfilment::{count, metric};
use e2e::marketplace::{Market, PRICE, SKU};
use futures::StreamExt;
use serde_json::json;

fn orders_in_test() -> usize {
    std::env::var("MARKETPLACE_E2E_ORDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn marketplace_orders_reach_the_platforms_state_through_duplicates_drops_and_disorder() {
    let n = orders_in_test();
    let started = Instant::now();
    let m = Market::start(json!({
        "push_copies": 3, "new_msg_id_ratio": 0.2, "drop_ratio": 0.1,
        "refunds_out_of_order": true
    }))
    .await;
    m.sys.set_stock(SKU, i64::try_from(n).unwrap() * 2).await;
    let tid = |i: usize| format!("T{i:05}-{}", m.run_id());
    // Every 5th trade is refunded in full before shipping, every 7th (of the others) gets a
    // 1-cent refund-only price adjustment; all the others just ship.
    let full = |i: usize| i.is_multiple_of(5);
    let partial = |i: usize| !full(i) && i.is_multiple_of(7);
    futures::stream::iter(0..n)
        .for_each_concurrent(8, |i| {
            let m = &m;
            let t = tid(i);
            async move {
                m.trade(&t).await;
                if full(i) {
                    m.refund(&t, PRICE, "RETURN_AND_REFUND").await;
                } else if partial(i) {
                    m.refund(&t, 1, "REFUND_ONLY").await;
                }
            }
        })
        .await;
    let pushed_in = started.elapsed();

    let pass = m.compensate().await;
    let ours = m.our_orders().await;
    assert_eq!(
        ours.len(),
        n,
        "every trade is an order after one pass: {pass}"
    );
    for i in 0..n {
        let (id, status) = &ours[&tid(i)];
        if full(i) && status == "CANCELLED" {
            // Its paid push was dropped and the closed trade came first (a closed trade never
            // starts fulfilment): the money went back through the platform's refund, drawn on
            // the flagged payment, so nothing is left owed.
            let (disposition, due): (String, Option<i64>) = sqlx::query_as(
                "SELECT disposition, refund_due_cents FROM payments WHERE order_id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&m.sys.order_db.pool)
            .await
            .unwrap();
            assert_eq!(
                (disposition.as_str(), due),
                ("REFUND_COVERED", Some(0)),
                "{}",
                tid(i)
            );
        } else if full(i) {
            // Refunded in full: REFUNDED once the WMS cancelled the outbound (its word that
            // the goods never left).
            m.sys.wait_order(id, "REFUNDED").await;
        } else {
            assert_eq!(status, "PAID", "{}", tid(i));
        }
        let platform = m.sim_get(&format!("/trades/{}", tid(i))).await;
        let platform_expected = if full(i) {
            "TRADE_CLOSED"
        } else {
            "WAIT_SELLER_SEND_GOODS"
        };
        assert_eq!(platform["status"], platform_expected);
    }
    let partial_ok = count(
        &m.sys.order_db.pool,
        "SELECT count(*) FROM refunds WHERE status = 'SUCCEEDED' AND kind = 'REFUND_ONLY'",
    )
    .await;
    assert_eq!(
        partial_ok,
        i64::try_from((0..n).filter(|i| partial(*i)).count()).unwrap()
    );

    let shippable: Vec<(String, String)> = (0..n)
        .filter(|i| !full(*i))
        .map(|i| (tid(i), ours[&tid(i)].0.clone()))
        .collect();
    m.ship_all(&shippable).await;

    // Exactly one outbound per shippable order; the refunded ones never ship.
    let outbounds = m.outbounds().await;
    for (t, id) in &shippable {
        assert_eq!(outbounds[id].1, "SHIPPED", "{t}");
    }
    for i in (0..n).filter(|i| full(*i)) {
        let id = &ours[&tid(i)].0;
        assert!(
            outbounds.get(id).is_none_or(|(_, s)| s == "CANCELLED"),
            "refunded {} has outbound {:?}",
            tid(i),
            outbounds.get(id)
        );
    }
    // One ship-back per (order, out_sid); none for orders refunded before shipping.
    let calls = m.ship_calls().await;
    for (t, _) in &shippable {
        assert_eq!(
            calls.get(t).map(Vec::as_slice),
            Some(&["shipped".to_owned()][..]),
            "{t}"
        );
    }
    for i in (0..n).filter(|i| full(*i)) {
        assert!(
            !calls.contains_key(&tid(i)),
            "{} was reported shipped",
            tid(i)
        );
    }
    // The platform records a call before the consumer's transaction that records the outcome
    // commits: wait for the last ones to land, then check there is one row per shipment.
    let expected = i64::try_from(shippable.len()).unwrap();
    let shipbacks = e2e::wait_for(
        "every ship-back outcome to be recorded",
        Duration::from_secs(30),
        || async {
            let n = count(
                &m.sys.order_db.pool,
                "SELECT count(*) FROM channel_shipbacks WHERE result IS NOT NULL",
            )
            .await;
            (n >= expected).then_some(n)
        },
    )
    .await;
    assert_eq!(shipbacks, expected);

    let sim_calls = m.sim_get("/calls").await;
    let mut conn = m.sys.order_db.pool.acquire().await.unwrap();
    let (layer1, layer2, stale) = order_service::channel::store::dedupe_counts(&mut conn)
        .await
        .unwrap();
    assert!(layer1 > 0 && layer2 > 0, "both layers absorbed duplicates");
    let order_metrics = m.sys.order.metrics().await;
    eprintln!(
        "marketplace e2e: {n} trades ({} refunded in full, {} partial refund-only) in {:.1}s \
         (pushes done after {:.1}s): changes {}, pushes sent {} (accepted {}, refused {}), \
         new msg_id {}, dropped {}; absorbed layer 1 {layer1}, layer 2 {layer2}, stale {stale}; \
         compensation pass {pass}; recovered metric {}; outbounds {}; ship-back calls {}",
        (0..n).filter(|i| full(*i)).count(),
        (0..n).filter(|i| partial(*i)).count(),
        started.elapsed().as_secs_f64(),
        pushed_in.as_secs_f64(),
        sim_calls["changes"],
        sim_calls["pushes_sent"],
        sim_calls["pushes_accepted"],
        sim_calls["pushes_failed"],
        sim_calls["pushes_new_msg_id"],
        sim_calls["pushes_dropped"],
        metric(
            &order_metrics,
            "order_channel_compensation_recovered_total",
            &[]
        ),
        outbounds.len(),
        calls.values().map(Vec::len).sum::<usize>(),
    );
    assert!(
        pass["recovered"].as_u64().unwrap() > 0,
        "dropped pushes were recovered: {pass}"
    );
}
