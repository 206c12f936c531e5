//! Events of aggregates being retried after a failure are sent alone, to pin a refused record
//! batch on its event; they must never hold back the aggregates that are not suspect
//! (guarantee 5).
//!
//! The suspects are what a refused record batch leaves behind: every event of the batch
//! recorded as `broker_rejected`, to be retried alone at once (seeded here as the relay
//! writes them). Some of them are real culprits that a private broker refuses (a JSON schema
//! on the topic), the others are innocent. A healthy stream on other aggregates must be
//! published while the suspects are still being worked through, each batch sending at most a
//! bounded number alone; in the end every innocent event is on the broker in order, and only
//! the culprits are parked.

use std::time::Duration;

use e2e::proc::{metric_series, metric_value, RelayArgs, RelayProcess};
use serde_json::json;
use sqlx::PgPool;

use crate::common::{ops, Ledger};

const SUSPECTS: usize = 600;
const CULPRITS: usize = 30;
const HEALTHY: usize = 12_000;

async fn retrying(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_failure WHERE parked_at IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Records event `id` as the relay records each event of a record batch the broker refused:
/// `broker_rejected`, to be retried alone at once.
async fn seed_refused(pool: &PgPool, (id, event_id): (i64, uuid::Uuid), aggregate: &str) {
    sqlx::query(
        "INSERT INTO outbox_failure (outbox_id, event_id, aggregate_type, aggregate_id, \
             error_class, error_message, attempts, retry_at) \
         VALUES ($1, $2, 'order', $3, 'broker_rejected', \
                 'delivery failed: Broker: Message size too large', 1, now())",
    )
    .bind(id)
    .bind(event_id)
    .bind(aggregate)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suspects_sent_alone_never_hold_back_the_healthy_aggregates() {
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let brokers = crate::common::topic_refusing_poison(&prefix);
    let db = e2e::db::fresh_database().await;
    let mut ledger = Ledger::default();
    crate::common::create_topic_by_publishing(&db, &brokers, &prefix, &mut ledger).await;

    // The suspects: three events each; the first of each is recorded as part of a refused
    // record batch. The first CULPRITS of them really are refused by the broker.
    for i in 0..SUSPECTS {
        let agg = format!("s-{i}");
        for n in 0..3 {
            let payload = if n == 0 && i < CULPRITS {
                crate::common::poison_payload(i)
            } else {
                json!({"n": n})
            };
            let (id, event_id) = ledger
                .put(&db.pool, &agg, &payload.to_string(), "{}", None)
                .await;
            if n == 0 {
                seed_refused(&db.pool, (id, event_id), &agg).await;
            }
        }
    }
    for i in 0..HEALTHY {
        let agg = format!("h-{}", i % 400);
        ledger
            .put(&db.pool, &agg, &json!({"n": i}).to_string(), "{}", None)
            .await;
    }
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "lone");
    args.extra = ["--batch-size", "2000"].map(String::from).to_vec();
    let relay = RelayProcess::start(&args);

    // Every healthy event is published while suspects still wait for their lone send.
    let still_retrying = e2e::wait_for(
        "every healthy event to be published",
        Duration::from_secs(120),
        || async {
            let healthy_left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'h-%'")
                    .fetch_one(&db.pool)
                    .await
                    .ok()?;
            (healthy_left == 0).then_some(())?;
            Some(retrying(&db.pool).await)
        },
    )
    .await;
    assert!(
        still_retrying > 0,
        "the healthy aggregates drained only once no suspect was left: they waited for the lone sends"
    );

    // Then the suspects: each innocent one published, each culprit parked alone.
    e2e::wait_for(
        "every suspect to be sent alone",
        Duration::from_secs(240),
        || async { (retrying(&db.pool).await == 0).then_some(()) },
    )
    .await;
    let (_, blocked) = ops(&["blocked"], &db.url);
    let events = blocked["events"].as_array().unwrap();
    assert_eq!(
        events.len(),
        CULPRITS,
        "only the culprits are parked: {blocked}"
    );
    for e in events {
        assert_eq!(e["error_class"], "broker_rejected", "{e}");
        assert_eq!(e["state"], "parked", "{e}");
        let agg: usize = e["aggregate_id"].as_str().unwrap()[2..].parse().unwrap();
        assert!(agg < CULPRITS, "an innocent suspect was parked: {e}");
    }
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        waiting,
        3 * CULPRITS as i64,
        "only the culprits and the events behind them are left"
    );

    let records = {
        let (b, t) = (brokers.clone(), topic.clone());
        tokio::task::spawn_blocking(move || e2e::verify::dump(&b, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty(), "order violated: {violations:?}");
    assert_eq!(
        missing.len(),
        3 * CULPRITS,
        "everything but the culprits and what waits behind them is on the broker"
    );

    // Lone sends per batch stay within the bound, and there were lone sends.
    let metrics = relay.metrics().await.expect("relay metrics");
    let batches = metric_value(&metrics, "outbox_batch_lone_sends_count").unwrap();
    let within = metric_series(
        &metrics,
        &format!(
            "outbox_batch_lone_sends_bucket{{le=\"{}\"}}",
            outbox_relay::batch::LONE_SENDS_PER_BATCH
        ),
    )
    .unwrap();
    let sent_alone = metric_value(&metrics, "outbox_batch_lone_sends_sum").unwrap();
    assert!(
        sent_alone >= SUSPECTS as f64,
        "every suspect was sent alone: {sent_alone}"
    );
    assert_eq!(
        within,
        batches,
        "no batch sent more than {} events alone",
        outbox_relay::batch::LONE_SENDS_PER_BATCH
    );
    eprintln!(
        "lone sends: {sent_alone} in {batches} batches; {still_retrying} suspects still waiting when the healthy stream was done"
    );
}

/// Kafka's Produce API key.
const PRODUCE: i16 = 0;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_a_lone_send_to_a_stalled_broker_stops_the_relay_and_releases_the_lease() {
    // A broker behind a proxy that can drop Produce requests: they never get an answer.
    let proxy_port = e2e::free_port();
    let kafka = tokio::task::spawn_blocking(move || e2e::servers::Kafka::start_behind(proxy_port))
        .await
        .unwrap();
    let proxy = e2e::proxy::Proxy::start_kafka(proxy_port, kafka.port).await;
    let brokers = format!("127.0.0.1:{proxy_port}");
    let prefix = e2e::unique_topic_prefix();
    let db = e2e::db::fresh_database().await;
    let mut ledger = Ledger::default();
    crate::common::create_topic_by_publishing(&db, &brokers, &prefix, &mut ledger).await;

    // An event due for a retry after a failure: the next relay sends it alone, and the broker
    // never answers (its Produce requests are dropped from now on).
    let (id, event_id) = ledger.put(&db.pool, "s-1", "{}", "{}", None).await;
    sqlx::query(
        "INSERT INTO outbox_failure (outbox_id, event_id, aggregate_type, aggregate_id, \
             error_class, error_message, attempts, retry_at) \
         VALUES ($1, $2, 'order', 's-1', 'delivery', 'delivery failed', 1, now())",
    )
    .bind(id)
    .bind(event_id)
    .execute(&db.pool)
    .await
    .unwrap();
    proxy.swallow(PRODUCE, 1_000);
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "lone-term");
    args.extra = ["--shutdown-timeout-ms", "2000", "--lease-ttl-ms", "30000"]
        .map(String::from)
        .to_vec();
    let mut relay = RelayProcess::start(&args);
    e2e::wait_for(
        "the lone send's Produce request to be dropped",
        Duration::from_secs(30),
        || async { (proxy.swallowed() > 0).then_some(()) },
    )
    .await;

    let (_, status) = relay
        .terminate(Duration::from_secs(20))
        .expect("the relay exits on SIGTERM while its lone send waits for an answer");
    assert!(status.success(), "exit status {status}");
    let released: bool = sqlx::query_scalar(
        "SELECT expires_at <= now() FROM outbox_relay_lease WHERE name = 'default'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(released, "the lease is released for a standby at once");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "the unacknowledged event stays to be sent again");
}

/// The longest stall `outbox_relay_runtime_stall_seconds` recorded: the smallest bucket bound
/// that holds every observation (`None`: beyond the largest bound, or no metrics).
fn longest_stall(metrics: &str) -> Option<f64> {
    let buckets = test_support::metrics::histogram(metrics, "outbox_relay_runtime_stall_seconds");
    let total = buckets.last()?.1;
    buckets
        .iter()
        .find(|(_, n)| *n == total)
        .map(|(le, _)| *le)
        .filter(|le| le.is_finite())
}

/// Sixteen lone sends refused by the broker in one batch replace the lone producer sixteen
/// times; the relay's single-threaded runtime must not stall on them (the old producers are
/// torn down off it), or the lease's renewals slip.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_producer_replacements_in_one_batch_do_not_stall_the_relay() {
    let prefix = e2e::unique_topic_prefix();
    let brokers = crate::common::topic_refusing_poison(&prefix);
    let db = e2e::db::fresh_database().await;
    let mut ledger = Ledger::default();
    crate::common::create_topic_by_publishing(&db, &brokers, &prefix, &mut ledger).await;
    let culprits = outbox_relay::batch::LONE_SENDS_PER_BATCH;
    for i in 0..culprits {
        let agg = format!("c-{i}");
        let payload = crate::common::poison_payload(i).to_string();
        let (id, event_id) = ledger.put(&db.pool, &agg, &payload, "{}", None).await;
        seed_refused(&db.pool, (id, event_id), &agg).await;
    }
    // The relay that created the topic held the lease before.
    let epoch_before: i64 = sqlx::query_scalar("SELECT epoch FROM outbox_relay_lease")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "replacements");
    args.extra = ["--lease-ttl-ms", "1500"].map(String::from).to_vec();
    let relay = RelayProcess::start(&args);
    e2e::wait_for(
        "every culprit to be parked",
        Duration::from_secs(120),
        || async {
            let parked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox_failure WHERE parked_at IS NOT NULL",
            )
            .fetch_one(&db.pool)
            .await
            .ok()?;
            (parked == culprits as i64).then_some(())
        },
    )
    .await;
    let metrics = relay.metrics().await.expect("the relay's metrics");
    // One batch sent all sixteen alone, each refused: sixteen new lone producers.
    assert_eq!(
        metric_value(&metrics, "outbox_batch_lone_sends_sum"),
        Some(culprits as f64),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "outbox_batch_lone_sends_count"),
        Some(1.0)
    );
    let stall = longest_stall(&metrics);
    eprintln!("longest runtime stall over {culprits} producer replacements: ≤ {stall:?} s");
    // The figure is wall-clock lateness, so on a loaded machine (CI: dozens of tests on two
    // cores) it includes the time the OS did not run the relay at all: 5-10 ms on an idle
    // machine, up to 0.25 s seen in CI. What must hold whatever the load is that no stall
    // approaches the 1.5 s lease (renewed every 500 ms) and that the lease stayed put.
    assert!(
        stall.is_some_and(|s| s <= 1.0),
        "the runtime stalled for up to {stall:?} s (bucket bound) while replacing producers"
    );
    assert_eq!(
        metric_value(&metrics, "outbox_relay_lease_epoch"),
        Some((epoch_before + 1) as f64),
        "the relay took the lease once and kept it"
    );
}

/// How many librdkafka clients (producers, consumers, admin clients) process `pid` runs: one
/// `rdk:main` thread each.
fn kafka_clients(pid: i32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "rdk:main")
        })
        .count()
}

/// Most of the time no event is being retried alone, and an idle producer session still wakes
/// its librdkafka threads every second: the lone producer's session goes once unused for a
/// while. An event retried alone after that starts a new session, initialised under the lease,
/// and is sent alone on it: the culprit of a refused record batch parks with the broker's
/// refusal, every other aggregate drains, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lone_producer_goes_while_unused_and_the_next_retry_starts_it_again() {
    let mut setup = crate::common::PoisonTopic::new().await;
    let s = &setup;
    let relay = RelayProcess::start(&RelayArgs::new(
        &s.db.url,
        &s.brokers,
        &s.prefix,
        "lone-idle",
    ));
    let pid = relay.pid();
    let logged = |line: &'static str| {
        let relay = &relay;
        move || async move { relay.log_text().contains(line).then_some(()) }
    };
    e2e::wait_for(
        "the relay to lead the bucket",
        Duration::from_secs(60),
        logged("Acquired the relay lease"),
    )
    .await;
    // Both producers of the bucket run (its batches' and the lone sends'): until the lone one
    // has gone unused for twice the longest delay between two retries (120 s).
    e2e::wait_for(
        "the bucket's two producers",
        Duration::from_secs(30),
        || async { (kafka_clients(pid) >= 2).then_some(()) },
    )
    .await;
    e2e::wait_for(
        "the unused lone producer's session to go",
        Duration::from_secs(300),
        logged("Retiring the lone Kafka producer's session"),
    )
    .await;
    e2e::wait_for(
        "one librdkafka client left in the relay",
        Duration::from_secs(30),
        || async { (kafka_clients(pid) == 1).then_some(()) },
    )
    .await;

    // 300 events of 30 aggregates, one of them too large for the topic: it fails in its
    // batch, and is retried alone.
    let poison = setup.put_with_poison(300, 30, 150).await;
    let s = &setup;
    crate::common::wait_drained_but(&s.db.pool, (&poison.0, poison.1), Duration::from_secs(300))
        .await;
    let (_, blocked) = ops(&["blocked"], &s.db.url);
    let events = blocked["events"].as_array().unwrap();
    assert_eq!(
        events.len(),
        1,
        "only the refused event is parked: {blocked}"
    );
    assert_eq!(
        events[0]["error_class"], "broker_rejected",
        "parked on the broker's answer to its lone send: {blocked}"
    );
    let log = relay.log_text();
    let retired = log
        .find("Retiring the lone Kafka producer's session")
        .expect("the relay logs the lone session's end");
    assert!(
        log[retired..].contains("Sending an event alone"),
        "an event was sent alone after the lone session went"
    );
    crate::common::check_all_but_the_outbox(&s.db.pool, &s.brokers, &s.topic, &s.ledger).await;
}
