//! Helpers shared by the test modules.

use std::time::Duration;

use e2e::stream::Written;
use e2e::verify::{check, dump, Report};
use sqlx::PgPool;

pub const AGGREGATE_TYPE: &str = "order";

/// Waits (with a deadline) until the outbox is empty, i.e. every committed row was
/// acknowledged and marked, then reads the topic with kafka-python and compares.
pub async fn drain_and_check(
    pool: &PgPool,
    brokers: &str,
    prefix: &str,
    written: &Written,
    deadline: Duration,
) -> Report {
    e2e::wait_for("the outbox to drain", deadline, || async {
        matches!(e2e::db::backlog(pool).await, Ok(0)).then_some(())
    })
    .await;
    let topic = format!("{prefix}{AGGREGATE_TYPE}");
    let brokers = brokers.to_owned();
    let records = tokio::task::spawn_blocking(move || dump(&brokers, &[topic]))
        .await
        .unwrap();
    let report = check(written, &records, AGGREGATE_TYPE);
    eprintln!(
        "broker check: {} messages, {} of {} committed events delivered, {} duplicates, {} missing, \
         {} rolled-back found, {} order violations, {} header errors, {} unknown-outcome events",
        report.messages,
        report.delivered,
        written.committed.len(),
        report.duplicates,
        report.missing.len(),
        report.rolled_back_found.len(),
        report.order_violations.len(),
        report.header_errors.len(),
        written.unknown.len(),
    );
    assert!(
        report.order_violations.len() < 20,
        "order violations: {:?}",
        report.order_violations
    );
    assert!(
        report.header_errors.len() < 20,
        "header errors: {:?}",
        &report.header_errors[..report.header_errors.len().min(10)]
    );
    assert!(
        report.is_clean(),
        "broker does not match the committed stream: {report:?}"
    );
    report
}

/// Published count reported by a relay's `/metrics` (0 when unreachable).
pub async fn published(relay: &e2e::proc::RelayProcess) -> f64 {
    relay
        .metrics()
        .await
        .and_then(|m| e2e::proc::metric_value(&m, "outbox_events_published_total"))
        .unwrap_or(0.0)
}

/// Current lease holder and epoch.
pub async fn lease_holder(pool: &PgPool) -> Option<(String, i64)> {
    sqlx::query_as("SELECT holder, epoch FROM outbox_relay_lease WHERE name = 'default' AND expires_at > now()")
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
}

/// Waits (deadline 60 s) until `relay` has published at least `n` events.
pub async fn wait_published(relay: &e2e::proc::RelayProcess, n: f64) {
    e2e::wait_for("the relay to publish", Duration::from_secs(60), || async {
        (published(relay).await >= n).then_some(())
    })
    .await;
}

/// Checks every 250 ms for `outage` that the relay process is still running.
pub async fn assert_stays_up(relay: &mut e2e::proc::RelayProcess, outage: Duration, what: &str) {
    let end = tokio::time::Instant::now() + outage;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while tokio::time::Instant::now() < end {
        tick.tick().await;
        assert!(relay.is_running(), "the relay must survive {what}");
    }
}

/// `max.message.bytes` of [`topic_refusing_poison`]'s topic: far above any record batch of
/// small events (librdkafka's `batch.size` is 1 000 000 bytes before lz4), far below a
/// [`poison_payload`] after compression.
pub const POISON_TOPIC_MAX_BYTES: usize = 512 * 1024;

/// Creates `<prefix>order` on the shared broker with `max.message.bytes` at
/// [`POISON_TOPIC_MAX_BYTES`], and returns the brokers: Apache Kafka refuses, as a whole, every
/// record batch holding a [`poison_payload`] (MESSAGE_TOO_LARGE in the produce response, the
/// asynchronous per-batch refusal of a topic-level limit: the healthy events of that batch are
/// refused with it).
pub fn topic_refusing_poison(prefix: &str) -> String {
    let brokers = e2e::kafka_brokers();
    let limit = format!("max.message.bytes={POISON_TOPIC_MAX_BYTES}");
    e2e::audit::create_topics_with(
        &brokers,
        6,
        &[&limit],
        &[&format!("{prefix}{AGGREGATE_TYPE}")],
    );
    brokers
}

/// A payload the topic of [`topic_refusing_poison`] refuses: 900 000 characters of random
/// base64 (under librdkafka's own 1 000 000-byte `message.max.bytes`, so the producer takes it;
/// lz4 leaves ~675 000 bytes, over the topic's limit, so the broker does not).
pub fn poison_payload(n: usize) -> serde_json::Value {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut noise = String::with_capacity(900_000);
    for _ in 0..900_000 {
        noise.push(B64[rand::random::<usize>() % 64] as char);
    }
    serde_json::json!({"poison": true, "noise": noise, "n": n})
}

/// Creates `<prefix>order` the way a deployment would: a first relay publishes one event
/// (recorded in `ledger`) and stops, so the test's own relay finds the topic.
pub async fn create_topic_by_publishing(
    db: &e2e::db::TestDb,
    brokers: &str,
    prefix: &str,
    ledger: &mut crate::parking::Ledger,
) {
    let mut warm = e2e::proc::RelayProcess::start(&e2e::proc::RelayArgs::new(
        &db.url, brokers, prefix, "warm",
    ));
    ledger.put(&db.pool, "warm", "{}", "{}", None).await;
    e2e::wait_for("the topic to exist", Duration::from_secs(60), || async {
        (e2e::db::backlog(&db.pool).await.ok()? == 0).then_some(())
    })
    .await;
    warm.terminate(Duration::from_secs(10));
}

/// A consumer runtime's settings for tests: consumer `name` in group `<topic>-<name>` on
/// `topic` (created with `partitions`), a 6 s session (a restarted member is assigned soon),
/// fast retries, 3 attempts for errors that come back every time.
pub fn runtime_config(
    name: &str,
    topic: &str,
    partitions: i32,
    queue_capacity: usize,
) -> outbox_kit::consumer::RuntimeConfig {
    outbox_kit::consumer::RuntimeConfig {
        consumer_name: name.into(),
        brokers: e2e::kafka_brokers(),
        group_id: format!("{topic}-{name}"),
        topics: vec![topic.to_owned()],
        client_config: vec![("session.timeout.ms".into(), "6000".into())].into(),
        create_topics: Some(outbox_kit::consumer::TopicSpec {
            partitions,
            replication_factor: Some(1),
        }),
        retry: outbox_kit::consumer::RetryPolicy {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        max_attempts_deterministic: 3,
        shutdown_timeout: Duration::from_secs(10),
        queue_capacity,
        inbox_retention: None,
        purge: Default::default(),
    }
}
