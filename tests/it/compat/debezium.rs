//! Debezium itself in the harness (`e2e::debezium`): its PostgreSQL connector with the Outbox
//! Event Router, run by Kafka Connect on the test's database and the shared broker, read back
//! with kafka-python. What teams coming from Debezium have on their topics today, the reference
//! the relay's Debezium compatibility is held against.

use e2e::debezium::{create_outbox_table, Debezium, DebeziumOptions};
use serde_json::json;
use uuid::Uuid;

/// Debezium's outbox table of this test's own schema.
const TABLE: &str = "dbz.outbox";

/// One committed row: its aggregate, its id, its payload as PostgreSQL prints it.
struct Row {
    aggregate_id: &'static str,
    id: Uuid,
    payload_text: String,
}

#[tokio::test(flavor = "multi_thread")]
async fn debezium_routes_each_row_keyed_by_aggregate_id_with_the_payload_text_in_order_per_key() {
    let db = e2e::db::empty_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    create_outbox_table(&db.pool, TABLE).await;
    let debezium = Debezium::start(&db.url, &brokers, &DebeziumOptions::new(TABLE, &prefix)).await;

    // Two aggregates, three transactions; one payload with nested objects, an array and text
    // beyond ASCII (and quotes and a backslash the JSON escapes).
    let events = [
        (
            "order-1",
            json!({"order_id": "order-1", "status": "CREATED"}),
        ),
        (
            "order-2",
            json!({
                "order_id": "order-2",
                "customer": {"name": "Zoë Ångström", "address": {"city": "Malmö", "zip": "211 22"}},
                "lines": [{"sku": "ランプ", "qty": 2, "note": "☃ \"fragile\" \\ 📦"}],
                "amount_cents": 9900
            }),
        ),
        ("order-1", json!({"order_id": "order-1", "status": "PAID"})),
    ];
    let mut rows = Vec::new();
    for (aggregate_id, payload) in events {
        let id = Uuid::new_v4();
        let payload_text: String = sqlx::query_scalar(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1, 'order', $2, 'OrderChanged', $3) RETURNING payload::text",
        )
        .bind(id)
        .bind(aggregate_id)
        .bind(&payload)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        rows.push(Row {
            aggregate_id,
            id,
            payload_text,
        });
    }

    let topic = format!("{prefix}order");
    let mut records = e2e::verify::dump_bytes(&brokers, std::slice::from_ref(&topic), 3);
    assert_eq!(
        records.len(),
        3,
        "three messages on {topic}, got {records:?}; Debezium's log: {}",
        debezium.log_path().display()
    );
    records.sort_by_key(|r| (r.partition, r.offset));
    for aggregate_id in ["order-1", "order-2"] {
        let sent: Vec<&Row> = rows
            .iter()
            .filter(|r| r.aggregate_id == aggregate_id)
            .collect();
        let got: Vec<_> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(aggregate_id))
            .collect();
        assert_eq!(
            got.iter()
                .map(|r| r.headers.get("id").cloned())
                .collect::<Vec<_>>(),
            sent.iter()
                .map(|r| Some(r.id.to_string()))
                .collect::<Vec<_>>(),
            "{aggregate_id}'s events, by their id header, in commit order"
        );
        for (r, row) in got.iter().zip(&sent) {
            assert_eq!(
                r.value_hex.as_deref(),
                Some(hex::encode(row.payload_text.as_bytes()).as_str()),
                "{aggregate_id}: the value is the payload's text, byte for byte ({:?} vs {:?})",
                r.value,
                row.payload_text
            );
            assert_eq!(r.partition, got[0].partition, "one partition per key");
        }
    }
}
