//! Publishing one bucket: its producers, its lease kept, and its batches run until shutdown,
//! until the bucket is released to another relay, or until its lease is lost.

use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{LeadEnd, RelaySettings, Shared};
use crate::batch::{BatchEnd, Batcher, ClaimFloor, Settle};
use crate::buckets::Layout;
use crate::lease::LeaseGuard;
use crate::outage::Outage;
use crate::publisher::Publisher;
use crate::records::RecordSink;
use crate::retry::{new_backoff, sleep_unless};
use crate::store::LeaseToken;
use crate::topics::TopicCatalog;

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

/// The producers of one bucket: the batches' (reporting the brokers' state for bucket 0 when
/// `broker_down` is given) and the lone sends', each transactional under the bucket's own
/// `transactional.id` when transactions are on.
pub(super) fn bucket_publishers(
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
pub(super) async fn publish_bucket(
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
    let mut topics = TopicCatalog::new(&s.brokers, &s.kafka_config, s.create_topics);
    let mut db = Outage::new("database");
    let mut kafka = Outage::new("kafka publish");
    if let Some(id) = &s.transactional_id {
        tracing::info!(transactional.id = %layout.transactional_id(id, bucket), bucket, "Publishing each batch as a Kafka transaction");
    }
    tracing::info!(lease.name = %token.name, lease.epoch = token.epoch, instance = %token.holder, bucket, buckets = layout.buckets, "Acquired the relay lease; publishing");
    shared.metrics.set_bucket_lease(bucket, Some(token.epoch));
    if first {
        shared.metrics.leader.set(1);
        shared.metrics.lease_epoch.set(token.epoch);
        publisher.set_leading(true);
    }
    let guard = LeaseGuard::start(shared.store.clone(), token, s.lease_ttl, acquired_at);
    publisher.commit_under(guard.check());
    lone.commit_under(guard.check());
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
    shared.metrics.set_bucket_lease(bucket, None);
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
    // The bucket's claims and marks keep their connection between them.
    let store = shared.store.holding();
    let mut batcher = Batcher {
        store: &store,
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
        full: false,
        lone_used: std::time::Instant::now(),
    };
    // Fence the relays that held the lease before, now (their open transactions are
    // aborted, so `read_committed` readers do not wait for their timeout); failing that,
    // the first batch tries again before it sends anything.
    if batcher.initialise(true).await == Err(BatchEnd::LeaseLost) {
        return LeadEnd::LeaseLost;
    }
    let end = run_batches(
        &mut batcher,
        &mut wake,
        guard,
        (s.poll, s.min_batch_interval),
        (shutdown, release),
    )
    .await;
    // A bucket handed over (SIGTERM, or released to another relay) right after a transaction
    // was stranded by a dead partition moves on to a new generation first: its next holder
    // initialises the row's generation, and would be refused on a stranded one for as long
    // as a send may take before it moves on itself.
    if end == LeadEnd::Shutdown
        && (batcher.publisher.id_stranded().is_some() || batcher.lone.id_stranded().is_some())
    {
        let bound = s.shutdown_timeout;
        if tokio::time::timeout(bound, batcher.initialise(true))
            .await
            .is_err()
        {
            tracing::warn!(?bound, "Could not move the bucket to a new transactional id generation before handing it over; its next holder moves it on once its initialisations have been refused for as long as a send may take");
        }
    }
    end
}

/// Runs batches until the relay stops, hands the bucket over or loses its lease.
async fn run_batches(
    batcher: &mut Batcher<'_>,
    wake: &mut watch::Receiver<u64>,
    guard: &LeaseGuard,
    ((min_poll, max_poll), interval): ((Duration, Duration), Duration),
    (shutdown, release): (&CancellationToken, &CancellationToken),
) -> LeadEnd {
    let mut idle = min_poll;
    let mut last_rows = Instant::now();
    let mut backoff = new_backoff();
    // When the next batch may start (`--min-batch-interval-ms`).
    let mut not_before: Option<Instant> = None;
    loop {
        if shutdown.is_cancelled() || release.is_cancelled() {
            return LeadEnd::Shutdown;
        }
        if !guard.is_valid() {
            return LeadEnd::LeaseLost;
        }
        if let Some(at) = not_before.take() {
            tokio::select! {
                // Checked again (the lease may have run out meanwhile) before the claim.
                () = tokio::time::sleep_until(at) => continue,
                _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                _ = release.cancelled() => return LeadEnd::Shutdown,
                _ = guard.lost() => return LeadEnd::LeaseLost,
            }
        }
        let started = Instant::now();
        // A release waits for the batch in flight; a shutdown cuts its wait for
        // acknowledgements short (`--shutdown-timeout-ms`).
        let end = batcher.run(shutdown).await;
        batcher.retire_idle_lone();
        // A backlog (the batch was full) goes on at once.
        if !interval.is_zero() && !batcher.full {
            not_before = Some(started + interval);
        }
        match end {
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
