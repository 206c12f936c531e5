//! A parked aggregate's backlog does not slow the others (guarantee 5): with one event parked
//! and 300 000 events of its aggregate behind it, a healthy event's commit → published latency
//! stays within twice the same relay's without that backlog. The claim starts above a floor
//! (`relay/src/batch/floor.rs`) instead of reading every held-back event first, and the floor
//! never skips an event committed late below it (guarantee 2).

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use sqlx::PgPool;

use crate::common::published;

/// One healthy event's commit → published time.
async fn commit_to_published(pool: &PgPool, n: usize) -> Duration {
    test_support::db::commit_to_published(pool, &format!("healthy-{n}"), Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the healthy event published within 60 s")
}

/// A database with one parked event (an invalid topic), and a relay publishing from it.
async fn parked_relay(name: &str) -> (e2e::db::TestDb, RelayProcess) {
    let brokers = e2e::kafka_brokers();
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, topic) \
         VALUES ('order', 'stuck', 'E', '{}', 'no such topic!')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, name));
    e2e::wait_for(
        "the poison to be parked",
        Duration::from_secs(60),
        || async {
            let parked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox_failure WHERE parked_at IS NOT NULL",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap_or(0);
            (parked == 1).then_some(())
        },
    )
    .await;
    // Warm-up: the topic is created, the connections are open.
    for n in 0..5 {
        commit_to_published(&db.pool, n).await;
    }
    (db, relay)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parked_aggregates_backlog_of_300_000_does_not_slow_other_events() {
    // Two relays of the same build and settings, each with one parked event; only the second
    // gets the backlog. Their healthy events alternate, so both medians see the same machine.
    let (plain, plain_relay) = parked_relay("floor-baseline").await;
    let (backlog, backlog_relay) = parked_relay("floor-backlog").await;
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'stuck', 'E', jsonb_build_object('n', g) FROM generate_series(1, 300000) g",
    )
    .execute(&backlog.pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE outbox")
        .execute(&backlog.pool)
        .await
        .unwrap();

    let (mut without, mut with) = (Vec::new(), Vec::new());
    for n in 100..125 {
        without.push(commit_to_published(&plain.pool, n).await);
        with.push(commit_to_published(&backlog.pool, n).await);
    }
    let (baseline, with_backlog) = (median(without), median(with));
    let ratio = with_backlog.as_secs_f64() / baseline.as_secs_f64();
    eprintln!(
        "commit → published, median of 25: {baseline:?} without the backlog, {with_backlog:?} \
         with 300 000 events behind the parked one ({ratio:.2}×)"
    );
    assert!(
        ratio <= 2.0,
        "a parked aggregate's backlog slowed other events: median {with_backlog:?} against \
         {baseline:?} without it ({ratio:.2}×)"
    );

    // Nothing of the parked aggregate was sent, and every healthy event was.
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE aggregate_id = 'stuck'")
        .fetch_one(&backlog.pool)
        .await
        .unwrap();
    assert_eq!(held, 300_001);
    for relay in [&plain_relay, &backlog_relay] {
        assert_eq!(published(relay).await, 30.0);
    }
}

/// The floor never passes a row that can still commit: a transaction takes an outbox id, stays
/// open while later events are published (and the floor would rise past its id), then commits;
/// its event is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_committed_late_below_the_floor_is_published() {
    let (db, relay) = parked_relay("floor-late").await;
    let mut late = db.pool.begin().await.unwrap();
    let (late_id,): (i64,) = sqlx::query_as(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'late', 'E', '{}') RETURNING id",
    )
    .fetch_one(&mut *late)
    .await
    .unwrap();
    // Later events, each published on its own batch while the late one is open, for long
    // enough that the relay notes candidates past its id (at most one every CANDIDATE_EVERY).
    let writing = std::time::Instant::now();
    let mut n = 100;
    while writing.elapsed() < 3 * outbox_relay::batch::CANDIDATE_EVERY || n < 120 {
        commit_to_published(&db.pool, n).await;
        n += 1;
    }
    let max_id: i64 = sqlx::query_scalar("SELECT pg_sequence_last_value('outbox_id_seq')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(max_id >= late_id + 20, "later events have higher ids");
    late.commit().await.unwrap();
    assert!(
        test_support::db::await_published(&db.pool, late_id, Duration::from_secs(30)).await,
        "the event committed late is published"
    );
    assert_eq!(published(&relay).await, (5 + (n - 100) + 1) as f64);
}

/// A failure row whose event was deleted by hand stops holding its aggregate back within about
/// a minute (`ORPHAN_SWEEP_EVERY`), on the leader's own timer: the gauges' refresh, which slows
/// down over a large backlog, no longer sets its pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_row_whose_event_was_deleted_by_hand_is_forgotten_within_a_minute() {
    let (db, _relay) = parked_relay("floor-orphan").await;
    // The parked event is deleted by hand; its failure row stays and holds `stuck` back.
    sqlx::query("DELETE FROM outbox WHERE aggregate_id = 'stuck'")
        .execute(&db.pool)
        .await
        .unwrap();
    let (next,): (i64,) = sqlx::query_as(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'stuck', 'E', '{}') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let deadline = outbox_relay::relay::ORPHAN_SWEEP_EVERY + Duration::from_secs(30);
    assert!(
        test_support::db::await_published(&db.pool, next, deadline).await,
        "the aggregate's next event is published once the orphan failure row is forgotten"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_failure")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}
