//! Failure isolation end to end (guarantee 5): events that cannot be sent are parked durably, hold
//! back only their aggregate, survive a SIGKILL of the leader and a takeover, and are resolved by
//! the operator's commands (`blocked`, `redrive`, `discard`) with every aggregate in `id` order.

use std::collections::HashMap;
use std::time::Duration;

use e2e::proc::{metric_series, metric_value, relay_cli, RelayArgs, RelayProcess};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::{lease_holder, ops, published, Ledger};

async fn outbox_ids(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT aggregate_id, id FROM outbox ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap_or_default()
}

async fn dump(brokers: &str, topic: &str) -> Vec<e2e::verify::Record> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || e2e::verify::dump(&brokers, &[topic]))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_poisons_are_parked_survive_a_takeover_and_are_resolved_by_the_operator() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let mut ledger = Ledger::default();

    // 5 000 events over 200 aggregates; three poisons in the middle, each followed by more
    // events of its aggregate.
    let big = format!("{{\"blob\":\"{}\"}}", "x".repeat(1_200_000));
    let mut poison = HashMap::new();
    for i in 0..5_000 {
        let agg = format!("agg-{}", i % 200);
        let (headers, payload, t) = match i {
            1_007 => (r#"{"x": 1e400}"#, format!("{{\"n\":{i}}}"), None),
            2_008 => ("{}", format!("{{\"n\":{i}}}"), Some("no such topic!")),
            3_009 => ("{}", big.clone(), None),
            _ => ("{}", format!("{{\"n\":{i}}}"), None),
        };
        let (id, event_id) = ledger.put(&db.pool, &agg, &payload, headers, t).await;
        if matches!(i, 1_007 | 2_008 | 3_009) {
            poison.insert(i % 200, (id, event_id));
        }
    }
    let (undecodable, bad_topic, too_large) = (poison[&7], poison[&8], poison[&9]);

    let relay_args = |name: &str| {
        let mut a = RelayArgs::new(&db.url, &brokers, &prefix, name);
        a.extra = ["--batch-size", "700", "--lease-ttl-ms", "1500"]
            .map(String::from)
            .to_vec();
        a
    };
    let mut leader = RelayProcess::start(&relay_args("park-a"));
    e2e::wait_for("park-a to lead", Duration::from_secs(30), || async {
        lease_holder(&db.pool).await.filter(|(h, _)| h == "park-a")
    })
    .await;
    let standby = RelayProcess::start(&relay_args("park-b"));

    // Every other aggregate drains; the three poisoned ones keep the poison and what follows.
    let held = |agg: &str| ["agg-7", "agg-8", "agg-9"].contains(&agg);
    let left = e2e::wait_for(
        "every healthy aggregate to drain",
        Duration::from_secs(120),
        || async {
            let ids = outbox_ids(&db.pool).await;
            (!ids.is_empty() && ids.iter().all(|(a, _)| held(a))).then_some(ids)
        },
    )
    .await;
    for (agg, (first, _)) in [
        ("agg-7", undecodable),
        ("agg-8", bad_topic),
        ("agg-9", too_large),
    ] {
        let mine: Vec<i64> = left
            .iter()
            .filter(|(a, _)| a == agg)
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(
            mine[0], first,
            "{agg}: the poison is its oldest unpublished event"
        );
        assert!(mine.len() > 1, "{agg}: later events wait behind it");
    }

    let (code, blocked) = ops(&["blocked"], &db.url);
    assert_eq!(code, 0);
    assert_eq!(blocked["parked"], 3, "{blocked}");
    let classes: HashMap<String, String> = blocked["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["state"], "parked");
            assert!(e["waiting_behind"].as_i64().unwrap() > 0, "{e}");
            (
                e["aggregate_id"].as_str().unwrap().to_owned(),
                e["error_class"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(classes["agg-7"], "undecodable");
    assert_eq!(classes["agg-8"], "invalid_topic");
    assert_eq!(classes["agg-9"], "refused");
    let (_, status) = ops(&["status"], &db.url);
    assert_eq!(status["parked_events"], 3, "{status}");
    assert_eq!(status["blocked_aggregates"], 3, "{status}");

    // Parking is the relay working as designed: healthy, and visible in the metrics.
    assert!(
        e2e::proc::http_get(&leader.metrics_addr, "/healthz")
            .await
            .is_some(),
        "/healthz stays 200 while events are parked"
    );
    e2e::wait_for("the parked gauge", Duration::from_secs(20), || async {
        let m = leader.metrics().await?;
        (metric_series(&m, "outbox_parked_events{class=\"undecodable\"}") == Some(1.0)
            && metric_value(&m, "outbox_blocked_aggregates") == Some(3.0))
        .then_some(())
    })
    .await;

    // SIGKILL the leader: the standby takes over and does not retry the parked events.
    let before: Vec<(i64, i32, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT outbox_id, attempts, last_failed_at FROM outbox_failure ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(before.len(), 3);
    leader.kill();
    e2e::wait_for("park-b to take over", Duration::from_secs(15), || async {
        lease_holder(&db.pool).await.filter(|(h, _)| h == "park-b")
    })
    .await;
    ledger
        .put(&db.pool, "agg-100", r#"{"after":"takeover"}"#, "{}", None)
        .await;
    e2e::wait_for("park-b to publish", Duration::from_secs(30), || async {
        (published(&standby).await >= 1.0).then_some(())
    })
    .await;
    let after: Vec<(i64, i32, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT outbox_id, attempts, last_failed_at FROM outbox_failure ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(before, after, "the new leader does not retry parked events");
    assert_eq!(
        outbox_ids(&db.pool).await.len(),
        left.len(),
        "nothing behind a parked event was sent"
    );

    // The operator: fixes one row and redrives it, discards one, fixes the topic of the third
    // and redrives its aggregate.
    sqlx::query("UPDATE outbox SET headers = '{\"x\": 1}' WHERE id = $1")
        .bind(undecodable.0)
        .execute(&db.pool)
        .await
        .unwrap();
    let (code, r) = ops(
        &["redrive", "--event-id", &undecodable.1.to_string()],
        &db.url,
    );
    assert_eq!((code, r["redriven"].as_i64()), (0, Some(1)), "{r}");
    let out = relay_cli(&[
        "discard",
        "--database-url",
        &db.url,
        "--event-id",
        &too_large.1.to_string(),
        "--reason",
        "payload over the broker limit; re-sent by the order team",
        "--by",
        "ops-test",
    ]);
    assert!(out.status.success(), "{out:?}");
    ledger.events.remove(&too_large.1);
    sqlx::query("UPDATE outbox SET topic = NULL WHERE id = $1")
        .bind(bad_topic.0)
        .execute(&db.pool)
        .await
        .unwrap();
    let (code, r) = ops(&["redrive", "--aggregate", "order:agg-8"], &db.url);
    assert_eq!((code, r["redriven"].as_i64()), (0, Some(1)), "{r}");
    // Nothing left to act on: a clear non-zero exit.
    let (code, _) = ops(
        &["redrive", "--event-id", &Uuid::new_v4().to_string()],
        &db.url,
    );
    assert_eq!(code, 2);
    let (code, r) = ops(
        &[
            "discard",
            "--event-id",
            &Uuid::new_v4().to_string(),
            "--reason",
            "x",
        ],
        &db.url,
    );
    assert_eq!((code, r["result"].as_str()), (2, Some("not_found")));

    e2e::wait_for("everything to drain", Duration::from_secs(60), || async {
        outbox_ids(&db.pool).await.is_empty().then_some(())
    })
    .await;
    let audit: (String, String, String, i64) = sqlx::query_as(
        "SELECT reason, discarded_by, error_class, octet_length(payload::text)::bigint FROM outbox_discarded WHERE event_id = $1",
    )
    .bind(too_large.1)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(audit.1, "ops-test");
    assert_eq!(audit.2, "refused");
    assert!(audit.0.starts_with("payload over") && audit.3 > 1_000_000);

    let records = dump(&brokers, &topic).await;
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty(), "order violations: {violations:?}");
    assert!(missing.is_empty(), "{} events missing", missing.len());
    assert!(
        !records
            .iter()
            .any(|r| r.headers.get("event_id") == Some(&too_large.1.to_string())),
        "the discarded event was never sent"
    );
    eprintln!(
        "parking: {} events delivered in order; 3 parked, 1 fixed+redriven, 1 discarded, 1 re-routed+redriven",
        ledger.events.len()
    );
}

/// Inserts `n` events in one statement: aggregate `{prefix}{i % aggregates}`, and when
/// `poison_every` is set, every that-many-th row is undecodable (or, alternately, has an
/// invalid topic). Returns the number of healthy events.
async fn bulk(pool: &PgPool, n: i64, aggregates: i64, poisoned_aggregates: i64) -> i64 {
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'h-' || (g % $2), 'E', jsonb_build_object('n', g) \
         FROM generate_series(1, $1) g",
    )
    .bind(n)
    .bind(aggregates)
    .execute(pool)
    .await
    .unwrap();
    if poisoned_aggregates > 0 {
        // Each poisoned aggregate: a poison, then two events that must wait behind it,
        // interleaved with the healthy stream.
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic) \
             SELECT 'order', 'p-' || (g % $1), 'E', jsonb_build_object('n', g), \
                    CASE WHEN g <= $1 AND g % 2 = 0 THEN '{\"x\": 1e400}'::jsonb ELSE '{}' END, \
                    CASE WHEN g <= $1 AND g % 2 = 1 THEN 'bad topic!' END \
             FROM generate_series(1, 3 * $1) g",
        )
        .bind(poisoned_aggregates)
        .execute(pool)
        .await
        .unwrap();
    }
    n
}

/// The functional half of the poison storm; the drain rate with and without the poisons is a
/// `relay-bench` phase (`isolation`), not a pass/fail threshold here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_poisoned_aggregates_hold_back_only_their_own_events() {
    let brokers = e2e::kafka_brokers();
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let poisoned = 2_000;
    // The poisons come first, so every batch meets them.
    bulk(&db.pool, 0, 1, poisoned).await;
    let healthy = bulk(&db.pool, 50_000, 4_000, 0).await;
    let relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "storm"));
    e2e::wait_for(
        "the healthy events to drain",
        Duration::from_secs(180),
        || async { (published(&relay).await >= healthy as f64).then_some(()) },
    )
    .await;
    let parked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_failure WHERE parked_at IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(parked, poisoned, "every poison is parked");
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'p-%'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        waiting,
        3 * poisoned,
        "every poisoned aggregate's events wait"
    );

    // What reached the broker: every healthy event, none of a poisoned aggregate.
    let records = dump(&brokers, &topic).await;
    let mut healthy_ids = std::collections::HashSet::new();
    for r in &records {
        let key = r.key.as_deref().unwrap_or_default();
        assert!(
            key.starts_with("h-"),
            "an event of a poisoned aggregate reached the broker: {key}"
        );
        healthy_ids.insert(r.headers.get("event_id").cloned().unwrap_or_default());
    }
    assert_eq!(
        healthy_ids.len() as i64,
        healthy,
        "every healthy event is on the broker"
    );
}
