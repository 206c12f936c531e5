//! Metadata requests of the topic catalog: what the cluster says of a topic (partitions,
//! replicas, leaders) and of its brokers, each request on a thread of its own
//! ([`detached`]).

use std::collections::HashSet;
use std::time::Duration;

use outbox_kafka::PolledProducer;
use rdkafka::error::KafkaError;

use crate::kafka_context::RelayContext;

/// How long one metadata request may wait for the cluster.
pub(super) const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// The id of a broker of the cluster (`None`: no broker answered).
pub(super) async fn any_broker(producer: &PolledProducer<RelayContext>) -> Option<i32> {
    use rdkafka::producer::Producer;
    let producer = producer.shared();
    detached(move || {
        let md = producer
            .client()
            .fetch_metadata(None, METADATA_TIMEOUT)
            .ok()?;
        md.brokers().first().map(|b| b.id())
    })
    .await
    .flatten()
}

/// Runs the blocking `f` (a metadata request, up to [`METADATA_TIMEOUT`]) on a thread of its
/// own, not the runtime's blocking pool: a runtime waits for its blocking threads as it shuts
/// down, so a SIGTERM while a request waits on a silent broker would wait for the request.
/// `None` when the thread could not be started or panicked.
async fn detached<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("relay-metadata".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.await.ok()
}

/// A topic as the metadata shows it.
#[derive(Debug, Clone)]
pub(super) struct Shape {
    /// Its first partition's replicas.
    pub(super) replicas: usize,
    /// Its partitions.
    pub(super) count: i32,
    /// Its partitions without a leader.
    pub(super) leaderless: HashSet<i32>,
}

/// `topic` as the metadata shows it, `None` when the broker does not have it (an error: no
/// broker answered in time).
pub(super) async fn describe(
    producer: &PolledProducer<RelayContext>,
    topic: &str,
) -> Result<Option<Shape>, KafkaError> {
    use rdkafka::producer::Producer;
    let producer = producer.shared();
    let topic = topic.to_owned();
    detached(move || {
        let md = producer
            .client()
            .fetch_metadata(Some(&topic), METADATA_TIMEOUT)?;
        Ok(md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| Shape {
                replicas: t.partitions()[0].replicas().len(),
                count: t.partitions().len() as i32,
                leaderless: t
                    .partitions()
                    .iter()
                    .filter(|p| p.leader() < 0)
                    .map(|p| p.id())
                    .collect(),
            }))
    })
    .await
    .ok_or(KafkaError::Canceled)?
}

/// The number of partitions of `topic`, `None` when the broker does not have it.
pub(super) async fn partitions(
    producer: &PolledProducer<RelayContext>,
    topic: &str,
) -> Result<Option<i32>, KafkaError> {
    Ok(describe(producer, topic).await?.map(|t| t.count))
}

/// Asks the broker whether `topic` exists (an error: no broker answered in time).
pub(crate) async fn exists(
    producer: &PolledProducer<RelayContext>,
    topic: &str,
) -> Result<bool, KafkaError> {
    Ok(replicas(producer, topic).await?.is_some())
}

/// The replication factor of `topic` (its first partition's replicas), `None` when the broker
/// does not have it (an error: no broker answered in time).
pub(crate) async fn replicas(
    producer: &PolledProducer<RelayContext>,
    topic: &str,
) -> Result<Option<usize>, KafkaError> {
    Ok(describe(producer, topic).await?.map(|t| t.replicas))
}
