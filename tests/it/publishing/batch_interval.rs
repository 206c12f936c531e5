//! `--min-batch-interval-ms`: under a steady trickle the relay starts a batch at most once per
//! interval (each batch gathers what arrived meanwhile, for less CPU per event), while a
//! backlog, whose batches come back full, drains at once; either way every committed event
//! reaches the broker in order.

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use e2e::stream::{write_stream, StreamSpec, Written};
use tokio::time::Instant;

use crate::common::{drain_and_check, relay_metric, AGGREGATE_TYPE};

/// Batches with rows the relay ran so far (`outbox_batch_rows`' count).
async fn batches(relay: &RelayProcess) -> f64 {
    relay_metric(relay, "outbox_batch_rows_count").await
}

/// Waits (deadline 60 s) until every committed event was published, then checks the topic.
async fn all_on_the_broker(pool: &sqlx::PgPool, brokers: &str, prefix: &str, written: &Written) {
    drain_and_check(pool, brokers, prefix, written, Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steady_trickle_is_gathered_into_batches_at_least_the_interval_apart() {
    const INTERVAL: Duration = Duration::from_millis(400);
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "batch-interval-trickle");
    args.extra = vec![
        "--min-batch-interval-ms".into(),
        INTERVAL.as_millis().to_string(),
    ];
    let relay = RelayProcess::start(&args);
    e2e::wait_for(
        "the relay to serve metrics",
        Duration::from_secs(60),
        || async { relay.metrics().await.map(|_| ()) },
    )
    .await;
    let before = batches(&relay).await;
    let started = Instant::now();
    // About 50 transactions a second for 4 s: unpaced, the relay (polling every 5 ms while
    // events come) would run a batch for nearly each of them.
    let spec = StreamSpec {
        writers: 2,
        events: 400,
        max_txn_events: 3,
        pause: Duration::from_millis(40),
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let written = write_stream(&pool, AGGREGATE_TYPE, &spec).await;
    all_on_the_broker(&db.pool, &brokers, &prefix, &written).await;
    let elapsed = started.elapsed();
    let ran = batches(&relay).await - before;
    // Batch starts at least INTERVAL apart: within `elapsed`, at most one per interval, and
    // one more for the batch in flight when the window opened. A slower machine only
    // lengthens `elapsed`.
    let bound = (elapsed.as_secs_f64() / INTERVAL.as_secs_f64()).floor() + 2.0;
    eprintln!(
        "batch interval: {} events committed over {:.1} s in {ran} batches (bound {bound})",
        written.committed.len(),
        elapsed.as_secs_f64()
    );
    assert!(ran >= 1.0, "the relay published in no batch");
    assert!(
        ran <= bound,
        "{ran} batches in {:.1} s: batches started less than {INTERVAL:?} apart",
        elapsed.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_drains_at_once_whatever_the_batch_interval() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    // 2 000 events in 20 full batches of 100, committed before the relay starts.
    let spec = StreamSpec {
        writers: 4,
        events: 2_000,
        rollback_every: usize::MAX,
        late_every: usize::MAX,
        pause: Duration::ZERO,
        ..StreamSpec::default()
    };
    let written = write_stream(&db.pool, AGGREGATE_TYPE, &spec).await;
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "batch-interval-backlog");
    // Paced like the trickle's batches, 20 batches would take over three minutes; the
    // drain's deadline is one.
    args.extra = vec![
        "--min-batch-interval-ms".into(),
        "10000".into(),
        "--batch-size".into(),
        "100".into(),
    ];
    let _relay = RelayProcess::start(&args);
    all_on_the_broker(&db.pool, &brokers, &prefix, &written).await;
}
