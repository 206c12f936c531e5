//! The relay loop: take this relay's share of the outbox's buckets ([`crate::buckets`]) and
//! publish each under its lease, running batches ([`crate::batch`]) until shutdown, until the
//! bucket goes to another relay or until its lease is lost; stand by while other relays hold
//! every bucket.
//!
//! Shutdown is only observed between batches or while waiting; never between "acknowledged"
//! and "marked" except by abandoning marks, which only causes duplicates.

use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use outbox_writer::outbox::NOTIFY_CHANNEL;
use sqlx::postgres::PgListener;
use std::collections::BTreeMap;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::batch::{BatchEnd, Batcher, ClaimFloor, Settle};
use crate::buckets::Layout;
use crate::lease::LeaseGuard;
use crate::metrics::Metrics;
use crate::outage::Outage;
use crate::parking::ParkPolicy;
use crate::publisher::Publisher;
use crate::records::RecordSink;
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
        // With transactions, the records topic must exist (or be created) before any bucket
        // is published.
        if s.transactional_id.is_some() {
            let Some(n) = self.records_topic(&probe, &shutdown).await? else {
                return Ok(());
            };
            let _ = shared.record_partitions.set(n);
        }
        drop(probe);
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
        let refresher = tokio::spawn(refresh_backlog(
            shared.store.clone(),
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
        let result = self.share_buckets(&shutdown).await;
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
        let mut topics = TopicCatalog::new(&s.brokers, &s.kafka_config, s.create_topics)?;
        let buckets = self.shared.store.layout().await.map_or(1, |l| l.buckets);
        let mut outage = Outage::new("kafka (records topic)");
        loop {
            match topics
                .records_topic(probe.producer(), &s.records_topic, buckets)
                .await
            {
                Ok(n) => {
                    outage.recovered();
                    return Ok(Some(n));
                }
                Err(Ok(why)) => anyhow::bail!(why),
                Err(Err(e)) => outage.failed(&e),
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
        let current = shared.store.layout().await?;
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
        let members = shared
            .store
            .renew_membership(&s.lease_name, &s.instance_id, s.lease_ttl)
            .await?;
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
        let rows = shared.store.bucket_rows(&s.lease_name, current).await?;
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

/// The producers of one bucket: the batches' (reporting the brokers' state for bucket 0 when
/// `broker_down` is given) and the lone sends', each transactional under the bucket's own
/// `transactional.id` when transactions are on.
fn bucket_publishers(
    s: &RelaySettings,
    layout: Layout,
    bucket: i16,
    broker_down: Option<prometheus::IntGauge>,
    records: Option<&Settle>,
) -> anyhow::Result<(Publisher, Publisher)> {
    let mut publisher =
        Publisher::reporting(&s.brokers, &s.kafka_config, &s.topic_prefix, broker_down)?
            .with_wire(s.wire.clone())
            .with_send_timeout(s.send_timeout);
    // Events of aggregates retried after a failure go out one at a time on a producer of
    // their own ([`crate::batch::Batcher::publish`]).
    let mut lone = Publisher::new(&s.brokers, &lone_config(&s.kafka_config), &s.topic_prefix)?
        .with_wire(s.wire.clone())
        .with_send_timeout(s.send_timeout);
    if let Some(base) = &s.transactional_id {
        let id = layout.transactional_id(base, bucket);
        publisher = publisher.with_transactions(&id)?;
        lone = lone.with_transactions(&format!("{id}.lone"))?;
    }
    if let Some(r) = records {
        let sink = |key: &str| RecordSink {
            topic: r.topic.clone(),
            partition: r.partition,
            key: key.to_owned(),
        };
        publisher = publisher.with_records(sink(&r.keys[0]));
        lone = lone.with_records(sink(&r.keys[1]));
    }
    Ok((publisher, lone))
}

/// Publishes `bucket` of `layout` under `token` until `shutdown`, until `release` (the bucket
/// goes to another relay: after the batch in flight) or until the lease is lost; releases the
/// lease unless lost.
async fn publish_bucket(
    shared: Arc<Shared>,
    wake: watch::Receiver<u64>,
    (layout, bucket): (Layout, i16),
    (token, acquired_at): (LeaseToken, Instant),
    (shutdown, release): (CancellationToken, CancellationToken),
) -> anyhow::Result<()> {
    let s = &shared.settings;
    let first = bucket == 0;
    // With transactions, each transaction of the bucket's producers ends with its record, keyed
    // by the producer's `transactional.id`.
    let records = match (&s.transactional_id, shared.record_partitions.get()) {
        (Some(base), Some(&partitions)) => {
            let id = layout.transactional_id(base, bucket);
            Some(Settle {
                brokers: s.brokers.clone(),
                extra: s.kafka_config.to_vec(),
                topic: s.records_topic.clone(),
                partition: crate::records::partition_of(bucket, partitions),
                keys: vec![id.clone(), format!("{id}.lone")],
            })
        }
        _ => None,
    };
    let (mut publisher, mut lone) = bucket_publishers(
        s,
        layout,
        bucket,
        first.then(|| shared.metrics.broker_down.clone()),
        records.as_ref(),
    )?;
    let mut topics = TopicCatalog::new(&s.brokers, &s.kafka_config, s.create_topics)?;
    let mut db = Outage::new("database");
    let mut kafka = Outage::new("kafka publish");
    if let Some(id) = &s.transactional_id {
        tracing::info!(transactional.id = %layout.transactional_id(id, bucket), bucket, "Publishing each batch as a Kafka transaction");
    }
    tracing::info!(lease.name = %token.name, lease.epoch = token.epoch, instance = %token.holder, bucket, buckets = layout.buckets, "Acquired the relay lease; publishing");
    if first {
        shared.metrics.leader.set(1);
        shared.metrics.lease_epoch.set(token.epoch);
        publisher.set_leading(true);
    }
    let guard = LeaseGuard::start(shared.store.clone(), token, s.lease_ttl, acquired_at);
    let end = lead(
        &shared,
        (wake, records),
        &guard,
        (&mut publisher, &mut lone),
        &mut topics,
        (&mut db, &mut kafka),
        (&shutdown, &release),
    )
    .await;
    let token = guard.token().clone();
    guard.stop().await;
    if first {
        shared.metrics.leader.set(0);
        shared.metrics.lease_epoch.set(0);
        publisher.set_leading(false);
    }
    // Whatever is still queued belongs to a lease this relay no longer holds, or is about to
    // release.
    publisher.purge();
    lone.purge();
    match end {
        LeadEnd::Shutdown => {
            if let Err(e) = shared.store.release_lease(&token).await {
                tracing::warn!(error = %e, bucket, "Could not release the lease; another relay takes over when it expires");
            }
        }
        LeadEnd::LeaseLost => {
            tracing::warn!(
                lease.epoch = token.epoch,
                bucket,
                "Lost the relay lease; back to standby"
            );
        }
    }
    Ok(())
}

async fn lead(
    shared: &Shared,
    (mut wake, records): (watch::Receiver<u64>, Option<Settle>),
    guard: &LeaseGuard,
    (publisher, lone): (&mut Publisher, &mut Publisher),
    topics: &mut TopicCatalog,
    (db, kafka): (&mut Outage, &mut Outage),
    (shutdown, release): (&CancellationToken, &CancellationToken),
) -> LeadEnd {
    let s = &shared.settings;
    let (min_poll, max_poll) = s.poll;
    let mut idle = min_poll;
    let mut last_rows = Instant::now();
    let mut backoff = new_backoff();
    let mut batcher = Batcher {
        store: &shared.store,
        metrics: &shared.metrics,
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
        // A new owner settles the bucket from its records before its first claim.
        unsettled: records.is_some(),
        records,
    };
    // Fence the relays that held the lease before, now (their open transactions are
    // aborted, so `read_committed` readers do not wait for their timeout); failing that,
    // the first batch tries again before it sends anything.
    if batcher.initialise(true).await == Err(BatchEnd::LeaseLost) {
        return LeadEnd::LeaseLost;
    }
    loop {
        if shutdown.is_cancelled() || release.is_cancelled() {
            return LeadEnd::Shutdown;
        }
        if !guard.is_valid() {
            return LeadEnd::LeaseLost;
        }
        // A release waits for the batch in flight; a shutdown cuts its wait for
        // acknowledgements short (`--shutdown-timeout-ms`).
        match batcher.run(shutdown).await {
            BatchEnd::Empty => {
                tokio::select! {
                    r = wake.changed() => if r.is_err() {
                        // The listener is gone: poll only.
                        tokio::time::sleep(idle).await;
                    },
                    _ = tokio::time::sleep(idle) => {}
                    _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                    _ = release.cancelled() => return LeadEnd::Shutdown,
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
                if !sleep_unless(wait, shutdown).await || release.is_cancelled() {
                    return LeadEnd::Shutdown;
                }
            }
            BatchEnd::LeaseLost => return LeadEnd::LeaseLost,
            BatchEnd::Shutdown => return LeadEnd::Shutdown,
        }
    }
}

/// Wakes the loop on `NOTIFY outbox_relay`; polling covers any notification lost while
/// reconnecting (and poolers that do not pass LISTEN through).
async fn listen_for_wakeups(store: Store, wake: watch::Sender<u64>, stop: CancellationToken) {
    loop {
        if let Ok(mut listener) = PgListener::connect_with(store.pool()).await {
            if listener.listen(NOTIFY_CHANNEL).await.is_ok() {
                loop {
                    tokio::select! {
                        r = listener.recv() => match r {
                            Ok(_) => wake.send_modify(|n| *n = n.wrapping_add(1)),
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
