//! The relay process's background tasks: the LISTEN wake-up, the runtime stall watch, the
//! orphan-failure sweep and the backlog gauges.

use std::time::Duration;

use outbox_writer::outbox::NOTIFY_CHANNEL;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::retry::sleep_unless;
use crate::store::Store;

/// Wakes the loop on `NOTIFY outbox_relay`; polling covers any notification lost while
/// reconnecting (and poolers that do not pass LISTEN through).
pub(super) async fn listen_for_wakeups(
    store: Store,
    wake: watch::Sender<u64>,
    stop: CancellationToken,
) {
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

/// Observes how late the runtime wakes a one-second timer (`outbox_relay_runtime_stall_seconds`):
/// the relay runs on one thread, so anything that blocks it delays the lease's renewal.
///
/// The period bounds what is missed: a stall longer than it always covers a wake-up and is
/// observed short by at most the period; a shorter one is seen in proportion to its length.
/// Stalls that matter to the lease are a large fraction of `--lease-ttl-ms` (seconds), so a
/// second resolves them. Each wake-up costs the idle relay two passes of its runtime (tokio
/// wakes its own driver whenever a new timer becomes the earliest): at 50 ms this watch alone
/// was most of the idle relay's CPU, at 250 ms still a fifth of its runtime's wake-ups.
pub(super) async fn watch_stalls(metrics: Metrics, stop: CancellationToken) {
    const TICK: Duration = Duration::from_secs(1);
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
pub(super) async fn forget_orphan_failures(
    store: Store,
    metrics: Metrics,
    stop: CancellationToken,
) {
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

/// Refreshes the backlog (per topic, per bucket), oldest-transaction and parking gauges every few
/// seconds.
pub(super) async fn refresh_backlog(
    store: Store,
    prefix: String,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut topics = crate::backlog_gauges::TopicSeries::default();
    let mut buckets = crate::backlog_gauges::BucketSeries::default();
    loop {
        let started = Instant::now();
        if let Ok((by_topic, by_bucket)) = store.backlog_by_topic_and_bucket(&prefix).await {
            topics.publish(&metrics, by_topic);
            buckets.publish(&metrics, by_bucket);
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
