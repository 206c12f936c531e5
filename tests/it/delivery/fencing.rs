//! With `--transactions`, a deposed leader cannot land a stale event after the new leader's
//! (guarantee 7: order per aggregate across a failover, fenced by the broker). The old leader hands
//! event A1 to its producer while its broker connection is stalled (harness proxy), then loses its
//! database connection too (another proxy): the standby takes the lease, publishes A1 and then A2,
//! a tombstone of the same key. Then both links heal and the old leader's queued request reaches
//! the broker.
//!
//! With `--transactions` the standby's `init_transactions` fenced the old producer at the
//! broker: a `read_committed` reader (kafka-python) never sees A1 after A2. Without, the old
//! request lands after A2: the second test shows the hazard is real in this very set-up (so the
//! first cannot pass for want of a stale send).

use std::time::Duration;

use e2e::proc::{metric_value, RelayArgs, RelayProcess};
use e2e::proxy::Proxy;
use e2e::servers::{Kafka, KafkaOptions};
use uuid::Uuid;

/// What the topic holds for the aggregate, in log order: (event id, tombstone).
type Log = Vec<(String, bool)>;

async fn metric(relay: &RelayProcess, name: &str) -> Option<f64> {
    metric_value(&relay.metrics().await?, name)
}

async fn insert(pool: &sqlx::PgPool, aggregate: &str, payload: Option<&str>) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', $1, 'E', $2::jsonb) RETURNING event_id",
    )
    .bind(aggregate)
    .bind(payload)
    .fetch_one(pool)
    .await
    .expect("insert an event")
}

async fn outbox_empty(pool: &sqlx::PgPool) -> Option<()> {
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await
        .ok()?;
    (left == 0).then_some(())
}

/// Runs the failover; returns the stale event's id, the tombstone's, and the topic's records
/// of the aggregate as a `read_committed` reader sees them.
async fn deposed_leader_heals(transactions: bool) -> (String, String, Log) {
    // The broker's PLAINTEXT listener is advertised at the proxy (the old leader's link); the
    // DIRECT listener is the standby's own, unproxied link.
    let kafka_link_port = e2e::free_port();
    let direct_port = e2e::free_port();
    let kafka = Kafka::start_with(KafkaOptions {
        port: e2e::free_port(),
        advertise: Some(format!("127.0.0.1:{kafka_link_port}")),
        listeners: vec![format!("DIRECT://127.0.0.1:{direct_port}")],
        // The broker's own traffic (transaction markers) must not cross the stalled proxy.
        config: "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,DIRECT:PLAINTEXT\n\
                 inter.broker.listener.name=DIRECT\n"
            .into(),
        ..KafkaOptions::default()
    });
    let kafka_link = Proxy::start(kafka_link_port, kafka.port).await;
    let direct = format!("127.0.0.1:{direct_port}");

    let db = e2e::db::fresh_database().await;
    let pg_port: u16 = db
        .url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("the database URL names a port");
    let db_link = Proxy::start(0, pg_port).await;
    let linked_url = db
        .url
        .replacen(&format!(":{pg_port}/"), &format!(":{}/", db_link.port), 1);

    let prefix = e2e::unique_topic_prefix();
    let extra = [
        "--lease-ttl-ms",
        "2000",
        "--transactions",
        if transactions { "true" } else { "false" },
    ]
    .map(String::from)
    .to_vec();
    let linked_kafka = format!("127.0.0.1:{kafka_link_port}");
    let mut old_args = RelayArgs::new(&linked_url, &linked_kafka, &prefix, "deposed");
    old_args.extra.clone_from(&extra);
    let old = RelayProcess::start(&old_args);
    e2e::wait_for(
        "the first relay to lead",
        Duration::from_secs(30),
        || async { (metric(&old, "outbox_relay_leader").await? == 1.0).then_some(()) },
    )
    .await;
    let mut standby_args = RelayArgs::new(&db.url, &direct, &prefix, "standby");
    standby_args.extra = extra;
    let standby = RelayProcess::start(&standby_args);
    e2e::wait_for("the standby to serve", Duration::from_secs(30), || async {
        metric(&standby, "outbox_relay_leader").await
    })
    .await;

    // A warm-up event: the old leader's producer is connected (and initialised) and the
    // topic exists before its links fail.
    insert(&db.pool, "warm-up", Some("{}")).await;
    e2e::wait_for("the warm-up event", Duration::from_secs(60), || {
        outbox_empty(&db.pool)
    })
    .await;
    let claimed_before = metric(&old, "outbox_batch_rows_count").await.unwrap_or(0.0);

    kafka_link.stall();
    let a1 = insert(&db.pool, "a-1", Some(r#"{"v": 1}"#))
        .await
        .to_string();
    e2e::wait_for(
        "the old leader to claim A1 (and hand it to its producer)",
        Duration::from_secs(30),
        || async {
            (metric(&old, "outbox_batch_rows_count").await? > claimed_before).then_some(())
        },
    )
    .await;
    db_link.stall();

    e2e::wait_for(
        "the standby to take over",
        Duration::from_secs(60),
        || async { (metric(&standby, "outbox_relay_leader").await? == 1.0).then_some(()) },
    )
    .await;
    e2e::wait_for("the standby to publish A1", Duration::from_secs(60), || {
        outbox_empty(&db.pool)
    })
    .await;
    let a2 = insert(&db.pool, "a-1", None).await.to_string();
    e2e::wait_for(
        "the standby to publish the tombstone A2",
        Duration::from_secs(60),
        || outbox_empty(&db.pool),
    )
    .await;

    kafka_link.resume();
    db_link.resume();
    // The old leader's batch ends (its stale send acknowledged, or fenced), then it finds the
    // lease gone.
    e2e::wait_for(
        "the old leader to step down",
        Duration::from_secs(120),
        || async { (metric(&old, "outbox_relay_leader").await? == 0.0).then_some(()) },
    )
    .await;

    let topic = format!("{prefix}order");
    let records =
        tokio::task::spawn_blocking(move || e2e::verify::dump_committed(&direct, &[topic]))
            .await
            .unwrap();
    let mut log: Vec<_> = records
        .into_iter()
        .filter(|r| r.key.as_deref() == Some("a-1"))
        .collect();
    log.sort_by_key(|r| r.offset);
    drop(kafka);
    let log = log
        .into_iter()
        .map(|r| {
            (
                r.headers.get("event_id").cloned().unwrap_or_default(),
                r.value.is_none(),
            )
        })
        .collect();
    (a1, a2, log)
}

/// True when the stale event `a1` appears after the tombstone `a2`.
fn stale_after_tombstone(a1: &str, a2: &str, log: &Log) -> bool {
    let tombstone = log.iter().position(|(id, _)| id == a2);
    tombstone.is_some_and(|t| log[t..].iter().any(|(id, _)| id == a1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_transactions_a_deposed_leader_cannot_land_a_stale_event() {
    let (a1, a2, log) = deposed_leader_heals(true).await;
    eprintln!("read_committed log of a-1: {log:?}");
    assert!(
        log.iter().any(|(id, _)| *id == a1),
        "the standby published A1: {log:?}"
    );
    assert!(
        log.iter().any(|(id, tomb)| *id == a2 && *tomb),
        "the standby published the tombstone A2: {log:?}"
    );
    assert!(
        !stale_after_tombstone(&a1, &a2, &log),
        "a read_committed reader saw A1 after A2: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_transactions_a_deposed_leaders_stale_event_lands_after_the_tombstone() {
    let (a1, a2, log) = deposed_leader_heals(false).await;
    eprintln!("log of a-1: {log:?}");
    assert!(
        stale_after_tombstone(&a1, &a2, &log),
        "the set-up no longer produces a stale send (A1 after A2), so the fencing test proves nothing: {log:?}"
    );
}
