//! The relay loop: wait for the lease as a hot standby, then run batches ([`crate::batch`])
//! until shutdown or until the lease is lost.
//!
//! Shutdown is only observed between batches or while waiting; never between "acknowledged"
//! and "marked" except by abandoning marks, which only causes duplicates.

use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use outbox_writer::outbox::NOTIFY_CHANNEL;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::batch::{BatchEnd, Batcher, ClaimFloor};
use crate::lease::LeaseGuard;
use crate::metrics::Metrics;
use crate::outage::Outage;
use crate::parking::ParkPolicy;
use crate::publisher::Publisher;
use crate::retry::{new_backoff, sleep_unless};
use crate::store::{ClaimLimits, LeaseToken, Store};
use crate::topics::{TopicCatalog, TopicSpec};

/// Everything the relay loop needs to know.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Extra librdkafka settings: the security flags' and `--kafka-config` (`Debug` hides
    /// secrets).
    pub kafka_config: outbox_kafka::KafkaSettings,
    /// Topic prefix for routing.
    pub topic_prefix: String,
    /// What the relay adds to every message (CloudEvents).
    pub wire: crate::publisher::WireSettings,
    /// Create missing topics with this spec.
    pub create_topics: Option<TopicSpec>,
    /// Rows and bytes per batch.
    pub limits: ClaimLimits,
    /// Retries and parking of failed events.
    pub park: ParkPolicy,
    /// Shortest and longest idle poll interval.
    pub poll: (Duration, Duration),
    /// Lease name.
    pub lease_name: String,
    /// This instance's id.
    pub instance_id: String,
    /// Lease time-to-live.
    pub lease_ttl: Duration,
    /// Grace period for in-flight acknowledgements on shutdown.
    pub shutdown_timeout: Duration,
    /// How long a batch may go without an acknowledgement while the cluster answers.
    pub send_timeout: Duration,
    /// With `--transactions`: the `transactional.id` all relays of the lease share.
    pub transactional_id: Option<String>,
    /// How long `outbox_discarded` audit rows are kept (deleted by the leader).
    pub discarded_retention: Duration,
    /// How the retention purge runs.
    pub purge: outbox_process::retention::PurgeSettings,
}

/// Why leading stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeadEnd {
    Shutdown,
    LeaseLost,
}

/// A relay instance.
#[derive(Debug)]
pub struct Relay {
    store: Store,
    settings: RelaySettings,
    metrics: Metrics,
    wake: Arc<Notify>,
}

/// How long after the last non-empty batch the relay keeps polling at the shortest interval.
const HOT_WINDOW: Duration = Duration::from_secs(2);

/// The lone producer's settings: the user's, with its own `client.id` (`<client.id>-lone`), so
/// broker logs and quotas tell the two producers apart.
fn lone_config(extra: &[(String, String)]) -> Vec<(String, String)> {
    let client_id = extra
        .iter()
        .rev()
        .find(|(k, _)| k.trim() == "client.id")
        .map_or("outbox-relay", |(_, v)| v.as_str());
    let mut config = extra.to_vec();
    config.push(("client.id".into(), format!("{client_id}-lone")));
    config
}

impl Relay {
    /// A relay over `store` with `settings`, reporting into `metrics`.
    pub fn new(store: Store, settings: RelaySettings, metrics: Metrics) -> Self {
        Self {
            store,
            settings,
            metrics,
            wake: Arc::new(Notify::new()),
        }
    }

    /// Runs until `shutdown` fires: standby until the lease is free, then active.
    ///
    /// # Errors
    /// Only for configuration errors (invalid librdkafka settings); outages are retried.
    pub async fn run(&self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let s = &self.settings;
        let mut publisher = Publisher::reporting(
            &s.brokers,
            &s.kafka_config,
            &s.topic_prefix,
            Some(self.metrics.broker_down.clone()),
        )?
        .with_wire(s.wire.clone())
        .with_send_timeout(s.send_timeout);
        // Events of aggregates retried after a failure go out one at a time on a producer of
        // their own ([`crate::batch::Batcher::publish`]).
        let mut lone = Publisher::new(&s.brokers, &lone_config(&s.kafka_config), &s.topic_prefix)?
            .with_wire(s.wire.clone())
            .with_send_timeout(s.send_timeout);
        if let Some(id) = &s.transactional_id {
            publisher = publisher.with_transactions(id)?;
            lone = lone.with_transactions(&format!("{id}.lone"))?;
            tracing::info!(transactional.id = %id, "Publishing each batch as a Kafka transaction");
        }
        let mut topics = TopicCatalog::new(&s.brokers, &s.kafka_config, s.create_topics)?;
        let helpers = shutdown.child_token();
        // LISTEN needs a session of its own; behind a transaction-pooling PgBouncer the relay
        // only polls.
        let listener = (!self.store.behind_pgbouncer()).then(|| {
            tokio::spawn(listen_for_wakeups(
                self.store.clone(),
                self.wake.clone(),
                helpers.clone(),
            ))
        });
        let refresher = tokio::spawn(refresh_backlog(
            self.store.clone(),
            s.topic_prefix.clone(),
            self.metrics.clone(),
            helpers.clone(),
        ));
        let stalls = tokio::spawn(watch_stalls(self.metrics.clone(), helpers.clone()));
        let sweeper = tokio::spawn(forget_orphan_failures(
            self.store.clone(),
            self.metrics.clone(),
            helpers.clone(),
        ));

        let mut db = Outage::new("database");
        let mut kafka = Outage::new("kafka publish");
        let leader = self.metrics.leader.clone();
        let retention = tokio::spawn(outbox_process::retention::run(
            self.store.pool().clone(),
            vec![crate::store::discarded_rule(s.discarded_retention)],
            s.purge,
            self.metrics.retention.clone(),
            move || leader.get() == 1,
            helpers.clone(),
        ));
        tracing::info!(instance = %s.instance_id, lease.name = %s.lease_name, "Relay started");
        while let Some((token, acquired_at)) = self.wait_for_lease(&shutdown).await {
            // What per-aggregate order rests on, checked before anything is published (a
            // database error here is an outage: the lease's first batch meets it too).
            match self.store.id_sequence_problem().await {
                Ok(Some(problem)) => {
                    if let Err(e) = self.store.release_lease(&token).await {
                        tracing::warn!(error = %e, "Could not release the lease");
                    }
                    helpers.cancel();
                    anyhow::bail!(problem);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "Could not check the outbox's id sequence"),
            }
            tracing::info!(lease.name = %token.name, lease.epoch = token.epoch, instance = %token.holder, "Acquired the relay lease; publishing");
            self.metrics.leader.set(1);
            self.metrics.lease_epoch.set(token.epoch);
            publisher.set_leading(true);
            let guard = LeaseGuard::start(self.store.clone(), token, s.lease_ttl, acquired_at);
            let end = self
                .lead(
                    &guard,
                    (&mut publisher, &mut lone),
                    &mut topics,
                    (&mut db, &mut kafka),
                    &shutdown,
                )
                .await;
            let token = guard.token().clone();
            guard.stop().await;
            self.metrics.leader.set(0);
            self.metrics.lease_epoch.set(0);
            publisher.set_leading(false);
            match end {
                LeadEnd::Shutdown => {
                    if let Err(e) = self.store.release_lease(&token).await {
                        tracing::warn!(error = %e, "Could not release the lease; a standby takes over when it expires");
                    }
                    break;
                }
                LeadEnd::LeaseLost => {
                    tracing::warn!(
                        lease.epoch = token.epoch,
                        "Lost the relay lease; back to standby"
                    );
                    // Whatever is still queued belongs to a lease we no longer hold.
                    publisher.replace()?;
                    lone.replace()?;
                }
            }
        }
        publisher.purge();
        lone.purge();
        helpers.cancel();
        if let Some(listener) = listener {
            let _ = listener.await;
        }
        let _ = refresher.await;
        let _ = sweeper.await;
        let _ = stalls.await;
        let _ = retention.await;
        tracing::info!("Relay stopped");
        Ok(())
    }

    /// Polls for the lease; `None` on shutdown.
    async fn wait_for_lease(&self, shutdown: &CancellationToken) -> Option<(LeaseToken, Instant)> {
        let s = &self.settings;
        let every = (s.lease_ttl / 5).min(Duration::from_secs(1));
        let mut outage = Outage::new("database (lease)");
        let mut announced = false;
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let sent = Instant::now();
            match self
                .store
                .try_acquire_lease(&s.lease_name, &s.instance_id, s.lease_ttl)
                .await
            {
                Ok(Some(token)) => {
                    outage.recovered();
                    return Some((token, sent));
                }
                Ok(None) => {
                    outage.recovered();
                    if !announced {
                        announced = true;
                        tracing::info!(lease.name = %s.lease_name, "Another instance holds the relay lease; standing by");
                    }
                }
                Err(e) => {
                    self.metrics.db_errors.inc();
                    outage.failed(&e);
                }
            }
            if !sleep_unless(every, shutdown).await {
                return None;
            }
        }
    }

    async fn lead(
        &self,
        guard: &LeaseGuard,
        (publisher, lone): (&mut Publisher, &mut Publisher),
        topics: &mut TopicCatalog,
        (db, kafka): (&mut Outage, &mut Outage),
        shutdown: &CancellationToken,
    ) -> LeadEnd {
        let s = &self.settings;
        let (min_poll, max_poll) = s.poll;
        let mut idle = min_poll;
        let mut last_rows = Instant::now();
        let mut backoff = new_backoff();
        let mut batcher = Batcher {
            store: &self.store,
            metrics: &self.metrics,
            token: guard.token(),
            guard,
            publisher,
            lone,
            topics,
            limits: s.limits,
            row_limit: s.limits.rows,
            policy: s.park,
            shutdown_timeout: s.shutdown_timeout,
            db,
            kafka,
            failures_known: true,
            prefetched: None,
            batches: 0,
            replaced: false,
            floor: ClaimFloor::new(crate::batch::CANDIDATE_EVERY),
        };
        // Fence the relays that held the lease before, now (their open transactions are
        // aborted, so `read_committed` readers do not wait for their timeout); failing that,
        // the first batch tries again before it sends anything.
        if batcher.initialise(true).await == Err(BatchEnd::LeaseLost) {
            return LeadEnd::LeaseLost;
        }
        loop {
            if shutdown.is_cancelled() {
                return LeadEnd::Shutdown;
            }
            if !guard.is_valid() {
                return LeadEnd::LeaseLost;
            }
            match batcher.run(shutdown).await {
                BatchEnd::Empty => {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(idle) => {}
                        _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                        _ = guard.lost() => return LeadEnd::LeaseLost,
                    }
                    // Stay at the shortest interval while events keep coming (a probe of an
                    // empty index costs well under a millisecond); back off only once the
                    // outbox has been quiet for a while, so an idle relay does not busy-poll.
                    if last_rows.elapsed() >= HOT_WINDOW {
                        idle = (idle * 2).min(max_poll);
                    }
                }
                BatchEnd::Done { clean } => {
                    idle = min_poll;
                    last_rows = Instant::now();
                    if clean {
                        backoff.reset();
                    }
                }
                BatchEnd::Backoff => {
                    let wait = backoff.next_backoff().unwrap_or(max_poll);
                    if !sleep_unless(wait, shutdown).await {
                        return LeadEnd::Shutdown;
                    }
                }
                BatchEnd::LeaseLost => return LeadEnd::LeaseLost,
                BatchEnd::Shutdown => return LeadEnd::Shutdown,
            }
        }
    }
}

/// Wakes the loop on `NOTIFY outbox_relay`; polling covers any notification lost while
/// reconnecting (and poolers that do not pass LISTEN through).
async fn listen_for_wakeups(store: Store, wake: Arc<Notify>, stop: CancellationToken) {
    loop {
        if let Ok(mut listener) = PgListener::connect_with(store.pool()).await {
            if listener.listen(NOTIFY_CHANNEL).await.is_ok() {
                loop {
                    tokio::select! {
                        r = listener.recv() => match r {
                            Ok(_) => wake.notify_one(),
                            Err(_) => break,
                        },
                        _ = stop.cancelled() => return,
                    }
                }
            }
        }
        if !sleep_unless(Duration::from_secs(2), &stop).await {
            return;
        }
    }
}

/// Observes how late the runtime wakes a 50 ms timer (`outbox_relay_runtime_stall_seconds`):
/// the relay runs on one thread, so anything that blocks it delays the lease's renewal.
async fn watch_stalls(metrics: Metrics, stop: CancellationToken) {
    const TICK: Duration = Duration::from_millis(50);
    loop {
        let asleep = Instant::now();
        if !sleep_unless(TICK, &stop).await {
            return;
        }
        metrics
            .runtime_stall
            .observe(asleep.elapsed().saturating_sub(TICK).as_secs_f64());
    }
}

/// How often the leader forgets failure records of events that are gone (one deleted by hand
/// holds its aggregate back until then).
pub const ORPHAN_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Forgets failure records of events no longer in the outbox, every [`ORPHAN_SWEEP_EVERY`]
/// while leading: a task of its own, so the gauges' refresh (slower over a large backlog)
/// does not stretch it.
async fn forget_orphan_failures(store: Store, metrics: Metrics, stop: CancellationToken) {
    loop {
        if metrics.leader.get() == 1 {
            if let Ok(n @ 1..) = store.forget_orphan_failures().await {
                tracing::info!(
                    records = n,
                    "Forgot failure records of events no longer in the outbox"
                );
            }
        }
        if !sleep_unless(ORPHAN_SWEEP_EVERY, &stop).await {
            return;
        }
    }
}

/// Refreshes the backlog (per topic), oldest-transaction and parking gauges every few
/// seconds.
async fn refresh_backlog(store: Store, prefix: String, metrics: Metrics, stop: CancellationToken) {
    let mut topics = crate::backlog_gauges::TopicSeries::default();
    loop {
        let started = Instant::now();
        if let Ok(b) = store.backlog_by_topic(&prefix).await {
            topics.publish(&metrics, b);
        }
        if let Ok(age) = store.oldest_transaction_age().await {
            metrics.db_oldest_transaction_age.set(age);
        }
        if let Ok(p) = store.parking_stats().await {
            metrics.set_parking(&p);
        }
        // Every 5 s, or ten times as long as the queries took: over a backlog of millions of
        // rows the per-topic count takes seconds, and the gauges must not keep PostgreSQL
        // busy for more than a tenth of the time.
        let every = Duration::from_secs(5).max(started.elapsed() * 10);
        if !sleep_unless(every, &stop).await {
            return;
        }
    }
}
