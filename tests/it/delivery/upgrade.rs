//! The upgrade from a release without buckets, with that release's own relay: the binary of the
//! last commit before buckets, built from this repository's history
//! (`deploy/local/build-old-relay.sh`). Its relays hold the one whole-outbox lease and publish
//! without Kafka transactions (its default). Under a steady stream of writers:
//!
//! 1. the old relay publishes alone;
//! 2. two relays of this version start beside it on the outbox of one bucket (the schema is
//!    already this version's: the migrations ran first, as a deployment runs them): they elect
//!    one leader with the old relay and publish nothing while it holds the lease;
//! 3. the old relay gets SIGTERM (it releases the lease): a new relay takes over and publishes;
//! 4. the new relays get SIGTERM, `outbox-relay buckets --set 4`, then the old relay starts
//!    again beside two new ones: the whole-outbox lease is held for good by `<buckets>`, so the
//!    old relay stands by and publishes nothing to the end, while the two share the buckets.
//!
//! A `read_committed` reader (kafka-python) then finds every committed event, each aggregate in
//! commit order, none twice: at no moment did an old and a new relay both publish (guarantees 4
//! and 7).

use std::time::Duration;

use e2e::proc::{old_relay_binary, RelayArgs, RelayProcess};
use e2e::stream::{write_stream, StreamSpec};

use crate::common::{
    check_committed, lease_holder, ops, published, wait_published, AGGREGATE_TYPE,
};

/// How long a relay may take to leave after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_without_buckets_upgrade_to_buckets_with_one_publisher_at_a_time() {
    let old_binary = tokio::task::spawn_blocking(old_relay_binary).await.unwrap();
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let spec = StreamSpec {
        events: 8_000,
        pause: Duration::from_millis(150),
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let writers = tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &spec).await });
    let args = |name: &str| {
        let mut a = RelayArgs::new(&db.url, &brokers, &prefix, name);
        a.extra = ["--lease-ttl-ms", "3000", "--batch-size", "200"]
            .map(String::from)
            .to_vec();
        a
    };

    // 1. The old relay alone.
    let mut old = RelayProcess::start_binary(&args("old"), &old_binary);
    wait_published(&old, 1.0).await;
    assert_eq!(
        lease_holder(&db.pool).await.map(|(h, _)| h).as_deref(),
        Some("old")
    );

    // 2. New relays beside it: one leader among them all, the old one.
    let mut new = [
        RelayProcess::start(&args("new-a")),
        RelayProcess::start(&args("new-b")),
    ];
    for r in &new {
        e2e::wait_for(
            "the new relays to serve their metrics",
            Duration::from_secs(30),
            || async { r.metrics().await.map(|_| ()) },
        )
        .await;
    }
    let before = published(&old).await;
    e2e::wait_for(
        "the old relay to go on publishing beside the new ones",
        Duration::from_secs(60),
        || async { (published(&old).await >= before + 500.0).then_some(()) },
    )
    .await;
    for r in &new {
        assert_eq!(
            published(r).await,
            0.0,
            "a new relay published while the old one held the lease"
        );
    }
    assert_eq!(
        lease_holder(&db.pool).await.map(|(h, _)| h).as_deref(),
        Some("old"),
        "the old relay keeps the lease"
    );

    // 3. The old relay stopped: a new one takes over.
    assert!(
        old.terminate(STOP_TIMEOUT).is_some(),
        "the old relay leaves on SIGTERM"
    );
    e2e::wait_for(
        "a new relay to take over and publish",
        Duration::from_secs(60),
        || async {
            let mut n = 0.0;
            for r in &new {
                n += published(r).await;
            }
            (n > 0.0).then_some(())
        },
    )
    .await;

    // 4. The new relays stopped, the outbox split, the old relay back beside two new ones.
    for r in &mut new {
        assert!(
            r.terminate(STOP_TIMEOUT).is_some(),
            "a new relay leaves on SIGTERM"
        );
    }
    let (code, out) = ops(&["buckets", "--set", "4"], &db.url);
    assert_eq!(code, 0, "buckets --set 4 with every relay stopped: {out}");
    let old = RelayProcess::start_binary(&args("old-again"), &old_binary);
    let new = [
        RelayProcess::start(&args("new-c")),
        RelayProcess::start(&args("new-d")),
    ];
    e2e::wait_for(
        "the two new relays to share the 4 buckets",
        Duration::from_secs(45),
        || async {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT holder, count(*) FROM outbox_relay_lease \
                 WHERE name LIKE 'default/l%' AND expires_at > now() GROUP BY holder \
                 ORDER BY holder",
            )
            .fetch_all(&db.pool)
            .await
            .ok()?;
            (rows == [("new-c".to_owned(), 2), ("new-d".to_owned(), 2)]).then_some(())
        },
    )
    .await;
    let written = writers.await.unwrap();
    e2e::wait_for("the outbox to drain", Duration::from_secs(120), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    // The old relay ran through all of it (its metrics answer: it is up, standing by).
    let old_metrics = old.metrics().await;
    assert!(
        old_metrics.is_some(),
        "the old relay runs beside the bucketed ones: {}",
        old.log_tail(20)
    );
    assert_eq!(
        published(&old).await,
        0.0,
        "the old relay published beside the bucketed ones: {}",
        old.log_tail(20)
    );
    let holder: String =
        sqlx::query_scalar("SELECT holder FROM outbox_relay_lease WHERE name = 'default'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(holder, "<buckets>", "the whole-outbox lease is parked");

    let report = check_committed(&brokers, &prefix, &written).await;
    eprintln!(
        "read_committed: {} messages, {} of {} committed events, {} duplicates",
        report.messages,
        report.delivered,
        written.committed.len(),
        report.duplicates,
    );
    assert_eq!(report.duplicates, 0, "an event was published twice");
    drop(new);
}
