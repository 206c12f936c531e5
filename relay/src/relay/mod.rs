//! The relay loop: take this relay's share of the outbox's buckets ([`crate::buckets`]) and
//! publish each under its lease, running batches ([`crate::batch`]) until shutdown, until the
//! bucket goes to another relay or until its lease is lost; stand by while other relays hold
//! every bucket.
//!
//! Shutdown is only observed between batches or while waiting; never between "acknowledged"
//! and "marked" except by abandoning marks, which only causes duplicates.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::buckets::Layout;
use crate::metrics::Metrics;
use crate::outage::Outage;
use crate::parking::ParkPolicy;
use crate::publisher::Publisher;
use crate::retry::sleep_unless;
use crate::store::{ClaimLimits, Store};
use crate::topics::{TopicCatalog, TopicSpec};

mod background;
mod bucket;

pub use background::ORPHAN_SWEEP_EVERY;
use background::{forget_orphan_failures, listen_for_wakeups, refresh_backlog, watch_stalls};
use bucket::{bucket_publishers, publish_bucket};

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
    /// Shortest time between the starts of two batches, unless a backlog is waiting.
    pub min_batch_interval: Duration,
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
    /// With `--transactions`: the relay's compacted topic of bucket records
    /// ([`crate::records`]).
    pub records_topic: String,
    /// How long `outbox_discarded` audit rows are kept (deleted by the leader).
    pub discarded_retention: Duration,
    /// How the retention purge runs.
    pub purge: outbox_process::retention::PurgeSettings,
}

/// Why publishing a bucket stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeadEnd {
    /// Shutdown, or the bucket is released to another relay: the lease is released.
    Shutdown,
    LeaseLost,
}

/// A relay instance.
#[derive(Debug)]
pub struct Relay {
    shared: Arc<Shared>,
    wake: watch::Sender<u64>,
}

/// What every bucket's publishing task of the process reads.
#[derive(Debug)]
struct Shared {
    store: Store,
    settings: RelaySettings,
    metrics: Metrics,
    /// With transactions: the number of partitions of the records topic, once known.
    record_partitions: std::sync::OnceLock<i32>,
}

/// A bucket this process publishes: its task, and the token that makes it release the bucket.
struct Held {
    release: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Held {
    /// Tells the task to release the bucket after its batch in flight; its end is awaited
    /// with the others `leaving`.
    fn let_go(self, leaving: &mut Vec<JoinHandle<anyhow::Result<()>>>) {
        self.release.cancel();
        leaving.push(self.task);
    }
}

impl Relay {
    /// A relay over `store` with `settings`, reporting into `metrics`.
    pub fn new(store: Store, settings: RelaySettings, metrics: Metrics) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                settings,
                metrics,
                record_partitions: std::sync::OnceLock::new(),
            }),
            wake: watch::channel(0).0,
        }
    }

    /// Runs until `shutdown` fires: takes this relay's share of the outbox's buckets and
    /// publishes each, standing by while the other relays hold them all.
    ///
    /// # Errors
    /// Only for configuration errors (invalid librdkafka settings, an id sequence the
    /// per-aggregate order cannot rest on); outages are retried.
    pub async fn run(&self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let shared = &self.shared;
        let s = &shared.settings;
        // Invalid librdkafka settings stop the relay here, before it takes any bucket.
        let one = Layout {
            buckets: 1,
            number: 1,
        };
        let (probe, _) = bucket_publishers(s, one, 0, None, None)?;
        let helpers = shutdown.child_token();
        // LISTEN needs a session of its own; behind a transaction-pooling PgBouncer the relay
        // only polls.
        let listener = (!shared.store.behind_pgbouncer()).then(|| {
            tokio::spawn(listen_for_wakeups(
                shared.store.clone(),
                self.wake.clone(),
                helpers.clone(),
            ))
        });
        // The gauges' three queries every few seconds share one kept connection: one test of
        // it before them instead of a test before and after each.
        let refresher = tokio::spawn(refresh_backlog(
            shared.store.holding(),
            s.topic_prefix.clone(),
            shared.metrics.clone(),
            helpers.clone(),
        ));
        let stalls = tokio::spawn(watch_stalls(shared.metrics.clone(), helpers.clone()));
        let sweeper = tokio::spawn(forget_orphan_failures(
            shared.store.clone(),
            shared.metrics.clone(),
            helpers.clone(),
        ));
        let leader = shared.metrics.leader.clone();
        let retention = tokio::spawn(outbox_process::retention::run(
            shared.store.pool().clone(),
            vec![crate::store::discarded_rule(s.discarded_retention)],
            s.purge,
            shared.metrics.retention.clone(),
            move || leader.get() == 1,
            helpers.clone(),
        ));
        tracing::info!(instance = %s.instance_id, lease.name = %s.lease_name, "Relay started");
        let result = async {
            // With transactions, the records topic must exist (or be created) before any
            // bucket is published. The gauges above already report the backlog meanwhile
            // (a broker that does not answer keeps the relay here).
            if s.transactional_id.is_some() {
                let Some(n) = self.records_topic(&probe, &shutdown).await? else {
                    return Ok(());
                };
                let _ = shared.record_partitions.set(n);
            }
            drop(probe);
            self.share_buckets(&shutdown).await
        }
        .await;
        helpers.cancel();
        if let Some(listener) = listener {
            let _ = listener.await;
        }
        let _ = refresher.await;
        let _ = sweeper.await;
        let _ = stalls.await;
        let _ = retention.await;
        tracing::info!("Relay stopped");
        result
    }

    /// The records topic's partitions (created when missing and allowed), retried while the
    /// broker does not answer; `None` on shutdown.
    async fn records_topic(
        &self,
        probe: &Publisher,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Option<i32>> {
        let s = &self.shared.settings;
        let mut topics = TopicCatalog::new(&s.brokers, &s.kafka_config, s.create_topics);
        let buckets = self.shared.store.layout().await.map_or(1, |l| l.buckets);
        let mut outage = Outage::new("kafka (records topic)");
        let Some(producer) = probe.producer() else {
            anyhow::bail!("the probe's Kafka producer has no session");
        };
        loop {
            // A request may wait seconds on a broker that does not answer: a shutdown does
            // not wait for it.
            let attempt = tokio::select! {
                r = topics.records_topic(producer, &s.records_topic, buckets) => r,
                () = shutdown.cancelled() => return Ok(None),
            };
            match attempt {
                Ok(n) => {
                    outage.recovered();
                    self.shared.metrics.set_healthy(true);
                    return Ok(Some(n));
                }
                Err(Ok(why)) => anyhow::bail!(why),
                Err(Err(e)) => {
                    // Nothing can be published until the broker answers: `/healthz` says so.
                    self.shared.metrics.set_healthy(false);
                    outage.failed(&e);
                }
            }
            if !sleep_unless(Duration::from_secs(1), shutdown).await {
                return Ok(None);
            }
        }
    }

    /// Every `min(ttl / 5, 1 s)`: renews this relay's membership, releases the buckets it
    /// holds beyond its share and takes free ones up to it; on shutdown, stops every bucket's
    /// task (each releases its lease) and leaves.
    async fn share_buckets(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let shared = &self.shared;
        let s = &shared.settings;
        let every = (s.lease_ttl / 5).min(Duration::from_secs(1));
        let mut outage = Outage::new("database (lease)");
        let mut held: BTreeMap<i16, Held> = BTreeMap::new();
        let mut leaving: Vec<JoinHandle<anyhow::Result<()>>> = Vec::new();
        let mut layout: Option<Layout> = None;
        let mut sequence_checked = false;
        let mut announced = false;
        let result = loop {
            if let Err(e) = reap(&mut held, &mut leaving).await {
                break Err(e);
            }
            if shutdown.is_cancelled() {
                break Ok(());
            }
            match self
                .round(
                    &mut held,
                    &mut leaving,
                    &mut layout,
                    &mut sequence_checked,
                    shutdown,
                )
                .await
            {
                Ok(Round::Holding) => {
                    outage.recovered();
                    announced = false;
                }
                Ok(Round::StandingBy) => {
                    outage.recovered();
                    if !announced {
                        announced = true;
                        tracing::info!(lease.name = %s.lease_name, "Another instance holds the relay lease; standing by");
                    }
                }
                Ok(Round::Refused(problem)) => break Err(anyhow::anyhow!(problem)),
                Err(e) => {
                    shared.metrics.db_errors.inc();
                    outage.failed(&e);
                }
            }
            shared.metrics.buckets_held.set(held.len() as i64);
            if !sleep_unless(every, shutdown).await {
                break Ok(());
            }
        };
        for (_, h) in std::mem::take(&mut held) {
            h.let_go(&mut leaving);
        }
        for task in leaving {
            match task.await {
                Ok(Err(e)) => tracing::error!(error = %e, "A bucket's publisher failed"),
                Err(e) => tracing::error!(error = %e, "A bucket's publisher panicked"),
                Ok(Ok(())) => {}
            }
        }
        shared.metrics.buckets_held.set(0);
        if let Err(e) = shared
            .store
            .leave_membership(&s.lease_name, &s.instance_id)
            .await
        {
            tracing::debug!(error = %e, "Could not leave the relays' membership; it expires");
        }
        result
    }

    /// One round of [`Relay::share_buckets`].
    async fn round(
        &self,
        held: &mut BTreeMap<i16, Held>,
        leaving: &mut Vec<JoinHandle<anyhow::Result<()>>>,
        layout: &mut Option<Layout>,
        sequence_checked: &mut bool,
        shutdown: &CancellationToken,
    ) -> Result<Round, sqlx::Error> {
        let shared = &self.shared;
        let s = &shared.settings;
        let view = shared
            .store
            .round_view(&s.lease_name, &s.instance_id, s.lease_ttl, *layout)
            .await?;
        let current = view.layout;
        if layout.is_some_and(|l| l != current) {
            tracing::info!(
                buckets = current.buckets,
                layout = current.number,
                "The outbox's buckets changed; taking buckets of the new layout"
            );
            for (_, h) in std::mem::take(held) {
                h.let_go(leaving);
            }
        }
        *layout = Some(current);
        let members = view.members;
        let share = crate::buckets::share(current.buckets, members);
        // Beyond the share: the highest buckets go, each after its batch in flight.
        while held.len() > share {
            let Some((bucket, h)) = held.pop_last() else {
                break;
            };
            tracing::info!(
                bucket,
                members,
                share,
                "Releasing a bucket to another relay"
            );
            h.let_go(leaving);
        }
        // Every relay reports the buckets nobody holds (the alert on a bucket without owner
        // needs no particular relay alive).
        let rows = view.rows;
        shared
            .metrics
            .buckets_unowned
            .set(rows.iter().filter(|r| r.holder.is_none()).count() as i64);
        if held.len() >= share {
            return Ok(if held.is_empty() {
                Round::StandingBy
            } else {
                Round::Holding
            });
        }
        // What per-aggregate order rests on, checked before anything is published.
        if !*sequence_checked {
            if let Some(problem) = shared.store.id_sequence_problem().await? {
                return Ok(Round::Refused(problem));
            }
            *sequence_checked = true;
        }
        for row in rows {
            if held.len() >= share {
                break;
            }
            if row.holder.is_some() || held.contains_key(&row.bucket) {
                continue;
            }
            let name = current.lease_name(&s.lease_name, row.bucket);
            let sent = Instant::now();
            let Some(token) = shared
                .store
                .try_acquire(
                    &name,
                    (current.scope(row.bucket), Some(current.number)),
                    &s.instance_id,
                    s.lease_ttl,
                )
                .await?
            else {
                continue;
            };
            let release = CancellationToken::new();
            let task = tokio::spawn(publish_bucket(
                shared.clone(),
                self.wake.subscribe(),
                (current, row.bucket),
                (token, sent),
                (shutdown.clone(), release.clone()),
            ));
            held.insert(row.bucket, Held { release, task });
        }
        Ok(if held.is_empty() {
            Round::StandingBy
        } else {
            Round::Holding
        })
    }
}

/// What a round of [`Relay::share_buckets`] found.
enum Round {
    /// This relay holds buckets.
    Holding,
    /// Every bucket is held by other relays.
    StandingBy,
    /// Publishing would break what the relay's guarantees rest on (the id sequence).
    Refused(String),
}

/// Forgets the tasks that ended: a bucket whose lease was lost can be taken again. A task that
/// failed (a configuration error) stops the relay.
async fn reap(
    held: &mut BTreeMap<i16, Held>,
    leaving: &mut Vec<JoinHandle<anyhow::Result<()>>>,
) -> anyhow::Result<()> {
    let ended: Vec<i16> = held
        .iter()
        .filter(|(_, h)| h.task.is_finished())
        .map(|(b, _)| *b)
        .collect();
    let mut tasks: Vec<JoinHandle<anyhow::Result<()>>> = ended
        .into_iter()
        .filter_map(|b| held.remove(&b))
        .map(|h| h.task)
        .collect();
    let (done, running): (Vec<_>, Vec<_>) = std::mem::take(leaving)
        .into_iter()
        .partition(JoinHandle::is_finished);
    *leaving = running;
    tasks.extend(done);
    for task in tasks {
        match task.await {
            Ok(r) => r?,
            Err(e) => anyhow::bail!("a bucket's publisher panicked: {e}"),
        }
    }
    Ok(())
}
