//! Phase 3: the release relay binary draining a backlog. The backlog is inserted first, then
//! the relay is started; the clock runs from its start until no healthy event is left in the
//! outbox. Its memory is sampled every 0.5 s to show that it stays flat.
//!
//! The same machinery serves the `isolation` phase (events of other aggregates in front of
//! the backlog: [`Front`]) and the `backlog` phase (a backlog inserted in chunks, claim time
//! sampled on the side while the relay drains, lease changes counted).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use outbox_relay::Store;
use serde::Serialize;

use crate::infra::Infra;
use crate::probe::side_claims;
pub use crate::probe::ProbeSample;
use crate::relay_proc::{RelayProc, RelaySpec};
use crate::workload::{Front, Workload};

/// The relay's log line when it loses the lease.
const LOST_LEASE_LOG: &str = "Lost the relay lease";

/// One sample taken while draining.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the relay was started.
    pub t_s: f64,
    /// Resident set size, KiB.
    pub rss_kb: u64,
    /// Events published so far (`outbox_events_published_total`).
    pub published: u64,
}

/// Figures of phase 3.
#[derive(Debug, Clone, Serialize)]
pub struct DrainFigures {
    /// Events in the backlog.
    pub events: u64,
    /// Seconds from starting the relay until the outbox was empty.
    pub seconds: f64,
    /// Events per second over that time.
    pub events_per_s: f64,
    /// Seconds from starting the relay until the first events were marked published.
    pub first_published_s: Option<f64>,
    /// Events per second from the first marked batch to the end (start-up excluded).
    pub steady_events_per_s: Option<f64>,
    /// Events per second in the first half of the backlog (progress polled every 50 ms).
    pub first_half_events_per_s: Option<f64>,
    /// Events per second in the second half of the backlog.
    pub second_half_events_per_s: Option<f64>,
    /// Peak resident set size of the relay (`VmHWM`), KiB.
    pub peak_rss_kb: u64,
    /// Smallest and largest sampled RSS after the first second, KiB.
    pub rss_range_kb: Option<(u64, u64)>,
    /// Average rows per batch (`outbox_batch_rows`).
    pub avg_batch_rows: Option<f64>,
    /// CPU from the relay's start until the outbox was empty: the relay process, PostgreSQL
    /// (claims, deletes, autovacuum), the broker.
    pub cpu: crate::cpu::CpuFigures,
    /// Samples every 0.5 s.
    pub samples: Vec<Sample>,
    /// The relay's log (the first relay's when several drain).
    pub relay_log: String,
    /// Relay processes that drained the backlog together, and the outbox's bucket count.
    pub relays: usize,
    /// See `relays`.
    pub buckets: i16,
    /// Events each relay published (`outbox_events_published_total` at the end).
    pub published_per_relay: Vec<u64>,
    /// Seconds of inserting the healthy backlog.
    pub insert_seconds: f64,
    /// Rows inserted in front of the backlog (see [`Front`]).
    pub front_rows: u64,
    /// Rows of the front still in the outbox when the healthy events were out.
    pub front_rows_left: Option<i64>,
    /// Seconds from starting the relay until the front's sendable events were out too
    /// (suspects only).
    pub all_seconds: Option<f64>,
    /// `outbox_batch_lone_sends`: events sent alone over the run (histogram sum) and the
    /// batches that had any (count); absent from relays without lone sends.
    pub lone_sends: Option<(f64, f64)>,
    /// Distinct values of `outbox_relay_lease_epoch` seen (0 left out), in order: one while
    /// leadership is stable.
    pub lease_epochs: Vec<i64>,
    /// Lines of the relay's log saying it lost the lease.
    pub lease_lost_logged: usize,
    /// Side claims (`backlog` phase).
    pub probes: Vec<ProbeSample>,
    /// The topic prefix of the run (its topics: `Workload::topic_names`).
    pub topic_prefix: String,
}

/// What the drain needs to know.
#[derive(Debug, Clone)]
pub struct DrainSpec<'a> {
    /// Backlog size.
    pub events: u64,
    /// Relay binary.
    pub binary: &'a std::path::Path,
    /// `--batch-size`.
    pub batch_size: i64,
    /// Extra relay arguments.
    pub extra: &'a [String],
    /// Longest the drain may take.
    pub timeout: Duration,
    /// Directory for the relay's log.
    pub log_dir: &'a std::path::Path,
    /// Names the log (`relay-<label>.log`), the database and the topic prefix.
    pub label: &'a str,
    /// Events of other aggregates inserted before the backlog.
    pub front: Front,
    /// Insert the backlog in transactions of this many rows with the aggregate lock off
    /// (instead of one statement with it on).
    pub chunk: Option<u64>,
    /// Take a side claim this often while draining.
    pub probe_every: Option<Duration>,
    /// Relay processes draining the backlog together (1 but for the `relays` phase).
    pub relays: usize,
    /// The outbox's bucket count (`outbox-relay buckets --set`, before the backlog is
    /// inserted); `None` leaves the migrations' one bucket.
    pub buckets: Option<i16>,
    /// Start the relays on the empty outbox and wait until they hold every bucket (balanced
    /// among them) before the backlog is inserted (one transaction); the clock and the CPU
    /// accounting start as it commits. Otherwise the relays start on the backlog, their
    /// start-up timed with it.
    pub warm: bool,
}

impl DrainSpec<'_> {
    /// The same drain with another label and front.
    pub fn with_front<'b>(&'b self, label: &'b str, front: Front) -> DrainSpec<'b> {
        DrainSpec {
            label,
            front,
            ..self.clone()
        }
    }
}

/// Runs phase 3.
///
/// # Errors
/// Database or broker errors, the relay exiting, or the backlog not draining in time.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    spec: &DrainSpec<'_>,
) -> anyhow::Result<DrainFigures> {
    let db = infra.fresh_database(spec.label).await?;
    let prefix = infra.topic_prefix(spec.label);
    let topics = w.topic_names(&prefix);
    infra.create_topics(&topics).await?;
    let buckets = match spec.buckets {
        Some(n) => {
            Store::from_pool(db.pool.clone())
                .set_buckets("default", i64::from(n))
                .await
                .map_err(|e| anyhow::anyhow!("buckets --set {n}: {e}"))?
                .buckets
        }
        None => 1,
    };
    let logs: Vec<std::path::PathBuf> = (0..spec.relays.max(1))
        .map(|i| match i {
            0 => spec.log_dir.join(format!("relay-{}.log", spec.label)),
            i => spec
                .log_dir
                .join(format!("relay-{}-{}.log", spec.label, i + 1)),
        })
        .collect();
    let log = logs[0].clone();
    let spawn = |log: &std::path::PathBuf| {
        RelayProc::spawn(&RelaySpec {
            binary: spec.binary,
            database_url: &db.url,
            brokers: infra.brokers(),
            topic_prefix: &prefix,
            batch_size: spec.batch_size,
            extra: spec.extra,
            log: log.clone(),
        })
    };
    let mut relays = Vec::new();
    if spec.warm {
        for log in &logs {
            relays.push(spawn(log)?);
        }
        held_by_all(&db.pool, &mut relays, buckets, spec.timeout).await?;
    }
    spec.front.insert(&db.pool).await?;
    // The healthy events are the rows after the front's.
    let front_max: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM outbox")
        .fetch_one(&db.pool)
        .await?;
    // Warm relays are already polling: the backlog is inserted in a transaction they cannot
    // see until it commits, after the checkpoint, as the clock starts.
    let mut unseen = None;
    let insert_seconds = match (spec.warm, spec.chunk) {
        (true, _) => {
            let t0 = Instant::now();
            let mut tx = db.pool.begin().await?;
            w.insert_range(&mut tx, 1, spec.events).await?;
            sqlx::query("ANALYZE outbox").execute(&mut *tx).await?;
            unseen = Some(tx);
            t0.elapsed().as_secs_f64()
        }
        (false, Some(chunk)) => {
            w.insert_backlog_unlocked(&db.pool, spec.events, chunk)
                .await?
        }
        (false, None) => w.insert_backlog(&db.pool, spec.events).await?,
    };
    infra.checkpoint().await;

    let probes = Arc::new(Mutex::new(Vec::new()));
    // Warm relays: their CPU from here on.
    let relay_s0 = relays
        .iter()
        .map(|r| infra.cpu.process_seconds(r.pid(), false))
        .sum::<Option<f64>>()
        .unwrap_or(0.0);
    let cpu0 = infra.cpu.snapshot();
    let start = Instant::now();
    if let Some(tx) = unseen {
        tx.commit().await?;
    }
    if !spec.warm {
        for log in &logs {
            relays.push(spawn(log)?);
        }
    }
    let mut published_per_relay = vec![0u64; relays.len()];
    let prober = spec.probe_every.map(|every| {
        tokio::spawn(side_claims(
            db.url.clone(),
            spec.batch_size,
            every,
            start,
            Arc::clone(&probes),
        ))
    });
    let deadline = start + spec.timeout;
    let mut lease_epochs: Vec<i64> = Vec::new();
    let mut samples = Vec::new();
    let mut next_sample = start;
    let mut next_count = start + Duration::from_secs(2);
    let mut first_published: Option<(f64, u64)> = None;
    let mut progress: Vec<(f64, u64)> = Vec::new();
    let seconds = loop {
        for (i, relay) in relays.iter_mut().enumerate() {
            relay.check_running()?;
            if let Some(m) = relay.metrics().await {
                if let Some(v) = crate::stats::metric_value(&m, "outbox_events_published_total") {
                    published_per_relay[i] = v as u64;
                }
                if i == 0 {
                    note_epoch(&mut lease_epochs, &m);
                }
            }
        }
        let published: u64 = published_per_relay.iter().sum();
        let now = Instant::now();
        let t = now.duration_since(start).as_secs_f64();
        progress.push((t, published));
        if published > 0 && first_published.is_none() {
            first_published = Some((t, published));
        }
        if now >= next_sample {
            if let Some(mem) = relays[0].memory() {
                samples.push(Sample {
                    t_s: now.duration_since(start).as_secs_f64(),
                    rss_kb: mem.rss_kb,
                    published,
                });
            }
            next_sample += Duration::from_millis(500);
        }
        // Only when the relay says it is done, or every 2 s in case its metrics are
        // unavailable (the front's events count as published too).
        if published >= spec.events || now >= next_count {
            let left: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE id > $1)")
                    .bind(front_max)
                    .fetch_one(&db.pool)
                    .await?;
            if !left {
                break now.duration_since(start).as_secs_f64();
            }
            next_count = Instant::now() + Duration::from_secs(2);
        }
        if now > deadline {
            bail!(
                "the relay did not drain {} events within {:?} ({published} published)",
                spec.events,
                spec.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let relay_s = relays
        .iter()
        .map(|r| infra.cpu.process_seconds(r.pid(), false))
        .sum::<Option<f64>>()
        .map(|s| s - relay_s0);
    let cpu = crate::cpu::CpuFigures::between(&cpu0, &infra.cpu.snapshot(), spec.events, relay_s);
    if let Some(p) = prober {
        p.abort();
    }
    let front_rows_left = (spec.front.rows() > 0).then_some(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox")
            .fetch_one(&db.pool)
            .await?,
    );
    let front_rows_left_target = spec.front.rows_left() as i64;
    let all_seconds = match front_rows_left {
        Some(left) if left > front_rows_left_target => {
            // The front's sendable events (suspects) are still going out.
            loop {
                for relay in &mut relays {
                    relay.check_running()?;
                }
                let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
                    .fetch_one(&db.pool)
                    .await?;
                if left <= front_rows_left_target {
                    break Some(start.elapsed().as_secs_f64());
                }
                if Instant::now() > deadline {
                    bail!(
                        "{left} rows of the front were still in the outbox after {:?}",
                        spec.timeout
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Some(_) => Some(seconds),
        None => None,
    };
    let peak_rss_kb = relays[0].memory().map_or(0, |m| m.hwm_kb);
    if let Some(m) = relays[0].memory() {
        samples.push(Sample {
            t_s: seconds,
            rss_kb: m.rss_kb,
            published: spec.events,
        });
    }
    let mut end_metrics = Vec::new();
    for relay in &relays {
        end_metrics.push(relay.metrics().await.unwrap_or_default());
    }
    note_epoch(&mut lease_epochs, &end_metrics[0]);
    // A histogram's sum and count over every relay.
    let sum_count = |name: &str| {
        end_metrics.iter().try_fold((0.0, 0.0), |(sum, count), m| {
            Some((
                sum + crate::stats::metric_value(m, &format!("{name}_sum"))?,
                count + crate::stats::metric_value(m, &format!("{name}_count"))?,
            ))
        })
    };
    for (i, m) in end_metrics.iter().enumerate() {
        if let Some(v) = crate::stats::metric_value(m, "outbox_events_published_total") {
            published_per_relay[i] = v as u64;
        }
    }
    let avg_batch_rows =
        sum_count("outbox_batch_rows").and_then(|(sum, count)| (count > 0.0).then(|| sum / count));
    let lone_sends = sum_count("outbox_batch_lone_sends");
    for relay in relays {
        relay.stop().await?;
    }
    let lease_lost_logged = std::fs::read_to_string(&log)
        .map(|t| t.lines().filter(|l| l.contains(LOST_LEASE_LOG)).count())
        .unwrap_or(0);
    let mut probes: Vec<ProbeSample> = probes.lock().map(|p| p.clone()).unwrap_or_default();
    for p in &mut probes {
        p.published = progress
            .iter()
            .rev()
            .find(|(t, _)| *t <= p.t_s)
            .map_or(0, |(_, n)| *n);
    }
    infra.drop_database(db).await?;

    progress.push((seconds, spec.events));
    let rate = |a: (f64, u64), b: (f64, u64)| {
        (b.0 > a.0).then(|| b.1.saturating_sub(a.1) as f64 / (b.0 - a.0))
    };
    let steady = first_published.and_then(|p| rate(p, (seconds, spec.events)));
    let half = |lo: u64, hi: u64| {
        let a = progress.iter().rev().find(|p| p.1 <= lo)?;
        let b = progress.iter().find(|p| p.1 >= hi)?;
        rate(*a, *b)
    };
    let later: Vec<u64> = samples
        .iter()
        .filter(|s| s.t_s >= 1.0)
        .map(|s| s.rss_kb)
        .collect();
    Ok(DrainFigures {
        events: spec.events,
        seconds,
        events_per_s: spec.events as f64 / seconds,
        first_published_s: first_published.map(|p| p.0),
        steady_events_per_s: steady,
        first_half_events_per_s: half(0, spec.events / 2),
        second_half_events_per_s: half(spec.events / 2, spec.events),
        peak_rss_kb,
        rss_range_kb: later
            .iter()
            .min()
            .zip(later.iter().max())
            .map(|(a, b)| (*a, *b)),
        avg_batch_rows,
        cpu,
        samples,
        relay_log: log.display().to_string(),
        relays: logs.len(),
        buckets,
        published_per_relay,
        insert_seconds,
        front_rows: spec.front.rows(),
        front_rows_left,
        all_seconds,
        lone_sends,
        lease_epochs,
        lease_lost_logged,
        probes,
        topic_prefix: prefix,
    })
}

/// Waits until `relays` hold every one of the outbox's `buckets`, balanced: as many holders
/// as there can be (`min(relays, buckets)`), none above its share.
async fn held_by_all(
    pool: &sqlx::PgPool,
    relays: &mut [RelayProc],
    buckets: i16,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let holders = relays.len().min(buckets as usize) as i64;
    loop {
        for r in relays.iter_mut() {
            r.check_running()?;
        }
        let (held, by, most): (i64, i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(n), 0)::bigint, count(*), coalesce(max(n), 0) FROM ( \
                 SELECT count(*) AS n FROM outbox_relay_lease \
                 WHERE (name = 'default' OR name LIKE 'default/l%') AND expires_at > now() \
                   AND holder <> '<buckets>' GROUP BY holder) h",
        )
        .fetch_one(pool)
        .await?;
        let share = outbox_relay::buckets::share(buckets, holders) as i64;
        if held == i64::from(buckets) && by == holders && most <= share {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the relays held {held} of {buckets} buckets among {by} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Notes the lease epoch of the relay's metrics when it differs from the last one seen.
fn note_epoch(seen: &mut Vec<i64>, metrics: &str) {
    let Some(epoch) = crate::stats::metric_value(metrics, "outbox_relay_lease_epoch") else {
        return;
    };
    let epoch = epoch as i64;
    if epoch > 0 && seen.last() != Some(&epoch) {
        seen.push(epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::note_epoch;

    #[test]
    fn lease_epochs_are_noted_once_per_change() {
        let mut seen = Vec::new();
        for text in [
            "outbox_relay_lease_epoch 0\n",
            "# HELP x\noutbox_relay_lease_epoch 3\n",
            "outbox_relay_lease_epoch 3\n",
            "outbox_events_published_total 5\n",
            "outbox_relay_lease_epoch 4\n",
        ] {
            note_epoch(&mut seen, text);
        }
        assert_eq!(seen, vec![3, 4]);
    }
}
