//! A partition worker: applies the messages of one assigned partition in offset order, one at
//! a time, and stores each message's offset only once it is finished (applied, recognised as a
//! duplicate, ignored, or dead-lettered). Messages of one key share a partition, so they are
//! applied in order; partitions have a worker each and run concurrently.
//!
//! A retryable failure is retried with backoff on the same message: nothing behind it in the
//! partition is applied meanwhile, and its offset does not move. The worker stops between
//! messages when told to (revoke, shutdown), or during a backoff wait; the message in hand is
//! then left unstored, so whoever consumes the partition next gets it again.

use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::apply::{apply, Applied, RetryPolicy};
use super::dlq::DeadLetters;
use super::event::{RawMessage, Rejection};
use super::handler::{Disposition, Handler};
use super::metrics::ConsumerMetrics;
use super::runtime::{RuntimeContext, WorkerRegistry};

/// What all workers of a runtime share.
pub(crate) struct Deps<H> {
    pub pool: PgPool,
    pub handler: Arc<H>,
    pub metrics: ConsumerMetrics,
    pub dead_letters: DeadLetters,
    pub consumer_name: String,
    pub retry: RetryPolicy,
}

/// One partition's worker.
pub(crate) struct Worker<H> {
    pub deps: Arc<Deps<H>>,
    pub consumer: Arc<StreamConsumer<RuntimeContext>>,
    pub registry: Arc<std::sync::Mutex<WorkerRegistry>>,
    pub topic: String,
    pub partition: i32,
    pub generation: u64,
}

/// The worker stopped while a message was unfinished.
struct Abandoned;

impl<H: Handler> Worker<H> {
    /// Applies messages from `rx` until `stop` is cancelled or the channel closes.
    pub async fn run(self, mut rx: mpsc::Receiver<RawMessage>, stop: CancellationToken) {
        tracing::debug!(
            kafka.topic = %self.topic,
            kafka.partition = self.partition,
            "Partition worker started"
        );
        loop {
            let msg = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => break,
                },
            };
            if self.process(&msg, &stop).await.is_err() {
                tracing::info!(
                    kafka.topic = %self.topic,
                    kafka.partition = self.partition,
                    kafka.offset = msg.offset,
                    "Stopped before the message in hand was applied; it will be delivered again"
                );
                break;
            }
            self.store_offset(&msg);
        }
        tracing::debug!(
            kafka.topic = %self.topic,
            kafka.partition = self.partition,
            "Partition worker stopped"
        );
    }

    /// Takes one message to a finished state.
    async fn process(&self, msg: &RawMessage, stop: &CancellationToken) -> Result<(), Abandoned> {
        let envelope = match msg.envelope() {
            Ok(e) => e,
            Err(rejection) => return self.dead_letter(msg, rejection, stop).await,
        };
        let Some(versions) = self.deps.handler.versions(&envelope.event_type) else {
            self.deps.metrics.finished("ignored");
            tracing::trace!(event.id = %envelope.event_id, event.name = %envelope.event_type, "Ignored event");
            return Ok(());
        };
        let event = match envelope.into_event(msg, versions) {
            Ok(e) => e,
            Err(rejection) => return self.dead_letter(msg, rejection, stop).await,
        };
        let mut failures = 0u32;
        loop {
            let started = Instant::now();
            let result = apply(
                &self.deps.pool,
                &self.deps.consumer_name,
                &*self.deps.handler,
                &event,
            )
            .await;
            match result {
                Ok(applied) => {
                    if let Applied::Effect(effect) = applied {
                        self.deps.handler.committed(&event, effect);
                    }
                    self.deps.metrics.observe_apply(started.elapsed());
                    self.deps.metrics.finished(applied.as_str());
                    if applied == Applied::Duplicate {
                        self.deps.metrics.inbox_duplicates.inc();
                        tracing::info!(
                            event.id = %event.event_id(),
                            event.name = %event.event_type(),
                            kafka.topic = %msg.topic,
                            kafka.partition = msg.partition,
                            kafka.offset = msg.offset,
                            "Skipped an event the inbox shows as already applied"
                        );
                    } else {
                        tracing::debug!(
                            event.id = %event.event_id(),
                            event.name = %event.event_type(),
                            outcome = applied.as_str(),
                            duration_ms = started.elapsed().as_secs_f64() * 1000.0,
                            "Applied event"
                        );
                    }
                    return Ok(());
                }
                Err(e) if e.disposition() == Disposition::DeadLetter => {
                    return self
                        .dead_letter(msg, Rejection::Unapplicable(e.describe()), stop)
                        .await;
                }
                Err(e) => {
                    failures += 1;
                    self.deps.metrics.retries.inc();
                    let wait = self.deps.retry.delay(failures, rand::random::<f64>());
                    tracing::warn!(
                        event.id = %event.event_id(),
                        event.name = %event.event_type(),
                        kafka.topic = %msg.topic,
                        kafka.partition = msg.partition,
                        kafka.offset = msg.offset,
                        attempt = failures,
                        retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        error = %e.describe(),
                        "Could not apply event; retrying the same message"
                    );
                    wait_or_stop(wait, stop).await?;
                }
            }
        }
    }

    /// Sends `msg` to its dead-letter topic, retrying until the broker acknowledged it.
    async fn dead_letter(
        &self,
        msg: &RawMessage,
        rejection: Rejection,
        stop: &CancellationToken,
    ) -> Result<(), Abandoned> {
        let event_id = msg
            .header("event_id")
            .flatten()
            .map(|v| String::from_utf8_lossy(v).into_owned());
        tracing::error!(
            event.id = event_id.as_deref().unwrap_or("-"),
            kafka.topic = %msg.topic,
            kafka.partition = msg.partition,
            kafka.offset = msg.offset,
            reason = rejection.reason(),
            error = %rejection,
            "Message can never be applied; sending it to the dead-letter topic and moving on"
        );
        let mut failures = 0u32;
        loop {
            match self.deps.dead_letters.send(msg, &rejection).await {
                Ok(()) => {
                    self.deps
                        .metrics
                        .dead_letters
                        .with_label_values(&[rejection.reason()])
                        .inc();
                    self.deps.metrics.finished("dead_lettered");
                    return Ok(());
                }
                Err(e) => {
                    failures += 1;
                    let wait = self.deps.retry.delay(failures, rand::random::<f64>());
                    tracing::warn!(
                        kafka.topic = %msg.topic,
                        kafka.partition = msg.partition,
                        kafka.offset = msg.offset,
                        attempt = failures,
                        error = %e,
                        "Could not produce to the dead-letter topic; retrying, the offset stays"
                    );
                    wait_or_stop(wait, stop).await?;
                }
            }
        }
    }

    /// Stores `msg.offset + 1` for the next commit, if this worker still owns the partition.
    fn store_offset(&self, msg: &RawMessage) {
        let current = self
            .registry
            .lock()
            .map(|r| r.is_current(&self.topic, self.partition, self.generation))
            .unwrap_or(false);
        if !current {
            tracing::debug!(
                kafka.topic = %self.topic,
                kafka.partition = self.partition,
                kafka.offset = msg.offset,
                "Partition was revoked meanwhile; not storing the offset (the inbox skips the redelivery)"
            );
            return;
        }
        let mut tpl = TopicPartitionList::new();
        let stored = tpl
            .add_partition_offset(&self.topic, self.partition, Offset::Offset(msg.offset + 1))
            .and_then(|()| self.consumer.store_offsets(&tpl));
        if let Err(e) = stored {
            tracing::debug!(
                kafka.topic = %self.topic,
                kafka.partition = self.partition,
                kafka.offset = msg.offset,
                error = %e,
                "Could not store the offset; the partition is probably being revoked"
            );
        }
    }
}

/// Sleeps for `wait` unless `stop` is cancelled first.
async fn wait_or_stop(
    wait: std::time::Duration,
    stop: &CancellationToken,
) -> Result<(), Abandoned> {
    tokio::select! {
        biased;
        () = stop.cancelled() => Err(Abandoned),
        () = tokio::time::sleep(wait) => Ok(()),
    }
}
