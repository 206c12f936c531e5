//! A partition worker: applies the messages of one assigned partition in offset order, one at
//! a time, and stores each message's offset only once it is finished (applied, recognised as a
//! duplicate, ignored, or dead-lettered). Messages of one key share a partition, so they are
//! applied in order; partitions have a worker each and run concurrently.
//!
//! A failed attempt is rolled back and retried with backoff on the same message: nothing
//! behind it in the partition is applied meanwhile, and its offset does not move. Infrastructure
//! errors are retried for as long as it takes; errors that come back the same on every attempt
//! ([`Disposition::RetryThenDeadLetter`]) and handler panics are retried up to
//! `max_attempts_deterministic` times, then dead-lettered ([`next_step`]). A panic is caught
//! around the attempt: its transaction is dropped (rolled back) and the partition goes on.
//! While a worker retries, it says so ([`Worker::retrying`]) and the fetch loop pauses its
//! partition, so the others keep flowing.
//!
//! The worker stops between messages when told to (revoke, shutdown), or during a backoff
//! wait; the message in hand is then left unstored, so whoever consumes the partition next gets
//! it again. A message finished after a shutdown request still has its offset stored (the
//! partition is still ours until the consumer closes), so SIGTERM commits it.
//!
//! A panic outside the contained handler ends the task; [`Worker::finished`] tells the fetch
//! loop where its successor has to start ([`super::supervisor`]).

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::apply::{apply, Applied, RetryPolicy};
use super::dlq::DeadLetters;
use super::event::{Event, RawMessage, Rejection};
use super::handler::{Disposition, Handler, HandlerError};
use super::metrics::ConsumerMetrics;
use super::registry::WorkerRegistry;
use super::runtime::RuntimeContext;

/// What all workers of a runtime share.
pub(crate) struct Deps<H> {
    pub pool: PgPool,
    pub handler: Arc<H>,
    pub metrics: ConsumerMetrics,
    pub dead_letters: DeadLetters,
    pub consumer_name: String,
    pub retry: RetryPolicy,
    pub max_attempts_deterministic: u32,
}

/// One partition's worker.
pub(crate) struct Worker<H> {
    pub deps: Arc<Deps<H>>,
    pub consumer: Arc<StreamConsumer<RuntimeContext>>,
    pub registry: Arc<std::sync::Mutex<WorkerRegistry>>,
    pub topic: String,
    pub partition: i32,
    pub generation: u64,
    /// True while the message in hand failed and waits for another attempt; the fetch loop
    /// pauses the partition meanwhile.
    pub retrying: Arc<AtomicBool>,
    /// The offset after the last message finished and stored: if this task dies, its
    /// successor starts there ([`super::registry::WorkerHandle::resume_offset`]).
    pub finished: Arc<AtomicI64>,
}

/// The worker stopped while a message was unfinished.
struct Abandoned;

/// Why an attempt failed.
#[derive(Debug)]
enum Failure {
    /// The handler (or the inbox, or the commit) returned an error.
    Error(HandlerError),
    /// The handler panicked; the message is the panic's payload when it is a string.
    Panic(String),
}

impl Failure {
    fn disposition(&self) -> Disposition {
        match self {
            Self::Error(e) => e.disposition(),
            Self::Panic(_) => Disposition::RetryThenDeadLetter,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Error(e) => e.describe(),
            Self::Panic(m) => format!("handler panicked: {m}"),
        }
    }

    /// What the dead letter says after `attempts` attempts.
    fn rejection(self, attempts: u32) -> Rejection {
        match self {
            Self::Panic(message) => Rejection::HandlerPanic { attempts, message },
            Self::Error(e) if e.disposition() == Disposition::DeadLetter => {
                Rejection::Unapplicable(e.describe())
            }
            Self::Error(e) => Rejection::RetriesExhausted {
                attempts,
                error: e.describe(),
            },
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Wait (backoff), then attempt the same message again.
    Retry,
    /// Send the message to the dead-letter topic and move on.
    DeadLetter,
}

/// The decision after `failures` consecutive failed attempts (1 = the first) of the given
/// disposition, with at most `max_attempts` attempts for errors that come back every time.
pub(crate) fn next_step(disposition: Disposition, failures: u32, max_attempts: u32) -> Step {
    match disposition {
        Disposition::Retry => Step::Retry,
        Disposition::DeadLetter => Step::DeadLetter,
        Disposition::RetryThenDeadLetter if failures >= max_attempts.max(1) => Step::DeadLetter,
        Disposition::RetryThenDeadLetter => Step::Retry,
    }
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

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
            let processed = self.process_traced(&msg, &stop).await;
            self.retrying.store(false, Ordering::Relaxed);
            if processed.is_err() {
                tracing::info!(
                    kafka.topic = %self.topic,
                    kafka.partition = self.partition,
                    kafka.offset = msg.offset,
                    "Stopped before the message in hand was applied; it will be delivered again"
                );
                break;
            }
            self.store_offset(&msg);
            self.finished.store(msg.offset + 1, Ordering::Release);
        }
        tracing::debug!(
            kafka.topic = %self.topic,
            kafka.partition = self.partition,
            "Partition worker stopped"
        );
    }

    /// Takes one message to a finished state inside a traced hop that continues the message's
    /// trace: every log line of it carries the trace id, and the events the handler writes carry
    /// this hop as their parent.
    async fn process_traced(
        &self,
        msg: &RawMessage,
        stop: &CancellationToken,
    ) -> Result<(), Abandoned> {
        let describe = || {
            use outbox_trace::Attribute;
            let text = |name| {
                msg.header(name)
                    .flatten()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            let mut attributes = vec![
                Attribute::Str("messaging.system", "kafka".to_owned()),
                Attribute::Str("messaging.operation.type", "process".to_owned()),
                Attribute::Str("messaging.destination.name", msg.topic.clone()),
                Attribute::Str(
                    "messaging.destination.partition.id",
                    msg.partition.to_string(),
                ),
                Attribute::Int("messaging.kafka.offset", msg.offset),
                Attribute::Str(
                    "messaging.consumer.group.name",
                    self.deps.consumer_name.clone(),
                ),
            ];
            if let Some(id) = text("event_id") {
                attributes.push(Attribute::Str("messaging.message.id", id));
            }
            if let Some(t) = text("event_type") {
                attributes.push(Attribute::Str("outbox.event_type", t));
            }
            (format!("process {}", msg.topic), attributes)
        };
        let hop = outbox_trace::TracedSpan::start(
            outbox_trace::SpanKind::Consumer,
            msg.trace_context(),
            describe,
        );
        let processed = hop.run(self.process(msg, stop)).await;
        hop.end(None);
        processed
    }

    /// Takes one message to a finished state.
    async fn process(&self, msg: &RawMessage, stop: &CancellationToken) -> Result<(), Abandoned> {
        let envelope = match msg.envelope() {
            Ok(e) => e,
            Err(rejection) => return self.dead_letter(msg, rejection, stop).await,
        };
        let handler = &*self.deps.handler;
        let versions = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            handler.versions(&envelope.event_type)
        })) {
            Ok(v) => v,
            Err(payload) => {
                self.deps.metrics.handler_panics.inc();
                let message = panic_message(&*payload);
                let rejection = Rejection::HandlerPanic {
                    attempts: 1,
                    message,
                };
                return self.dead_letter(msg, rejection, stop).await;
            }
        };
        let Some(versions) = versions else {
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
            // A panicking handler must not take the worker (and its partition) down with it:
            // the attempt's future, with its transaction, is dropped, which rolls it back.
            let attempt = AssertUnwindSafe(apply(
                &self.deps.pool,
                &self.deps.consumer_name,
                &*self.deps.handler,
                &event,
            ))
            .catch_unwind()
            .await;
            let failure = match attempt {
                Ok(Ok(applied)) => {
                    self.finished(msg, &event, applied, started);
                    return Ok(());
                }
                Ok(Err(e)) => Failure::Error(e),
                Err(payload) => {
                    self.deps.metrics.handler_panics.inc();
                    Failure::Panic(panic_message(&*payload))
                }
            };
            failures += 1;
            let step = next_step(
                failure.disposition(),
                failures,
                self.deps.max_attempts_deterministic,
            );
            if step == Step::DeadLetter {
                return self
                    .dead_letter(msg, failure.rejection(failures), stop)
                    .await;
            }
            self.retrying.store(true, Ordering::Relaxed);
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
                error = %failure.describe(),
                "Could not apply event; retrying the same message"
            );
            wait_or_stop(wait, stop).await?;
        }
    }

    /// Counts and logs a successful attempt.
    fn finished(&self, msg: &RawMessage, event: &Event, applied: Applied, started: Instant) {
        if let Applied::Effect(effect) = applied {
            let handler = &*self.deps.handler;
            let counted =
                std::panic::catch_unwind(AssertUnwindSafe(|| handler.committed(event, effect)));
            if let Err(payload) = counted {
                self.deps.metrics.handler_panics.inc();
                tracing::error!(
                    event.id = %event.event_id(),
                    event.name = %event.event_type(),
                    panic = %panic_message(&*payload),
                    "Handler panicked after its transaction committed; the event stays applied"
                );
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infrastructure_errors_retry_forever_and_deterministic_ones_a_bounded_number_of_times() {
        for failures in [1, 5, 1000] {
            assert_eq!(next_step(Disposition::Retry, failures, 5), Step::Retry);
            assert_eq!(
                next_step(Disposition::DeadLetter, failures, 5),
                Step::DeadLetter
            );
        }
        let steps: Vec<Step> = (1..=5)
            .map(|n| next_step(Disposition::RetryThenDeadLetter, n, 5))
            .collect();
        assert_eq!(
            steps,
            [
                Step::Retry,
                Step::Retry,
                Step::Retry,
                Step::Retry,
                Step::DeadLetter
            ]
        );
        assert_eq!(
            next_step(Disposition::RetryThenDeadLetter, 1, 0),
            Step::DeadLetter,
            "at least one attempt, never zero"
        );
    }

    #[test]
    fn a_panic_dead_letters_with_its_message_and_the_attempts() {
        let payload: Box<dyn Any + Send> = Box::new("boom");
        let failure = Failure::Panic(panic_message(&*payload));
        assert_eq!(failure.disposition(), Disposition::RetryThenDeadLetter);
        let r = failure.rejection(5);
        assert_eq!(r.reason(), "handler_panic");
        assert_eq!(r.to_string(), "handler panicked on 5 attempts: boom");
        let payload: Box<dyn Any + Send> = Box::new(format!("index {} out of range", 3));
        assert_eq!(panic_message(&*payload), "index 3 out of range");
        let r = Failure::Error(HandlerError::Database(sqlx::Error::RowNotFound)).rejection(5);
        assert_eq!(r.reason(), "retries_exhausted");
        assert!(r.to_string().starts_with("failed 5 attempts: "), "{r}");
    }
}
