//! The consumers end to end: the order service, the WMS consumer and the stock consumer as
//! processes, each with its own database and relay, on a real broker. Forward and reverse
//! flows, stock moving by line (hand-written WMS events: lines cut before shipping, a partial
//! return), the WMS by line (hand-written refund events with lines), redelivery of the very same messages, the same business event under a new event id,
//! SIGKILL in the middle of a stream, insufficient stock, poison messages. The runtime's
//! transaction rules are checked directly against PostgreSQL first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e::fulfilment::{
    count, in_inbox, inbox_duplicates, metric, produce_all, Produce, System, PARTITIONS,
};
use e2e::verify::{dump, Record};
use futures::StreamExt;
use outbox_kit::consumer::{
    apply, Applied, Disposition, Effect, Event, Handler, HandlerError, RawMessage,
};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgConnection;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// The runtime's transaction, against PostgreSQL only.

/// Records each event in `effects`; the payload says how to fail.
struct Recorder;

impl Handler for Recorder {
    fn versions(&self, _event_type: &str) -> Option<&'static [u32]> {
        Some(&[1])
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let n = event.payload["n"].as_i64().unwrap_or(1);
        let sleep_ms = event.payload["sleep_ms"].as_i64().unwrap_or(0);
        sqlx::query("INSERT INTO effects (event_id, n) VALUES ($1, $2)")
            .bind(event.event_id())
            .bind(n)
            .execute(&mut *conn)
            .await?;
        if sleep_ms > 0 {
            sqlx::query("SELECT pg_sleep($1::float8 / 1000)")
                .bind(sleep_ms)
                .execute(&mut *conn)
                .await?;
        }
        match event.payload["fail"].as_str() {
            Some("transient") => Err(HandlerError::Transient("dependency down".into())),
            _ => Ok(Effect::Changed),
        }
    }
}

fn event(id: Uuid, payload: Value) -> Event {
    let raw = RawMessage {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        key: Some(b"k".to_vec()),
        payload: Some(payload.to_string().into_bytes()),
        headers: vec![
            ("event_id".into(), Some(id.to_string().into_bytes())),
            ("event_type".into(), Some(b"Thing".to_vec())),
        ],
    };
    raw.envelope().unwrap().into_event(&raw, &[1]).unwrap()
}

async fn inbox_db() -> sqlx::PgPool {
    let db = e2e::db::fresh_database().await;
    outbox_kit::schema::migrate_inbox(&db.pool).await.unwrap();
    sqlx::query("CREATE TABLE effects (event_id uuid NOT NULL, n bigint NOT NULL CHECK (n >= 0))")
        .execute(&db.pool)
        .await
        .unwrap();
    db.pool
}

#[tokio::test]
async fn apply_commits_the_effect_with_its_inbox_row_or_neither() {
    let pool = inbox_db().await;
    let effects = |id: Uuid| {
        let pool = pool.clone();
        async move {
            count(
                &pool,
                &format!("SELECT count(*) FROM effects WHERE event_id = '{id}'"),
            )
            .await
        }
    };
    let inbox = |id: Uuid| {
        let pool = pool.clone();
        async move {
            count(
                &pool,
                &format!("SELECT count(*) FROM inbox WHERE event_id = '{id}'"),
            )
            .await
        }
    };

    // First delivery: effect and inbox row commit together.
    let ok = Uuid::new_v4();
    let first = apply(&pool, "test", &Recorder, &event(ok, json!({})))
        .await
        .unwrap();
    assert_eq!(first, Applied::Effect(Effect::Changed));
    assert_eq!((effects(ok).await, inbox(ok).await), (1, 1));
    // Redelivery: skipped, counted in the inbox row.
    assert_eq!(
        apply(&pool, "test", &Recorder, &event(ok, json!({})))
            .await
            .unwrap(),
        Applied::Duplicate
    );
    assert_eq!(
        apply(&pool, "test", &Recorder, &event(ok, json!({})))
            .await
            .unwrap(),
        Applied::Duplicate
    );
    assert_eq!(effects(ok).await, 1, "no second effect");
    assert_eq!(
        count(
            &pool,
            &format!("SELECT duplicates::bigint FROM inbox WHERE event_id = '{ok}'")
        )
        .await,
        2
    );
    // Another consumer of the same database has its own inbox rows.
    assert_eq!(
        apply(&pool, "other", &Recorder, &event(ok, json!({})))
            .await
            .unwrap(),
        Applied::Effect(Effect::Changed)
    );

    // A retryable failure rolls back the effect and the inbox row: the retry applies it.
    let flaky = Uuid::new_v4();
    let err = apply(
        &pool,
        "test",
        &Recorder,
        &event(flaky, json!({"fail": "transient"})),
    )
    .await
    .unwrap_err();
    assert_eq!(err.disposition(), Disposition::Retry);
    assert_eq!((effects(flaky).await, inbox(flaky).await), (0, 0));
    assert_eq!(
        apply(&pool, "test", &Recorder, &event(flaky, json!({})))
            .await
            .unwrap(),
        Applied::Effect(Effect::Changed)
    );

    // An effect the database refuses (CHECK) can never apply: dead-lettered, nothing kept.
    let refused = Uuid::new_v4();
    let err = apply(&pool, "test", &Recorder, &event(refused, json!({"n": -1})))
        .await
        .unwrap_err();
    assert_eq!(
        err.disposition(),
        Disposition::DeadLetter,
        "{}",
        err.describe()
    );
    assert!(
        err.describe().contains("SQLSTATE 23514"),
        "{}",
        err.describe()
    );
    assert_eq!((effects(refused).await, inbox(refused).await), (0, 0));
}

#[tokio::test]
async fn concurrent_deliveries_of_one_event_apply_it_once() {
    let pool = inbox_db().await;
    let id = Uuid::new_v4();
    // Ten deliveries at once, each holding its transaction open for a while.
    let results: Vec<Applied> = futures::future::join_all((0..10).map(|_| {
        let pool = pool.clone();
        async move {
            apply(
                &pool,
                "test",
                &Recorder,
                &event(id, json!({"sleep_ms": 200})),
            )
            .await
            .unwrap()
        }
    }))
    .await;
    let applied = results
        .iter()
        .filter(|a| **a == Applied::Effect(Effect::Changed))
        .count();
    assert_eq!(applied, 1, "{results:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM effects").await, 1);
    assert_eq!(
        count(&pool, "SELECT sum(duplicates)::bigint FROM inbox").await,
        9
    );
}

// ---------------------------------------------------------------------------------------------
// Helpers of the end-to-end cases.

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Every message on the given topics of the system, read with kafka-python.
async fn dump_topics(sys: &System, aggregate_types: &[&str]) -> Vec<Record> {
    let brokers = sys.brokers.clone();
    let topics: Vec<String> = aggregate_types.iter().map(|a| sys.topic(a)).collect();
    tokio::task::spawn_blocking(move || dump(&brokers, &topics))
        .await
        .unwrap()
}

fn event_type(r: &Record) -> &str {
    r.headers.get("event_type").map_or("", String::as_str)
}

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

// ---------------------------------------------------------------------------------------------
// The flows.

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

// ---------------------------------------------------------------------------------------------
// Duplicates.

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

// ---------------------------------------------------------------------------------------------
// Crashes and poison.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_database_is_retried_on_the_same_message_until_it_applies() {
    let sys = System::start().await;
    sys.sku("F1", 100).await;
    sys.set_stock("F1", 10).await;
    // The stock consumer's statements fail (undefined table) until the table is back.
    sqlx::query("ALTER TABLE reservations RENAME TO reservations_away")
        .execute(&sys.stock_db.pool)
        .await
        .unwrap();
    let order = sys.paid_order("judy", &[("F1", 1)]).await;
    e2e::wait_for(
        "the stock consumer to retry",
        Duration::from_secs(60),
        || async {
            (metric(&sys.stock.metrics().await, "consumer_retries_total", &[]) >= 3.0).then_some(())
        },
    )
    .await;
    assert!(sys.outbounds_of(&order).await.is_empty());
    sqlx::query("ALTER TABLE reservations_away RENAME TO reservations")
        .execute(&sys.stock_db.pool)
        .await
        .unwrap();
    sys.wait_outbound(&order, "CREATED").await;
    sys.wait_stock("F1", (10, 1)).await;
    let m = sys.stock.metrics().await;
    assert_eq!(
        metric(&m, "consumer_messages_total", &[("outcome", "applied")]),
        1.0,
        "applied once"
    );
    assert_eq!(
        metric(
            &m,
            "consumer_messages_total",
            &[("outcome", "dead_lettered")]
        ),
        0.0,
        "nothing discarded"
    );
    assert_eq!(
        count(&sys.stock_db.pool, "SELECT count(*) FROM inbox").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_messages_go_to_the_dead_letter_topic_and_later_ones_are_applied() {
    let sys = System::start().await;
    sys.sku("P1", 100).await;
    sys.set_stock("P1", 10).await;
    let topic = sys.topic("order");
    let h = |pairs: &[(&str, String)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    };
    let mut poison: Vec<Produce> = vec![];
    for p in 0..PARTITIONS {
        let key = format!("poison-{p}");
        let paid = json!({"order_id": Uuid::new_v4(), "items": [{"sku_id": "P1", "quantity": 1}]})
            .to_string();
        poison.push((
            topic.clone(),
            key.clone(),
            paid.clone(),
            h(&[("event_type", "OrderPaid".into())]),
            Some(p),
        ));
        poison.push((
            topic.clone(),
            key.clone(),
            "not json".into(),
            h(&[
                ("event_id", Uuid::new_v4().to_string()),
                ("event_type", "OrderPaid".into()),
            ]),
            Some(p),
        ));
        poison.push((
            topic.clone(),
            key.clone(),
            paid,
            h(&[
                ("event_id", Uuid::new_v4().to_string()),
                ("event_type", "OrderPaid".into()),
                ("event_version", "99".into()),
            ]),
            Some(p),
        ));
        poison.push((
            topic.clone(),
            key,
            r#"{"order_id": 42}"#.into(),
            h(&[
                ("event_id", Uuid::new_v4().to_string()),
                ("event_type", "OrderPaid".into()),
            ]),
            Some(p),
        ));
    }
    produce_all(&sys.brokers, poison).await;

    // Behind the poison in every partition: a real order, applied.
    let order = sys.paid_order("ivan", &[("P1", 1)]).await;
    sys.wait_outbound(&order, "CREATED").await;
    sys.wait_stock("P1", (10, 1)).await;

    let dead = |m: String| -> f64 {
        metric(
            &m,
            "consumer_messages_total",
            &[("outcome", "dead_lettered")],
        )
    };
    e2e::wait_for(
        "every poison message dead-lettered",
        Duration::from_secs(60),
        || async {
            (dead(sys.stock.metrics().await) == 12.0 && dead(sys.wms.metrics().await) == 3.0)
                .then_some(())
        },
    )
    .await;
    let records = tokio::task::spawn_blocking({
        let brokers = sys.brokers.clone();
        let dlq = format!("{topic}.dlq");
        move || dump(&brokers, &[dlq])
    })
    .await
    .unwrap();
    let mut by: HashMap<(String, String), usize> = HashMap::new();
    for r in &records {
        let get = |k: &str| r.headers.get(k).cloned().unwrap_or_default();
        assert!(!get("dlq.error").is_empty(), "{r:?}");
        assert_eq!(get("dlq.source.topic"), topic);
        assert!(
            get("dlq.source.partition")
                .parse::<i32>()
                .is_ok_and(|p| (0..PARTITIONS).contains(&p)),
            "{r:?}"
        );
        assert!(get("dlq.source.offset").parse::<i64>().is_ok(), "{r:?}");
        assert!(
            r.key.as_deref().is_some_and(|k| k.starts_with("poison-")),
            "{r:?}"
        );
        *by.entry((get("dlq.consumer"), get("dlq.reason")))
            .or_default() += 1;
    }
    let expected: HashMap<(String, String), usize> = [
        (("stock", "missing_header"), 3),
        (("stock", "undecodable"), 3),
        (("stock", "unknown_version"), 3),
        (("stock", "unapplicable"), 3),
        (("wms", "missing_header"), 3),
    ]
    .into_iter()
    .map(|((c, r), n)| ((c.to_owned(), r.to_owned()), n))
    .collect();
    assert_eq!(by, expected, "dead letters by consumer and reason");
    let sample = records
        .iter()
        .find(|r| r.headers.get("dlq.reason").map(String::as_str) == Some("unknown_version"))
        .unwrap();
    assert!(
        sample.headers["dlq.error"].contains("unknown version 99 of OrderPaid"),
        "{:?}",
        sample.headers
    );
    assert_eq!(
        count(&sys.stock_db.pool, "SELECT count(*) FROM reservations").await,
        1,
        "only the real order"
    );
}
