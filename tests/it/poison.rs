//! One poison event must not freeze the relay, and must not let later events of its own
//! aggregate overtake it: an event librdkafka refuses (larger than `message.max.bytes`) holds
//! back its aggregate only, while other aggregates keep flowing.

use std::time::Duration;

use e2e::proc::{metric_value, RelayArgs, RelayProcess};
use outbox_kit::{enqueue, NewEvent};
use serde_json::json;

async fn put(pool: &sqlx::PgPool, aggregate: &str, payload: serde_json::Value) -> i64 {
    enqueue(pool, &NewEvent::new("order", aggregate, "E", &payload))
        .await
        .unwrap()
        .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_event_holds_back_only_its_aggregate() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();

    let poison = put(&db.pool, "A", json!({"blob": "x".repeat(1_200_000)})).await;
    let a2 = put(&db.pool, "A", json!({"n": 2})).await;
    for i in 0..5 {
        put(&db.pool, "B", json!({"n": i})).await;
    }
    let relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "poison"));

    let left = || async {
        sqlx::query_scalar::<_, i64>("SELECT id FROM outbox ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .ok()
    };
    e2e::wait_for(
        "B's events to be published past the poison event",
        Duration::from_secs(30),
        || async { left().await.filter(|ids| ids == &[poison, a2]) },
    )
    .await;

    // The relay keeps going: new events of other aggregates are published too.
    for i in 0..3 {
        put(&db.pool, "C", json!({"n": i})).await;
    }
    e2e::wait_for(
        "C's events to be published",
        Duration::from_secs(30),
        || async { left().await.filter(|ids| ids == &[poison, a2]) },
    )
    .await;

    let topic = format!("{prefix}order");
    let records = tokio::task::spawn_blocking({
        let brokers = brokers.clone();
        let topic = topic.clone();
        move || e2e::verify::dump(&brokers, &[topic])
    })
    .await
    .unwrap();
    let keys: Vec<&str> = records.iter().filter_map(|r| r.key.as_deref()).collect();
    assert_eq!(keys.iter().filter(|k| **k == "B").count(), 5);
    assert_eq!(keys.iter().filter(|k| **k == "C").count(), 3);
    assert!(
        !keys.contains(&"A"),
        "A's second event must not overtake its first"
    );

    let metrics = relay.metrics().await.unwrap();
    let rejected = metric_value(&metrics, "outbox_publish_failures_total").unwrap_or(0.0);
    assert!(rejected >= 1.0, "the refused event is counted:\n{metrics}");
    let log = relay.log_text();
    assert_eq!(
        log.matches("holding back its aggregate").count(),
        1,
        "logged once, not per retry:\n{log}"
    );

    // An operator removes the poison event (what parking/redrive will automate): A resumes.
    sqlx::query("DELETE FROM outbox WHERE id = $1")
        .bind(poison)
        .execute(&db.pool)
        .await
        .unwrap();
    e2e::wait_for(
        "A's second event to be published",
        Duration::from_secs(90),
        || async { left().await.filter(|ids| ids.is_empty()) },
    )
    .await;
    let records = tokio::task::spawn_blocking(move || e2e::verify::dump(&brokers, &[topic]))
        .await
        .unwrap();
    assert_eq!(
        records
            .iter()
            .filter(|r| r.key.as_deref() == Some("A"))
            .count(),
        1
    );
}
