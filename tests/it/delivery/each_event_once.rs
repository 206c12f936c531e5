//! With `--transactions`, a relay that dies between a transaction's commit and the marking of
//! its rows does not cause a duplicate (guarantee 4): each transaction also records which rows
//! it published (the bucket record), and the relay taking the bucket over marks them from it
//! instead of sending them again.
//!
//! The window is real: the relay's PostgreSQL link (a harness proxy) is stalled until the
//! broker holds, `read_committed`, an event whose outbox row is still there (committed, not
//! marked); only then is the relay SIGKILLed. A `read_committed` reader then sees every event
//! exactly once.

use std::collections::HashSet;
use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use e2e::proxy::Proxy;
use e2e::stream::{write_stream, StreamSpec};
use e2e::verify::{check, dump_committed};
use uuid::Uuid;

use crate::common::{published, wait_published, AGGREGATE_TYPE};

/// The event ids on `topic`, read `read_committed` (whatever is there within a few seconds).
async fn committed_ids(brokers: &str, topic: &str) -> HashSet<Uuid> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        e2e::verify::dump_with(
            &brokers,
            &[topic],
            &["--timeout", "3", "--isolation-level", "read_committed"],
        )
    })
    .await
    .unwrap()
    .iter()
    .filter_map(|r| {
        r.headers
            .get("event_id")
            .and_then(|s| Uuid::parse_str(s).ok())
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_between_a_commit_and_its_mark_sends_nothing_twice() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}{AGGREGATE_TYPE}");
    let (db_link, linked_url) = Proxy::in_front_of_database(&db.url).await;
    let extra = |a: &mut RelayArgs| {
        // A lingering producer: most of a batch's time is spent between its claim and its
        // mark (sending, committing), where a stalled database link leaves the window open.
        a.extra = [
            "--transactions",
            "true",
            "--lease-ttl-ms",
            "3000",
            "--kafka-config",
            "linger.ms=100",
        ]
        .map(String::from)
        .to_vec();
    };
    let mut args = RelayArgs::new(&linked_url, &brokers, &prefix, "killed");
    extra(&mut args);
    let mut killed = RelayProcess::start(&args);

    // About 400 events a second for 20 s: events keep coming through every attempt.
    let spec = StreamSpec {
        events: 8_000,
        pause: Duration::from_millis(200),
        ..StreamSpec::default()
    };
    let pool = db.pool.clone();
    let writers = tokio::spawn(async move { write_stream(&pool, AGGREGATE_TYPE, &spec).await });
    wait_published(&killed, 200.0).await;

    // Stall the relay's database link until a committed transaction's rows are on the broker
    // and still in the outbox; a stall that caught the relay claiming (nothing committed) is
    // lifted and tried again.
    let mut window = None;
    for attempt in 1..=10 {
        db_link.stall();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
        while window.is_none() && tokio::time::Instant::now() < deadline {
            let on_broker = committed_ids(&brokers, &topic).await;
            let ids: Vec<Uuid> = on_broker.into_iter().collect();
            let unmarked: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox WHERE event_id = ANY($1)")
                    .bind(&ids)
                    .fetch_one(&db.pool)
                    .await
                    .unwrap();
            if unmarked > 0 {
                window = Some(unmarked);
            }
        }
        if window.is_some() {
            eprintln!("attempt {attempt}: {window:?} committed events unmarked");
            break;
        }
        db_link.resume();
        let before = published(&killed).await;
        wait_published(&killed, before + 1.0).await;
    }
    let Some(unmarked) = window else {
        panic!("the relay never stalled between a commit and its mark in 10 attempts");
    };
    killed.kill();

    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "successor");
    extra(&mut args);
    let successor = RelayProcess::start(&args);
    let written = writers.await.unwrap();
    e2e::wait_for("the outbox to drain", Duration::from_secs(120), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    let settled = crate::common::relay_metric(&successor, "outbox_events_settled_total").await;
    let records = {
        let (brokers, topic) = (brokers.clone(), topic.clone());
        tokio::task::spawn_blocking(move || dump_committed(&brokers, &[topic]))
            .await
            .unwrap()
    };
    let report = check(&written, &records, AGGREGATE_TYPE);
    eprintln!(
        "read_committed: {} messages, {} of {} committed events, {} duplicates; the successor settled {settled} events ({unmarked} were on the broker unmarked at the kill)",
        report.messages,
        report.delivered,
        written.committed.len(),
        report.duplicates,
    );
    assert!(report.is_clean(), "the broker does not match: {report:?}");
    assert_eq!(
        report.duplicates, 0,
        "an event committed before the kill was sent again"
    );
    assert!(
        settled >= unmarked as f64,
        "the successor marked {settled} events from the record, fewer than the {unmarked} seen unmarked"
    );
    drop(successor);
}
