//! Ship-backs to the marketplace (the simulator as the platform, the whole shop running): a
//! ship API failing five times is retried and reported once, a ship-back the platform refuses
//! is dead-lettered and counted, a slow ship API is called with no database transaction open,
//! and the ship-back consumer SIGKILLed mid-run and restarted still ships back once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e::fulfilment::{count, metric};
use e2e::marketplace::{Market, SKU};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

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
