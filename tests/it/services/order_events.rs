//! The order service with the relay and the broker: an order created and paid over HTTP (with
//! duplicate requests and callbacks) arrives on `outbox.event.order` as exactly one
//! `OrderCreated` then one `OrderPaid`, with the contract headers, read by kafka-python. The
//! service and the relay run as their least-privilege roles (`deploy/postgres/roles.sql`): the
//! migrations applied by the migrator, the service as `order_service` without touching the
//! schema, the relay as `outbox_relay`.

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess, ServiceProcess};
use order_service::CallbackSecret;
use serde_json::{json, Value};

const SECRET: &str = "e2e-callback-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn created_then_paid_order_arrives_on_the_broker_in_order_once() {
    let db = e2e::db::fresh_database().await;
    let roles = e2e::roles::migrate_as_migrator("order-service", &db.url, "order_service");
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    let addr = format!("127.0.0.1:{}", e2e::free_port());
    let _service = ServiceProcess::start(
        "order-service",
        "order-service",
        &["--listen", &addr, "--database-url", &roles.service],
        &[
            ("PAYMENT_CALLBACK_SECRET", SECRET),
            ("DATABASE_MIGRATIONS", "skip"),
        ],
    );
    let _relay = RelayProcess::start(&RelayArgs::new(
        &roles.relay,
        &brokers,
        &prefix,
        "order-relay",
    ));
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    crate::common::serving_with_a_lamp(&http, &base).await;

    // A double-clicked order: the same key twice gives one order.
    let order_body = json!({"items": [{"sku_id": "sku-1", "quantity": 2}]});
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = http
            .post(format!("{base}/orders"))
            .header("Idempotency-Key", "req-1")
            .bearer_auth(e2e::auth::customer("u-1"))
            .json(&order_body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "POST /orders: {}", r.status());
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["amount_cents"], 5000);
        ids.push(v["order_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids[0], ids[1]);
    let order_id = ids[0].clone();

    // The provider calls back three times (the same signed request: duplicates inside the
    // replay window).
    let body = serde_json::to_vec(&json!({
        "order_id": order_id, "transaction_id": "tx-1", "amount_cents": 5000, "status": "SUCCESS"
    }))
    .unwrap();
    let now = chrono::Utc::now().timestamp();
    let signature = CallbackSecret::new(SECRET).unwrap().sign_at(now, &body);
    for _ in 0..3 {
        let r = http
            .post(format!("{base}/payments/callback"))
            .header("X-Signature-Timestamp", now.to_string())
            .header("X-Signature", &signature)
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }

    e2e::wait_for("the outbox to drain", Duration::from_secs(60), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    let topic = format!("{prefix}order");
    let records = tokio::task::spawn_blocking({
        let brokers = brokers.clone();
        move || e2e::verify::dump(&brokers, &[topic])
    })
    .await
    .unwrap();
    let mine: Vec<_> = records
        .iter()
        .filter(|r| r.key.as_deref() == Some(order_id.as_str()))
        .collect();
    let types: Vec<&str> = mine
        .iter()
        .map(|r| r.headers["event_type"].as_str())
        .collect();
    assert_eq!(
        types,
        ["OrderCreated", "OrderPaid"],
        "exactly one of each, in order"
    );
    for r in &mine {
        let h = &r.headers;
        assert_eq!(h["id"], h["event_id"]);
        assert_eq!(h["aggregate_type"], "order");
        assert_eq!(h["aggregate_id"], order_id);
        assert!(
            chrono::DateTime::parse_from_rfc3339(&h["occurred_at"]).is_ok(),
            "occurred_at {:?}",
            h["occurred_at"]
        );
        let payload: Value = serde_json::from_str(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(payload["order_id"], order_id);
    }
    assert_eq!(mine[0].partition, mine[1].partition);
    assert!(mine[0].offset < mine[1].offset);
}
