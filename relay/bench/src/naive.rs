//! Phase 4: a naive relay as a first draft would write it: select the oldest row, publish it,
//! wait for the acknowledgement, delete it, repeat. One connection, an idempotent producer
//! with librdkafka's defaults (except `linger.ms`, reported), autocommit statements.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use outbox_writer::{EventEnvelope, Payload};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use sqlx::{Connection, Row};

use crate::infra::Infra;
use crate::workload::{owned_headers, Workload, AGGREGATE_TYPE};

/// Figures of phase 4.
#[derive(Debug, Clone, Serialize)]
pub struct NaiveFigures {
    /// Events relayed.
    pub events: u64,
    /// Seconds.
    pub seconds: f64,
    /// Events per second.
    pub events_per_s: f64,
    /// `linger.ms` of its producer.
    pub linger_ms: u64,
}

/// Runs phase 4.
///
/// # Errors
/// Database or broker errors.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    n: u64,
    linger_ms: u64,
) -> anyhow::Result<NaiveFigures> {
    let db = infra.fresh_database("naive").await?;
    let prefix = infra.topic_prefix("naive");
    let topic = format!("{prefix}{AGGREGATE_TYPE}");
    infra.create_topic(&topic).await?;
    w.insert_backlog(&db.pool, n).await?;
    infra.checkpoint().await;

    let producer: FutureProducer = infra
        .client_config()
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms.to_string())
        .set("enable.metrics.push", "false")
        .create()
        .context("creating the naive producer")?;
    let mut conn = crate::infra::connect(&db.url).await?;

    let start = Instant::now();
    let mut relayed = 0u64;
    loop {
        let Some(r) = sqlx::query(
            "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload::text AS payload, \
                    payload_bytes, content_type, headers, topic, created_at \
             FROM outbox ORDER BY id LIMIT 1",
        )
        .fetch_optional(&mut conn)
        .await?
        else {
            break;
        };
        let row = EventEnvelope {
            id: r.get("id"),
            event_id: r.get("event_id"),
            aggregate_type: r.get("aggregate_type"),
            aggregate_id: r.get("aggregate_id"),
            event_type: r.get("event_type"),
            payload: match (r.get("payload"), r.get("payload_bytes")) {
                (Some(json), _) => Payload::Json(json),
                (None, Some(bytes)) => Payload::Binary {
                    bytes,
                    content_type: r
                        .get::<Option<String>, _>("content_type")
                        .unwrap_or_default(),
                },
                (None, None) => Payload::Tombstone,
            },
            key: None,
            headers: r.get("headers"),
            topic: r.get("topic"),
            created_at: r.get("created_at"),
            relay_headers: true,
        };
        let record = FutureRecord::to(&topic)
            .key(&row.aggregate_id)
            .payload(row.payload.bytes().unwrap_or_default())
            .headers(owned_headers(&row));
        if let Err((e, _)) = producer.send(record, Duration::from_secs(30)).await {
            bail!("naive relay: event {} not acknowledged: {e}", row.id);
        }
        sqlx::query("DELETE FROM outbox WHERE id = $1")
            .bind(row.id)
            .execute(&mut conn)
            .await?;
        relayed += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    conn.close().await?;
    infra.drop_database(db).await?;
    if relayed != n {
        bail!("naive relay moved {relayed} events, expected {n}");
    }
    Ok(NaiveFigures {
        events: n,
        seconds,
        events_per_s: n as f64 / seconds,
        linger_ms,
    })
}
