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
//!
//! The third test attacks the fencing itself: the old leader's producer session is replaced
//! while it still leads, and the new session's initialisation reaches the broker only after the
//! standby took over. A relay that initialised it there (as the relay did before sessions were
//! initialised under the lease) fences the standby and commits A1 after A2.

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

/// Kafka's EndTxn API key (a transaction's commit or abort).
const END_TXN: i16 = 26;

/// Two relays on one outbox: the old leader reaches the broker and PostgreSQL through proxies
/// (its links, to stall), the standby directly.
struct Failover {
    kafka: Kafka,
    kafka_link: Proxy,
    db_link: Proxy,
    /// The broker's unproxied listener (the standby's, the reader's).
    direct: String,
    db: e2e::db::TestDb,
    prefix: String,
    old: RelayProcess,
    standby: RelayProcess,
}

impl Failover {
    /// Starts both relays (`extra` flags for both) and publishes a warm-up event: the old
    /// leader's producer is connected (and initialised) and the topic exists before its links
    /// fail.
    async fn start(extra: &[&str]) -> Self {
        // The broker's PLAINTEXT listener is advertised at the proxy (the old leader's link);
        // the DIRECT listener is the standby's own, unproxied link.
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
        let kafka_link = Proxy::start_kafka(kafka_link_port, kafka.port).await;
        let direct = format!("127.0.0.1:{direct_port}");

        let db = e2e::db::fresh_database().await;
        let (db_link, linked_url) = Proxy::in_front_of_database(&db.url).await;

        let prefix = e2e::unique_topic_prefix();
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
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
        insert(&db.pool, "warm-up", Some("{}")).await;
        e2e::wait_for("the warm-up event", Duration::from_secs(60), || {
            outbox_empty(&db.pool)
        })
        .await;
        Self {
            kafka,
            kafka_link,
            db_link,
            direct,
            db,
            prefix,
            old,
            standby,
        }
    }

    /// Rows the old leader claimed so far (batches' rows, as its metrics count them).
    async fn old_claims(&self) -> f64 {
        metric(&self.old, "outbox_batch_rows_count")
            .await
            .unwrap_or(0.0)
    }

    /// With the old leader cut off from PostgreSQL: the standby takes over and publishes A1
    /// (still in the outbox), then the tombstone A2 of the same aggregate; returns A2's id.
    async fn standby_takes_over_and_publishes_a2(&self) -> String {
        e2e::wait_for(
            "the standby to take over",
            Duration::from_secs(60),
            || async { (metric(&self.standby, "outbox_relay_leader").await? == 1.0).then_some(()) },
        )
        .await;
        e2e::wait_for("the standby to publish A1", Duration::from_secs(60), || {
            outbox_empty(&self.db.pool)
        })
        .await;
        let a2 = insert(&self.db.pool, "a-1", None).await.to_string();
        e2e::wait_for(
            "the standby to publish the tombstone A2",
            Duration::from_secs(60),
            || outbox_empty(&self.db.pool),
        )
        .await;
        a2
    }

    /// Heals both links, waits for the old leader to step down, and returns the topic's
    /// records of the aggregate as a `read_committed` reader (kafka-python) sees them.
    async fn heal_and_read(self) -> Log {
        self.kafka_link.resume();
        self.db_link.resume();
        // The old leader's batch ends (its stale send acknowledged, or fenced), then it finds
        // the lease gone.
        e2e::wait_for(
            "the old leader to step down",
            Duration::from_secs(120),
            || async { (metric(&self.old, "outbox_relay_leader").await? == 0.0).then_some(()) },
        )
        .await;
        let topic = format!("{}order", self.prefix);
        let direct = self.direct.clone();
        let records =
            tokio::task::spawn_blocking(move || e2e::verify::dump_committed(&direct, &[topic]))
                .await
                .unwrap();
        let mut log: Vec<_> = records
            .into_iter()
            .filter(|r| r.key.as_deref() == Some("a-1"))
            .collect();
        log.sort_by_key(|r| r.offset);
        drop(self.kafka);
        log.into_iter()
            .map(|r| {
                (
                    r.headers.get("event_id").cloned().unwrap_or_default(),
                    r.value.is_none(),
                )
            })
            .collect()
    }
}

/// Runs the failover; returns the stale event's id, the tombstone's, and the topic's records
/// of the aggregate as a `read_committed` reader sees them.
async fn deposed_leader_heals(transactions: bool) -> (String, String, Log) {
    let f = Failover::start(&[
        "--lease-ttl-ms",
        "2000",
        "--transactions",
        if transactions { "true" } else { "false" },
    ])
    .await;
    let claimed_before = f.old_claims().await;
    f.kafka_link.stall();
    let a1 = insert(&f.db.pool, "a-1", Some(r#"{"v": 1}"#))
        .await
        .to_string();
    e2e::wait_for(
        "the old leader to claim A1 (and hand it to its producer)",
        Duration::from_secs(30),
        || async { (f.old_claims().await > claimed_before).then_some(()) },
    )
    .await;
    f.db_link.stall();
    let a2 = f.standby_takes_over_and_publishes_a2().await;
    (a1, a2, f.heal_and_read().await)
}

/// The old leader's producer session is replaced while it still leads (its commit of A1 got
/// no answer: the request was swallowed), and while the lease is still its own its new session
/// initialises (`InitProducerId`) into a stalled link, before it settles the bucket from its
/// record or claims A1 again. Then the old leader loses PostgreSQL, the standby takes over and publishes A1 and
/// the tombstone A2, and the old leader's link heals: its initialisation reaches the broker
/// after the standby's. Returns A1, A2 and the `read_committed` log.
async fn deposed_leader_reinitialises() -> (String, String, Log) {
    // The send timeout bounds the commit and the initialisation: long enough for the
    // takeover to happen while the old leader's initialisation is held.
    let f = Failover::start(&[
        "--lease-ttl-ms",
        "2000",
        "--transactions",
        "true",
        "--send-timeout-ms",
        "15000",
    ])
    .await;
    let claimed_before = f.old_claims().await;
    f.kafka_link.swallow(END_TXN, 1);
    let a1 = insert(&f.db.pool, "a-1", Some(r#"{"v": 1}"#))
        .await
        .to_string();
    e2e::wait_for(
        "the old leader's commit of A1 to be swallowed",
        Duration::from_secs(60),
        || async { (f.kafka_link.swallowed() == 1).then_some(()) },
    )
    .await;
    // Everything the old leader sends to the broker from now on waits in the link: its
    // abort, the new session's connections and its InitProducerId.
    f.kafka_link.stall();
    let claimed_once = f.old_claims().await;
    assert!(claimed_once > claimed_before, "A1 was claimed once");
    // The old leader replaces its session and initialises the new one under its lease (the
    // row locked through the initialisation): before it claims A1 again, or before it
    // settles the bucket from its record (the commit may have gone through).
    e2e::wait_for(
        "the old leader to initialise a new session under its lease",
        Duration::from_secs(90),
        || async {
            let claimed_again = f.old_claims().await > claimed_once;
            (claimed_again || lease_row_locked(&f.db.pool).await).then_some(())
        },
    )
    .await;
    f.db_link.stall();
    let a2 = f.standby_takes_over_and_publishes_a2().await;
    (a1, a2, f.heal_and_read().await)
}

/// True while a transaction holds the lease row locked (a relay initialising a producer under
/// its lease).
async fn lease_row_locked(pool: &sqlx::PgPool) -> bool {
    let Ok(mut tx) = pool.begin().await else {
        return false;
    };
    let probe =
        sqlx::query("SELECT 1 FROM outbox_relay_lease WHERE name = 'default' FOR UPDATE NOWAIT")
            .execute(&mut *tx)
            .await;
    let _ = tx.rollback().await;
    matches!(probe, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03"))
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
async fn a_deposed_relay_reinitialising_its_session_cannot_fence_the_new_leader() {
    let (a1, a2, log) = deposed_leader_reinitialises().await;
    eprintln!("read_committed log of a-1: {log:?}");
    assert!(
        log.iter().any(|(id, tomb)| *id == a2 && *tomb),
        "the standby published the tombstone A2: {log:?}"
    );
    assert!(
        log.iter().any(|(id, _)| *id == a1),
        "A1 was published: {log:?}"
    );
    assert!(
        !stale_after_tombstone(&a1, &a2, &log),
        "a read_committed reader saw A1 after A2: the deposed relay's new session fenced the new leader and committed its stale batch: {log:?}"
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
