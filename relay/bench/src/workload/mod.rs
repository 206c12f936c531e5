//! The events every phase moves: `order` / `OrderPaid` events of ~`payload_bytes` bytes of JSON,
//! keyed by one of `aggregates` aggregate ids, event `i` belonging to aggregate `i % aggregates`.
//! The database backlog and the pre-built Kafka messages have the same keys, sizes and headers.
//!
//! What a drain meets in front of that backlog (poisoned or suspect aggregates) is `front`.

use std::fmt::Write as _;
use std::time::Instant;

use chrono::Utc;
use outbox_writer::{EventEnvelope, Payload};
use rdkafka::message::{Header, OwnedHeaders};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

mod front;

pub use front::Front;

/// Aggregate type of every event (topic `<prefix>order`).
pub const AGGREGATE_TYPE: &str = "order";
/// Event type of every event.
pub const EVENT_TYPE: &str = "OrderPaid";

/// Characters of a payload besides the padding and the two numbers.
const PAYLOAD_OVERHEAD: u64 = 63;

/// Content type of the `binary` payload kind's values.
pub const BINARY_CONTENT_TYPE: &str = "application/octet-stream";

/// Which payload column the events use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadKind {
    /// `payload jsonb`, as most writers use it.
    #[default]
    Json,
    /// `payload_bytes bytea` with a `content_type`: the same bytes as the JSON kind, published
    /// unchanged.
    Binary,
}

/// What fills a payload up to its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    /// `"xxx..."`: what the main phases always used (lz4 and PostgreSQL's TOAST compression
    /// shrink it to almost nothing).
    #[default]
    Repeat,
    /// Hex digits of pseudo-random data (a slice of a 4 MiB pool, at an offset that depends on
    /// the event): neither lz4 nor TOAST compression can shrink it, so the bytes the broker and
    /// the database move are the payload's size (the `sizes` phase).
    Random,
}

/// Characters of the hex pool that [`Padding::Random`] slices (the SQL builds it from
/// `md5(k)` for `k` in `1..=POOL_CHARS / 32`, the bench from a PRNG: same size, same kind of
/// text, not the same bytes).
pub const POOL_CHARS: u64 = 4 << 20;

/// The bench's hex pool of [`POOL_CHARS`] characters.
fn hex_pool() -> &'static str {
    static POOL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut s = String::with_capacity(POOL_CHARS as usize);
        while (s.len() as u64) < POOL_CHARS {
            // splitmix64
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let _ = write!(s, "{z:016x}");
        }
        s.truncate(POOL_CHARS as usize);
        s
    })
}

/// Where event `i`'s padding of `len` characters starts in the pool (0-based; the SQL adds 1
/// for `substring`).
pub fn pool_offset(i: u64, len: u64) -> u64 {
    (i.wrapping_mul(7_919)) % (POOL_CHARS - len.min(POOL_CHARS - 1))
}

/// Shape of the events.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Distinct aggregate ids.
    pub aggregates: u64,
    /// Target payload size in bytes.
    pub payload_bytes: u64,
    /// The payload column.
    pub kind: PayloadKind,
    /// Aggregate types, one topic each: 1 is `order` alone, more are `order-<k>` for `k` in
    /// `0..topics`, event `i` of type `k = i % topics` (the `topics` phase).
    pub topics: u64,
    /// What fills the payloads.
    pub padding: Padding,
    /// Every row's `headers` carry a W3C `traceparent` (a trace of its own per event), so a
    /// relay with OTLP export on makes one PRODUCER span per event (`--traced`).
    pub traced: bool,
}

impl Workload {
    /// The main phases' workload: one topic, `x` padding.
    pub fn new(aggregates: u64, payload_bytes: u64, kind: PayloadKind) -> Self {
        Self {
            aggregates,
            payload_bytes,
            kind,
            topics: 1,
            padding: Padding::Repeat,
            traced: false,
        }
    }

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

    /// Aggregate type of event `i` (its topic is `<prefix><type>`).
    pub fn aggregate_type(&self, i: u64) -> String {
        if self.topics <= 1 {
            AGGREGATE_TYPE.to_owned()
        } else {
            format!("{AGGREGATE_TYPE}-{}", i % self.topics)
        }
    }

    /// Every topic the events go to under `prefix`.
    pub fn topic_names(&self, prefix: &str) -> Vec<String> {
        if self.topics <= 1 {
            vec![format!("{prefix}{AGGREGATE_TYPE}")]
        } else {
            (0..self.topics)
                .map(|k| format!("{prefix}{AGGREGATE_TYPE}-{k}"))
                .collect()
        }
    }

    /// Payload of event `i`, as PostgreSQL prints the `jsonb` that [`Self::insert_backlog`]
    /// writes (keys ordered by length, a space after `:` and `,`).
    pub fn payload(&self, i: u64) -> String {
        let len = self.pad_len();
        let pad: std::borrow::Cow<'_, str> = match self.padding {
            Padding::Repeat => "x".repeat(len as usize).into(),
            Padding::Random => {
                let at = pool_offset(i, len) as usize;
                hex_pool()[at..at + len as usize].into()
            }
        };
        format!(
            r#"{{"pad": "{pad}", "currency": "EUR", "order_id": "{i}", "amount_cents": {}}}"#,
            (i * 37) % 100_000
        )
    }

    /// The value of event `i` as the relay reads it.
    pub fn value(&self, i: u64) -> Payload {
        match self.kind {
            PayloadKind::Json => Payload::Json(self.payload(i)),
            PayloadKind::Binary => Payload::Binary {
                bytes: self.payload(i).into_bytes(),
                content_type: BINARY_CONTENT_TYPE.to_owned(),
            },
        }
    }

    /// The statement that inserts events `$5..=$6` (`$1` the aggregate type, `$2` the
    /// aggregates, `$3` the event type, `$4` the padding length).
    fn insert_sql(&self) -> String {
        let pad = match self.padding {
            Padding::Repeat => "repeat('x', $4)".to_owned(),
            Padding::Random => {
                // bytea: `substring` goes straight to the offset (on text in a UTF-8
                // database it walks every character before it: minutes for 20 000 rows).
                format!(
                    "convert_from(substring(p.pool FROM (1 + (g * 7919) % ({POOL_CHARS} - $4))::int \
                     FOR $4), 'UTF8')"
                )
            }
        };
        let json = format!(
            "jsonb_build_object('pad', {pad}, 'currency', 'EUR', \
             'order_id', g::text, 'amount_cents', (g * 37) % 100000)"
        );
        let (columns, values) = match self.kind {
            PayloadKind::Json => ("payload", json),
            // The same bytes as the JSON kind, stored as bytea.
            PayloadKind::Binary => (
                "payload_bytes, content_type",
                format!("convert_to(({json})::text, 'UTF8'), '{BINARY_CONTENT_TYPE}'"),
            ),
        };
        let (with, from) = match self.padding {
            Padding::Repeat => (String::new(), ""),
            Padding::Random => (
                format!(
                    "WITH p AS MATERIALIZED (SELECT convert_to(string_agg(md5(k::text), '' ORDER BY k), 'UTF8') AS pool \
                     FROM generate_series(1, {}) k) ",
                    POOL_CHARS / 32
                ),
                "p, ",
            ),
        };
        let (columns, values) = if self.traced {
            (
                format!("{columns}, headers"),
                format!(
                    "{values}, jsonb_build_object('traceparent', \
                     '00-' || md5(g::text) || '-' || left(md5('s' || g::text), 16) || '-01')"
                ),
            )
        } else {
            (columns.to_owned(), values)
        };
        let aggregate_type = if self.topics <= 1 {
            "$1".to_owned()
        } else {
            format!("$1 || '-' || (g % {})::text", self.topics)
        };
        format!(
            "{with}INSERT INTO outbox (aggregate_type, aggregate_id, event_type, {columns}) \
             SELECT {aggregate_type}, (g % $2)::text, $3, {values} \
             FROM {from}generate_series($5::bigint, $6::bigint) g"
        )
    }

    /// Envelopes of events `1..=n` as the relay would read them from the outbox.
    pub fn envelopes(&self, n: u64) -> Vec<EventEnvelope> {
        let now = Utc::now();
        (1..=n)
            .map(|i| EventEnvelope {
                id: i as i64,
                event_id: Uuid::new_v4(),
                aggregate_type: self.aggregate_type(i),
                aggregate_id: self.aggregate_id(i),
                event_type: EVENT_TYPE.to_owned(),
                payload: self.value(i),
                key: None,
                headers: serde_json::json!({}),
                topic: None,
                created_at: now,
                relay_headers: true,
            })
            .collect()
    }

    /// Inserts events `1..=n` with one `INSERT ... SELECT generate_series`; returns seconds.
    ///
    /// # Errors
    /// Database errors.
    pub async fn insert_backlog(&self, pool: &PgPool, n: u64) -> Result<f64, sqlx::Error> {
        let start = Instant::now();
        sqlx::query(&self.insert_sql())
            .bind(AGGREGATE_TYPE)
            .bind(self.aggregates as i64)
            .bind(EVENT_TYPE)
            .bind(self.pad_len() as i32)
            .bind(1i64)
            .bind(n as i64)
            .execute(pool)
            .await?;
        let secs = start.elapsed().as_secs_f64();
        sqlx::query("ANALYZE outbox").execute(pool).await?;
        Ok(secs)
    }

    /// Inserts events `first..=last` with one `INSERT ... SELECT generate_series` on `conn`
    /// (the caller decides the transaction and whether the aggregate lock is on).
    ///
    /// # Errors
    /// Database errors.
    pub async fn insert_range(
        &self,
        conn: &mut PgConnection,
        first: u64,
        last: u64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&self.insert_sql())
            .bind(AGGREGATE_TYPE)
            .bind(self.aggregates as i64)
            .bind(EVENT_TYPE)
            .bind(self.pad_len() as i32)
            .bind(first as i64)
            .bind(last as i64)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Inserts events `1..=n` in transactions of `chunk` rows each with the per-aggregate
    /// lock off (as a bulk load that nothing else writes meanwhile may), then `ANALYZE`;
    /// returns the seconds of the inserts.
    ///
    /// # Errors
    /// Database errors.
    pub async fn insert_backlog_unlocked(
        &self,
        pool: &PgPool,
        n: u64,
        chunk: u64,
    ) -> Result<f64, sqlx::Error> {
        let start = Instant::now();
        let mut first = 1;
        while first <= n {
            let last = (first + chunk.max(1) - 1).min(n);
            let mut tx = pool.begin().await?;
            aggregate_lock_off(&mut tx).await?;
            self.insert_range(&mut tx, first, last).await?;
            tx.commit().await?;
            first = last + 1;
        }
        let secs = start.elapsed().as_secs_f64();
        sqlx::query("ANALYZE outbox").execute(pool).await?;
        Ok(secs)
    }

    /// Average payload size of the rows in the outbox, in bytes of JSON text or bytes.
    ///
    /// # Errors
    /// Database errors.
    pub async fn stored_payload_bytes(pool: &PgPool) -> Result<f64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT COALESCE(avg(coalesce(octet_length(payload::text), octet_length(payload_bytes))), 0)::float8 \
             FROM (SELECT payload, payload_bytes FROM outbox ORDER BY id LIMIT 1000) s",
        )
        .fetch_one(pool)
        .await
    }
}

/// Turns the per-aggregate insert lock (migration `20260101000003_aggregate_order.sql`) off
/// for the rest of the current transaction (`outbox_aggregate_lock_off()`, migration
/// `20260101000006`).
///
/// # Errors
/// Database errors.
pub async fn aggregate_lock_off(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT outbox_aggregate_lock_off()")
        .execute(conn)
        .await?;
    Ok(())
}

/// The Kafka headers the relay sends for `e`, built once.
pub fn owned_headers(e: &EventEnvelope) -> OwnedHeaders {
    let headers = e.kafka_headers(outbox_writer::HeaderOptions::default());
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
        let w = Workload::new(10_000, 300, PayloadKind::Json);
        let p = w.payload(123_456);
        assert!((290..=310).contains(&p.len()), "{} bytes", p.len());
        let v: serde_json::Value = serde_json::from_str(&p).unwrap();
        assert_eq!(v["order_id"], "123456");
        assert_eq!(w.aggregate_id(123_456), "3456");
    }

    #[test]
    fn random_padding_has_the_size_and_differs_per_event() {
        for size in [100u64, 1024, 16 << 10, 256 << 10] {
            let w = Workload {
                padding: Padding::Random,
                ..Workload::new(10_000, size, PayloadKind::Json)
            };
            let (a, b) = (w.payload(1), w.payload(2));
            assert!(
                a.len() as u64 >= size - 10 && a.len() as u64 <= size + 10,
                "{size}: {} bytes",
                a.len()
            );
            let v: serde_json::Value = serde_json::from_str(&a).unwrap();
            let pad = v["pad"].as_str().unwrap();
            assert!(pad.bytes().all(|c| c.is_ascii_hexdigit()));
            assert_ne!(a[..60], b[..60], "events share a padding");
        }
        // The offset keeps the slice inside the pool.
        assert!(pool_offset(u64::MAX, 256 << 10) + (256 << 10) <= POOL_CHARS);
    }

    #[test]
    fn topics_are_named_after_the_aggregate_types() {
        let one = Workload::new(10, 300, PayloadKind::Json);
        assert_eq!(one.topic_names("p."), vec!["p.order"]);
        assert_eq!(one.aggregate_type(7), "order");
        let many = Workload { topics: 100, ..one };
        let names = many.topic_names("p.");
        assert_eq!(names.len(), 100);
        assert_eq!(
            (names[0].as_str(), names[99].as_str()),
            ("p.order-0", "p.order-99")
        );
        let used: std::collections::BTreeSet<String> = (1..=1_000)
            .map(|i| format!("p.{}", many.aggregate_type(i)))
            .collect();
        assert_eq!(used, names.into_iter().collect());
        // Envelopes route like the rows the SQL inserts: type `order-<i % topics>`.
        let e = many.envelopes(3);
        assert_eq!(e[2].topic("p."), "p.order-3");
    }
}
