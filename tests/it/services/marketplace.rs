//! The marketplace channel end to end: the simulator as a process pushing to the order
//! service (duplicates, new msg_ids, out-of-order refund snapshots, dropped pushes), one
//! compensation pass, the WMS shipping, ship-backs to the platform.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e::fulfilment::{count, metric, Service, System};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

const MARKETPLACE_SECRET: &str = "e2e-marketplace-secret";
const SKU: &str = "MK";
const PRICE: i64 = 1_000;

struct Market {
    sim: Service,
    sys: System,
    http: reqwest::Client,
}

impl Market {
    /// The simulator, then the system with the order service pointed at it, then the
    /// simulator's pushes pointed at the order service with `faults`.
    async fn start(faults: Value) -> Self {
        Self::start_on(&e2e::kafka_brokers(), faults).await
    }

    /// [`Market::start`] on the broker at `brokers`.
    async fn start_on(brokers: &str, mut faults: Value) -> Self {
        let sim = Service::start_marketplace_simulator(MARKETPLACE_SECRET).await;
        let sys = System::start_with(
            brokers,
            vec![
                ("MARKETPLACE_SECRET".into(), MARKETPLACE_SECRET.into()),
                ("MARKETPLACE_URL".into(), sim.url("")),
                // Only explicit passes in these tests.
                (
                    "MARKETPLACE_COMPENSATION_INTERVAL_MS".into(),
                    "3600000".into(),
                ),
            ],
        )
        .await;
        faults["push_url"] = Value::from(sys.order.url("/channels/marketplace/push"));
        let http = reqwest::Client::new();
        let r = http
            .put(sim.url("/admin/faults"))
            .json(&faults)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        sys.sku(SKU, PRICE).await;
        Self { sim, sys, http }
    }

    /// A short id of this test's run (its topic prefix's first part), for unique tids.
    fn run_id(&self) -> &str {
        self.sys.prefix.split('.').next().unwrap_or("run")
    }

    async fn sim_post(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(self.sim.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    async fn sim_get(&self, path: &str) -> Value {
        self.http
            .get(self.sim.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn trade(&self, tid: &str) {
        self.sim_post(
            "/trades",
            json!({"tid": tid, "buyer_id": format!("buyer-{tid}"),
                   "items": [{"sku_id": SKU, "quantity": 1}], "paid_cents": PRICE, "pay": true}),
        )
        .await;
    }

    async fn refund(&self, tid: &str, cents: i64, kind: &str) {
        self.sim_post(
            &format!("/trades/{tid}/refunds"),
            json!({"refund_id": format!("R-{tid}"), "refund_cents": cents, "kind": kind,
                   "statuses": ["WAIT_SELLER_AGREE", "SUCCESS"]}),
        )
        .await;
    }

    async fn compensate(&self) -> Value {
        let r = self
            .http
            .post(self.sys.order.url("/channels/marketplace/compensate"))
            .bearer_auth(e2e::auth::operator())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// tid -> (our order id, our status).
    async fn our_orders(&self) -> HashMap<String, (String, String)> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT c.external_order_id, o.order_id::text, o.status FROM channel_orders c \
             JOIN orders o USING (order_id)",
        )
        .fetch_all(&self.sys.order_db.pool)
        .await
        .unwrap();
        rows.into_iter().map(|(t, id, s)| (t, (id, s))).collect()
    }

    /// order id -> (outbound_no, status) in the WMS.
    async fn outbounds(&self) -> HashMap<String, (String, String)> {
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT order_id::text, outbound_no, status FROM outbounds")
                .fetch_all(&self.sys.wms_db.pool)
                .await
                .unwrap();
        rows.into_iter().map(|(o, n, s)| (o, (n, s))).collect()
    }

    /// Ship calls per tid by result.
    async fn ship_calls(&self) -> HashMap<String, Vec<String>> {
        let calls = self.sim_get("/calls").await;
        let mut by_tid: HashMap<String, Vec<String>> = HashMap::new();
        for c in calls["ship"].as_array().unwrap() {
            by_tid
                .entry(c["tid"].as_str().unwrap().to_owned())
                .or_default()
                .push(c["result"].as_str().unwrap().to_owned());
        }
        by_tid
    }

    /// Waits for the WMS to have a `CREATED` outbound for each of `orders`, ships them all and
    /// waits until the platform shows each trade shipped (the ship-back arrived).
    async fn ship_all(&self, orders: &[(String, String)]) {
        self.ship_outbounds(orders).await;
        self.wait_platform_shipped(orders.len(), Duration::from_secs(120))
            .await;
    }

    /// Waits for the WMS to have a `CREATED` outbound for each of `orders` and ships them all
    /// (tracking number `SF{index:06}`), without waiting for the ship-backs.
    async fn ship_outbounds(&self, orders: &[(String, String)]) {
        let ids: Vec<String> = orders.iter().map(|(_, id)| id.clone()).collect();
        let outbounds = e2e::wait_for(
            "an outbound CREATED for every shippable order",
            Duration::from_secs(120),
            || async {
                let ob = self.outbounds().await;
                ids.iter()
                    .all(|id| ob.get(id).is_some_and(|(_, s)| s == "CREATED"))
                    .then_some(ob)
            },
        )
        .await;
        futures::stream::iter(orders.iter().enumerate())
            .for_each_concurrent(8, |(i, (_, id))| {
                let no = outbounds[id].0.clone();
                async move {
                    let (s, body, _) = self.sys.ship(&no, "SF", &format!("SF{i:06}")).await;
                    assert_eq!(s, StatusCode::OK, "{body}");
                }
            })
            .await;
    }

    /// Waits until the platform shows `n` trades shipped (their ship-backs arrived).
    async fn wait_platform_shipped(&self, n: usize, timeout: Duration) {
        e2e::wait_for(
            "the platform to show every shippable trade shipped",
            timeout,
            || async {
                let trades = self.sim_get("/trades").await;
                let shipped = trades
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|t| t["status"] == "WAIT_BUYER_CONFIRM")
                    .count();
                (shipped == n).then_some(())
            },
        )
        .await;
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ship_api_failing_five_times_is_retried_and_reported_once() {
    let m = Market::start(json!({"ship_fail_times": 5})).await;
    m.sys.set_stock(SKU, 10).await;
    let tid = format!("TF-{}", m.run_id());
    m.trade(&tid).await;
    let ours = m.our_orders().await;
    let order = vec![(tid.clone(), ours[&tid].0.clone())];
    m.ship_all(&order).await;
    m.sys.wait_outboxes_drained().await;
    let calls = m.ship_calls().await;
    let results = &calls[&tid];
    assert_eq!(
        results.iter().filter(|r| *r == "failed").count(),
        5,
        "{results:?}"
    );
    assert_eq!(results.last().map(String::as_str), Some("shipped"));
    assert_eq!(
        results.len(),
        6,
        "reported once after the failures: {results:?}"
    );
    // The platform answers before the consumer commits the row: wait for it.
    let attempts: i32 = e2e::wait_for("the ship-back row", Duration::from_secs(30), || async {
        sqlx::query_scalar("SELECT attempts FROM channel_shipbacks WHERE result IS NOT NULL")
            .fetch_optional(&m.sys.order_db.pool)
            .await
            .unwrap()
    })
    .await;
    assert!(attempts >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ship_back_the_platform_refuses_is_dead_lettered_and_counted() {
    let m = Market::start(json!({"ship_refuse": true})).await;
    m.sys.set_stock(SKU, 10).await;
    let tid = format!("TR-{}", m.run_id());
    m.trade(&tid).await;
    let id = m.our_orders().await[&tid].0.clone();
    let outbound = m.sys.wait_outbound(&id, "CREATED").await;
    let (s, _, _) = m
        .sys
        .ship(outbound["outbound_no"].as_str().unwrap(), "SF", "SF-R1")
        .await;
    assert_eq!(s, StatusCode::OK);
    e2e::wait_for(
        "the refused ship-back to be dead-lettered and counted",
        Duration::from_secs(60),
        || async {
            let text = m.sys.order.metrics().await;
            (metric(&text, "order_shipback_failures_total", &[]) >= 1.0
                && metric(
                    &text,
                    "consumer_dead_letters_total",
                    &[("reason", "unapplicable")],
                ) >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(m.ship_calls().await[&tid], ["refused"]);
    assert_eq!(
        count(
            &m.sys.order_db.pool,
            "SELECT count(*) FROM channel_shipbacks WHERE result IS NOT NULL"
        )
        .await,
        0
    );
    // The intent stays, unanswered, with the refusal.
    let error: Option<String> = sqlx::query_scalar(
        "SELECT last_error FROM channel_shipbacks WHERE result IS NULL AND external_order_id = $1",
    )
    .bind(&tid)
    .fetch_one(&m.sys.order_db.pool)
    .await
    .unwrap();
    assert!(
        error.as_deref().is_some_and(|e| e.contains("refused")),
        "the unanswered ship-back says why: {error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_ship_api_is_called_with_no_database_transaction_open() {
    const DELAY_MS: u64 = 3_000;
    let m = Market::start(json!({"ship_delay_ms": DELAY_MS})).await;
    m.sys.set_stock(SKU, 10).await;
    let tid = format!("TD-{}", m.run_id());
    m.trade(&tid).await;
    let order = vec![(tid.clone(), m.our_orders().await[&tid].0.clone())];
    m.ship_all(&order).await;
    // The platform records the call, then answers DELAY_MS later: from the moment it has the
    // call until the answer is recorded, no backend of the order database may be inside a
    // transaction for more than a second (before, the consumer's transaction stayed open
    // around the call).
    e2e::wait_for(
        "the platform to receive the ship call",
        Duration::from_secs(60),
        || async { m.ship_calls().await.contains_key(&tid).then_some(()) },
    )
    .await;
    let in_flight = Instant::now();
    // (samples taken, transactions seen open for over a second)
    let seen = std::sync::Mutex::new((0u32, Vec::<(String, String)>::new()));
    let (pool, seen_ref) = (&m.sys.order_db.pool, &seen);
    e2e::wait_for(
        "the ship-back answer to be recorded",
        Duration::from_secs(60),
        move || async move {
            let open: Vec<(String, String)> = sqlx::query_as(
                "SELECT coalesce(application_name, ''), coalesce(state, '') FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                   AND xact_start < now() - interval '1 second'",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            {
                let mut seen = seen_ref.lock().unwrap();
                seen.0 += 1;
                seen.1.extend(open);
            }
            let answered: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM channel_shipbacks WHERE result IS NOT NULL",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            (answered == 1).then_some(())
        },
    )
    .await;
    let waited = in_flight.elapsed();
    let (samples, long_transactions) = seen.into_inner().unwrap();
    eprintln!(
        "slow ship API: answer recorded {:.2}s after the call reached the platform, \
         {samples} samples of pg_stat_activity, {} of them saw a transaction open over 1 s",
        waited.as_secs_f64(),
        long_transactions.len()
    );
    assert!(
        waited >= Duration::from_millis(DELAY_MS / 2),
        "the samples covered the slow call ({:.2}s)",
        waited.as_secs_f64()
    );
    assert!(
        long_transactions.is_empty(),
        "a transaction stayed open while the platform was called ({} times; first: {:?})",
        long_transactions.len(),
        long_transactions.first()
    );
    assert_eq!(m.ship_calls().await[&tid], ["shipped"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ship_back_consumer_sigkilled_mid_run_and_restarted_still_ships_back_once() {
    const N: usize = 40;
    // The simulator has no delay fault: two 503s per trade before it answers make each
    // ship-back take the consumer's quick retries (~250 ms), so the run lasts long enough to
    // be killed in the middle of it.
    let faults = json!({"ship_fail_times": 2});
    let m = Market::start_on(&e2e::kafka_brokers(), faults.clone()).await;
    m.sys.set_stock(SKU, i64::try_from(N).unwrap() * 2).await;
    let tid = |i: usize| format!("TK{i:03}-{}", m.run_id());
    futures::stream::iter(0..N)
        .for_each_concurrent(8, |i| {
            let m = &m;
            let t = tid(i);
            async move { m.trade(&t).await }
        })
        .await;
    let ours = m.our_orders().await;
    let orders: Vec<(String, String)> = (0..N).map(|i| (tid(i), ours[&tid(i)].0.clone())).collect();
    let out_sid = |i: usize| format!("SF{i:06}");

    let shipped_tids = |calls: &HashMap<String, Vec<String>>| {
        calls
            .values()
            .filter(|r| r.iter().any(|r| r == "shipped"))
            .count()
    };
    m.ship_outbounds(&orders).await;
    let ship_started = Instant::now();
    let shipped_before_kill = e2e::wait_for(
        "a few ship-backs to be reported",
        Duration::from_secs(120),
        || async {
            let done = shipped_tids(&m.ship_calls().await);
            (done >= 3).then_some(done)
        },
    )
    .await;
    m.sys.order.kill();
    let killed_after = ship_started.elapsed();
    let calls_at_kill = m.ship_calls().await;
    let shipped_at_kill = shipped_tids(&calls_at_kill);
    let rows_at_kill = count(
        &m.sys.order_db.pool,
        "SELECT count(*) FROM channel_shipbacks WHERE result IS NOT NULL",
    )
    .await;
    assert!(
        shipped_at_kill < N,
        "the kill came after every ship-back ({shipped_at_kill} of {N} shipped)"
    );
    // Like the consumer SIGKILL tests: start again and wait until the group hands it partitions.
    let starts = m.sys.order.start_again_until_assigned().await;
    let restarted_after = ship_started.elapsed();
    // The order service listens on a new port: point the simulator's pushes at it.
    let mut faults = faults;
    faults["push_url"] = Value::from(m.sys.order.url("/channels/marketplace/push"));
    let r = m
        .http
        .put(m.sim.url("/admin/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    m.wait_platform_shipped(N, Duration::from_secs(180)).await;
    e2e::wait_for(
        "a ship-back row for every shipment",
        Duration::from_secs(120),
        || async {
            (count(
                &m.sys.order_db.pool,
                "SELECT count(*) FROM channel_shipbacks WHERE result IS NOT NULL",
            )
            .await
                == i64::try_from(N).unwrap())
            .then_some(())
        },
    )
    .await;
    m.sys.wait_outboxes_drained().await;

    // Exactly one `shipped` answer per (trade, out_sid); any further call for it was answered
    // `already_shipped` (a redelivery after the kill, absorbed by the platform).
    let raw = m.sim_get("/calls").await;
    let mut by_shipment: HashMap<(String, String), Vec<String>> = HashMap::new();
    for c in raw["ship"].as_array().unwrap() {
        by_shipment
            .entry((
                c["tid"].as_str().unwrap().to_owned(),
                c["out_sid"].as_str().unwrap().to_owned(),
            ))
            .or_default()
            .push(c["result"].as_str().unwrap().to_owned());
    }
    let expected: Vec<(String, String)> = (0..N).map(|i| (tid(i), out_sid(i))).collect();
    for key in &expected {
        let results = by_shipment
            .get(key)
            .unwrap_or_else(|| panic!("{key:?} was never reported"));
        assert_eq!(
            results.iter().filter(|r| *r == "shipped").count(),
            1,
            "{key:?}: {results:?}"
        );
        assert!(
            results
                .iter()
                .all(|r| ["shipped", "already_shipped", "failed"].contains(&r.as_str())),
            "{key:?}: {results:?}"
        );
    }
    let reported: Vec<&(String, String)> = by_shipment
        .iter()
        .filter(|(_, r)| r.iter().any(|r| r == "shipped" || r == "already_shipped"))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        reported.len(),
        N,
        "distinct shipments reported: {reported:?}"
    );
    assert_eq!(by_shipment.len(), N, "no call for another shipment");

    // One channel_shipbacks row per shipment.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT external_order_id, out_sid, result FROM channel_shipbacks WHERE result IS NOT NULL",
    )
    .fetch_all(&m.sys.order_db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), N);
    let mut row_keys: Vec<(String, String)> = rows
        .iter()
        .map(|(t, s, _)| (t.clone(), s.clone()))
        .collect();
    row_keys.sort();
    let mut expected_sorted = expected;
    expected_sorted.sort();
    assert_eq!(row_keys, expected_sorted);

    let all: Vec<&String> = by_shipment.values().flatten().collect();
    let of = |what: &str| all.iter().filter(|r| r.as_str() == what).count();
    eprintln!(
        "ship-back SIGKILL: {N} shipments; order service killed {:.2}s after shipping began \
         with {shipped_at_kill} shipped ({shipped_before_kill} seen before the kill, \
         {} ship calls, {rows_at_kill} channel_shipbacks rows), restarted after {:.2}s \
         (assigned {starts:?} after its start); ship calls {} (shipped {}, already_shipped {}, failed {}); \
         channel_shipbacks rows {} (already_shipped results {})",
        killed_after.as_secs_f64(),
        calls_at_kill.values().map(Vec::len).sum::<usize>(),
        restarted_after.as_secs_f64(),
        all.len(),
        of("shipped"),
        of("already_shipped"),
        of("failed"),
        rows.len(),
        rows.iter()
            .filter(|(_, _, r)| r == "already_shipped")
            .count(),
    );
}
