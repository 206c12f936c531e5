//! Durability of the topics the relay publishes to (nothing committed is lost only if the
//! broker keeps what it acknowledged): a topic it creates with more than one replica takes
//! writes only when a majority of them have it (`min.insync.replicas`,
//! `--topic-min-insync-replicas`), and an existing topic whose leader alone may acknowledge a
//! write (`min.insync.replicas` 1, more than one replica) is named in a warning before the
//! relay publishes to it: an event the relay saw acknowledged, and deleted, could be lost with
//! that broker. On a real two-broker cluster.

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess};
use e2e::servers::Kafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;

const WARNING: &str = "Topic accepts writes acknowledged by its leader alone";

fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("an admin client")
}

async fn create(admin: &AdminClient<DefaultClientContext>, topic: &str, min_insync: &str) {
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, 3, TopicReplication::Fixed(2))
                .set("min.insync.replicas", min_insync)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("create topics");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

async fn min_insync(admin: &AdminClient<DefaultClientContext>, topic: &str) -> Option<String> {
    let results = admin
        .describe_configs(
            &[ResourceSpecifier::Topic(topic)],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("describe configs");
    results
        .into_iter()
        .flatten()
        .find_map(|r| r.get("min.insync.replicas")?.value.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn created_topics_need_a_majority_and_a_topic_its_leader_alone_acknowledges_is_named() {
    let first = Kafka::start();
    let _second = Kafka::start_joining(&first);
    let brokers = first.brokers();
    let admin = admin(&brokers);
    let prefix = e2e::unique_topic_prefix();
    create(&admin, &format!("{prefix}weak"), "1").await;
    create(&admin, &format!("{prefix}strong"), "2").await;

    let db = e2e::db::fresh_database().await;
    for aggregate_type in ["order", "weak", "strong"] {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1, 'a-1', 'E', '{}')",
        )
        .bind(aggregate_type)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "durability");
    args.extra = ["--topic-replication-factor", "2"]
        .map(String::from)
        .to_vec();
    let relay = RelayProcess::start(&args);
    e2e::wait_for(
        "the three events to be published",
        Duration::from_secs(90),
        || async {
            let left = e2e::db::backlog(&db.pool).await.ok()?;
            (left == 0).then_some(())
        },
    )
    .await;

    // Created by the relay with two replicas: a majority of two is two.
    assert_eq!(
        min_insync(&admin, &format!("{prefix}order"))
            .await
            .as_deref(),
        Some("2")
    );
    let log = relay.log_text();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one topic warned about, once: {warnings:?}"
    );
    assert!(
        warnings[0].contains(&format!("{prefix}weak"))
            && warnings[0].contains("set its min.insync.replicas to 2"),
        "{warnings:?}"
    );
}

#[test]
fn a_min_insync_above_the_replication_factor_is_refused_at_start() {
    let out = e2e::proc::relay_cli(&[
        "run",
        "--database-url",
        "postgres://nobody@127.0.0.1:1/none",
        "--kafka-brokers",
        "127.0.0.1:1",
        "--create-missing-topics",
        "--topic-replication-factor",
        "2",
        "--topic-min-insync-replicas",
        "3",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--topic-min-insync-replicas 3 is above --topic-replication-factor 2"),
        "{stderr}"
    );
}
