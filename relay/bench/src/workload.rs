//! The events every phase moves: `order` / `OrderPaid` events of ~`payload_bytes` bytes of JSON,
//! keyed by one of `aggregates` aggregate ids, event `i` belonging to aggregate `i % aggregates`.
//! The database backlog and the pre-built Kafka messages have the same keys, sizes and headers.

use std::time::Instant;

use chrono::Utc;
use outbox_kit::EventEnvelope;
use rdkafka::message::{Header, OwnedHeaders};
use sqlx::PgPool;
use uuid::Uuid;

/// Aggregate type of every event (topic `<prefix>order`).
pub const AGGREGATE_TYPE: &str = "order";
/// Event type of every event.
pub const EVENT_TYPE: &str = "OrderPaid";

/// Characters of a payload besides the padding and the two numbers.
const PAYLOAD_OVERHEAD: u64 = 63;

/// Shape of the events.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Distinct aggregate ids.
    pub aggregates: u64,
    /// Target payload size in bytes.
    pub payload_bytes: u64,
}

impl Workload {
    fn pad_len(&self) -> u64 {
        // Room for a 6-digit order id and a 5-digit amount.
        self.payload_bytes
            .saturating_sub(PAYLOAD_OVERHEAD + 11)
            .max(1)
    }

    /// Aggregate id (the Kafka key) of event `i`.
    pub fn aggregate_id(&self, i: u64) -> String {
        (i % self.aggregates).to_string()
    }

    /// Payload of event `i`, as PostgreSQL prints the `jsonb` that [`Self::insert_backlog`]
    /// writes (keys ordered by length, a space after `:` and `,`).
    pub fn payload(&self, i: u64) -> String {
        let pad = "x".repeat(self.pad_len() as usize);
        format!(
            r#"{{"pad": "{pad}", "currency": "EUR", "order_id": "{i}", "amount_cents": {}}}"#,
            (i * 37) % 100_000
        )
    }

    /// Envelopes of events `1..=n` as the relay would read them from the outbox.
    pub fn envelopes(&self, n: u64) -> Vec<EventEnvelope> {
        let now = Utc::now();
        (1..=n)
            .map(|i| EventEnvelope {
                id: i as i64,
                event_id: Uuid::new_v4(),
                aggregate_type: AGGREGATE_TYPE.to_owned(),
                aggregate_id: self.aggregate_id(i),
                event_type: EVENT_TYPE.to_owned(),
                payload: self.payload(i),
                headers: serde_json::json!({}),
                topic: None,
                created_at: now,
            })
            .collect()
    }

    /// Inserts events `1..=n` with one `INSERT ... SELECT generate_series`; returns seconds.
    ///
    /// # Errors
    /// Database errors.
    pub async fn insert_backlog(&self, pool: &PgPool, n: u64) -> Result<f64, sqlx::Error> {
        let start = Instant::now();
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT $1, (g % $2)::text, $3, \
                    jsonb_build_object('pad', repeat('x', $4), 'currency', 'EUR', \
                                       'order_id', g::text, 'amount_cents', (g * 37) % 100000) \
             FROM generate_series(1::bigint, $5::bigint) g",
        )
        .bind(AGGREGATE_TYPE)
        .bind(self.aggregates as i64)
        .bind(EVENT_TYPE)
        .bind(self.pad_len() as i32)
        .bind(n as i64)
        .execute(pool)
        .await?;
        let secs = start.elapsed().as_secs_f64();
        sqlx::query("ANALYZE outbox").execute(pool).await?;
        Ok(secs)
    }

    /// Average payload size of the rows in the outbox, in bytes of JSON text.
    ///
    /// # Errors
    /// Database errors.
    pub async fn stored_payload_bytes(pool: &PgPool) -> Result<f64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT COALESCE(avg(octet_length(payload::text)), 0)::float8 FROM \
             (SELECT payload FROM outbox ORDER BY id LIMIT 1000) s",
        )
        .fetch_one(pool)
        .await
    }
}

/// The Kafka headers the relay sends for `e`, built once.
pub fn owned_headers(e: &EventEnvelope) -> OwnedHeaders {
    let headers = e.kafka_headers();
    let mut owned = OwnedHeaders::new_with_capacity(headers.len());
    for (k, v) in &headers {
        owned = owned.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_have_the_requested_size_and_are_json() {
        let w = Workload {
            aggregates: 10_000,
            payload_bytes: 300,
        };
        let p = w.payload(123_456);
        assert!((290..=310).contains(&p.len()), "{} bytes", p.len());
        let v: serde_json::Value = serde_json::from_str(&p).unwrap();
        assert_eq!(v["order_id"], "123456");
        assert_eq!(w.aggregate_id(123_456), "3456");
    }
}
