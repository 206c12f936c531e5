//! The relay's database-side gauges: the backlog per destination topic and the age of the
//! database's oldest open transaction, read from a running relay's `/metrics`.

use std::time::Duration;

use e2e::proc::{metric_series, RelayArgs, RelayProcess};
use sqlx::Connection;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backlog_by_topic_and_the_oldest_open_transaction_are_exported() {
    let db = e2e::db::fresh_database().await;
    let prefix = e2e::unique_topic_prefix();
    // A broker nobody listens on: nothing is published, the backlog stays put.
    let relay = RelayProcess::start(&RelayArgs::new(
        &db.url,
        "127.0.0.1:1",
        &prefix,
        "metrics-relay",
    ));
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, topic) \
         SELECT 'order', g::text, 'E', '{}', CASE WHEN g <= 20 THEN 'custom.topic' END \
         FROM generate_series(1, 50) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let routed = format!("outbox_backlog_events_by_topic{{topic=\"{prefix}order\"}}");
    let (total, by_routed, by_custom) =
        e2e::wait_for("the backlog per topic", Duration::from_secs(30), || async {
            let m = relay.metrics().await?;
            let total = metric_series(&m, "outbox_backlog_events")?;
            let routed = metric_series(&m, &routed)?;
            let custom =
                metric_series(&m, "outbox_backlog_events_by_topic{topic=\"custom.topic\"}")?;
            (total == 50.0).then_some((total, routed, custom))
        })
        .await;
    assert_eq!((total, by_routed, by_custom), (50.0, 30.0, 20.0));
    let m = relay.metrics().await.unwrap();
    assert!(
        metric_series(
            &m,
            "outbox_oldest_unpublished_age_seconds_by_topic{topic=\"custom.topic\"}"
        )
        .is_some(),
        "{m}"
    );

    // A transaction left open in another session: its age shows, and goes when it ends.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT txid_current()")
        .execute(&mut *tx)
        .await
        .unwrap();
    let age_of = |m: &str| metric_series(m, "outbox_db_oldest_transaction_age_seconds");
    let seen = e2e::wait_for(
        "the open transaction's age",
        Duration::from_secs(30),
        || async { age_of(&relay.metrics().await?).filter(|a| *a >= 3.0) },
    )
    .await;
    tx.commit().await.unwrap();
    e2e::wait_for(
        "the age to fall once it committed",
        Duration::from_secs(30),
        || async { age_of(&relay.metrics().await?).filter(|a| *a < 1.0) },
    )
    .await;
    eprintln!("relay metrics: backlog 50 = 30 routed + 20 custom.topic; open transaction seen at {seen:.1} s");
}
