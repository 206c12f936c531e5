//! Flow control between the fetch loop and the partition workers: the loop never waits for a
//! worker, so one slow or stuck partition cannot hold back the others.
//!
//! - [`hand_off`] puts a fetched message into its partition's queue, or, when the queue is
//!   full (or messages already wait), at the end of the partition's overflow buffer: messages
//!   reach the worker in offset order, none is dropped.
//! - [`regulate`] pauses a partition (`consumer.pause`) while its worker retries a message or
//!   its overflow buffer is not empty, and resumes it once neither holds. librdkafka stops
//!   fetching a paused partition, so the buffer holds at most what was fetched before the pause
//!   took effect. We chose the buffer over seeking back after pausing: a seek on a running
//!   consumer races with the fetcher, and the buffer keeps the messages we already have.
//! - [`regulate_all`] runs every [`REGULATE_INTERVAL`] while messages arrive or wait (or a
//!   partition is paused, or a worker retries): moves buffered messages into queues that have
//!   room again and pauses or resumes each partition. With nothing arriving, buffered or
//!   paused it runs every [`IDLE_REGULATE_INTERVAL`] (it also restarts dead workers), so an
//!   idle consumer does not wake 50 times a second.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaResult;
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc::error::TrySendError;

use super::event::RawMessage;
use super::metrics::ConsumerMetrics;
use super::registry::{WorkerHandle, WorkerRegistry};
use super::runtime::RuntimeContext;

/// How often the fetch loop refills queues from overflow buffers and pauses or resumes
/// partitions.
pub(crate) const REGULATE_INTERVAL: Duration = Duration::from_millis(20);

/// How often the fetch loop regulates while no message arrived since the last time and none
/// is buffered, no partition is paused and no worker retries.
pub(crate) const IDLE_REGULATE_INTERVAL: Duration = Duration::from_millis(500);

/// Gives `msg` to its partition's worker without waiting: into the queue when it has room and
/// nothing waits before it, else at the end of the overflow buffer. A message at an offset the
/// worker already has (fetched again) is dropped, so nothing is applied twice by this process
/// because of a pause.
pub(crate) fn hand_off(w: &mut WorkerHandle, msg: RawMessage) {
    if msg.offset < w.next_offset {
        tracing::debug!(
            kafka.topic = %msg.topic,
            kafka.partition = msg.partition,
            kafka.offset = msg.offset,
            "Dropped a message fetched again; its worker has it already"
        );
        return;
    }
    w.next_offset = msg.offset + 1;
    if !w.overflow.is_empty() {
        w.overflow.push_back(msg);
        return;
    }
    match w.tx.try_send(msg) {
        Ok(()) => {}
        Err(TrySendError::Full(msg)) => w.overflow.push_back(msg),
        Err(TrySendError::Closed(_)) => {
            // The partition was revoked while this message was fetched; its next owner reads it
            // from the committed offset.
            tracing::debug!("Dropped a message of a revoked partition");
        }
    }
}

/// Moves buffered messages into the queue while it has room.
fn refill(w: &mut WorkerHandle) {
    while let Some(msg) = w.overflow.pop_front() {
        match w.tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(msg)) => {
                w.overflow.push_front(msg);
                return;
            }
            Err(TrySendError::Closed(_)) => {
                w.overflow.clear();
                return;
            }
        }
    }
}

/// Whether the partition should not be fetched now: its worker retries, or messages wait.
fn should_pause(w: &WorkerHandle) -> bool {
    !w.overflow.is_empty() || w.retrying.load(std::sync::atomic::Ordering::Relaxed)
}

/// Pauses or resumes fetching of one partition.
///
/// # Errors
/// When librdkafka refuses (the partition is not assigned any more).
pub(crate) fn set_paused<C: Consumer<RuntimeContext>>(
    consumer: &C,
    topic: &str,
    partition: i32,
    paused: bool,
) -> KafkaResult<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    if paused {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    }
}

/// Refills the queue of `w` (partition `topic`/`partition`) from its buffer and pauses or
/// resumes the partition as needed. Returns whether its paused state changed.
pub(crate) fn regulate<C: Consumer<RuntimeContext>>(
    w: &mut WorkerHandle,
    consumer: &C,
    topic: &str,
    partition: i32,
) -> bool {
    refill(w);
    let pause = should_pause(w);
    if pause == w.paused {
        return false;
    }
    match set_paused(consumer, topic, partition, pause) {
        Ok(()) => {
            w.paused = pause;
            tracing::debug!(
                kafka.topic = %topic,
                kafka.partition = partition,
                buffered = w.overflow.len(),
                "{}",
                if pause {
                    "Paused a partition: its worker is retrying or its queue is full"
                } else {
                    "Resumed a partition"
                }
            );
            true
        }
        Err(e) => {
            // Nothing is lost either way: the buffer keeps what is fetched meanwhile.
            tracing::debug!(kafka.topic = %topic, kafka.partition = partition, error = %e, "Could not pause or resume a partition");
            false
        }
    }
}

/// [`regulate`] for every partition; updates `consumer_paused_partitions`. Returns whether
/// any partition still needs regulating: messages buffered, paused, or its worker retrying.
pub(crate) fn regulate_all<C: Consumer<RuntimeContext>>(
    registry: &Mutex<WorkerRegistry>,
    consumer: &C,
    metrics: &ConsumerMetrics,
) -> bool {
    let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
    let mut changed = false;
    let mut unsettled = false;
    for ((topic, partition), w) in &mut r.workers {
        changed |= regulate(w, consumer, topic, *partition);
        unsettled |= w.paused || should_pause(w);
    }
    if changed {
        metrics
            .paused_partitions
            .set(i64::try_from(r.paused_count()).unwrap_or(i64::MAX));
    }
    unsettled
}
