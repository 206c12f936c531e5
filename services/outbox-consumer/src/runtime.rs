//! The consumer loop: one consumer-group member reading the subscribed topics and handing each
//! message to the worker of its partition ([`super::worker`]).
//!
//! Offsets: librdkafka commits (every second, on revoke and on close) only offsets the workers
//! stored, and a worker stores an offset only after the message is finished and its database
//! transaction committed. So no commit ever passes an unapplied message, whatever happens.
//!
//! Rebalances: when partitions are revoked, their workers are told to stop after the event in
//! hand and their queued messages are dropped; an offset finished after the revoke is not
//! stored. The new owner starts from the committed offset, and the inbox skips what was applied
//! but not committed. Shutdown tells every worker to stop after the event in hand, waits for
//! them up to a deadline, and still stores the offsets they finished meanwhile (the partitions
//! are ours until the consumer closes), then commits the stored offsets and leaves the group.
//!
//! Back-pressure ([`super::flow`]): the loop never waits for a worker. Each partition has a
//! bounded queue; a partition whose queue is full, or whose worker is retrying a message, is
//! paused (`consumer.pause`), and the messages of it fetched before the pause took effect wait
//! in that partition's overflow buffer, in offset order. Every few milliseconds the loop moves
//! buffered messages into queues that have room again and resumes the partitions that neither
//! retry nor buffer. So a partition stuck on retries holds back only itself, and no message is
//! skipped, reordered or fetched twice by this process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::TopicPartitionList;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::{consumer_client_config, RuntimeConfig};
use super::dlq::DeadLetters;
use super::event::RawMessage;
use super::flow;
use super::handler::Handler;
use super::metrics::ConsumerMetrics;
use super::registry::{WorkerHandle, WorkerRegistry};
use super::supervisor::Spawner;
use super::topics;
use super::worker::Deps;

/// Why the consumer could not run.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The Kafka client could not be created or subscribed (invalid settings).
    #[error("Kafka client error")]
    Kafka(#[from] KafkaError),
    /// The broker refused the connection at start-up (wrong credentials, an untrusted
    /// certificate): retrying with the same settings cannot succeed.
    #[error("connecting to Kafka")]
    Refused(#[from] outbox_kafka::ProbeError),
    /// A setting the runtime's guarantees depend on was set to something else.
    #[error("{0}")]
    Setting(String),
}

/// librdkafka callbacks of the runtime's consumer.
pub(crate) struct RuntimeContext {
    registry: Arc<Mutex<WorkerRegistry>>,
    metrics: ConsumerMetrics,
    broker_down: AtomicBool,
}

impl ClientContext for RuntimeContext {
    /// librdkafka logs every reconnect attempt; those go to debug level. Outages are reported
    /// once through [`ClientContext::error`].
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical => {
                tracing::error!(librdkafka.facility = fac, "{log_message}")
            }
            _ => tracing::debug!(librdkafka.facility = fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(
                RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::Resolve,
            ) => {
                if !self.broker_down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %error, reason, "Kafka broker unreachable; librdkafka keeps retrying");
                }
            }
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => tracing::warn!(
                reason,
                "A subscribed topic does not exist (yet); create it, or start with --create-missing-topics"
            ),
            _ => tracing::error!(error = %error, reason, "Kafka client error"),
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl ConsumerContext for RuntimeContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let partitions = partitions_of(tpl);
                self.metrics.rebalances.with_label_values(&["revoke"]).inc();
                if let Ok(mut r) = self.registry.lock() {
                    // A partition we paused must not stay paused if it comes back to us.
                    for (topic, partition) in r.retire(&partitions) {
                        let _ = flow::set_paused(consumer, &topic, partition, false);
                    }
                    self.metrics
                        .paused_partitions
                        .set(i64::try_from(r.paused_count()).unwrap_or(i64::MAX));
                }
                tracing::info!(
                    partitions = ?partitions,
                    "Partitions revoked; their workers stop after the event in hand"
                );
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => {
                self.metrics.rebalances.with_label_values(&["error"]).inc();
                tracing::warn!(error = %e, "Rebalance failed");
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.metrics.rebalances.with_label_values(&["assign"]).inc();
            tracing::info!(partitions = ?partitions_of(tpl), "Partitions assigned");
        }
        let assigned = consumer.assignment().map(|a| a.count()).unwrap_or(0);
        self.metrics
            .assigned_partitions
            .set(i64::try_from(assigned).unwrap_or(i64::MAX));
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::trace!(partitions = offsets.count(), "Committed offsets"),
            // Nothing was stored since the last commit.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                self.metrics.commit_failures.inc();
                tracing::warn!(error = %e, "Offset commit failed; the next commit carries the same offsets");
            }
        }
    }
}

/// Copies a message out of librdkafka's buffer.
fn raw_message(m: &BorrowedMessage<'_>) -> RawMessage {
    RawMessage {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers: m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Runs a consumer until `shutdown` is cancelled: subscribes to `config.topics` in group
/// `config.group_id`, applies each message through `handler` (inbox row and effect in one
/// transaction of `pool`), dead-letters what can never be applied, and commits offsets only
/// behind finished messages. Returns after the shutdown drain.
///
/// # Errors
/// [`ConsumerError::Kafka`] when the client cannot be created or subscribed;
/// [`ConsumerError::Setting`] for a setting the guarantees depend on
/// ([`super::config::check_overrides`]); [`ConsumerError::Refused`] when the broker refuses the
/// login or the TLS handshake at start-up (before anything is consumed), or the first time a
/// broker answers when none did at start-up (`shutdown` is then cancelled).
pub async fn run<H: Handler>(
    config: RuntimeConfig,
    pool: PgPool,
    handler: Arc<H>,
    metrics: ConsumerMetrics,
    shutdown: CancellationToken,
) -> Result<(), ConsumerError> {
    super::config::check_overrides(&config.client_config).map_err(ConsumerError::Setting)?;
    let refusal = outbox_kafka::probe::check_at_start(
        &config.brokers,
        &config.client_config,
        outbox_kafka::probe::START_CHECK_TIMEOUT,
        &shutdown,
    )
    .await?
    .stop_on_refusal(shutdown.clone());
    if let Some(spec) = config.create_topics {
        let mut failures = 0;
        loop {
            match topics::create_missing(&config, spec).await {
                Ok(()) => break,
                Err(e) => {
                    failures += 1;
                    let wait = config.retry.delay(failures, rand::random::<f64>());
                    tracing::warn!(error = %e, attempt = failures, "Could not create the topics; retrying");
                    tokio::select! {
                        // Stopped, perhaps by the background check's refusal.
                        () = shutdown.cancelled() => return Ok(refusal.check()?),
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }
    let retention = config.inbox_retention.map(|window| {
        tokio::spawn(outbox_process::retention::run(
            pool.clone(),
            vec![inbox_rule(&config.consumer_name, window)],
            config.purge,
            metrics.retention.clone(),
            || true,
            shutdown.child_token(),
        ))
    });
    let registry = Arc::new(Mutex::new(WorkerRegistry::default()));
    let context = RuntimeContext {
        registry: registry.clone(),
        metrics: metrics.clone(),
        broker_down: AtomicBool::new(false),
    };
    let consumer: Arc<StreamConsumer<RuntimeContext>> =
        Arc::new(consumer_client_config(&config).create_with_context(context)?);
    let subscribed = config.subscribed_topics();
    let topic_names: Vec<&str> = subscribed.iter().map(String::as_str).collect();
    consumer.subscribe(&topic_names)?;
    let deps = Arc::new(Deps {
        pool,
        handler,
        metrics: metrics.clone(),
        dead_letters: DeadLetters::new(&config)?,
        consumer_name: config.consumer_name.clone(),
        retry: config.retry,
        max_attempts_deterministic: config.max_attempts_deterministic,
    });
    metrics.up.set(1);
    let lag_stop = shutdown.child_token();
    let lag = tokio::spawn(super::lag::report(
        consumer.clone(),
        metrics.clone(),
        lag_stop.clone(),
    ));
    tracing::info!(
        consumer = %config.consumer_name,
        kafka.group = %config.group_id,
        kafka.topics = ?subscribed,
        "Consuming"
    );

    let spawner = Spawner {
        queue_capacity: config.queue_capacity,
        deps: &deps,
        consumer: &consumer,
        registry: &registry,
        shutdown: &shutdown,
        metrics: &metrics,
    };
    // Regulated every REGULATE_INTERVAL while messages arrive or wait, else every
    // IDLE_REGULATE_INTERVAL (see `flow`); one timer, reset only when that changes.
    let regulate = tokio::time::sleep(flow::REGULATE_INTERVAL);
    tokio::pin!(regulate);
    let mut settled = false;
    loop {
        let next = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            () = &mut regulate => {
                spawner.restart_dead(&mut registry.lock().unwrap_or_else(|p| p.into_inner()));
                settled = !flow::regulate_all(&registry, &*consumer, &metrics);
                let every = if settled {
                    flow::IDLE_REGULATE_INTERVAL
                } else {
                    flow::REGULATE_INTERVAL
                };
                regulate.as_mut().reset(tokio::time::Instant::now() + every);
                continue;
            }
            m = consumer.recv() => m,
        };
        if settled {
            settled = false;
            regulate
                .as_mut()
                .reset(tokio::time::Instant::now() + flow::REGULATE_INTERVAL);
        }
        let msg = match next {
            Ok(m) => raw_message(&m),
            Err(e) => {
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition) {
                    // Reported once per metadata refresh by `RuntimeContext::error`.
                    tracing::debug!(error = %e, "Kafka consumer error");
                } else {
                    tracing::warn!(error = %e, "Kafka consumer error");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if consumer
            .context()
            .broker_down
            .swap(false, Ordering::Relaxed)
        {
            tracing::info!("Kafka broker reachable again");
        }
        dispatch(msg, &spawner);
    }

    drain(&config, &consumer, &registry).await;
    if let Some(r) = retention {
        r.abort();
    }
    // The lag task holds the consumer; it must be gone before the consumer closes.
    lag_stop.cancel();
    let _ = lag.await;
    metrics.up.set(0);
    metrics.assigned_partitions.set(0);
    metrics.paused_partitions.set(0);
    // Closing leaves the group (and commits what is stored once more); it blocks on librdkafka.
    let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
    tracing::info!(consumer = %config.consumer_name, "Consumer stopped");
    Ok(refusal.check()?)
}

/// The retention rule of `consumer_name`'s inbox rows.
fn inbox_rule(consumer_name: &str, window: Duration) -> outbox_process::retention::RetentionRule {
    outbox_process::retention::RetentionRule {
        table: "inbox",
        time_column: "processed_at",
        scope: Some(("consumer_name", consumer_name.to_owned())),
        window,
    }
}

/// Hands `msg` to the worker of its partition (starting it if there is none) without waiting,
/// and pauses the partition if it has to wait ([`flow`]). A message of a partition whose worker
/// died is dropped: restarting the worker seeks the partition back to before it
/// ([`super::supervisor`]).
fn dispatch<H: Handler>(msg: RawMessage, spawner: &Spawner<'_, H>) {
    let mut r = spawner.registry.lock().unwrap_or_else(|p| p.into_inner());
    let key = (msg.topic.clone(), msg.partition);
    if r.workers.get(&key).is_some_and(WorkerHandle::is_dead) {
        spawner.restart(&key.0, key.1, &mut r);
        return;
    }
    if !r.workers.contains_key(&key) {
        let handle = spawner.start(&key.0, key.1, msg.offset, &mut r);
        r.workers.insert(key.clone(), handle);
    }
    if let Some(w) = r.workers.get_mut(&key) {
        flow::hand_off(w, msg);
        if flow::regulate(w, &**spawner.consumer, &key.0, key.1) {
            spawner
                .metrics
                .paused_partitions
                .set(i64::try_from(r.paused_count()).unwrap_or(i64::MAX));
        }
    }
}

/// Shutdown: every worker finishes the event in hand (up to the deadline), then the stored
/// offsets are committed synchronously.
async fn drain(
    config: &RuntimeConfig,
    consumer: &Arc<StreamConsumer<RuntimeContext>>,
    registry: &Arc<Mutex<WorkerRegistry>>,
) {
    let handles = registry
        .lock()
        .map(|mut r| r.retire_all())
        .unwrap_or_default();
    let aborts: Vec<_> = handles.iter().map(JoinHandle::abort_handle).collect();
    let finished =
        tokio::time::timeout(config.shutdown_timeout, futures::future::join_all(handles)).await;
    if finished.is_err() {
        tracing::warn!(
            shutdown_timeout_ms = u64::try_from(config.shutdown_timeout.as_millis()).unwrap_or(u64::MAX),
            "Events still being applied at the shutdown deadline; leaving them to be delivered again"
        );
        for a in &aborts {
            a.abort();
        }
    }
    let c = consumer.clone();
    let committed =
        tokio::task::spawn_blocking(move || c.commit_consumer_state(CommitMode::Sync)).await;
    match committed {
        Ok(Ok(())) | Ok(Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset))) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "Final offset commit failed; the inbox skips what is delivered again")
        }
        Err(e) => tracing::warn!(error = %e, "Final offset commit did not run"),
    }
}
