//! The consumer loop: one consumer-group member reading the subscribed topics and handing each
//! message to the worker of its partition ([`super::worker`]).
//!
//! Offsets: librdkafka commits (every second, on revoke and on close) only offsets the workers
//! stored, and a worker stores an offset only after the message is finished and its database
//! transaction committed. So no commit ever passes an unapplied message, whatever happens.
//!
//! Rebalances ([`super::context`]): when partitions are revoked, their workers are told to stop
//! after the event in hand and their queued messages are dropped; an offset finished after the
//! revoke is not stored. The new owner starts from the committed offset, and the inbox skips what
//! was applied but not committed. Shutdown tells every worker to stop after the event in hand,
//! waits for them up to a deadline, and still stores the offsets they finished meanwhile (the
//! partitions are ours until the consumer closes), then commits the stored offsets and leaves the
//! group.
//!
//! The whole shutdown is bounded by the shutdown timeout: librdkafka's final commit and close
//! (revoke, commit, leave the group) wait for a group coordinator without any limit of their
//! own, so with the broker gone they would hold the process until it is killed. They run on a
//! thread of their own that the runtime waits for only until the deadline (at least
//! [`CLOSE_GRACE`]); past it the runtime returns [`ConsumerError::Unclosed`] and the process
//! exits without the leave. Nothing applied is lost: offsets are stored only behind committed
//! business transactions, and what is delivered again is an inbox duplicate.
//!
//! Back-pressure ([`super::flow`]): the loop never waits for a worker. Each partition has a
//! bounded queue; a partition whose queue is full, or whose worker is retrying a message, is
//! paused (`consumer.pause`), and the messages of it fetched before the pause took effect wait
//! in that partition's overflow buffer, in offset order. Every few milliseconds the loop moves
//! buffered messages into queues that have room again and resumes the partitions that neither
//! retry nor buffer. So a partition stuck on retries holds back only itself, and no message is
//! skipped, reordered or fetched twice by this process.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::config::{consumer_client_config, RuntimeConfig};
use super::context::{RuntimeConsumer, RuntimeContext};
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
    /// At shutdown, the final offset commit and leaving the group did not finish within the
    /// shutdown timeout (no broker answered): the consumer stopped without them. Safe: what
    /// was applied is delivered again to the group's next member and skipped by the inbox.
    #[error(
        "Kafka consumer did not close within {waited_ms} ms at shutdown (final offset commit \
         and group leave unfinished: broker unreachable?); events applied since the last \
         commit will be delivered again and skipped by the inbox"
    )]
    Unclosed {
        /// How long the close was waited for.
        waited_ms: u64,
    },
}

/// What the final commit and the close get at least, when the workers took the whole
/// shutdown timeout: a broker that answers needs milliseconds.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

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
    let context = RuntimeContext::new(registry.clone(), metrics.clone());
    let consumer: Arc<RuntimeConsumer> =
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
        if consumer.context().take_broker_down() {
            tracing::info!("Kafka broker reachable again");
        }
        dispatch(msg, &spawner);
    }

    let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
    drain(&registry, deadline, config.shutdown_timeout).await;
    if let Some(r) = retention {
        r.abort();
    }
    // The lag task holds the consumer; it must be gone before the consumer closes.
    lag_stop.cancel();
    let _ = lag.await;
    metrics.up.set(0);
    metrics.assigned_partitions.set(0);
    metrics.paused_partitions.set(0);
    let closed = close(consumer, deadline).await;
    refusal.check()?;
    closed?;
    tracing::info!(consumer = %config.consumer_name, "Consumer stopped");
    Ok(())
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

/// Shutdown: every worker finishes the event in hand, up to `deadline`; the ones still busy
/// then are aborted (and waited for, so that none holds the consumer any more).
async fn drain(
    registry: &Arc<Mutex<WorkerRegistry>>,
    deadline: tokio::time::Instant,
    timeout: Duration,
) {
    let mut handles = registry
        .lock()
        .map(|mut r| r.retire_all())
        .unwrap_or_default();
    let finished =
        tokio::time::timeout_at(deadline, futures::future::join_all(handles.iter_mut())).await;
    if finished.is_err() {
        tracing::warn!(
            shutdown_timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            "Events still being applied at the shutdown deadline; leaving them to be delivered again"
        );
        let busy: Vec<_> = handles.into_iter().filter(|h| !h.is_finished()).collect();
        for h in &busy {
            h.abort();
        }
        let _ = futures::future::join_all(busy).await;
    }
}

/// Commits the stored offsets and closes `consumer` (revoke, commit once more, leave the
/// group) on a thread of its own, waiting for it until `deadline` but at least
/// [`CLOSE_GRACE`]. librdkafka waits for a group coordinator without a limit of its own; past
/// the deadline the thread is left behind (it ends with the process) and
/// [`ConsumerError::Unclosed`] is returned.
async fn close(
    consumer: Arc<RuntimeConsumer>,
    deadline: tokio::time::Instant,
) -> Result<(), ConsumerError> {
    let bound = deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .max(CLOSE_GRACE);
    let (done, closed) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("kafka-close".into())
        .spawn(move || {
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => tracing::warn!(error = %e, "Final offset commit failed; the inbox skips what is delivered again"),
            }
            drop(consumer);
            let _ = done.send(());
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "Could not start the thread that closes the Kafka consumer");
    } else if let Ok(Ok(())) = tokio::time::timeout(bound, closed).await {
        return Ok(());
    }
    let waited_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    tracing::error!(
        waited_ms,
        "Kafka consumer did not close within the shutdown timeout (final offset commit and group leave unfinished: broker unreachable?); stopping without them, what was applied since the last commit is delivered again and skipped by the inbox"
    );
    Err(ConsumerError::Unclosed { waited_ms })
}
