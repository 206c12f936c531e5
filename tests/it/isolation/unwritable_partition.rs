//! A partition the broker cannot write holds back only its own aggregate: every other
//! aggregate flows, the stuck event is retried, then parked, and nothing is reordered
//! (guarantee 8). The fault is real: a two-broker cluster, a topic whose only replica lives on
//! the second broker, and that broker SIGKILLed. librdkafka keeps such a message queued for as
//! long as a send may take (the relay never lets it time out inside librdkafka, see
//! `relay/src/publisher/settings.rs`); the relay's own bound on a send (`--send-timeout-ms`)
//! turns it into a failure of its aggregate.

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use e2e::servers::Kafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use serde_json::json;

use crate::common::{ops, Ledger};

/// Two brokers, the transaction coordinators' topic on the first (in a real cluster it is
/// replicated; here a coordinator on the second broker would go down with it), a `stuck`
/// topic whose one partition lives on the second broker alone and an `order` topic of
/// `healthy_partitions` partitions on the first.
struct TwoBrokers {
    first: Kafka,
    second: Kafka,
    brokers: String,
    prefix: String,
    stuck_topic: String,
    healthy_topic: String,
}

impl TwoBrokers {
    async fn start(healthy_partitions: usize) -> Self {
        let first = Kafka::start();
        place_transaction_state(&first.brokers());
        let second = Kafka::start_joining(&first);
        let brokers = first.brokers();
        let prefix = e2e::unique_topic_prefix();
        let stuck_topic = format!("{prefix}stuck");
        let healthy_topic = format!("{prefix}order");
        create_placed(&brokers, &stuck_topic, &[&[2]]).await;
        let on_first: &[i32] = &[1];
        create_placed(
            &brokers,
            &healthy_topic,
            &vec![on_first; healthy_partitions],
        )
        .await;
        Self {
            first,
            second,
            brokers,
            prefix,
            stuck_topic,
            healthy_topic,
        }
    }
}

/// Creates `topic` with one partition per entry of `replicas`, each on the brokers given.
async fn create_placed(brokers: &str, topic: &str, replicas: &[&[i32]]) {
    create_placed_with(brokers, topic, replicas, &[]).await;
}

/// [`create_placed`] with topic settings.
async fn create_placed_with(
    brokers: &str,
    topic: &str,
    replicas: &[&[i32]],
    settings: &[(&str, &str)],
) {
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("an admin client");
    let results = admin
        .create_topics(
            &[settings.iter().fold(
                NewTopic::new(
                    topic,
                    replicas.len() as i32,
                    TopicReplication::Variable(replicas),
                ),
                |t, (k, v)| t.set(k, v),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("create topics");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

/// Creates Kafka's `__transaction_state` topic while `brokers` is the only broker.
fn place_transaction_state(brokers: &str) {
    use rdkafka::producer::{BaseProducer, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", "place-transaction-state")
        .create()
        .expect("a transactional producer");
    producer
        .init_transactions(Duration::from_secs(60))
        .expect("init_transactions on the first broker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unwritable_partition_holds_back_only_its_own_aggregate() {
    unwritable_partition(false).await;
}

/// With transactions, a partition the metadata shows without a leader is kept out of the
/// batches' transactions: a transaction holding a message for it could neither commit nor
/// let the next one begin while the partition is down, and every aggregate would wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_transactions_an_unwritable_partition_holds_back_only_its_own_aggregate() {
    unwritable_partition(true).await;
}

/// With transactions, a partition that dies while a transaction holds messages for it: the
/// relay aborts the transaction after `--send-timeout-ms`, but the coordinator cannot finish
/// that abort (its marker cannot be written to the dead partition), and until it can it
/// refuses to initialise the same `transactional.id` again. The bucket moves its producers to
/// a new generation of their id (recorded in its lease row) and goes on: every aggregate of the
/// live partitions is published, in order, while the dead partition's stay behind. The
/// broker is SIGKILLed under load, while the metadata still names it as the partition's leader,
/// so transactions are caught holding messages for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_transactions_a_partition_dying_mid_transaction_leaves_its_bucket_publishing() {
    partition_dying_mid_transaction(false).await;
}

/// [`with_transactions_a_partition_dying_mid_transaction_leaves_its_bucket_publishing`], then the
/// relay is SIGKILLed while the partition is still dead: the relay that takes the bucket over
/// initialises the generation recorded in the lease row, moves on from it when the relay it
/// replaces stranded that generation too before it died, and publishes every healthy event,
/// in order, none twice for a `read_committed` reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_transactions_a_relay_taking_over_a_stranded_bucket_publishes_under_its_new_generation(
) {
    partition_dying_mid_transaction(true).await;
}

/// A relay taking over a bucket one of whose `transactional.id`s a dead partition holds: its
/// previous holder (here a producer of the test's) had sent a message to the partition inside
/// a transaction and never ended it (SIGKILLed), and then the partition's broker died. Before
/// it initialises the id again the coordinator must abort that transaction, and it cannot
/// write the abort's marker to the dead partition: every initialisation of the id is refused
/// as concurrent until the partition is back. Only the holder that aborted could know the id
/// was stranded; the relay taking over sees the refusals last longer than a send may take,
/// moves the bucket's producers to a new generation of their id and publishes every healthy
/// event, in order, none twice for a `read_committed` reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_transactions_a_relay_taking_over_an_id_a_dead_partition_holds_moves_to_a_new_generation(
) {
    let mut cluster = TwoBrokers::start(3).await;
    let db = e2e::db::fresh_database().await;
    // The lone producer's id (the id of the batches' producer plus `.lone`) of generation 0:
    // the relay initialises it when it takes the bucket, after the batches' producer.
    let lone_id = format!("{}relay.lone", cluster.prefix);
    let holder = {
        let (b, id, t) = (
            cluster.brokers.clone(),
            lone_id.clone(),
            cluster.stuck_topic.clone(),
        );
        tokio::task::spawn_blocking(move || open_transaction(&b, &id, &t))
            .await
            .unwrap()
    };
    cluster.second.stop();
    // Like a SIGKILLed relay's, its transaction is never ended.
    std::mem::forget(holder);
    wait_leaderless(&cluster.brokers, &cluster.stuck_topic).await;
    let mut ledger = Ledger::default();
    for i in 0..300 {
        ledger
            .put(
                &db.pool,
                &format!("a-{}", i % 30),
                &json!({"n": i}).to_string(),
                "{}",
                None,
            )
            .await;
    }
    let _relay =
        relay_beside_the_stuck_topic(&db, &cluster.brokers, &cluster.prefix, "held-id", true).await;
    wait_outbox_empty(&db, "every healthy event to be published").await;
    let generation: i32 =
        sqlx::query_scalar("SELECT txn_generation FROM outbox_relay_lease WHERE name = 'default'")
            .fetch_one(&db.pool)
            .await
            .expect("the lease row");
    assert!(
        generation >= 1,
        "the bucket moved to a new generation of its transactional id"
    );
    let records = {
        let (b, t) = (cluster.brokers.clone(), cluster.healthy_topic.clone());
        tokio::task::spawn_blocking(move || e2e::verify::dump_committed(&b, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty(), "order violated: {violations:?}");
    assert!(missing.is_empty(), "events missing: {}", missing.len());
    assert_eq!(
        records.len(),
        300,
        "each event once for a read_committed reader"
    );
}

/// A transactional producer of `id` with a transaction left open that holds one acknowledged
/// message for partition 0 of `topic`.
fn open_transaction(brokers: &str, id: &str, topic: &str) -> rdkafka::producer::BaseProducer {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", id)
        .create()
        .expect("a transactional producer");
    producer
        .init_transactions(Duration::from_secs(60))
        .expect("init_transactions");
    producer.begin_transaction().expect("a transaction begun");
    producer
        .send(
            BaseRecord::<str, str>::to(topic)
                .partition(0)
                .key("held")
                .payload("{}"),
        )
        .map_err(|(e, _)| e)
        .expect("a message queued");
    producer
        .flush(Duration::from_secs(60))
        .expect("the message acknowledged");
    producer
}

async fn partition_dying_mid_transaction(handover: bool) {
    let TwoBrokers {
        first: _first,
        mut second,
        brokers,
        prefix,
        stuck_topic,
        healthy_topic,
    } = TwoBrokers::start(3).await;
    let db = e2e::db::fresh_database().await;
    let mut relay =
        relay_beside_the_stuck_topic(&db, &brokers, &prefix, "mid-transaction", true).await;

    // Writers: every fourth event bound for the stuck topic, the rest for the healthy one.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let (pool, stop, stuck_topic) = (db.pool.clone(), stop.clone(), stuck_topic.clone());
        async move {
            let mut ledger = Ledger::default();
            let mut i = 0u64;
            // 200 events a second.
            let mut pace = tokio::time::interval(Duration::from_millis(5));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pace.tick().await;
                let stuck = i.is_multiple_of(4);
                let (aggregate, topic) = if stuck {
                    (format!("s-{}", i % 12), Some(stuck_topic.as_str()))
                } else {
                    (format!("a-{}", i % 30), None)
                };
                ledger
                    .put(&pool, &aggregate, &json!({"n": i}).to_string(), "{}", topic)
                    .await;
                i += 1;
            }
            ledger
        }
    });
    crate::common::wait_published(&relay, 200.0).await;
    // The stuck topic's only broker crashes under load.
    second.stop();
    let killed_at = crate::common::published(&relay).await;
    // Healthy events go on being published past the dead partition.
    e2e::wait_for(
        "the relay to publish 1 000 more events with the partition dead",
        Duration::from_secs(120),
        || async { (crate::common::published(&relay).await >= killed_at + 1_000.0).then_some(()) },
    )
    .await;
    let generation = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT txn_generation FROM outbox_relay_lease WHERE name = 'default'",
        )
        .fetch_one(&db.pool)
        .await
        .ok()
    };
    // The relay publishing at the end (dropped with the test).
    let _survivor = if handover {
        e2e::wait_for(
            "the bucket to move to a new generation of its transactional id",
            Duration::from_secs(60),
            || async { generation().await.filter(|g| *g >= 1) },
        )
        .await;
        // The relay dies with the partition still dead; another takes the bucket over.
        let standby = RelayProcess::start(&stuck_topic_relay_args(
            &db,
            &brokers,
            &prefix,
            "mid-transaction-b",
            true,
        ));
        relay.kill();
        e2e::wait_for(
            "the relay taking over to publish 500 healthy events",
            Duration::from_secs(120),
            || async { (crate::common::published(&standby).await >= 500.0).then_some(()) },
        )
        .await;
        Some(standby)
    } else {
        None
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let ledger = writer.await.unwrap();
    e2e::wait_for(
        "every healthy event to be published",
        Duration::from_secs(90),
        || async {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox WHERE topic IS DISTINCT FROM $1")
                    .bind(&stuck_topic)
                    .fetch_one(&db.pool)
                    .await
                    .ok()?;
            (left == 0).then_some(())
        },
    )
    .await;
    let generation = generation().await.expect("the lease row");
    assert!(
        generation >= 1,
        "the bucket moved to a new generation of its transactional id"
    );
    let records = {
        let (b, t) = (brokers.clone(), healthy_topic.clone());
        tokio::task::spawn_blocking(move || e2e::verify::dump_committed(&b, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty(), "order violated: {violations:?}");
    let missing_healthy = missing
        .iter()
        .filter(|e| ledger.events[*e].0.starts_with("a-"))
        .count();
    assert_eq!(missing_healthy, 0, "healthy events missing");
    let duplicates = records.len()
        - records
            .iter()
            .filter_map(|r| r.headers.get("event_id"))
            .collect::<std::collections::HashSet<_>>()
            .len();
    assert_eq!(
        duplicates, 0,
        "healthy events twice for a read_committed reader"
    );
}

/// Events without a key (a Debezium copy of a NULL key) bound for a topic one of whose two
/// partitions has no leader: librdkafka's partitioner would send about one in four of them to
/// the dead partition (a random pick, tried again once when it has no leader), where each
/// would wait out the send timeout inside its transaction and fail. The relay sends them to
/// the partition with a leader: every one is published and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_transactions_keyless_events_go_to_partitions_with_a_leader() {
    let mut cluster = TwoBrokers::start(1).await;
    let (brokers, prefix) = (cluster.brokers.clone(), cluster.prefix.clone());
    // Partition 0 on the first broker, partition 1 on the second.
    let mixed_topic = format!("{prefix}mixed");
    create_placed(&brokers, &mixed_topic, &[&[1], &[2]]).await;
    cluster.second.stop();
    wait_leaderless(&brokers, &cluster.stuck_topic).await;
    let db = e2e::db::fresh_database().await;
    let relay = relay_beside_the_stuck_topic(&db, &brokers, &prefix, "keyless", true).await;
    const EVENTS: i64 = 200;
    for i in 0..EVENTS {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, topic, \
             message_key, relay_headers) \
             VALUES ('copied', $1, 'Happened', '{}', $2, '', false)",
        )
        .bind(format!("k-{i}"))
        .bind(&mixed_topic)
        .execute(&db.pool)
        .await
        .expect("a keyless row");
    }
    wait_outbox_empty(&db, "every keyless event to be published").await;
    let metrics = relay.metrics().await.unwrap_or_default();
    let failures: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("outbox_publish_failures_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        crate::common::published(&relay).await,
        EVENTS as f64,
        "every keyless event published once"
    );
    assert_eq!(
        failures, 0.0,
        "keyless events failed (sent to the partition without a leader)"
    );
}

/// Beside a dead partition, every other aggregate's median commit → published latency stays
/// within 2× of the same run's before the partition died, while the dead partition's
/// aggregates fail, are retried alone and parked; transactions on and off. Both medians come
/// from the relay's own histogram, over windows of the same load: 100 events a second of
/// healthy aggregates, and beside them in the second window 20 a second bound for the dead
/// partition, each on a new aggregate so that retries go on through the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_transactions_other_aggregates_latency_beside_a_dead_partition_stays_within_twice() {
    latency_beside_a_dead_partition(true).await;
}

/// [`with_transactions_other_aggregates_latency_beside_a_dead_partition_stays_within_twice`]
/// without transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_aggregates_latency_beside_a_dead_partition_stays_within_twice() {
    latency_beside_a_dead_partition(false).await;
}

async fn latency_beside_a_dead_partition(transactions: bool) {
    let TwoBrokers {
        first: _first,
        mut second,
        brokers,
        prefix,
        stuck_topic,
        ..
    } = TwoBrokers::start(3).await;
    let db = e2e::db::fresh_database().await;
    let relay =
        relay_beside_the_stuck_topic(&db, &brokers, &prefix, "beside-dead", transactions).await;
    let mut ledger = Ledger::default();
    let window = async |ledger: &mut Ledger, window: u32, stuck: bool| {
        const LATENCY: &str = "outbox_publish_latency_seconds";
        let before = e2e::proc::histogram(&relay.metrics().await.unwrap_or_default(), LATENCY);
        // 100 healthy events a second.
        let mut pace = tokio::time::interval(Duration::from_millis(10));
        for i in 0..600u32 {
            pace.tick().await;
            let aggregate = format!("a-{}", i % 40);
            let payload = json!({"window": window, "n": i}).to_string();
            ledger.put(&db.pool, &aggregate, &payload, "{}", None).await;
            if stuck && i % 5 == 0 {
                let aggregate = format!("s-{window}-{i}");
                ledger
                    .put(&db.pool, &aggregate, &payload, "{}", Some(&stuck_topic))
                    .await;
            }
        }
        e2e::wait_for(
            "the window's healthy events to be published",
            Duration::from_secs(60),
            || async {
                let left: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM outbox WHERE topic IS DISTINCT FROM $1",
                )
                .bind(&stuck_topic)
                .fetch_one(&db.pool)
                .await
                .ok()?;
                (left == 0).then_some(())
            },
        )
        .await;
        let after = e2e::proc::histogram(&relay.metrics().await.unwrap_or_default(), LATENCY);
        e2e::proc::histogram_quantile(&e2e::proc::histogram_delta(&after, &before), 0.5)
            .expect("latencies observed in the window")
    };
    // Warm: the relay has published before the first window starts.
    for i in 0..20 {
        let payload = json!({"warm": i}).to_string();
        ledger.put(&db.pool, "warm", &payload, "{}", None).await;
    }
    crate::common::wait_published(&relay, 20.0).await;
    let alive = window(&mut ledger, 1, false).await;
    second.stop();
    wait_leaderless(&brokers, &stuck_topic).await;
    let dead = window(&mut ledger, 2, true).await;
    // The dead partition's aggregates were failing meanwhile: retried, some parked.
    let (_, blocked) = ops(&["blocked"], &db.url);
    let stuck = blocked["events"].as_array().map_or(0, Vec::len);
    eprintln!(
        "median commit → published: {:.1} ms with both brokers, {:.1} ms beside the dead partition ({stuck} of its events failing or parked)",
        alive * 1e3,
        dead * 1e3
    );
    assert!(
        stuck > 0,
        "the dead partition's events were not failing: {blocked}"
    );
    assert!(
        dead <= 2.0 * alive,
        "beside the dead partition the median rose from {:.1} to {:.1} ms",
        alive * 1e3,
        dead * 1e3
    );
}

/// A relay (`name`) for [`TwoBrokers`]: its records topic made on the first broker (the one
/// that stays), transactions on or off, a 3 s send timeout, parking after 3 attempts.
async fn relay_beside_the_stuck_topic(
    db: &e2e::db::TestDb,
    brokers: &str,
    prefix: &str,
    name: &str,
    transactions: bool,
) -> RelayProcess {
    let on_first: &[i32] = &[1];
    create_placed_with(
        brokers,
        &format!("{prefix}outbox-relay.records"),
        &[on_first; 8],
        &[("cleanup.policy", "compact")],
    )
    .await;
    RelayProcess::start(&stuck_topic_relay_args(
        db,
        brokers,
        prefix,
        name,
        transactions,
    ))
}

/// The arguments of [`relay_beside_the_stuck_topic`]'s relay.
fn stuck_topic_relay_args(
    db: &e2e::db::TestDb,
    brokers: &str,
    prefix: &str,
    name: &str,
    transactions: bool,
) -> RelayArgs {
    let mut args = RelayArgs::new(&db.url, brokers, prefix, name);
    args.extra = [
        "--transactions",
        if transactions { "true" } else { "false" },
        "--send-timeout-ms",
        "3000",
        "--park-after",
        "3",
        "--transactional-id",
        &format!("{prefix}relay"),
    ]
    .map(String::from)
    .to_vec();
    args
}

/// Waits (up to 120 s) until the outbox of `db` holds no row.
async fn wait_outbox_empty(db: &e2e::db::TestDb, what: &str) {
    e2e::wait_for(what, Duration::from_secs(120), || async {
        (e2e::db::backlog(&db.pool).await.ok()? == 0).then_some(())
    })
    .await;
}

/// Waits until the metadata `brokers` serve shows partition 0 of `topic` without a leader.
async fn wait_leaderless(brokers: &str, topic: &str) {
    use rdkafka::producer::{BaseProducer, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("a producer");
    let producer = std::sync::Arc::new(producer);
    e2e::wait_for(
        "the metadata to show the partition without a leader",
        Duration::from_secs(90),
        || {
            let (producer, topic) = (producer.clone(), topic.to_owned());
            async move {
                tokio::task::spawn_blocking(move || {
                    let md = producer
                        .client()
                        .fetch_metadata(Some(&topic), Duration::from_secs(5))
                        .ok()?;
                    let t = md.topics().iter().find(|t| t.name() == topic)?;
                    t.partitions()
                        .iter()
                        .any(|p| p.id() == 0 && p.leader() < 0)
                        .then_some(())
                })
                .await
                .ok()
                .flatten()
            }
        },
    )
    .await;
}

async fn unwritable_partition(transactions: bool) {
    let TwoBrokers {
        first,
        mut second,
        brokers,
        prefix,
        stuck_topic,
        healthy_topic,
    } = TwoBrokers::start(6).await;
    // The only broker of the stuck topic's partition crashes; the first broker serves on.
    second.stop();
    if transactions {
        // A partition that dies inside a transaction holds its bucket until it is back (the
        // transaction cannot end): this case starts once the cluster knows it is gone.
        wait_leaderless(&first.brokers(), &stuck_topic).await;
    }

    let db = e2e::db::fresh_database().await;
    let mut ledger = Ledger::default();
    let (stuck_id, _) = ledger
        .put(
            &db.pool,
            "s-1",
            &json!({"stuck": true}).to_string(),
            "{}",
            Some(&stuck_topic),
        )
        .await;
    for i in 0..2_000 {
        ledger
            .put(
                &db.pool,
                &format!("a-{}", i % 50),
                &json!({"n": i}).to_string(),
                "{}",
                None,
            )
            .await;
    }
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "unwritable");
    args.extra = [
        "--park-after",
        "3",
        "--send-timeout-ms",
        "3000",
        "--transactions",
        if transactions { "true" } else { "false" },
    ]
    .map(String::from)
    .to_vec();
    let relay = RelayProcess::start(&args);

    e2e::wait_for(
        "every healthy event to be published while the stuck one waits",
        Duration::from_secs(180),
        || async {
            let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox ORDER BY id")
                .fetch_all(&db.pool)
                .await
                .ok()?;
            (left == [stuck_id]).then_some(())
        },
    )
    .await;
    let blocked = e2e::wait_for(
        "the stuck event to be retried, then parked",
        Duration::from_secs(180),
        || async {
            let (_, blocked) = ops(&["blocked"], &db.url);
            let events = blocked["events"].as_array()?.clone();
            (events.len() == 1 && events[0]["state"] == "parked").then_some(events)
        },
    )
    .await;
    assert_eq!(blocked[0]["outbox_id"], stuck_id, "{blocked:?}");
    assert_eq!(
        blocked[0]["attempts"], 3,
        "retried, then parked: {blocked:?}"
    );
    assert_eq!(blocked[0]["error_class"], "unacknowledged", "{blocked:?}");
    let error = blocked[0]["error_message"].as_str().unwrap_or_default();
    assert!(
        error.contains("not acknowledged"),
        "the error says what happened: {error}"
    );
    let records = {
        let (b, t) = (brokers.clone(), healthy_topic.clone());
        tokio::task::spawn_blocking(move || e2e::verify::dump_committed(&b, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty(), "order violated: {violations:?}");
    assert_eq!(missing.len(), 1, "only the stuck event is missing");

    // One broker of two gone is not an outage: the gauge (and `/healthz`) say the cluster
    // is reachable, and the log never says it is not.
    let metrics = relay.metrics().await.expect("the relay's metrics");
    assert_eq!(
        e2e::proc::metric_value(&metrics, "outbox_kafka_brokers_down"),
        Some(0.0)
    );
    assert!(
        !relay
            .log_text()
            .contains("Kafka broker unreachable; librdkafka keeps retrying"),
        "one broker's loss was reported as an outage"
    );
}

/// A cluster that answers but can write none of the batch's partitions (the broker holding
/// every replica of the topic is down) is an outage, not a wave of failures: nothing is
/// recorded or parked, `/healthz` is unhealthy and the log says why; once the broker is back
/// every event is published, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_that_cannot_write_is_an_outage_that_parks_nothing() {
    cannot_write(Refusal::NoLeader).await;
}

/// The same, when every partition has a leader but too few in-sync replicas to take an
/// `acks=all` write (`min.insync.replicas` 2, the second replica's broker down, as in a
/// routine restart of one broker of two): the metadata looks healthy, the broker answers
/// `NOT_ENOUGH_REPLICAS` to every write, and nothing is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_without_enough_in_sync_replicas_is_an_outage_that_parks_nothing() {
    cannot_write(Refusal::TooFewInSync).await;
}

/// How the cluster refuses the writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The topic's only replicas are on the broker that is down.
    NoLeader,
    /// Every partition leads on the live broker, `min.insync.replicas` 2, the other replica
    /// down.
    TooFewInSync,
}

async fn cannot_write(refusal: Refusal) {
    let first = Kafka::start();
    place_transaction_state(&first.brokers());
    let mut second = Kafka::start_joining(&first);
    let brokers = first.brokers();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    match refusal {
        Refusal::NoLeader => {
            let on_second: &[i32] = &[2];
            create_placed(&brokers, &topic, &[on_second; 3]).await;
            second.stop();
            wait_leaderless(&brokers, &topic).await;
        }
        Refusal::TooFewInSync => {
            let on_both: &[i32] = &[1, 2];
            create_placed_with(
                &brokers,
                &topic,
                &[on_both; 3],
                &[("min.insync.replicas", "2")],
            )
            .await;
            second.stop();
            // Until the cluster has fenced the stopped broker, its metadata still lists it.
            e2e::wait_for(
                "the stopped broker to leave the metadata",
                Duration::from_secs(60),
                || async { (!first.broker_ids().contains(&2)).then_some(()) },
            )
            .await;
        }
    }

    let db = e2e::db::fresh_database().await;
    let mut ledger = Ledger::default();
    for i in 0..200 {
        ledger
            .put(
                &db.pool,
                &format!("a-{}", i % 20),
                &json!({"n": i}).to_string(),
                "{}",
                None,
            )
            .await;
    }
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "no-writes");
    args.extra = ["--park-after", "2", "--send-timeout-ms", "3000"]
        .map(String::from)
        .to_vec();
    let mut relay = RelayProcess::start(&args);
    e2e::wait_for(
        "the relay to report the outage",
        Duration::from_secs(60),
        || async {
            let unhealthy = e2e::proc::http_get(&relay.metrics_addr, "/healthz")
                .await
                .is_none();
            let said = match refusal {
                Refusal::NoLeader => "the cluster cannot take writes",
                Refusal::TooFewInSync => "acknowledged none of the batch's",
            };
            (unhealthy && relay.log_text().contains(said)).then_some(())
        },
    )
    .await;
    // Through several of the relay's backoffs, well past what parking after two attempts
    // takes: nothing is recorded against the events.
    let watch_until = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    while tokio::time::Instant::now() < watch_until {
        tick.tick().await;
        let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_failure")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(
            failures, 0,
            "an outage recorded failures against the events"
        );
        assert!(relay.is_running(), "the relay must ride the outage out");
    }

    second.start_again();
    e2e::wait_for("the outbox to drain", Duration::from_secs(180), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    let records = {
        let (b, t) = (brokers.clone(), topic.clone());
        tokio::task::spawn_blocking(move || e2e::verify::dump(&b, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty(), "order violated: {violations:?}");
    assert!(missing.is_empty(), "lost: {missing:?}");
    e2e::wait_for("/healthz to recover", Duration::from_secs(30), || async {
        e2e::proc::http_get(&relay.metrics_addr, "/healthz").await
    })
    .await;
}
