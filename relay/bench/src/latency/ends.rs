//! The two ends of each event's trip, on one wall clock: the writer that commits it and notes
//! when, and the consumer that notes when it arrives (and the `CreateTime` the producer
//! stamped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use outbox_writer::{enqueue, NewEvent};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use crate::infra::Infra;
use crate::relay_proc::RelayProc;
use crate::workload::{Workload, AGGREGATE_TYPE, EVENT_TYPE};

/// An event as the consumer saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) at_ms: f64,
    pub(crate) create_ms: Option<i64>,
}

/// An event as its writer committed it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Committed {
    pub(crate) id: Uuid,
    pub(crate) begin_ms: f64,
    pub(crate) commit_ms: f64,
}

/// Milliseconds since the Unix epoch: the one clock both ends stamp with.
pub(crate) fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

/// One event in its own transaction; returns its id and wall-clock begin and commit times.
pub(crate) async fn write_one(pool: &PgPool, w: &Workload, i: u64) -> anyhow::Result<Committed> {
    let id = Uuid::new_v4();
    let text = w.payload(i);
    let payload: serde_json::Value = serde_json::from_str(&text)?;
    let aggregate = w.aggregate_id(i);
    let value = match w.kind {
        crate::workload::PayloadKind::Json => outbox_writer::NewPayload::Json(&payload),
        crate::workload::PayloadKind::Binary => outbox_writer::NewPayload::Binary {
            bytes: text.as_bytes(),
            content_type: Some(crate::workload::BINARY_CONTENT_TYPE),
        },
    };
    let event = NewEvent {
        event_id: Some(id),
        payload: value,
        ..NewEvent::new(AGGREGATE_TYPE, &aggregate, EVENT_TYPE, &payload)
    };
    let begin_ms = wall_ms();
    let mut tx = pool.begin().await?;
    enqueue(&mut *tx, &event).await?;
    tx.commit().await?;
    Ok(Committed {
        id,
        begin_ms,
        commit_ms: wall_ms(),
    })
}

/// Waits until the consumer has seen every event of `ids`.
pub(crate) async fn wait_seen(
    seen: &Mutex<HashMap<Uuid, Seen>>,
    ids: &[Committed],
    count: &mut watch::Receiver<usize>,
    relay: &mut RelayProc,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let missing = {
            let seen = seen.lock().unwrap();
            ids.iter().filter(|c| !seen.contains_key(&c.id)).count()
        };
        if missing == 0 {
            return Ok(());
        }
        relay.check_running()?;
        if Instant::now() > deadline {
            bail!("{missing} committed events not seen by the consumer within {timeout:?}");
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), count.changed()).await;
    }
}

/// A consumer reading every partition of `topic` from the beginning into `seen`, each message
/// known by the event id in its header `id_header` (`event_id`; Debezium's `id`). It reads
/// `read_committed` (librdkafka's default, set explicitly): with `--transactions` an event
/// counts as seen only once its batch's transaction is committed.
pub(crate) fn spawn_consumer(
    infra: &Infra,
    topic: &str,
    id_header: &'static str,
    seen: Arc<Mutex<HashMap<Uuid, Seen>>>,
    count: watch::Sender<usize>,
    mut stop: oneshot::Receiver<()>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let consumer: StreamConsumer = infra
        .client_config()
        .set(
            "group.id",
            format!("relay-bench-{:08x}", rand::random::<u32>()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "10")
        .set("isolation.level", "read_committed")
        .set("enable.metrics.push", "false")
        .create()
        .context("creating the consumer")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..infra.partitions() {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(tokio::spawn(async move {
        loop {
            let msg = tokio::select! {
                m = consumer.recv() => m,
                _ = &mut stop => return,
            };
            let Ok(m) = msg else { continue };
            let at_ms = wall_ms();
            let id = m.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == id_header)
                    .and_then(|h| h.value)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|s| Uuid::parse_str(s).ok())
            });
            if let Some(id) = id {
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.entry(id).or_insert(Seen {
                        at_ms,
                        create_ms: m.timestamp().to_millis(),
                    });
                    seen.len()
                };
                let _ = count.send(n);
            }
        }
    }))
}
