//! Per-aggregate order for writers that do not lock anything themselves: two connections
//! write events of one aggregate with plain INSERTs, and the one with the larger `id` tries to
//! commit first. The broker's first occurrences must follow the order in which the
//! transactions really committed (guarantee 3; docs/src/design.md), read back with
//! kafka-python. And nothing is skipped (guarantee 2): a row committed below a batch the relay
//! already claimed ahead goes first, in order.

use std::collections::HashMap;
use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use sqlx::{Connection, PgConnection, PgPool};

use crate::common::published;

const ROUNDS: usize = 12;

async fn insert(conn: &mut PgConnection, aggregate: &str, writer: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', $1, 'E', jsonb_build_object('writer', $2::text)) RETURNING id",
    )
    .bind(aggregate)
    .bind(writer)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// True once a backend of this database waits for a lock in an INSERT into the outbox.
async fn insert_waits(pool: &PgPool) -> bool {
    sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND ltrim(query) LIKE 'INSERT INTO outbox%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_inserts_committing_against_their_id_order_are_published_in_commit_order() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let mut first = PgConnection::connect(&db.url).await.unwrap();

    // aggregate -> the writers in the order their transactions committed.
    let mut committed: HashMap<String, Vec<&str>> = HashMap::new();
    let mut waited = 0;
    for round in 0..ROUNDS {
        let aggregate = format!("agg-{round}");
        sqlx::query("BEGIN").execute(&mut first).await.unwrap();
        insert(&mut first, &aggregate, "first").await;
        // The second writer inserts after the first (a larger id, unless the outbox makes
        // it wait) and wants to commit before it.
        let url = db.url.clone();
        let agg = aggregate.clone();
        let second = tokio::spawn(async move {
            let mut c = PgConnection::connect(&url).await.unwrap();
            sqlx::query("BEGIN").execute(&mut c).await.unwrap();
            insert(&mut c, &agg, "second").await;
            c
        });
        let blocked = e2e::wait_for(
            "the second insert to finish or wait for a lock",
            Duration::from_secs(20),
            || async {
                if second.is_finished() {
                    Some(false)
                } else if insert_waits(&db.pool).await {
                    Some(true)
                } else {
                    None
                }
            },
        )
        .await;
        let order = committed.entry(aggregate).or_default();
        if blocked {
            // It cannot commit first: it waits for the first writer's transaction.
            waited += 1;
            sqlx::query("COMMIT").execute(&mut first).await.unwrap();
            order.push("first");
            let mut c = second.await.unwrap();
            sqlx::query("COMMIT").execute(&mut c).await.unwrap();
            order.push("second");
        } else {
            let mut c = second.await.unwrap();
            sqlx::query("COMMIT").execute(&mut c).await.unwrap();
            order.push("second");
            sqlx::query("COMMIT").execute(&mut first).await.unwrap();
            order.push("first");
        }
    }

    // Both writers of every round committed before the relay starts: it sees them together
    // and has only the ids to go by.
    let relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "commit-order"));
    e2e::wait_for("every event published", Duration::from_secs(60), || async {
        (published(&relay).await >= (2 * ROUNDS) as f64).then_some(())
    })
    .await;
    let topic = format!("{prefix}order");
    let records = tokio::task::spawn_blocking(move || e2e::verify::dump(&brokers, &[topic]))
        .await
        .unwrap();
    let on_broker = first_occurrences(&records, "writer");
    for (aggregate, order) in &committed {
        assert_eq!(
            on_broker.get(aggregate),
            Some(&order.iter().map(|w| serde_json::json!(w)).collect()),
            "{aggregate}: first occurrences on the broker against the commit order"
        );
    }
    assert_eq!(
        waited, ROUNDS,
        "every second writer waited for the first writer of its aggregate"
    );
}

/// Inserts `n` events per aggregate of `aggregates`, numbered from `from` (`seq`), one
/// statement per number.
async fn fill(conn: &mut PgConnection, aggregates: &[String], from: usize, n: usize) {
    for seq in from..from + n {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', a, 'E', jsonb_build_object('seq', $2::int) FROM unnest($1::text[]) a",
        )
        .bind(aggregates)
        .bind(seq as i32)
        .execute(&mut *conn)
        .await
        .unwrap();
    }
}

/// The relay claims the next batch while the last one is in flight (past its last `id`). A
/// row whose transaction took a lower `id` and committed after that claim lies below it: the
/// relay must send it before anything of its aggregate that came later, and not lose it. The
/// relay is stopped (SIGSTOP) in the middle of a backlog, so its claim ahead is taken while
/// the late transactions are still open; they commit, their aggregates get more events, and
/// the relay goes on. Per aggregate, the broker's first occurrences (read with kafka-python)
/// must be every event, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_committed_below_a_batch_claimed_ahead_go_first_and_in_order() {
    const LATE: usize = 3;
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let aggregates: Vec<String> = (0..40).map(|a| format!("agg-{a}")).collect();
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    fill(&mut conn, &aggregates, 0, 50).await;
    // Transactions that take their ids now and commit much later.
    let mut late = Vec::new();
    for k in 0..LATE {
        let mut c = PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut c).await.unwrap();
        fill(&mut c, &[format!("late-{k}")], 0, 1).await;
        late.push(c);
    }
    fill(&mut conn, &aggregates, 50, 500).await;
    let before_late = 40 * 50;
    let total_backlog = 40 * 550;

    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "claim-ahead");
    args.extra = vec!["--batch-size".into(), "100".into()];
    let relay = RelayProcess::start(&args);
    e2e::wait_for(
        "the relay past the late rows' ids, in the middle of the backlog",
        Duration::from_secs(60),
        || async { (published(&relay).await >= (before_late + 300) as f64).then_some(()) },
    )
    .await;
    // Read before the stop: a stopped relay answers no scrape.
    let before_stop = published(&relay).await;
    e2e::proc::signal(relay.pid(), "STOP");
    assert!(
        before_stop < (total_backlog - 1000) as f64,
        "the relay drained the backlog before it was stopped ({before_stop} published): nothing was claimed ahead"
    );
    for c in &mut late {
        sqlx::query("COMMIT").execute(&mut *c).await.unwrap();
    }
    let late_aggregates: Vec<String> = (0..LATE).map(|k| format!("late-{k}")).collect();
    fill(&mut conn, &late_aggregates, 1, 5).await;
    fill(&mut conn, &aggregates, 550, 20).await;
    e2e::proc::signal(relay.pid(), "CONT");

    let expected = total_backlog + LATE * 6 + 40 * 20;
    e2e::wait_for(
        "every event published",
        Duration::from_secs(120),
        || async { (published(&relay).await >= expected as f64).then_some(()) },
    )
    .await;
    let metrics = relay.metrics().await.unwrap();
    let late_rows = e2e::proc::metric_value(&metrics, "outbox_batch_late_rows_total").unwrap();
    assert!(
        late_rows >= 1.0,
        "the late rows were found below a batch claimed ahead (late rows {late_rows})"
    );
    let sent_ahead = e2e::proc::metric_series(
        &metrics,
        "outbox_batches_claimed_ahead_total{outcome=\"sent\"}",
    )
    .unwrap_or(0.0);
    assert!(
        sent_ahead >= 10.0,
        "batches claimed ahead and sent: {sent_ahead}"
    );

    let topic = format!("{prefix}order");
    let records = tokio::task::spawn_blocking(move || e2e::verify::dump(&brokers, &[topic]))
        .await
        .unwrap();
    let seen = first_occurrences(&records, "seq");
    for a in &aggregates {
        assert_eq!(seen.get(a), Some(&seqs(570)), "{a}");
    }
    for a in &late_aggregates {
        assert_eq!(seen.get(a), Some(&seqs(6)), "{a}");
    }
}

/// Per key, the values of `field` of the payloads on the broker in the order of their first
/// occurrence (offset order within a partition; one key lives on one partition).
fn first_occurrences(
    records: &[e2e::verify::Record],
    field: &str,
) -> HashMap<String, Vec<serde_json::Value>> {
    let mut sorted: Vec<_> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut firsts: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for r in sorted {
        let value: serde_json::Value = serde_json::from_str(r.value.as_deref().unwrap()).unwrap();
        let seen = firsts.entry(r.key.clone().unwrap_or_default()).or_default();
        if !seen.contains(&value[field]) {
            seen.push(value[field].clone());
        }
    }
    firsts
}

/// `seq` values 0 to `n - 1`, as the payloads carry them.
fn seqs(n: i64) -> Vec<serde_json::Value> {
    (0..n).map(|s| serde_json::json!(s)).collect()
}
