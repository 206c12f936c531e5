//! Guarantee 1: every committed event reaches the broker, none rolled back does, and each
//! aggregate's events arrive in order; also across SIGKILLs of the relay. And the broker's half
//! of guarantee 4: no duplicate without a failure, and after a SIGKILL no more than the events
//! that were in flight. The first test
//! runs the relay as the least-privilege relay role and the writers as a service role
//! (`deploy/postgres/roles.sql`).

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use e2e::stream::{write_stream, StreamSpec};

use crate::common::{drain_and_check, wait_published, AGGREGATE_TYPE};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn committed_events_reach_the_broker_in_order_and_rolled_back_ones_never() {
    let db = e2e::db::fresh_database().await;
    let roles = e2e::roles::apply(&db.url, "stream_writer");
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let relay = RelayProcess::start(&RelayArgs::new(&roles.relay, &brokers, &prefix, "stream"));

    let spec = StreamSpec {
        events: 12_000,
        ..StreamSpec::default()
    };
    let writer = sqlx::postgres::PgPoolOptions::new()
        .max_connections(20)
        .connect(&roles.service)
        .await
        .unwrap();
    let written = write_stream(&writer, AGGREGATE_TYPE, &spec).await;
    assert!(
        written.committed.len() >= 10_000,
        "only {} committed",
        written.committed.len()
    );
    assert!(!written.rolled_back.is_empty());

    let report = drain_and_check(
        &db.pool,
        &brokers,
        &prefix,
        &written,
        Duration::from_secs(180),
    )
    .await;
    assert_eq!(report.delivered, written.committed.len());
    assert_eq!(
        report.duplicates, 0,
        "no failure happened, so no event may be sent twice"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_relay_restarts_without_loss_or_reordering() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "kill");
    // A short lease so the restarted process does not wait long for its dead predecessor's.
    args.extra = vec![
        "--lease-ttl-ms".into(),
        "1500".into(),
        "--batch-size".into(),
        "500".into(),
    ];

    let spec = StreamSpec {
        events: 10_000,
        pause: Duration::from_millis(60),
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let writers = tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &spec).await });

    let mut relay = RelayProcess::start(&args);
    let mut kills = 0;
    while kills < 5 && !writers.is_finished() {
        // Kill mid-stream, once this process has published something.
        wait_published(&relay, 200.0).await;
        relay.kill();
        kills += 1;
        relay = RelayProcess::start(&args);
    }
    let written = writers.await.unwrap();
    assert!(kills >= 3, "the stream ended after only {kills} kills");

    let report = drain_and_check(
        &db.pool,
        &brokers,
        &prefix,
        &written,
        Duration::from_secs(180),
    )
    .await;
    eprintln!(
        "SIGKILLed the relay {kills} times: {} duplicates (events in flight at a kill)",
        report.duplicates
    );
    assert!(
        report.duplicates <= kills * 500,
        "more duplicates than events in flight: {}",
        report.duplicates
    );
    drop(relay);
}
