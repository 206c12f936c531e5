//! The consumer runtime in this process (`outbox_consumer::run`) with a probe handler, on
//! a fresh database and the shared broker: handler panics and errors that come back on every
//! attempt are dead-lettered after bounded attempts while everything else flows; a partition
//! stuck on retries is paused and holds back only itself (and its lag, `consumer_lag_messages`,
//! shows it); SIGTERM commits the offset of the
//! message it just finished; a worker that panics outside the handler is restarted and its
//! partition applied without a gap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use e2e::fulfilment::count;
use e2e::verify::dump;
use outbox_consumer::{ConsumerMetrics, Effect, Event, Handler, HandlerError, RuntimeConfig};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::ClientConfig;
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const PARTITIONS: i32 = 3;
const MAX_ATTEMPTS: u32 = 3;

/// Armed until a [`TrapError`] is formatted once.
static TRAP_ARMED: AtomicBool = AtomicBool::new(true);

/// An error whose message panics the first time it is formatted. The runtime formats a
/// handler's error in the worker task itself (the retry's log line, the dead letter's
/// `dlq.error`), outside the `catch_unwind` that contains the handler: so this panics the
/// worker, as a bug in the runtime's own code would.
#[derive(Debug)]
struct TrapError;

impl std::fmt::Display for TrapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if TRAP_ARMED.swap(false, Ordering::SeqCst) {
            panic!("formatting the trap error panicked");
        }
        f.write_str("trap error")
    }
}

impl std::error::Error for TrapError {}

/// Applies `Probe` events: records `(key, n)` in `applied`; the payload's `mode` says how to
/// fail instead (`trap`: fail with a [`TrapError`] until one was formatted, then apply).
struct Probe;

impl Handler for Probe {
    fn versions(&self, event_type: &str) -> Option<&'static [u32]> {
        (event_type == "Probe").then_some(&[1])
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let key = event.payload["key"].as_str().unwrap_or_default().to_owned();
        match event.payload["mode"].as_str().unwrap_or("ok") {
            "panic" => panic!("probe panic on {key}"),
            "row_not_found" => {
                sqlx::query("SELECT 1 FROM flags WHERE name = 'never set'")
                    .fetch_one(&mut *conn)
                    .await?;
            }
            "decode" => {
                sqlx::query_scalar::<_, i64>("SELECT 'not a number'::text")
                    .fetch_one(&mut *conn)
                    .await?;
            }
            "stuck" => {
                let unstuck: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM flags WHERE name = 'unstuck')",
                )
                .fetch_one(&mut *conn)
                .await?;
                if !unstuck {
                    return Err(HandlerError::Transient(
                        "waiting for the unstuck flag".into(),
                    ));
                }
            }
            "trap" if TRAP_ARMED.load(Ordering::SeqCst) => {
                return Err(HandlerError::Database(sqlx::Error::Decode(Box::new(
                    TrapError,
                ))));
            }
            "slow" => {
                sqlx::query("SELECT pg_sleep(1.5)")
                    .execute(&mut *conn)
                    .await?;
            }
            _ => {}
        }
        sqlx::query("INSERT INTO applied (key, n, event_id) VALUES ($1, $2, $3)")
            .bind(&key)
            .bind(event.payload["n"].as_i64().unwrap_or(0))
            .bind(event.event_id())
            .execute(&mut *conn)
            .await?;
        Ok(Effect::Changed)
    }
}

/// A test's database, topic and producer.
struct Rig {
    pool: PgPool,
    brokers: String,
    topic: String,
    producer: FutureProducer,
}

impl Rig {
    async fn new() -> Self {
        let db = e2e::db::fresh_database().await;
        outbox_writer::schema::migrate_inbox(&db.pool)
            .await
            .unwrap();
        for ddl in [
            "CREATE TABLE applied (seq bigserial PRIMARY KEY, key text NOT NULL, n bigint NOT NULL, event_id uuid NOT NULL)",
            "CREATE TABLE flags (name text PRIMARY KEY)",
        ] {
            sqlx::query(ddl).execute(&db.pool).await.unwrap();
        }
        let brokers = e2e::kafka_brokers();
        let producer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .set("enable.metrics.push", "false")
            .create()
            .unwrap();
        Self {
            pool: db.pool,
            brokers,
            topic: format!("{}probe", e2e::unique_topic_prefix()),
            producer,
        }
    }

    fn config(&self, queue_capacity: usize) -> RuntimeConfig {
        RuntimeConfig {
            group_id: format!("{}-group", self.topic),
            max_attempts_deterministic: MAX_ATTEMPTS,
            ..crate::common::runtime_config("probe", &self.topic, PARTITIONS, queue_capacity)
        }
    }

    /// Starts a runtime and waits until it has every partition (of the topic and of its redrive
    /// topic).
    async fn start(&self, queue_capacity: usize) -> Running {
        let registry = prometheus::Registry::new();
        let metrics = ConsumerMetrics::register(&registry, "probe").unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(outbox_consumer::run(
            self.config(queue_capacity),
            self.pool.clone(),
            Arc::new(Probe),
            metrics.clone(),
            shutdown.clone(),
        ));
        e2e::wait_for(
            "the runtime to be assigned every partition",
            Duration::from_secs(60),
            || async {
                (metrics.assigned_partitions.get() == 2 * i64::from(PARTITIONS)).then_some(())
            },
        )
        .await;
        Running {
            registry,
            metrics,
            shutdown,
            task,
        }
    }

    /// Produces a `Probe` event to `partition`, waiting for the broker's ack; returns its id.
    async fn send(&self, partition: i32, key: &str, n: i64, mode: &str) -> Uuid {
        let id = Uuid::new_v4();
        let value = json!({"key": key, "n": n, "mode": mode}).to_string();
        self.send_raw(partition, key, &value, Some(id)).await;
        id
    }

    async fn send_raw(&self, partition: i32, key: &str, value: &str, id: Option<Uuid>) {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "event_type",
            value: Some("Probe"),
        });
        if let Some(id) = id {
            headers = headers.insert(Header {
                key: "event_id",
                value: Some(&id.to_string()),
            });
        }
        let record = FutureRecord::to(&self.topic)
            .partition(partition)
            .key(key)
            .payload(value)
            .headers(headers);
        self.producer
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    async fn applied_ns(&self, key: &str) -> Vec<i64> {
        sqlx::query_scalar("SELECT n FROM applied WHERE key = $1 ORDER BY seq")
            .bind(key)
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    async fn applied(&self) -> i64 {
        count(&self.pool, "SELECT count(*) FROM applied").await
    }
}

/// A runtime running in this process.
struct Running {
    registry: prometheus::Registry,
    metrics: ConsumerMetrics,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), outbox_consumer::ConsumerError>>,
}

impl Running {
    fn dead_lettered(&self) -> u64 {
        self.metrics
            .messages
            .with_label_values(&["dead_lettered"])
            .get()
    }

    /// The metrics as `/metrics` shows them.
    fn metrics_text(&self) -> String {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .unwrap();
        String::from_utf8(buf).unwrap()
    }

    /// SIGTERM, as the binaries do it: cancel, wait for the drain and the final commit.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the runtime stops within 30 s")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panics_undecodable_values_and_missing_rows_are_dead_lettered_after_bounded_attempts() {
    let rig = Rig::new().await;
    let rt = rig.start(16).await;
    // Each partition: a good event, a poison one, good ones behind it.
    rig.send(0, "p0", 1, "ok").await;
    let panicking = rig.send(0, "p0", 2, "panic").await;
    rig.send(0, "p0", 3, "ok").await;
    rig.send(1, "p1", 1, "ok").await;
    let missing_row = rig.send(1, "p1", 2, "row_not_found").await;
    rig.send(1, "p1", 3, "ok").await;
    rig.send(2, "p2", 1, "ok").await;
    let undecodable_value = rig.send(2, "p2", 2, "decode").await;
    rig.send(2, "p2", 3, "ok").await;
    let not_json = Uuid::new_v4();
    rig.send_raw(2, "p2", "not json", Some(not_json)).await;
    rig.send(2, "p2", 5, "ok").await;

    e2e::wait_for(
        "every good event applied and every poison one dead-lettered",
        Duration::from_secs(60),
        || async { (rig.applied().await == 7 && rt.dead_lettered() == 4).then_some(()) },
    )
    .await;
    assert_eq!(
        rig.applied_ns("p0").await,
        [1, 3],
        "the partition went on after the panic"
    );
    assert_eq!(rig.applied_ns("p1").await, [1, 3]);
    assert_eq!(rig.applied_ns("p2").await, [1, 3, 5]);
    assert_eq!(
        count(&rig.pool, "SELECT count(*) FROM inbox").await,
        7,
        "dead letters leave no inbox row"
    );
    assert_eq!(
        rt.metrics.handler_panics.get(),
        u64::from(MAX_ATTEMPTS),
        "the panicking event was attempted a bounded number of times"
    );
    let by_reason = |r: &str| rt.metrics.dead_letters.with_label_values(&[r]).get();
    assert_eq!(
        (
            by_reason("handler_panic"),
            by_reason("retries_exhausted"),
            by_reason("undecodable")
        ),
        (1, 2, 1)
    );

    let dlq = format!("{}.dlq", rig.topic);
    let records = tokio::task::spawn_blocking({
        let brokers = rig.brokers.clone();
        move || dump(&brokers, &[dlq])
    })
    .await
    .unwrap();
    let mut seen: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            let h = |k: &str| r.headers.get(k).cloned().unwrap_or_default();
            assert_eq!(h("dlq.source.topic"), rig.topic, "{r:?}");
            assert_eq!(h("dlq.consumer"), "probe", "{r:?}");
            (h("event_id"), h("dlq.reason"), h("dlq.error"))
        })
        .collect();
    seen.sort();
    let mut expected = vec![
        (panicking, "handler_panic", "probe panic on p0"),
        (missing_row, "retries_exhausted", "no rows returned"),
        (undecodable_value, "retries_exhausted", "mismatched types"),
        (not_json, "undecodable", "undecodable payload"),
    ];
    expected.sort_by_key(|(id, _, _)| id.to_string());
    assert_eq!(seen.len(), expected.len(), "{records:?}");
    for ((id, reason, error), (want_id, want_reason, want_error)) in seen.iter().zip(&expected) {
        assert_eq!(id, &want_id.to_string());
        assert_eq!(reason, want_reason, "{error}");
        assert!(error.contains(want_error), "{reason}: {error}");
    }
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_stuck_retrying_is_paused_and_holds_back_only_itself() {
    let rig = Rig::new().await;
    // A small queue: the stuck partition's messages overflow it quickly.
    let rt = rig.start(2).await;
    rig.send(0, "stuck", 1, "stuck").await;
    for n in 2..=20 {
        rig.send(0, "stuck", n, "ok").await;
    }
    e2e::wait_for(
        "the stuck partition to retry",
        Duration::from_secs(60),
        || async { (rt.metrics.retries.get() >= 2).then_some(()) },
    )
    .await;
    for n in 1..=10 {
        rig.send(1, "free1", n, "ok").await;
        rig.send(2, "free2", n, "ok").await;
    }
    e2e::wait_for(
        "the other partitions applied while one is stuck",
        Duration::from_secs(60),
        || async {
            (rig.applied_ns("free1").await.len() == 10 && rig.applied_ns("free2").await.len() == 10)
                .then_some(())
        },
    )
    .await;
    assert!(rig.applied_ns("stuck").await.is_empty(), "still stuck");
    assert_eq!(
        rt.metrics.paused_partitions.get(),
        1,
        "the stuck partition is paused"
    );
    // The lag gauge shows it: the stuck partition's 20 messages, nothing on the others.
    let lag = |partition: &str| {
        rt.metrics
            .lag
            .with_label_values(&[rig.topic.as_str(), partition])
            .get()
    };
    e2e::wait_for(
        "the lag of the stuck partition to show",
        Duration::from_secs(30),
        || async { (lag("0") == 20 && lag("1") == 0 && lag("2") == 0).then_some(()) },
    )
    .await;

    sqlx::query("INSERT INTO flags (name) VALUES ('unstuck')")
        .execute(&rig.pool)
        .await
        .unwrap();
    e2e::wait_for(
        "the stuck partition to catch up",
        Duration::from_secs(60),
        || async { (rig.applied_ns("stuck").await.len() >= 20).then_some(()) },
    )
    .await;
    e2e::wait_for(
        "the partition to be resumed",
        Duration::from_secs(10),
        || async { (rt.metrics.paused_partitions.get() == 0).then_some(()) },
    )
    .await;
    e2e::wait_for(
        "the lag of the caught-up partition to fall to 0",
        Duration::from_secs(30),
        || async { (lag("0") == 0).then_some(()) },
    )
    .await;
    assert_eq!(
        rig.applied_ns("stuck").await,
        (1..=20).collect::<Vec<i64>>(),
        "every message of the stuck partition applied once, in order"
    );
    assert_eq!(
        rig.applied_ns("free1").await,
        (1..=10).collect::<Vec<i64>>()
    );
    assert_eq!(
        rig.applied_ns("free2").await,
        (1..=10).collect::<Vec<i64>>()
    );
    assert_eq!(count(&rig.pool, "SELECT count(*) FROM inbox").await, 40);
    assert_eq!(
        rt.dead_lettered(),
        0,
        "retryable errors are never dead-lettered"
    );
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_an_apply_commits_the_offset_of_the_message_it_finished() {
    let rig = Rig::new().await;
    let first = rig.start(16).await;
    rig.send(0, "slow", 1, "slow").await;
    e2e::wait_for(
        "the slow event to be in the middle of its transaction",
        Duration::from_secs(60),
        || async {
            (count(
                &rig.pool,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state = 'active' AND query LIKE 'SELECT pg_sleep%'",
            )
            .await
                == 1)
                .then_some(())
        },
    )
    .await;
    // Shut down while the event is being applied: it finishes, and its offset is committed.
    first.stop().await;
    assert_eq!(
        rig.applied_ns("slow").await,
        [1],
        "finished before the exit"
    );

    let second = rig.start(16).await;
    rig.send(0, "slow", 2, "ok").await;
    e2e::wait_for(
        "the next event applied by the next consumer",
        Duration::from_secs(60),
        || async { (rig.applied_ns("slow").await.len() == 2).then_some(()) },
    )
    .await;
    assert_eq!(
        second.metrics.inbox_duplicates.get(),
        0,
        "the finished event was not delivered again"
    );
    assert_eq!(
        count(
            &rig.pool,
            "SELECT COALESCE(sum(duplicates), 0)::bigint FROM inbox"
        )
        .await,
        0
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_that_panics_outside_the_handler_is_restarted_and_applies_its_partition_once() {
    let rig = Rig::new().await;
    let config = rig.config(16);
    outbox_consumer::topics::create_missing(&config, config.create_topics.unwrap())
        .await
        .unwrap();
    // On the broker before the consumer starts, so the messages behind the trap are already
    // fetched (queued for the worker or buffered) when it dies.
    let mut ids = vec![];
    for n in 1..=10 {
        let mode = if n == 2 { "trap" } else { "ok" };
        ids.push(rig.send(0, "trap", n, mode).await);
    }
    let rt = rig.start(4).await;
    e2e::wait_for(
        "every message of the partition applied after the worker died",
        Duration::from_secs(60),
        || async { (rig.applied_ns("trap").await.len() >= 10).then_some(()) },
    )
    .await;
    assert!(
        !TRAP_ARMED.load(Ordering::SeqCst),
        "the worker panicked outside the handler"
    );
    assert_eq!(
        rig.applied_ns("trap").await,
        (1..=10).collect::<Vec<i64>>(),
        "every message applied once, in order, none skipped"
    );
    let in_inbox: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inbox WHERE consumer_name = 'probe' AND event_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(&rig.pool)
    .await
    .unwrap();
    assert_eq!(in_inbox, 10, "one inbox row per event");
    assert_eq!(rt.metrics.worker_restarts.get(), 1);
    assert_eq!(rt.metrics.handler_panics.get(), 0, "not a handler panic");
    assert_eq!(rt.dead_lettered(), 0, "nothing dead-lettered");
    let text = rt.metrics_text();
    assert!(
        text.contains("consumer_worker_restarts_total{consumer=\"probe\"} 1"),
        "{text}"
    );
    rt.stop().await;
}
