//! Phase 1, the broker's ceiling: an idempotent rdkafka producer (the relay's own librdkafka
//! settings) sending pre-built messages, all in flight at once. Also the relay's publish path
//! (`Publisher::publish_envelopes`, headers built per row, one batch awaited before the next) without
//! a database, which shows what waiting for every batch costs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::future::join_all;
use outbox_relay::publisher::{producer_config, Publisher};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;

use crate::infra::Infra;
use crate::workload::{owned_headers, Workload, AGGREGATE_TYPE};

/// Figures of phase 1.
#[derive(Debug, Clone, Serialize)]
pub struct ProduceFigures {
    /// Messages sent.
    pub messages: u64,
    /// Seconds from the first send to the last acknowledgement (all in flight).
    pub seconds: f64,
    /// Messages per second, all in flight.
    pub msgs_per_s: f64,
    /// Messages per second through `Publisher::publish_envelopes` in batches of the relay's batch size.
    pub publish_path_msgs_per_s: f64,
    /// Seconds of that run.
    pub publish_path_seconds: f64,
    /// Average wait per batch in the publish-path run (send to last acknowledgement), in ms.
    pub publish_path_ms_per_batch: f64,
    /// CPU of the all-in-flight run (relay-bench is the producer; the broker).
    pub cpu: crate::cpu::CpuFigures,
    /// CPU of the publish-path run.
    pub publish_path_cpu: crate::cpu::CpuFigures,
}

/// Runs phase 1.
///
/// # Errors
/// Broker errors, or a message that was not acknowledged.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    n: u64,
    batch_size: i64,
) -> anyhow::Result<ProduceFigures> {
    let envelopes = w.envelopes(n);

    // All in flight: pre-built keys, payloads and headers, produce all, then await all.
    let prefix = infra.topic_prefix("produce");
    let topic = format!("{prefix}{AGGREGATE_TYPE}");
    infra.create_topic(&topic).await?;
    let producer: FutureProducer = producer_config(infra.brokers(), &[])
        .create()
        .context("creating the producer")?;
    warm_up(&producer, &topic).await?;
    let messages: Vec<_> = envelopes
        .iter()
        .map(|e| {
            (
                topic.as_str(),
                e.aggregate_id.as_str(),
                e.payload.bytes().unwrap_or_default(),
                owned_headers(e),
            )
        })
        .collect();
    let (seconds, cpu) = send_all(infra, &producer, messages).await?;
    drop(producer);

    // The relay's publish path, batch after batch, no database.
    let prefix = infra.topic_prefix("publish");
    infra
        .create_topic(&format!("{prefix}{AGGREGATE_TYPE}"))
        .await?;
    let publisher = Publisher::new(infra.brokers(), &[], &prefix)?;
    // Warm up: the producer's first message pays for the connection and the producer id.
    if let Some(first) = envelopes.first() {
        let warm = publisher
            .publish_envelopes(std::slice::from_ref(first))
            .await;
        if !matches!(warm.first(), Some(outbox_relay::decide::Outcome::Acked(_))) {
            bail!("warm-up message through the publish path failed: {warm:?}");
        }
    }
    let cpu1 = infra.cpu.snapshot();
    let start = Instant::now();
    let mut batches = 0u64;
    for chunk in envelopes.chunks(batch_size as usize) {
        let outcomes = publisher.publish_envelopes(chunk).await;
        if let Some((row, bad)) = chunk
            .iter()
            .zip(&outcomes)
            .find(|(_, o)| !matches!(o, outbox_relay::decide::Outcome::Acked(_)))
        {
            bail!("publish path: event {} failed: {bad:?}", row.id);
        }
        batches += 1;
    }
    let publish_seconds = start.elapsed().as_secs_f64();
    let publish_path_cpu = crate::cpu::CpuFigures::between(&cpu1, &infra.cpu.snapshot(), n, None);

    Ok(ProduceFigures {
        messages: n,
        seconds,
        msgs_per_s: n as f64 / seconds,
        publish_path_msgs_per_s: n as f64 / publish_seconds,
        publish_path_seconds: publish_seconds,
        publish_path_ms_per_batch: publish_seconds * 1000.0 / batches.max(1) as f64,
        cpu,
        publish_path_cpu,
    })
}

/// The raw producer alone over a workload's own topics (`sizes`, `topics` phases).
#[derive(Debug, Clone, Serialize)]
pub struct RawProduce {
    /// Messages sent.
    pub messages: u64,
    /// Payload bytes sent (keys and headers not counted).
    pub payload_bytes: u64,
    /// Topics they went to.
    pub topics: usize,
    /// Seconds from the first send to the last acknowledgement (all in flight).
    pub seconds: f64,
    /// Messages per second.
    pub msgs_per_s: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// CPU (relay-bench is the producer; the broker).
    pub cpu: crate::cpu::CpuFigures,
}

/// The all-in-flight raw produce of events `1..=n` of `w`, each to its own topic (created
/// here and deleted after).
///
/// # Errors
/// Broker errors, or a message that was not acknowledged.
pub async fn raw(infra: &Infra, w: &Workload, n: u64, label: &str) -> anyhow::Result<RawProduce> {
    let envelopes = w.envelopes(n);
    let prefix = infra.topic_prefix(label);
    let topics = w.topic_names(&prefix);
    infra.create_topics(&topics).await?;
    let producer: FutureProducer = producer_config(infra.brokers(), &[])
        .create()
        .context("creating the producer")?;
    // The first message to each topic pays for its metadata: warm them all.
    let warm: Vec<_> = topics
        .iter()
        .map(|t| {
            producer.send(
                FutureRecord::to(t).key("warm-up").payload("{}"),
                Duration::from_secs(30),
            )
        })
        .collect();
    for r in join_all(warm).await {
        if let Err((e, _)) = r {
            bail!("warm-up message of {label} failed: {e}");
        }
    }
    let payload_bytes: u64 = envelopes
        .iter()
        .map(|e| e.payload.bytes().map_or(0, |b| b.len() as u64))
        .sum();
    let dest: Vec<String> = envelopes.iter().map(|e| e.topic(&prefix)).collect();
    let messages: Vec<_> = envelopes
        .iter()
        .zip(&dest)
        .map(|(e, topic)| {
            (
                topic.as_str(),
                e.aggregate_id.as_str(),
                e.payload.bytes().unwrap_or_default(),
                owned_headers(e),
            )
        })
        .collect();
    let sent = send_all(infra, &producer, messages).await;
    drop(producer);
    infra.delete_topics(&topics).await;
    let (seconds, cpu) = sent?;
    Ok(RawProduce {
        messages: n,
        payload_bytes,
        topics: topics.len(),
        seconds,
        msgs_per_s: n as f64 / seconds,
        mb_per_s: payload_bytes as f64 / seconds / 1e6,
        cpu,
    })
}

/// Sends every message of `messages` (topic, key, payload, headers) at once and awaits all acknowledgements;
/// returns the seconds and the CPU of that.
async fn send_all(
    infra: &Infra,
    producer: &FutureProducer,
    messages: Vec<(&str, &str, &[u8], OwnedHeaders)>,
) -> anyhow::Result<(f64, crate::cpu::CpuFigures)> {
    let n = messages.len() as u64;
    let cpu0 = infra.cpu.snapshot();
    let start = Instant::now();
    let mut futures = Vec::with_capacity(messages.len());
    for (topic, key, payload, headers) in messages {
        let mut record = FutureRecord::to(topic)
            .key(key)
            .payload(payload)
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(f) => break futures.push(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((e, _)) => bail!("produce refused: {e}"),
            }
        }
    }
    let failed = join_all(futures)
        .await
        .into_iter()
        .filter(|r| !matches!(r, Ok(Ok(_))))
        .count();
    let seconds = start.elapsed().as_secs_f64();
    let cpu = crate::cpu::CpuFigures::between(&cpu0, &infra.cpu.snapshot(), n, None);
    if failed > 0 {
        bail!("{failed} of {n} messages were not acknowledged");
    }
    Ok((seconds, cpu))
}

/// Sends one message and waits for it, so connection set-up and the idempotent producer id
/// are not timed.
async fn warm_up<C: rdkafka::client::ClientContext + 'static>(
    producer: &FutureProducer<C>,
    topic: &str,
) -> anyhow::Result<()> {
    let r = producer
        .send(
            FutureRecord::to(topic).key("warm-up").payload("{}"),
            Duration::from_secs(30),
        )
        .await;
    if let Err((e, _)) = r {
        bail!("warm-up message to {topic} failed: {e}");
    }
    Ok(())
}
