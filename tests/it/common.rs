//! Helpers shared by the test modules: draining an outbox and checking the broker against what
//! was written, a relay's counts and the lease, topics that refuse poisons, a ledger of events
//! written with plain SQL and the operator's commands.

use std::collections::HashMap;
use std::time::Duration;

use e2e::proc::relay_cli;
use e2e::stream::Written;
use e2e::verify::{check, dump, dump_committed, Report};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

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

/// The value of `series` in a relay's `/metrics` (0 when unreachable or not exported yet).
pub async fn relay_metric(relay: &e2e::proc::RelayProcess, series: &str) -> f64 {
    relay
        .metrics()
        .await
        .and_then(|m| e2e::proc::metric_value(&m, series))
        .unwrap_or(0.0)
}

/// Published count reported by a relay's `/metrics` (0 when unreachable).
pub async fn published(relay: &e2e::proc::RelayProcess) -> f64 {
    relay_metric(relay, "outbox_events_published_total").await
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
    ledger: &mut Ledger,
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
) -> outbox_consumer::RuntimeConfig {
    outbox_consumer::RuntimeConfig {
        consumer_name: name.into(),
        brokers: e2e::kafka_brokers(),
        group_id: format!("{topic}-{name}"),
        topics: vec![topic.to_owned()],
        client_config: vec![("session.timeout.ms".into(), "6000".into())].into(),
        create_topics: Some(outbox_consumer::TopicSpec {
            partitions,
            replication_factor: Some(1),
        }),
        retry: outbox_consumer::RetryPolicy {
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

/// What the test wrote: event id → (aggregate, outbox id).
#[derive(Debug, Default)]
pub struct Ledger {
    pub events: HashMap<Uuid, (String, i64)>,
}

impl Ledger {
    /// Inserts one event with plain SQL (like a producer in any language would).
    pub async fn put(
        &mut self,
        pool: &PgPool,
        aggregate: &str,
        payload: &str,
        headers: &str,
        topic: Option<&str>,
    ) -> (i64, Uuid) {
        let (id, event_id): (i64, Uuid) = sqlx::query_as(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic) \
             VALUES ('order', $1, 'E', $2::jsonb, $3::jsonb, $4) RETURNING id, event_id",
        )
        .bind(aggregate)
        .bind(payload)
        .bind(headers)
        .bind(topic)
        .fetch_one(pool)
        .await
        .unwrap();
        self.events.insert(event_id, (aggregate.to_owned(), id));
        (id, event_id)
    }

    /// First occurrences on the broker out of `id` order, per aggregate; events missing.
    pub fn check(&self, records: &[e2e::verify::Record]) -> (Vec<String>, Vec<Uuid>) {
        let mut sorted: Vec<&e2e::verify::Record> = records.iter().collect();
        sorted.sort_by_key(|r| (r.topic.clone(), r.partition, r.offset));
        let mut seen = std::collections::HashSet::new();
        let mut last: HashMap<&str, i64> = HashMap::new();
        let mut violations = Vec::new();
        for r in sorted {
            let Some(id) = r
                .headers
                .get("event_id")
                .and_then(|s| Uuid::parse_str(s).ok())
            else {
                continue;
            };
            let Some((agg, outbox_id)) = self.events.get(&id) else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            let l = last.entry(agg.as_str()).or_default();
            if *outbox_id < *l {
                violations.push(format!("{agg}: id {outbox_id} after {l}"));
            }
            *l = (*l).max(*outbox_id);
        }
        let missing = self
            .events
            .keys()
            .filter(|e| !seen.contains(*e))
            .copied()
            .collect();
        (violations, missing)
    }
}

/// A fresh database and `<prefix>order`, a topic that refuses poisons
/// ([`topic_refusing_poison`]), created the way a deployment would
/// ([`create_topic_by_publishing`], the event it publishes in `ledger`).
pub struct PoisonTopic {
    pub prefix: String,
    pub topic: String,
    pub brokers: String,
    pub db: e2e::db::TestDb,
    pub ledger: Ledger,
}

impl PoisonTopic {
    pub async fn new() -> Self {
        let prefix = e2e::unique_topic_prefix();
        let topic = format!("{prefix}{AGGREGATE_TYPE}");
        let brokers = topic_refusing_poison(&prefix);
        let db = e2e::db::fresh_database().await;
        let mut ledger = Ledger::default();
        create_topic_by_publishing(&db, &brokers, &prefix, &mut ledger).await;
        Self {
            prefix,
            topic,
            brokers,
            db,
            ledger,
        }
    }

    /// Writes `n` events of `aggregates` aggregates (`a-<i % aggregates>`), the one at
    /// `poison_at` a poison ([`poison_payload`]); returns the poison's aggregate and outbox id.
    pub async fn put_with_poison(
        &mut self,
        n: usize,
        aggregates: usize,
        poison_at: usize,
    ) -> (String, i64) {
        let mut poison = None;
        for i in 0..n {
            let agg = format!("a-{}", i % aggregates);
            let payload = if i == poison_at {
                poison_payload(i)
            } else {
                serde_json::json!({"n": i})
            };
            let (id, _) = self
                .ledger
                .put(&self.db.pool, &agg, &payload.to_string(), "{}", None)
                .await;
            if i == poison_at {
                poison = Some((agg, id));
            }
        }
        poison.expect("the poison is among the events")
    }
}

/// Waits (up to `deadline`) until the outbox holds only `poison`'s aggregate, the poison
/// (`(aggregate, outbox id)`) first: every other aggregate drained.
pub async fn wait_drained_but(pool: &PgPool, poison: (&str, i64), deadline: Duration) {
    e2e::wait_for(
        "everything but the poisoned aggregate to drain",
        deadline,
        || async {
            let left: Vec<(String, i64)> =
                sqlx::query_as("SELECT aggregate_id, id FROM outbox ORDER BY id")
                    .fetch_all(pool)
                    .await
                    .ok()?;
            (!left.is_empty() && left.iter().all(|(a, _)| a == poison.0) && left[0].1 == poison.1)
                .then_some(())
        },
    )
    .await;
}

/// Reads `topic` back and checks it against `ledger`: first occurrences in `id` order per
/// aggregate, and exactly the events still in the outbox missing (none of them may be there
/// before the event that holds them back). Returns how many messages the topic holds and how
/// many events the outbox.
pub async fn check_all_but_the_outbox(
    pool: &PgPool,
    brokers: &str,
    topic: &str,
    ledger: &Ledger,
) -> (usize, usize) {
    let records = {
        let (b, t) = (brokers.to_owned(), topic.to_owned());
        tokio::task::spawn_blocking(move || dump(&b, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(
        violations.is_empty(),
        "first-occurrence order violated: {violations:?}"
    );
    let behind: std::collections::BTreeSet<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(
        missing
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>(),
        behind,
        "exactly the events still in the outbox are not on the broker"
    );
    (records.len(), behind.len())
}

/// Runs an operator command with `--json`; returns its exit code and parsed output.
pub fn ops(args: &[&str], url: &str) -> (i32, Value) {
    let mut argv = args.to_vec();
    argv.extend(["--database-url", url, "--json"]);
    let out = relay_cli(&argv);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// `d` in seconds with one decimal, for the tests' timing lines.
pub fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Five events `{"n": i}` of type `event_type` for aggregates `aggregate(i)`, in one
/// transaction on `db`.
pub async fn write_five_events(
    db: &e2e::db::TestDb,
    aggregate: impl Fn(usize) -> String,
    event_type: &str,
) {
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..5 {
        let payload = serde_json::json!({"n": i});
        outbox_writer::enqueue(
            &mut *tx,
            &outbox_writer::NewEvent::new("order", &aggregate(i), event_type, &payload),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Starts a relay with `args` that should stop by itself (`what`); its log once it has.
pub async fn relay_stopped(args: &e2e::proc::RelayArgs, what: &str) -> String {
    let mut relay = e2e::proc::RelayProcess::start(args);
    e2e::wait_for(what, Duration::from_secs(60), || {
        let running = relay.is_running();
        async move { (!running).then_some(()) }
    })
    .await;
    relay.log_text()
}

/// The `n` of each record's JSON value, in the order read (what `write_five_events` and the
/// secured tests' writers put there).
pub fn numbers(records: &[e2e::verify::Record]) -> Vec<i64> {
    records
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect()
}

/// Waits until the order service at `base` (`http://host:port`) answers `/healthz`, then stocks
/// `sku-1` ("Lamp", 25.00) as the operator.
pub async fn serving_with_a_lamp(http: &reqwest::Client, base: &str) {
    wait_serving(http, base).await;
    let put = http
        .put(format!("{base}/skus/sku-1"))
        .bearer_auth(e2e::auth::operator())
        .json(&serde_json::json!({"name": "Lamp", "price_cents": 2500}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "PUT /skus: {}", put.status());
}

/// Waits until the order service at `base` answers `/healthz`.
pub async fn wait_serving(http: &reqwest::Client, base: &str) {
    e2e::wait_for(
        "the order service to serve",
        Duration::from_secs(30),
        || async {
            http.get(format!("{base}/healthz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        },
    )
    .await;
}

/// Reads the topic `read_committed` and checks it against `written`: every committed event,
/// first occurrences in commit order.
pub async fn check_committed(brokers: &str, prefix: &str, written: &Written) -> Report {
    let topic = format!("{prefix}{AGGREGATE_TYPE}");
    let brokers = brokers.to_owned();
    let records = tokio::task::spawn_blocking(move || dump_committed(&brokers, &[topic]))
        .await
        .unwrap();
    let report = check(written, &records, AGGREGATE_TYPE);
    assert!(report.is_clean(), "the broker does not match: {report:?}");
    report
}
