//! Guarantee 4 end to end: duplicates on the broker are absorbed by the consumers. The order
//! service, the WMS consumer and the stock consumer run as processes, each with its own
//! database and relay, on a real broker. The very same messages produced again by kafka-python
//! have no second effect and count as inbox duplicates; the same business event under a new
//! event id changes nothing (the business keys hold); consumers SIGKILLed in the middle of
//! 1 000 paid orders leave one outbound and one reservation per order.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e::fulfilment::{
    count, dump_topics, in_inbox, inbox_duplicates, metric, produce_all, Produce, System,
};
use e2e::verify::{event_type, Record};
use futures::StreamExt;
use reqwest::StatusCode;
use uuid::Uuid;

use crate::common::secs;

/// `r` to produce again with the independent client, to the same partition; with `new_id`,
/// under that event id.
fn again(r: &Record, new_id: Option<Uuid>) -> Produce {
    let mut headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    headers.sort();
    if let Some(id) = new_id {
        for (k, v) in &mut headers {
            if k == "id" || k == "event_id" {
                *v = id.to_string();
            }
        }
    }
    (
        r.topic.clone(),
        r.key.clone().unwrap_or_default(),
        r.value.clone().unwrap_or_default(),
        headers,
        Some(r.partition),
    )
}

/// What the three databases hold, as text: equal before and after means nothing changed.
async fn state(sys: &System) -> Vec<String> {
    let text = |pool: &sqlx::PgPool, sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<String>>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
                .unwrap_or_default()
        }
    };
    vec![
        text(&sys.order_db.pool, "SELECT string_agg(order_id || ':' || status || ':' || refund_reserved_cents, ',' ORDER BY order_id) FROM orders").await,
        text(&sys.wms_db.pool, "SELECT string_agg(outbound_no || ':' || order_id || ':' || status, ',' ORDER BY outbound_no) FROM outbounds").await,
        text(&sys.wms_db.pool, "SELECT string_agg(order_id || ':' || hold || ':' || active || permanent, ',' ORDER BY order_id, hold) FROM order_holds").await,
        text(&sys.stock_db.pool, "SELECT string_agg(sku_id || ':' || on_hand || ':' || reserved, ',' ORDER BY sku_id) FROM stock").await,
        text(&sys.stock_db.pool, "SELECT string_agg(order_id || ':' || status, ',' ORDER BY order_id) FROM reservations").await,
        text(&sys.stock_db.pool, "SELECT count(*)::text FROM stock_movements").await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redelivered_messages_have_no_second_effect_and_count_as_duplicates() {
    let started = Instant::now();
    let sys = System::start().await;
    sys.sku("D1", 100).await;
    sys.set_stock("D1", 10).await;
    for user in ["frank", "grace"] {
        let order = sys.paid_order(user, &[("D1", 2)]).await;
        let outbound = sys.wait_outbound(&order, "CREATED").await;
        let (status, _, _) = sys
            .ship(
                outbound["outbound_no"].as_str().unwrap(),
                "DHL",
                &format!("T-{user}"),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        sys.wait_order(&order, "SHIPPED").await;
    }
    sys.wait_stock("D1", (6, 0)).await;
    sys.wait_outboxes_drained().await;
    let before = state(&sys).await;
    let records = dump_topics(&sys, &["order", "stock", "outbound"]).await;

    // What each consumer applies of these messages: each one comes back as a duplicate.
    let handled = |types: &[&str]| {
        records
            .iter()
            .filter(|r| types.contains(&event_type(r)))
            .count() as i64
    };
    let expect_stock = handled(&[
        "OrderPaid",
        "OrderCancelled",
        "OutboundShipped",
        "OutboundCancelled",
        "ReturnReceived",
    ]);
    let expect_wms = handled(&[
        "StockReserved",
        "RefundRequested",
        "RefundClosed",
        "RefundSucceeded",
        "OrderCancelled",
    ]);
    let expect_order = handled(&["OutboundShipped", "StockReservationRejected"]);
    assert_eq!(
        (expect_stock, expect_wms, expect_order),
        (4, 2, 2),
        "{} messages",
        records.len()
    );

    produce_all(
        &sys.brokers,
        records.iter().map(|r| again(r, None)).collect(),
    )
    .await;
    e2e::wait_for(
        "every redelivery to be recognised",
        Duration::from_secs(60),
        || async {
            let got = (
                inbox_duplicates(&sys.stock_db.pool).await,
                inbox_duplicates(&sys.wms_db.pool).await,
                inbox_duplicates(&sys.order_db.pool).await,
            );
            (got == (expect_stock, expect_wms, expect_order)).then_some(())
        },
    )
    .await;
    sys.wait_outboxes_drained().await;
    assert_eq!(
        state(&sys).await,
        before,
        "the redelivered messages changed nothing"
    );
    for (service, expected) in [
        (&sys.stock, expect_stock),
        (&sys.wms, expect_wms),
        (&sys.order, expect_order),
    ] {
        let m = service.metrics().await;
        assert_eq!(
            metric(&m, "consumer_inbox_duplicates_total", &[]),
            expected as f64,
            "{}",
            service.name
        );
    }
    let after = dump_topics(&sys, &["order", "stock", "outbound"]).await;
    assert_eq!(
        after.len(),
        2 * records.len(),
        "no consumer emitted a second event"
    );
    eprintln!(
        "redelivery: {} messages produced again ({} order, {} stock, {} outbound); inbox duplicates: stock {expect_stock}, wms {expect_wms}, order {expect_order}; state unchanged; {}",
        records.len(),
        records.iter().filter(|r| r.topic.ends_with(".order")).count(),
        records.iter().filter(|r| r.topic.ends_with(".stock")).count(),
        records.iter().filter(|r| r.topic.ends_with(".outbound")).count(),
        secs(started.elapsed())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_business_event_under_a_new_event_id_changes_nothing() {
    let sys = System::start().await;
    sys.sku("N1", 100).await;
    sys.set_stock("N1", 10).await;
    let order = sys.paid_order("heidi", &[("N1", 2)]).await;
    sys.wait_outbound(&order, "CREATED").await;
    sys.wait_stock("N1", (10, 2)).await;
    sys.wait_outboxes_drained().await;
    let before = state(&sys).await;

    let records = dump_topics(&sys, &["order", "stock"]).await;
    let find = |t: &str| {
        records
            .iter()
            .find(|r| event_type(r) == t && r.key.as_deref() == Some(order.as_str()))
            .unwrap_or_else(|| panic!("no {t}"))
    };
    let (paid_again, reserved_again) = (Uuid::new_v4(), Uuid::new_v4());
    produce_all(
        &sys.brokers,
        vec![
            again(find("OrderPaid"), Some(paid_again)),
            again(find("StockReserved"), Some(reserved_again)),
        ],
    )
    .await;
    e2e::wait_for(
        "both consumers to take the new event ids",
        Duration::from_secs(60),
        || async {
            let stock = in_inbox(&sys.stock_db.pool, &paid_again.to_string()).await;
            let wms = in_inbox(&sys.wms_db.pool, &reserved_again.to_string()).await;
            (stock && wms).then_some(())
        },
    )
    .await;

    // New event ids pass the inbox; the business keys hold.
    assert_eq!(
        sys.outbounds_of(&order).await.len(),
        1,
        "one outbound per order"
    );
    assert_eq!(
        sys.stock_of("N1").await,
        (10, 2),
        "one reservation per order"
    );
    let sql = format!(
        "SELECT count(*) FROM stock_movements WHERE order_id = '{order}' AND kind = 'RESERVE'"
    );
    assert_eq!(count(&sys.stock_db.pool, &sql).await, 1);
    sys.wait_outboxes_drained().await;
    assert_eq!(state(&sys).await, before);
    for service in [&sys.stock, &sys.wms] {
        let m = service.metrics().await;
        assert_eq!(
            metric(&m, "consumer_messages_total", &[("outcome", "unchanged")]),
            1.0,
            "{}",
            service.name
        );
        assert_eq!(
            metric(&m, "consumer_inbox_duplicates_total", &[]),
            0.0,
            "{}",
            service.name
        );
    }
    let stock_events = dump_topics(&sys, &["stock"])
        .await
        .iter()
        .filter(|r| event_type(r) == "StockReserved")
        .count();
    assert_eq!(
        stock_events, 2,
        "the original StockReserved and our copy; no second reservation event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_mid_stream_leaves_one_outbound_and_one_reservation_per_order() {
    const ORDERS: usize = 1_000;
    let started = Instant::now();
    let sys = System::start_on(&e2e::kafka_brokers()).await;
    let skus = ["K1", "K2", "K3", "K4"];
    for sku in skus {
        sys.sku(sku, 100).await;
        sys.set_stock(sku, 100_000).await;
    }
    let lines = |i: usize| -> Vec<(&str, i64)> {
        let mut l = vec![(skus[i % 4], 1 + (i % 3) as i64)];
        if i.is_multiple_of(2) {
            l.push((skus[(i + 1) % 4], 1));
        }
        l
    };
    let expected_lines: usize = (0..ORDERS).map(|i| lines(i).len()).sum();
    let mut expected_reserved: HashMap<&str, i64> = HashMap::new();
    for i in 0..ORDERS {
        for (sku, q) in lines(i) {
            *expected_reserved.entry(sku).or_default() += q;
        }
    }

    let pay = async {
        futures::stream::iter(0..ORDERS)
            .map(|i| {
                let items = lines(i);
                let sys = &sys;
                async move { sys.paid_order(&format!("user-{i}"), &items).await }
            })
            .buffer_unordered(16)
            .collect::<Vec<String>>()
            .await
    };
    let reservations = || count(&sys.stock_db.pool, "SELECT count(*) FROM reservations");
    let outbounds = || count(&sys.wms_db.pool, "SELECT count(*) FROM outbounds");
    let chaos = async {
        e2e::wait_for("300 reservations", Duration::from_secs(180), || async {
            (reservations().await >= 300).then_some(())
        })
        .await;
        sys.stock.kill();
        let stock_killed_at = reservations().await;
        let stock_starts = sys.stock.start_again_until_assigned().await;
        // The WMS in the middle of its stream too: past the outbounds made while the stock
        // consumer was down, so new reservations keep arriving.
        e2e::wait_for("600 outbounds", Duration::from_secs(180), || async {
            (outbounds().await >= 600).then_some(())
        })
        .await;
        sys.wms.kill();
        let wms_killed_at = outbounds().await;
        let wms_starts = sys.wms.start_again_until_assigned().await;
        (stock_killed_at, wms_killed_at, stock_starts, wms_starts)
    };
    let (orders, (stock_killed_at, wms_killed_at, stock_starts, wms_starts)) =
        tokio::join!(pay, chaos);
    let paid_after = started.elapsed();
    e2e::wait_for(
        "every order reserved and with an outbound",
        Duration::from_secs(300),
        || async {
            (reservations().await == ORDERS as i64 && outbounds().await == ORDERS as i64)
                .then_some(())
        },
    )
    .await;
    let done_after = started.elapsed();

    let stock = &sys.stock_db.pool;
    let wms = &sys.wms_db.pool;
    assert_eq!(
        count(
            stock,
            "SELECT count(*) FROM reservations WHERE status = 'RESERVED'"
        )
        .await,
        ORDERS as i64
    );
    assert_eq!(
        count(
            stock,
            "SELECT count(*) FROM stock_movements WHERE kind = 'RESERVE'"
        )
        .await,
        expected_lines as i64
    );
    assert_eq!(
        count(
            stock,
            "SELECT count(*) FROM stock_movements WHERE kind <> 'RESERVE'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            wms,
            "SELECT count(DISTINCT order_id) FROM outbounds WHERE status = 'CREATED'"
        )
        .await,
        ORDERS as i64
    );
    assert_eq!(
        count(wms, "SELECT count(*) FROM outbound_lines").await,
        expected_lines as i64
    );
    let ids: Vec<Uuid> = orders.iter().map(|o| Uuid::parse_str(o).unwrap()).collect();
    let missing_reservations: i64 = sqlx::query_scalar("SELECT count(*) FROM unnest($1::uuid[]) o WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.order_id = o)")
        .bind(&ids)
        .fetch_one(stock)
        .await
        .unwrap();
    let missing_outbounds: i64 = sqlx::query_scalar("SELECT count(*) FROM unnest($1::uuid[]) o WHERE NOT EXISTS (SELECT 1 FROM outbounds b WHERE b.order_id = o)")
        .bind(&ids)
        .fetch_one(wms)
        .await
        .unwrap();
    assert_eq!((missing_reservations, missing_outbounds), (0, 0));
    for sku in skus {
        assert_eq!(
            sys.stock_of(sku).await,
            (100_000, expected_reserved[sku]),
            "{sku}"
        );
    }
    let stock_dups = inbox_duplicates(stock).await;
    let wms_dups = inbox_duplicates(wms).await;
    eprintln!(
        "SIGKILL: {ORDERS} orders paid in {}; stock-consumer killed at {stock_killed_at} reservations, wms-consumer at {wms_killed_at} outbounds \
         (assigned after its start: stock {stock_starts:?}, wms {wms_starts:?}); \
         all done after {}: {ORDERS} reservations ({expected_lines} RESERVE movements), {ORDERS} outbounds; \
         redeliveries skipped by the inbox: stock {stock_dups}, wms {wms_dups}",
        secs(paid_after),
        secs(done_after)
    );
    drop(sys);
}
