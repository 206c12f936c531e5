//! A partition the broker cannot write (NOT_ENOUGH_REPLICAS, which librdkafka retries for as
//! long as a send may take) holds back only its own aggregate: every other aggregate flows,
//! the stuck event is retried, then parked, and nothing is reordered (guarantee 5).

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use serde_json::json;

use crate::common::{ops, Ledger};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unwritable_partition_holds_back_only_its_own_aggregate() {
    // min.insync.replicas=2 on a one-broker cluster: every produce to the topic is answered
    // NOT_ENOUGH_REPLICAS, a retriable error, for as long as the topic lives.
    let prefix = e2e::unique_topic_prefix();
    let brokers = e2e::kafka_brokers();
    let stuck_topic = format!("{prefix}stuck");
    let healthy_topic = format!("{prefix}order");
    e2e::audit::create_topics_with(&brokers, 1, &["min.insync.replicas=2"], &[&stuck_topic]);
    e2e::audit::create_topics_with(&brokers, 6, &[], &[&healthy_topic]);
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
    args.extra = ["--park-after", "3"].map(String::from).to_vec();
    let _relay = RelayProcess::start(&args);

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
    e2e::wait_for(
        "the stuck event to be retried, then parked",
        Duration::from_secs(300),
        || async {
            let (_, blocked) = ops(&["blocked"], &db.url);
            let events = blocked["events"].as_array()?.clone();
            (events.len() == 1 && events[0]["state"] == "parked").then_some(blocked)
        },
    )
    .await;
    let records = {
        let (b, t) = (brokers.clone(), healthy_topic.clone());
        tokio::task::spawn_blocking(move || e2e::verify::dump(&b, &[t]))
            .await
            .unwrap()
    };
    let (violations, missing) = ledger.check(&records);
    assert!(violations.is_empty(), "order violated: {violations:?}");
    assert_eq!(missing.len(), 1, "only the stuck event is missing");
}
