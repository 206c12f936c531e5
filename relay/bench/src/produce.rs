//! Phase 1, the broker's ceiling: an idempotent rdkafka producer (the relay's own librdkafka
//! settings) sending pre-built messages, all in flight at once. Also the relay's publish path
//! (`Publisher::publish_envelopes`, headers built per row, one batch awaited before the next) without
//! a database, which shows what waiting for every batch costs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::future::join_all;
use outbox_relay::publisher::{producer_config, Publisher};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
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
                e.aggregate_id.as_str(),
                e.payload.bytes().unwrap_or_default(),
                owned_headers(e),
            )
        })
        .collect();
    let cpu0 = infra.cpu.snapshot();
    let start = Instant::now();
    let mut futures = Vec::with_capacity(messages.len());
    for (key, payload, headers) in messages {
        let mut record = FutureRecord::to(&topic)
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
