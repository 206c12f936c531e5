//! Phase 3: the release relay binary draining a backlog. The backlog is inserted first, then
//! the relay is started; the clock runs from its start until `SELECT count(*) FROM outbox`
//! is 0. Its memory is sampled every 0.5 s to show that it stays flat.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;

use crate::infra::Infra;
use crate::relay_proc::{RelayProc, RelaySpec};
use crate::workload::{Workload, AGGREGATE_TYPE};

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
    /// The relay's log.
    pub relay_log: String,
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
    let db = infra.fresh_database("drain").await?;
    let prefix = infra.topic_prefix("drain");
    infra
        .create_topic(&format!("{prefix}{AGGREGATE_TYPE}"))
        .await?;
    w.insert_backlog(&db.pool, spec.events).await?;
    infra.checkpoint().await;

    let log = spec.log_dir.join("relay-drain.log");
    let cpu0 = infra.cpu.snapshot();
    let start = Instant::now();
    let mut relay = RelayProc::spawn(&RelaySpec {
        binary: spec.binary,
        database_url: &db.url,
        brokers: infra.brokers(),
        topic_prefix: &prefix,
        batch_size: spec.batch_size,
        extra: spec.extra,
        log: log.clone(),
    })?;
    let deadline = start + spec.timeout;
    let mut samples = Vec::new();
    let mut next_sample = start;
    let mut next_count = start + Duration::from_secs(2);
    let mut published = 0u64;
    let mut first_published: Option<(f64, u64)> = None;
    let mut progress: Vec<(f64, u64)> = Vec::new();
    let seconds = loop {
        relay.check_running()?;
        if let Some(m) = relay.metrics().await {
            if let Some(v) = crate::stats::metric_value(&m, "outbox_events_published_total") {
                published = v as u64;
            }
        }
        let now = Instant::now();
        let t = now.duration_since(start).as_secs_f64();
        progress.push((t, published));
        if published > 0 && first_published.is_none() {
            first_published = Some((t, published));
        }
        if now >= next_sample {
            if let Some(mem) = relay.memory() {
                samples.push(Sample {
                    t_s: now.duration_since(start).as_secs_f64(),
                    rss_kb: mem.rss_kb,
                    published,
                });
            }
            next_sample += Duration::from_millis(500);
        }
        // count(*) scans the table: only when the relay says it is done, or every 2 s in
        // case its metrics are unavailable.
        if published >= spec.events || now >= next_count {
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
                .fetch_one(&db.pool)
                .await?;
            if left == 0 {
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
    let cpu = crate::cpu::CpuFigures::between(
        &cpu0,
        &infra.cpu.snapshot(),
        spec.events,
        infra.cpu.process_seconds(relay.pid(), false),
    );
    let peak_rss_kb = relay.memory().map_or(0, |m| m.hwm_kb);
    if let Some(m) = relay.memory() {
        samples.push(Sample {
            t_s: seconds,
            rss_kb: m.rss_kb,
            published: spec.events,
        });
    }
    let avg_batch_rows = relay.metrics().await.and_then(|m| {
        let sum = crate::stats::metric_value(&m, "outbox_batch_rows_sum")?;
        let count = crate::stats::metric_value(&m, "outbox_batch_rows_count")?;
        (count > 0.0).then(|| sum / count)
    });
    relay.stop().await?;
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
    })
}
