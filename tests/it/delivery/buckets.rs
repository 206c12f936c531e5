//! Several relays publishing one outbox at once: the outbox split into 8 buckets
//! (`outbox-relay buckets --set 8`), three relays with `--transactions` share them (3/3/2), and
//! each relay in turn is SIGKILLed and replaced, then SIGSTOPped and woken, under load. The
//! others take its buckets over; the replacement (or the woken relay) gets its share back. A
//! `read_committed` reader (kafka-python) sees every committed event exactly once, each
//! aggregate in commit order (guarantees 1, 3, 4 and 7).
//!
//! Also: the bucket count is refused while a relay publishes, and a bad count is refused by
//! name, changing nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::proc::{RelayArgs, RelayProcess};
use e2e::stream::{write_stream, StreamSpec};

use crate::common::{check_committed, ops, published, secs, AGGREGATE_TYPE};

/// Live bucket leases per holder (`default/l<layout>/b<n>` rows).
async fn holders(pool: &sqlx::PgPool) -> BTreeMap<String, usize> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT holder, count(*) FROM outbox_relay_lease \
         WHERE name LIKE 'default/l%' AND expires_at > now() GROUP BY holder",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    rows.into_iter().map(|(h, n)| (h, n as usize)).collect()
}

/// Waits until exactly the relays `names` hold the 8 buckets, each 2 or 3.
async fn wait_balanced(pool: &sqlx::PgPool, names: &[&str], what: &str) -> Duration {
    let started = Instant::now();
    e2e::wait_for(what, Duration::from_secs(45), || async {
        let h = holders(pool).await;
        let ok = h.len() == names.len()
            && names.iter().all(|n| matches!(h.get(*n), Some(2..=3)))
            && h.values().sum::<usize>() == 8;
        ok.then_some(())
    })
    .await;
    started.elapsed()
}

/// Waits until all 8 buckets are held, none by `gone`.
async fn wait_taken_over(pool: &sqlx::PgPool, gone: &str, what: &str) -> Duration {
    let started = Instant::now();
    e2e::wait_for(what, Duration::from_secs(45), || async {
        let h = holders(pool).await;
        (!h.contains_key(gone) && h.values().sum::<usize>() == 8).then_some(())
    })
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_share_the_buckets_through_sigkill_sigstop_and_restarts_losing_nothing() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let (code, out) = ops(&["buckets", "--set", "8"], &db.url);
    assert_eq!(code, 0, "buckets --set 8: {out}");
    assert_eq!(out["buckets"], 8, "{out}");

    let spec = StreamSpec {
        events: 24_000,
        pause: Duration::from_millis(150),
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let writers = tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &spec).await });
    let args = |name: &str| {
        let mut a = RelayArgs::new(&db.url, &brokers, &prefix, name);
        a.extra = [
            "--transactions",
            "true",
            "--lease-ttl-ms",
            "3000",
            "--batch-size",
            "200",
        ]
        .map(String::from)
        .to_vec();
        a
    };
    let mut names: Vec<String> = vec!["r0".into(), "r1".into(), "r2".into()];
    let mut relays: Vec<RelayProcess> = names
        .iter()
        .map(|n| RelayProcess::start(&args(n)))
        .collect();
    let balanced = |names: Vec<String>, what: String| {
        let pool = db.pool.clone();
        async move {
            let n: Vec<&str> = names.iter().map(String::as_str).collect();
            wait_balanced(&pool, &n, &what).await
        }
    };
    let took = balanced(names.clone(), "three relays to share the 8 buckets".into()).await;
    eprintln!("balanced 3/3/2 after {}", secs(took));
    // Each publishes its share.
    for r in &relays {
        e2e::wait_for(
            "every relay to publish",
            Duration::from_secs(60),
            || async { (published(r).await > 0.0).then_some(()) },
        )
        .await;
    }
    // Refused while relays publish; nothing changes.
    let (code, out) = ops(&["buckets", "--set", "4"], &db.url);
    assert_eq!(
        code, 1,
        "buckets --set 4 while relays publish must be refused: {out}"
    );
    assert!(
        out["error"]
            .as_str()
            .unwrap_or("")
            .contains("stop every relay"),
        "{out}"
    );
    let (code, out) = ops(&["buckets", "--set", "0"], &db.url);
    assert_eq!(code, 1, "{out}");
    assert!(
        out["error"]
            .as_str()
            .unwrap_or("")
            .contains("between 1 and 256"),
        "{out}"
    );
    let (_, out) = ops(&["buckets"], &db.url);
    assert_eq!(out["buckets"], 8, "a refused change changes nothing: {out}");

    // Each relay in turn: SIGKILLed, its buckets taken over, replaced by a new relay that gets
    // its share.
    for i in 0..3 {
        relays[i].kill();
        let t = wait_taken_over(
            &db.pool,
            &names[i],
            &format!("{}'s buckets to be taken over", names[i]),
        )
        .await;
        eprintln!(
            "{} SIGKILLed: its buckets taken over after {}",
            names[i],
            secs(t)
        );
        names[i] = format!("{}k", names[i]);
        relays[i] = RelayProcess::start(&args(&names[i]));
        let t = balanced(names.clone(), format!("{} to get its share", names[i])).await;
        eprintln!("{} started: balanced after {}", names[i], secs(t));
    }
    // Each relay in turn: SIGSTOPped (its leases expire, its transactions stay open until the
    // new owners' initialisation fences them), then woken: it finds its leases gone and takes
    // its share again.
    for i in 0..3 {
        e2e::proc::signal(relays[i].pid(), "STOP");
        let t = wait_taken_over(
            &db.pool,
            &names[i],
            &format!("{}'s buckets to be taken over", names[i]),
        )
        .await;
        eprintln!(
            "{} SIGSTOPped: its buckets taken over after {}",
            names[i],
            secs(t)
        );
        e2e::proc::signal(relays[i].pid(), "CONT");
        let t = balanced(names.clone(), format!("{} to get its share back", names[i])).await;
        eprintln!("{} woken: balanced after {}", names[i], secs(t));
        assert!(relays[i].is_running(), "{} must survive SIGSTOP", names[i]);
    }

    // Every relay sees every bucket held again (what the alert on a bucket without owner
    // reads).
    for r in &relays {
        e2e::wait_for(
            "every relay to see no bucket without owner",
            Duration::from_secs(60),
            || async {
                let m = r.metrics().await?;
                (e2e::proc::metric_value(&m, "outbox_relay_buckets_unowned") == Some(0.0))
                    .then_some(())
            },
        )
        .await;
    }
    // Per bucket, exactly one relay's `outbox_relay_bucket_held` reads 1 (the owner an
    // operator reads off the dashboard), under an epoch past the first: every bucket changed
    // hands at least once in the rounds above.
    e2e::wait_for(
        "each bucket held by exactly one relay, per the relays' metrics",
        Duration::from_secs(60),
        || async {
            let mut texts = Vec::new();
            for r in &relays {
                texts.push(r.metrics().await?);
            }
            (0..8)
                .all(|b| {
                    let b = b.to_string();
                    let holders: Vec<&String> = texts
                        .iter()
                        .filter(|m| {
                            e2e::proc::metric(m, "outbox_relay_bucket_held", &[("bucket", &b)])
                                == 1.0
                        })
                        .collect();
                    holders.len() == 1
                        && e2e::proc::metric(
                            holders[0],
                            "outbox_relay_bucket_epoch",
                            &[("bucket", &b)],
                        ) > 1.0
                })
                .then_some(())
        },
    )
    .await;
    let written = writers.await.unwrap();
    e2e::wait_for("the outbox to drain", Duration::from_secs(180), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    let report = check_committed(&brokers, &prefix, &written).await;
    eprintln!(
        "read_committed: {} messages, {} of {} committed events, {} duplicates",
        report.messages,
        report.delivered,
        written.committed.len(),
        report.duplicates,
    );
    // Each event once: a bucket taken over is settled from its records (no duplicate), so
    // the order of first occurrences checked above is the order of every message.
    assert_eq!(
        report.duplicates, 0,
        "events sent twice across the kills and stops"
    );
    drop(relays);
}

/// A backlog written under one bucket moves to its buckets when the count changes (relays
/// stopped), every row to the bucket the insert trigger gives new rows of its aggregate; a
/// relay then publishes all of it in order; back to one bucket, the whole-outbox lease is free
/// again and a relay publishes under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changing_the_bucket_count_moves_the_backlog_and_loses_nothing() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let spec = StreamSpec {
        events: 3_000,
        pause: Duration::ZERO,
        ..StreamSpec::default()
    };
    let mut written = write_stream(&db.pool, AGGREGATE_TYPE, &spec).await;
    let (code, out) = ops(&["buckets", "--set", "8"], &db.url);
    assert_eq!(code, 0, "{out}");
    let (spread, misplaced): (i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT bucket), \
                count(*) FILTER (WHERE bucket <> outbox_bucket_of(aggregate_type, aggregate_id)) \
         FROM outbox",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(spread, 8, "the backlog spreads over the 8 buckets");
    assert_eq!(misplaced, 0, "every row is in its aggregate's bucket");
    // What the per-bucket backlog gauges read: each bucket's count, in one scan with the
    // per-topic one.
    let store = outbox_relay::store::Store::from_pool(db.pool.clone());
    let (by_topic, by_bucket) = store.backlog_by_topic_and_bucket(&prefix).await.unwrap();
    let counted: Vec<(i16, i64)> =
        sqlx::query_as("SELECT bucket, count(*) FROM outbox GROUP BY bucket ORDER BY bucket")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        by_bucket
            .iter()
            .map(|b| (b.bucket, b.events))
            .collect::<Vec<_>>(),
        counted,
        "the backlog per bucket"
    );
    assert_eq!(
        by_topic.iter().map(|t| t.events).sum::<i64>(),
        counted.iter().map(|(_, n)| n).sum::<i64>(),
        "the backlog per topic, from the same statement"
    );
    // New rows get the same bucket from the trigger.
    let more = StreamSpec {
        events: 1_000,
        pause: Duration::ZERO,
        first_writer: spec.writers,
        ..StreamSpec::default()
    };
    written.merge(write_stream(&db.pool, AGGREGATE_TYPE, &more).await);
    let misplaced: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE bucket <> outbox_bucket_of(aggregate_type, aggregate_id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        misplaced, 0,
        "the insert trigger puts new rows in their aggregate's bucket"
    );

    let args = RelayArgs::new(&db.url, &brokers, &prefix, "alone");
    let mut relay = RelayProcess::start(&args);
    e2e::wait_for("the outbox to drain", Duration::from_secs(120), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    assert_eq!(
        holders(&db.pool).await.get("alone"),
        Some(&8),
        "one relay holds every bucket"
    );
    check_committed(&brokers, &prefix, &written).await;
    let (_, status) = relay
        .terminate(Duration::from_secs(10))
        .expect("SIGTERM stops the relay");
    assert!(status.success());

    // Back to one bucket: the whole-outbox lease serves again.
    let (code, out) = ops(&["buckets", "--set", "1"], &db.url);
    assert_eq!(code, 0, "{out}");
    let last = StreamSpec {
        events: 1_000,
        pause: Duration::ZERO,
        first_writer: 2 * spec.writers,
        ..StreamSpec::default()
    };
    written.merge(write_stream(&db.pool, AGGREGATE_TYPE, &last).await);
    let relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "again"));
    e2e::wait_for("the outbox to drain", Duration::from_secs(120), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    assert_eq!(
        crate::common::lease_holder(&db.pool).await.map(|(h, _)| h),
        Some("again".to_owned()),
        "with one bucket the relay holds the whole-outbox lease"
    );
    check_committed(&brokers, &prefix, &written).await;
    drop(relay);
}

/// The upgrade: a relay of a version without buckets knows only the whole-outbox lease. While
/// one holds it, the count cannot change; once the outbox has buckets, that lease is held for
/// good by `<buckets>`, so such a relay can neither take it nor claim, however long it waits,
/// while relays with buckets publish; back to one bucket, both kinds share the one lease again.
#[tokio::test]
async fn a_relay_without_buckets_stands_by_while_the_outbox_has_buckets() {
    use outbox_relay::store::{ClaimedBatch, Store};
    let db = e2e::db::fresh_database().await;
    let ttl = Duration::from_millis(500);
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'o' || i, 'E', '{}' FROM generate_series(1, 10) i",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // What a relay without buckets does: the whole-outbox lease, claims over every row.
    let old = Store::from_pool(db.pool.clone());
    let token = old
        .try_acquire_lease("default", "old", ttl)
        .await
        .unwrap()
        .expect("with one bucket, the whole-outbox lease is free");
    let (code, out) = ops(&["buckets", "--set", "4"], &db.url);
    assert_eq!(code, 1, "the count changed under a live relay: {out}");
    old.release_lease(&token).await.unwrap();
    let (code, out) = ops(&["buckets", "--set", "4"], &db.url);
    assert_eq!(code, 0, "{out}");

    tokio::time::sleep(ttl * 2).await;
    assert_eq!(
        old.try_acquire_lease("default", "old", ttl).await.unwrap(),
        None,
        "a relay without buckets took the whole-outbox lease of a bucketed outbox"
    );
    assert!(
        matches!(
            old.claim_batch(&token, 100).await.unwrap(),
            ClaimedBatch::LeaseLost
        ),
        "its old token still claims"
    );
    let (_, status) = ops(&["status"], &db.url);
    assert_eq!(status["lease_holder"], "<buckets>", "{status}");

    let (code, out) = ops(&["buckets", "--set", "1"], &db.url);
    assert_eq!(code, 0, "{out}");
    let back = old
        .try_acquire_lease("default", "old", ttl)
        .await
        .unwrap()
        .expect("back to one bucket, the whole-outbox lease is free again");
    assert!(back.epoch > token.epoch, "under a new epoch");
    let ClaimedBatch::Rows(rows, _) = old.claim_batch(&back, 100).await.unwrap() else {
        panic!("the lease is held");
    };
    assert_eq!(rows.len(), 10, "every row is back in the one bucket");
}
