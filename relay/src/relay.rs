//! The relay loop: wait for the lease as a hot standby, then claim, publish and mark batches
//! until shutdown or until the lease is lost.
//!
//! One batch:
//! 1. claim: read the head of the outbox in `id` order (fenced by the lease);
//! 2. publish: hand every row to the idempotent producer at once, await all delivery reports;
//! 3. mark: delete the rows whose report said "persisted" — except rows of an aggregate that
//!    had an earlier failure in the batch, which stay and are sent again after it — fenced by
//!    the lease epoch;
//! 4. on failures, back off exponentially before the next batch.
//!
//! Shutdown is only observed between batches or while waiting; never between "acknowledged"
//! and "marked" except by abandoning marks, which only causes duplicates.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use backoff::ExponentialBackoff;
use outbox_kit::outbox::NOTIFY_CHANNEL;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::LeaseGuard;
use crate::metrics::Metrics;
use crate::outage::Outage;
use crate::publisher::{PublishError, Publisher, RowOutcome};
use crate::quarantine::Quarantine;
use crate::store::{Claim, LeaseToken, Marked, Store};
use crate::topics::TopicCreator;

/// Everything the relay loop needs to know.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Extra librdkafka settings.
    pub kafka_config: Vec<(String, String)>,
    /// Topic prefix for routing.
    pub topic_prefix: String,
    /// `Some((partitions, replication))` to create missing topics.
    pub create_topics: Option<(i32, i32)>,
    /// Rows per batch.
    pub batch_size: i64,
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

fn new_backoff() -> ExponentialBackoff {
    ExponentialBackoff {
        initial_interval: Duration::from_millis(100),
        max_interval: Duration::from_secs(10),
        multiplier: 2.0,
        randomization_factor: 0.2,
        max_elapsed_time: None,
        ..ExponentialBackoff::default()
    }
}

/// Sleeps unless `token` fires first; false when it fired.
async fn sleep_unless(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = token.cancelled() => false,
    }
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
        let mut publisher = Publisher::new(&s.brokers, &s.kafka_config, &s.topic_prefix)?;
        let mut topics = match s.create_topics {
            Some((p, r)) => Some(TopicCreator::new(&s.brokers, &s.kafka_config, p, r)?),
            None => None,
        };
        let helpers = shutdown.child_token();
        let listener = tokio::spawn(listen_for_wakeups(
            self.store.clone(),
            self.wake.clone(),
            helpers.clone(),
        ));
        let refresher = tokio::spawn(refresh_backlog(
            self.store.clone(),
            self.metrics.clone(),
            helpers.clone(),
        ));

        tracing::info!(instance = %s.instance_id, lease.name = %s.lease_name, "Relay started");
        while let Some((token, acquired_at)) = self.wait_for_lease(&shutdown).await {
            tracing::info!(lease.name = %token.name, lease.epoch = token.epoch, instance = %token.holder, "Acquired the relay lease; publishing");
            self.metrics.leader.set(1);
            let guard = LeaseGuard::start(self.store.clone(), token, s.lease_ttl, acquired_at);
            let end = self
                .lead(&guard, &mut publisher, &mut topics, &shutdown)
                .await;
            let token = guard.token().clone();
            guard.stop().await;
            self.metrics.leader.set(0);
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
                    publisher.purge();
                    publisher = Publisher::new(&s.brokers, &s.kafka_config, &s.topic_prefix)?;
                }
            }
        }
        publisher.purge();
        helpers.cancel();
        let _ = listener.await;
        let _ = refresher.await;
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
        publisher: &mut Publisher,
        topics: &mut Option<TopicCreator>,
        shutdown: &CancellationToken,
    ) -> LeadEnd {
        let s = &self.settings;
        let token = guard.token();
        let (min_poll, max_poll) = s.poll;
        let mut idle = min_poll;
        let mut last_rows = Instant::now();
        let mut backoff = new_backoff();
        let mut db = Outage::new("database");
        let mut kafka = Outage::new("kafka publish");
        let mut quarantine = Quarantine::default();
        loop {
            if shutdown.is_cancelled() {
                return LeadEnd::Shutdown;
            }
            if !guard.is_valid() {
                return LeadEnd::LeaseLost;
            }
            let held = quarantine.held(Instant::now());
            let claim = match self
                .store
                .claim_batch_excluding(token, s.batch_size, &held)
                .await
            {
                Ok(c) => {
                    db.recovered();
                    self.metrics.set_healthy(!kafka.is_failing());
                    c
                }
                Err(e) => {
                    self.metrics.db_errors.inc();
                    self.metrics.set_healthy(false);
                    db.failed(&e);
                    if !sleep_unless(backoff.next_backoff().unwrap_or(max_poll), shutdown).await {
                        return LeadEnd::Shutdown;
                    }
                    continue;
                }
            };
            let rows = match claim {
                Claim::LeaseLost => return LeadEnd::LeaseLost,
                Claim::Rows(rows) => rows,
            };
            if rows.is_empty() {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(idle) => {}
                    _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                    _ = guard.lost() => return LeadEnd::LeaseLost,
                }
                // Stay at the shortest interval while events keep coming (a probe of an empty
                // index costs well under a millisecond); back off only once the outbox has been
                // quiet for a while, so an idle relay does not busy-poll.
                if last_rows.elapsed() >= HOT_WINDOW {
                    idle = (idle * 2).min(max_poll);
                }
                continue;
            }
            idle = min_poll;
            last_rows = Instant::now();
            self.metrics.batch_size.observe(rows.len() as f64);

            if let Some(tc) = topics.as_mut() {
                let names: HashSet<String> = rows.iter().map(|r| publisher.topic_of(r)).collect();
                if let Err(e) = tc.ensure(names.iter().map(String::as_str)).await {
                    kafka.failed(&e);
                    if !sleep_unless(backoff.next_backoff().unwrap_or(max_poll), shutdown).await {
                        return LeadEnd::Shutdown;
                    }
                    continue;
                }
            }

            // Publish; on shutdown give in-flight messages a grace period, then abandon them
            // unmarked (they are sent again by whoever relays next).
            let grace = async {
                shutdown.cancelled().await;
                tokio::time::sleep(s.shutdown_timeout).await;
            };
            let outcomes = tokio::select! {
                o = publisher.publish(&rows) => o,
                _ = grace => {
                    tracing::warn!(events = rows.len(), "Shutdown grace period over; abandoning in-flight events unmarked");
                    return LeadEnd::Shutdown;
                }
            };
            let settled = settle(&rows, &outcomes);

            if !settled.acked.is_empty() {
                match self
                    .mark(token, &settled.acked, &mut db, &mut backoff, shutdown)
                    .await
                {
                    Some(Marked::Deleted(n)) => {
                        self.metrics.published.inc_by(n);
                        for (row, ack) in rows.iter().zip(&outcomes) {
                            if let Ok(at) = ack.result {
                                if settled.acked_set.contains(&row.id) {
                                    let secs = (at - row.created_at).num_microseconds().unwrap_or(0)
                                        as f64
                                        / 1e6;
                                    self.metrics.latency.observe(secs.max(0.0));
                                }
                            }
                        }
                    }
                    Some(Marked::LeaseLost) => {
                        tracing::warn!(events = settled.acked.len(), "Lease lost before marking; acknowledged events will be published again by the new holder");
                        return LeadEnd::LeaseLost;
                    }
                    None => return LeadEnd::Shutdown,
                }
            }

            if !quarantine.is_empty() {
                for row in rows.iter().filter(|r| settled.acked_set.contains(&r.id)) {
                    quarantine.release(&row.aggregate_id);
                }
            }
            if settled.failed.is_empty() {
                kafka.recovered();
                publisher.context().mark_broker_up();
                backoff.reset();
                continue;
            }
            // Failures specific to some aggregates (others were acknowledged, or the message
            // itself was refused) hold back just those aggregates; when every event of the
            // batch failed for another reason (broker, topic), the whole relay backs off.
            let mut global = settled.acked.is_empty()
                && settled
                    .failed
                    .iter()
                    .any(|(_, e)| *e != PublishError::HeldBack && !e.is_message_specific());
            if !global {
                let now = Instant::now();
                for (id, err) in &settled.failed {
                    if *err == PublishError::HeldBack {
                        continue;
                    }
                    let Some(row) = rows.iter().find(|r| r.id == *id) else {
                        continue;
                    };
                    match quarantine.hold(&row.aggregate_id, now) {
                        Some((delay, failures)) if failures > 1 => tracing::debug!(
                            aggregate.id = %row.aggregate_id,
                            outbox.id = row.id,
                            failures,
                            retry_in_ms = delay.as_millis() as u64,
                            "Event still not published"
                        ),
                        Some((delay, _)) => tracing::warn!(
                            aggregate.id = %row.aggregate_id,
                            event.id = %row.event_id,
                            outbox.id = row.id,
                            error = %err,
                            retry_in_ms = delay.as_millis() as u64,
                            "Event not published; holding back its aggregate, other aggregates continue"
                        ),
                        None => global = true,
                    }
                }
            }
            for (reason, n) in &settled.failure_counts {
                self.metrics
                    .publish_failures
                    .with_label_values(&[reason])
                    .inc_by(*n);
            }
            let first = &settled.failed[0];
            kafka.failed(&format_args!(
                "{} of {} events not published, first id {}: {}",
                settled.failed.len(),
                rows.len(),
                first.0,
                first.1
            ));
            if publisher.is_fatal() || settled.failed.iter().any(|(_, e)| e.is_fatal()) {
                tracing::error!(
                    "Kafka producer hit a fatal error; replacing it and resuming from the outbox"
                );
                publisher.purge();
                match Publisher::new(&s.brokers, &s.kafka_config, &s.topic_prefix) {
                    Ok(p) => *publisher = p,
                    Err(e) => tracing::error!(error = %e, "Could not recreate the Kafka producer"),
                }
            }
            self.metrics.set_healthy(false);
            if global && !sleep_unless(backoff.next_backoff().unwrap_or(max_poll), shutdown).await {
                return LeadEnd::Shutdown;
            }
        }
    }

    /// Marks acknowledged rows, retrying database errors. `None` when shutdown interrupted
    /// the retries (the rows stay and are published again: duplicates, never loss).
    async fn mark(
        &self,
        token: &LeaseToken,
        ids: &[i64],
        db: &mut Outage,
        backoff: &mut ExponentialBackoff,
        shutdown: &CancellationToken,
    ) -> Option<Marked> {
        loop {
            match self.store.mark_published(token, ids).await {
                Ok(m) => {
                    db.recovered();
                    return Some(m);
                }
                Err(e) => {
                    self.metrics.db_errors.inc();
                    db.failed(&e);
                    if !sleep_unless(
                        backoff.next_backoff().unwrap_or(Duration::from_secs(1)),
                        shutdown,
                    )
                    .await
                    {
                        tracing::warn!(events = ids.len(), "Shutdown while the database is down; acknowledged events stay unmarked and will be sent again");
                        return None;
                    }
                }
            }
        }
    }
}

/// The marking decision for one batch.
#[derive(Debug, Default)]
pub struct Settled {
    /// Rows to mark published, in id order.
    pub acked: Vec<i64>,
    /// The same as a set.
    pub acked_set: HashSet<i64>,
    /// Rows not published and why (including acknowledged rows held back behind an earlier
    /// failure of their aggregate).
    pub failed: Vec<(i64, PublishError)>,
    /// Failure counts by reason label.
    pub failure_counts: Vec<(&'static str, u64)>,
}

/// Decides which rows of a batch may be marked: acknowledged rows, unless an earlier row of
/// the same aggregate failed (marking it would let the aggregate's order depend on a resend
/// that has not happened yet).
pub fn settle(rows: &[outbox_kit::EventEnvelope], outcomes: &[RowOutcome]) -> Settled {
    let mut failed_aggregates: HashSet<&str> = HashSet::new();
    let mut out = Settled::default();
    let mut counts: std::collections::BTreeMap<&'static str, u64> = Default::default();
    for (row, o) in rows.iter().zip(outcomes) {
        debug_assert_eq!(row.id, o.id);
        let agg = row.aggregate_id.as_str();
        let err = match &o.result {
            Ok(_) if !failed_aggregates.contains(agg) => {
                out.acked.push(row.id);
                out.acked_set.insert(row.id);
                continue;
            }
            Ok(_) => PublishError::HeldBack,
            Err(e) => e.clone(),
        };
        failed_aggregates.insert(agg);
        *counts
            .entry(match err {
                PublishError::Rejected(_) => "rejected",
                PublishError::Delivery(_) => "delivery",
                PublishError::Cancelled => "cancelled",
                PublishError::HeldBack => "held_back",
            })
            .or_default() += 1;
        out.failed.push((row.id, err));
    }
    out.failure_counts = counts.into_iter().collect();
    out
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

/// Refreshes the backlog gauges every few seconds.
async fn refresh_backlog(store: Store, metrics: Metrics, stop: CancellationToken) {
    loop {
        if let Ok(b) = store.backlog().await {
            metrics.backlog.set(b.unpublished);
            metrics.oldest_age.set(b.oldest_age_seconds);
        }
        if !sleep_unless(Duration::from_secs(5), &stop).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use rdkafka::error::RDKafkaErrorCode;

    fn row(id: i64, agg: &str) -> outbox_kit::EventEnvelope {
        outbox_kit::EventEnvelope {
            id,
            event_id: uuid::Uuid::new_v4(),
            aggregate_type: "order".into(),
            aggregate_id: agg.into(),
            event_type: "E".into(),
            payload: "{}".into(),
            headers: serde_json::json!({}),
            topic: None,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn a_failure_holds_back_later_events_of_its_aggregate_only() {
        let rows = vec![
            row(1, "a"),
            row(2, "b"),
            row(3, "a"),
            row(4, "b"),
            row(5, "c"),
        ];
        let ok = |id| RowOutcome {
            id,
            result: Ok(Utc::now()),
        };
        let outcomes = vec![
            ok(1),
            RowOutcome {
                id: 2,
                result: Err(PublishError::Delivery(RDKafkaErrorCode::MessageTimedOut)),
            },
            ok(3),
            ok(4),
            ok(5),
        ];
        let s = settle(&rows, &outcomes);
        assert_eq!(s.acked, vec![1, 3, 5]);
        assert_eq!(s.failed.iter().map(|f| f.0).collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(s.failed[1].1, PublishError::HeldBack);
        assert_eq!(s.failure_counts, vec![("delivery", 1), ("held_back", 1)]);
    }
}
