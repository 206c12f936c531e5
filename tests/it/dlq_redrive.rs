//! `stock-consumer dlq list` and `dlq redrive` as processes against a running stock consumer:
//! an event the database refused is dead-lettered, listed, fixed, redriven and applied once; a
//! second redrive is an inbox duplicate; an unknown event id fails with a message.

use std::time::Duration;

use e2e::fulfilment::{count, inbox_duplicates, produce};
use e2e::proc::{workspace_binary, ServiceProcess};
use serde_json::{json, Value};
use uuid::Uuid;

/// Runs `stock-consumer dlq <args>` with `envs`; returns (exit success, stdout, stderr).
async fn dlq(envs: &[(String, String)], args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(workspace_binary("stock-consumer"))
        .arg("dlq")
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .output()
        .await
        .expect("run stock-consumer dlq");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn listed(envs: &[(String, String)]) -> Vec<Value> {
    let (ok, stdout, stderr) = dlq(envs, &["list", "--json"]).await;
    assert!(ok, "dlq list failed: {stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(doc["consumer"], "stock");
    doc["dead_letters"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixed_dead_letter_redriven_is_applied_exactly_once() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let envs: Vec<(String, String)> = [
        ("DATABASE_URL", db.url.as_str()),
        ("KAFKA_BROKERS", brokers.as_str()),
        ("OUTBOX_TOPIC_PREFIX", prefix.as_str()),
        ("KAFKA_GROUP_ID", &format!("{prefix}stock")),
        ("CONSUMER_CREATE_MISSING_TOPICS", "true"),
        ("CONSUMER_TOPIC_PARTITIONS", "3"),
        ("KAFKA_CONSUMER_CONFIG", "session.timeout.ms=6000"),
        ("CONSUMER_RETRY_MAX_BACKOFF_MS", "500"),
        ("LISTEN_ADDR", "127.0.0.1:0"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let env_refs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let consumer = ServiceProcess::start("stock-consumer", "stock-consumer-dlq", &[], &env_refs);
    e2e::wait_for(
        "the stock consumer to be assigned its partitions",
        Duration::from_secs(90),
        || async {
            consumer
                .log_text()
                .contains("Partitions assigned")
                .then_some(())
        },
    )
    .await;

    // The database refuses this order's reservation until an operator fixes it.
    let order = Uuid::new_v4();
    sqlx::query("INSERT INTO stock (sku_id, on_hand) VALUES ('R1', 10)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER TABLE reservations ADD CONSTRAINT e2e_blocked CHECK (order_id <> '{order}')"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let event_id = Uuid::new_v4();
    let paid = json!({"order_id": order, "items": [{"sku_id": "R1", "quantity": 1}]}).to_string();
    let headers: Vec<(String, String)> = [
        ("event_id", event_id.to_string()),
        ("event_type", "OrderPaid".to_owned()),
        ("aggregate_type", "order".to_owned()),
        ("aggregate_id", order.to_string()),
        ("traceparent", "00-e2e-01".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    tokio::task::spawn_blocking({
        let (brokers, topic, key) = (brokers.clone(), topic.clone(), order.to_string());
        move || produce(&brokers, &topic, &key, &paid, &headers, None)
    })
    .await
    .unwrap();

    let letter = e2e::wait_for(
        "dlq list to show the refused event",
        Duration::from_secs(60),
        || async {
            listed(&envs)
                .await
                .into_iter()
                .find(|l| l["event_id"] == event_id.to_string())
        },
    )
    .await;
    assert_eq!(letter["reason"], "unapplicable", "{letter}");
    assert_eq!(letter["source_topic"], topic.as_str(), "{letter}");
    assert_eq!(letter["event_type"], "OrderPaid", "{letter}");
    assert!(letter["source_offset"].is_i64(), "{letter}");
    assert!(letter["dead_lettered_at"].is_string(), "{letter}");
    assert!(
        letter["error"]
            .as_str()
            .unwrap_or_default()
            .contains("e2e_blocked"),
        "{letter}"
    );
    let reservations = || {
        count(
            &db.pool,
            "SELECT count(*) FROM reservations WHERE status = 'RESERVED'",
        )
    };
    assert_eq!(reservations().await, 0);

    // Fixed: the redrive applies it.
    sqlx::query("ALTER TABLE reservations DROP CONSTRAINT e2e_blocked")
        .execute(&db.pool)
        .await
        .unwrap();
    let id = event_id.to_string();
    let (ok, stdout, stderr) = dlq(&envs, &["redrive", "--event-id", &id, "--json"]).await;
    assert!(ok, "dlq redrive failed: {stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let redriven = doc["redriven"].as_array().cloned().unwrap_or_default();
    assert_eq!(redriven.len(), 1, "{doc}");
    assert_eq!(redriven[0]["event_id"], id.as_str());
    assert_eq!(redriven[0]["topic"], topic.as_str());
    e2e::wait_for(
        "the redriven event applied",
        Duration::from_secs(60),
        || async { (reservations().await == 1).then_some(()) },
    )
    .await;
    let reserved = || count(&db.pool, "SELECT reserved FROM stock WHERE sku_id = 'R1'");
    assert_eq!(reserved().await, 1);

    // Again: the inbox counts a duplicate, nothing is applied twice.
    let (ok, _, stderr) = dlq(&envs, &["redrive", "--event-id", &id]).await;
    assert!(ok, "second dlq redrive failed: {stderr}");
    e2e::wait_for(
        "the second redrive counted as an inbox duplicate",
        Duration::from_secs(60),
        || async { (inbox_duplicates(&db.pool).await == 1).then_some(()) },
    )
    .await;
    assert_eq!(reservations().await, 1, "applied exactly once");
    assert_eq!(reserved().await, 1);
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM stock_movements").await,
        1
    );
    assert_eq!(
        listed(&envs)
            .await
            .iter()
            .filter(|l| l["event_id"] == id.as_str())
            .count(),
        1,
        "redriving dead-lettered nothing new"
    );

    // An event id no dead letter has: non-zero exit, the message names it.
    let unknown = Uuid::new_v4().to_string();
    let (ok, stdout, stderr) = dlq(&envs, &["redrive", "--event-id", &unknown]).await;
    assert!(!ok, "redrive of an unknown event id must fail: {stdout}");
    assert!(
        stderr.contains(&format!(
            "no dead letter of consumer `stock` has event id {unknown}"
        )),
        "{stderr}"
    );
    drop(consumer);
}
