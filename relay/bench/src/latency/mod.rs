//! Phase 5: end-to-end latency at a fixed offered load. Writer tasks commit one event per
//! transaction through `outbox_writer::enqueue` on a fixed schedule and note each event's commit
//! time; the release relay publishes them; an rdkafka consumer (all partitions assigned) notes
//! when each event id arrives.
//!
//! Three views of the same events, all against the writer's commit time on one clock:
//! - commit → handed to the producer: the message's `CreateTime`, which librdkafka stamps when
//!   the relay calls produce (ms resolution); a lower bound of commit → ack;
//! - commit → broker ack: the relay's `outbox_publish_latency_seconds` histogram (from
//!   `created_at`, the transaction start, which precedes commit by the `txn_ms` shown);
//!   bucket-interpolated;
//! - commit → seen by a consumer: exact per event, an upper bound of commit → ack (adds the
//!   consumer's fetch round trip, `fetch.wait.max.ms=10`).
//!
//! The writer and the consumer that stamp each event are `ends`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_relay::metrics::BatchStage;
use serde::Serialize;
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use crate::infra::Infra;
use crate::relay_proc::{RelayProc, RelaySpec};
use crate::stats::{self, Percentiles};
use crate::workload::{Workload, AGGREGATE_TYPE};

pub(crate) mod ends;

use ends::{spawn_consumer, wait_seen, write_one, Committed, Seen};

/// What the latency phase needs to know.
#[derive(Debug, Clone)]
pub struct LoadSpec<'a> {
    /// Offered events per second, all writers together.
    pub rate: u64,
    /// Seconds of load.
    pub seconds: u64,
    /// Writer tasks.
    pub writers: u64,
    /// Relay binary.
    pub binary: &'a std::path::Path,
    /// `--batch-size`.
    pub batch_size: i64,
    /// Extra relay arguments.
    pub extra: &'a [String],
    /// Directory for the relay's log.
    pub log_dir: &'a std::path::Path,
    /// Seconds of the idle measurement after the load (0: none).
    pub idle_seconds: u64,
    /// Names the log (`relay-<label>.log`), the database and the topic prefix.
    pub label: &'a str,
    /// Events committed at once and drained by the relay before the load (0: the load starts
    /// on a fresh table): the table then holds as many dead rows as a relay leaves behind
    /// after a backlog, until autovacuum clears them.
    pub drained_first: u64,
}

/// Commits `events` at once and waits (at most 10 minutes) until the relay has published them
/// all.
async fn drain_first(pool: &sqlx::PgPool, w: &Workload, events: u64) -> anyhow::Result<()> {
    w.insert_backlog(pool, events).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM outbox)")
        .fetch_one(pool)
        .await?
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the relay did not drain the {events} events committed before the load"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Seconds the relay is left alone after its last event before the idle measurement starts
/// (it polls every `--min-poll-interval-ms` for 2 s after a non-empty batch, then backs off).
pub const IDLE_SETTLE_S: f64 = 3.0;

/// What the relay costs with nothing to send.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IdleFigures {
    /// Seconds measured (after [`IDLE_SETTLE_S`] s of quiet).
    pub seconds: f64,
    /// Relay process CPU per second of wall time, ms/s.
    pub relay_cpu_ms_per_s: Option<f64>,
    /// PostgreSQL CPU per second (the relay's polls, and whatever else the server does), ms/s.
    pub postgres_cpu_ms_per_s: Option<f64>,
    /// Broker CPU per second, ms/s.
    pub broker_cpu_ms_per_s: Option<f64>,
}

impl IdleFigures {
    /// From the CPU seconds over `seconds` of wall time.
    pub fn from_cpu(seconds: f64, relay_s: Option<f64>, cpu: &crate::cpu::CpuFigures) -> Self {
        let per_s = |v: Option<f64>| v.map(|v| v * 1e3 / seconds.max(1e-9));
        Self {
            seconds,
            relay_cpu_ms_per_s: per_s(relay_s),
            postgres_cpu_ms_per_s: per_s(cpu.postgres_s),
            broker_cpu_ms_per_s: per_s(cpu.broker_s),
        }
    }
}

/// Quantiles read from the relay's latency histogram, ms.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct HistogramQuantiles {
    /// Observations.
    pub count: f64,
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Share of events acknowledged within 50 ms (exact: 0.05 s is a bucket bound).
    pub within_50ms: Option<f64>,
}

/// Each step of the relay's batches, from its `outbox_batch_stage_seconds`, ms (`count` is
/// batches).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BatchStages {
    /// Each claim of rows (the head, the claim ahead of a full batch, the rows below it).
    pub claim: HistogramQuantiles,
    /// Topics checked, every event sent and acknowledged.
    pub publish: HistogramQuantiles,
    /// Rows deleted, failures recorded.
    pub mark: HistogramQuantiles,
}

/// Figures of phase 5.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyFigures {
    /// Offered events per second.
    pub offered_per_s: u64,
    /// Seconds of load.
    pub seconds: u64,
    /// Writer tasks.
    pub writers: u64,
    /// Events committed.
    pub committed: u64,
    /// Committed events per second actually achieved.
    pub achieved_per_s: f64,
    /// Committed events the consumer did not see within the deadline.
    pub not_seen: u64,
    /// Commit → seen by the consumer, ms.
    pub commit_to_seen_ms: Option<Percentiles>,
    /// Commit → handed to the producer (message `CreateTime`), ms.
    pub commit_to_produce_ms: Option<Percentiles>,
    /// Commit → broker acknowledgement, from the relay's histogram, ms.
    pub commit_to_ack_ms: HistogramQuantiles,
    /// The relay's batches with rows during the load, each step's time
    /// (`outbox_batch_stage_seconds`): where the relay's part of the latency goes.
    pub stages: BatchStages,
    /// Transaction start → commit returned, ms (how much earlier `created_at` is than commit).
    pub txn_ms: Option<Percentiles>,
    /// CPU from the start of the load until the consumer had seen every event, per event
    /// committed: the relay process, PostgreSQL (writers included), the broker, relay-bench
    /// (writers and consumer).
    pub cpu: crate::cpu::CpuFigures,
    /// The relay with nothing to send, after the load.
    pub idle: Option<IdleFigures>,
    /// The relay's log.
    pub relay_log: String,
}

/// Runs phase 5.
///
/// # Errors
/// Database or broker errors, or the relay exiting.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    spec: &LoadSpec<'_>,
) -> anyhow::Result<LatencyFigures> {
    let db = infra.fresh_database(spec.label).await?;
    let prefix = infra.topic_prefix(spec.label);
    let topic = format!("{prefix}{AGGREGATE_TYPE}");
    infra.create_topic(&topic).await?;

    let log = spec.log_dir.join(format!("relay-{}.log", spec.label));
    let mut relay = RelayProc::spawn(&RelaySpec {
        binary: spec.binary,
        database_url: &db.url,
        brokers: infra.brokers(),
        topic_prefix: &prefix,
        batch_size: spec.batch_size,
        extra: spec.extra,
        log: log.clone(),
    })?;
    relay.wait_until_leading(Duration::from_secs(30)).await?;
    if spec.drained_first > 0 {
        drain_first(&db.pool, w, spec.drained_first).await?;
    }

    let seen: Arc<Mutex<HashMap<Uuid, Seen>>> = Arc::default();
    let (count_tx, mut count_rx) = watch::channel(0usize);
    let (stop_tx, stop_rx) = oneshot::channel();
    let consumer = spawn_consumer(infra, &topic, "event_id", seen.clone(), count_tx, stop_rx)?;

    // Warm-up: one event all the way through, so connections are up before the clock runs.
    let warm = write_one(&db.pool, w, 0).await?;
    wait_seen(
        &seen,
        &[warm],
        &mut count_rx,
        &mut relay,
        Duration::from_secs(60),
    )
    .await?;
    let before = metrics_counting(&relay, 1.0).await;

    let per_writer = spec.rate * spec.seconds / spec.writers;
    let cpu0 = infra.cpu.snapshot();
    let relay_cpu0 = infra.cpu.process_seconds(relay.pid(), false);
    let period = Duration::from_secs_f64(spec.writers as f64 / spec.rate as f64);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for wr in 0..spec.writers {
        let pool = db.pool.clone();
        let w = *w;
        let writers = spec.writers;
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut out = Vec::with_capacity(per_writer as usize);
            for k in 0..per_writer {
                tick.tick().await;
                out.push(write_one(&pool, &w, wr + writers * k).await?);
            }
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut committed = Vec::new();
    for t in tasks {
        committed.extend(t.await??);
    }
    let load_secs = started.elapsed().as_secs_f64();
    let ids: Vec<Committed> = committed;
    let not_seen = match wait_seen(
        &seen,
        &ids,
        &mut count_rx,
        &mut relay,
        Duration::from_secs(60),
    )
    .await
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("latency: {e}");
            let seen = seen.lock().unwrap();
            ids.iter().filter(|c| !seen.contains_key(&c.id)).count() as u64
        }
    };
    let after = metrics_counting(&relay, (1 + ids.len()) as f64).await;
    let relay_cpu = |infra: &Infra, relay: &RelayProc, from: Option<f64>| {
        infra
            .cpu
            .process_seconds(relay.pid(), false)
            .zip(from)
            .map(|(b, a)| (b - a).max(0.0))
    };
    let cpu = crate::cpu::CpuFigures::between(
        &cpu0,
        &infra.cpu.snapshot(),
        ids.len() as u64,
        relay_cpu(infra, &relay, relay_cpu0),
    );
    // The consumer's fetches would count as broker CPU in the idle figures.
    let _ = stop_tx.send(());
    let _ = consumer.await;
    let idle = if spec.idle_seconds > 0 {
        // Nothing left to send (the last acknowledged rows deleted), then quiet.
        let deadline = Instant::now() + Duration::from_secs(30);
        while sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM outbox)")
            .fetch_one(&db.pool)
            .await?
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs_f64(IDLE_SETTLE_S)).await;
        relay.check_running()?;
        let (c0, r0) = (
            infra.cpu.snapshot(),
            infra.cpu.process_seconds(relay.pid(), false),
        );
        tokio::time::sleep(Duration::from_secs(spec.idle_seconds)).await;
        let c = crate::cpu::CpuFigures::between(
            &c0,
            &infra.cpu.snapshot(),
            1,
            relay_cpu(infra, &relay, r0),
        );
        Some(IdleFigures::from_cpu(c.wall_s, c.relay_s, &c))
    } else {
        None
    };
    relay.stop().await?;
    infra.drop_database(db).await?;

    let quantiles = |name: &str| {
        let hist = stats::histogram_delta(
            &stats::histogram(&after, name),
            &stats::histogram(&before, name),
        );
        let ms = |q| stats::histogram_quantile(&hist, q).map(|s| s * 1000.0);
        HistogramQuantiles {
            count: hist.last().map_or(0.0, |b| b.1),
            p50: ms(0.50),
            p95: ms(0.95),
            p99: ms(0.99),
            within_50ms: stats::fraction_at_most(&hist, 0.05),
        }
    };
    let stage = |s: BatchStage| {
        quantiles(&format!(
            "outbox_batch_stage_seconds{{stage=\"{}\"}}",
            s.as_str()
        ))
    };
    let seen = seen.lock().unwrap();
    let (mut to_seen, mut to_produce, mut txn) = (Vec::new(), Vec::new(), Vec::new());
    for c in &ids {
        txn.push(c.commit_ms - c.begin_ms);
        if let Some(s) = seen.get(&c.id) {
            to_seen.push(s.at_ms - c.commit_ms);
            if let Some(t) = s.create_ms {
                to_produce.push(t as f64 - c.commit_ms);
            }
        }
    }
    Ok(LatencyFigures {
        offered_per_s: spec.rate,
        seconds: spec.seconds,
        writers: spec.writers,
        committed: ids.len() as u64,
        achieved_per_s: ids.len() as f64 / load_secs,
        not_seen,
        commit_to_seen_ms: stats::percentiles(&to_seen),
        commit_to_produce_ms: stats::percentiles(&to_produce),
        commit_to_ack_ms: quantiles("outbox_publish_latency_seconds"),
        stages: BatchStages {
            claim: stage(BatchStage::Claim),
            publish: stage(BatchStage::Publish),
            mark: stage(BatchStage::Mark),
        },
        txn_ms: stats::percentiles(&txn),
        cpu,
        idle,
        relay_log: log.display().to_string(),
    })
}

/// The relay's metrics once its latency histogram counts at least `n` events, or after 30 s
/// whatever they say. An event is counted after its batch is marked, which can come after the
/// consumer saw it: read at once, the warm-up event could fall inside the measured window and
/// the last batch outside it.
async fn metrics_counting(relay: &RelayProc, n: f64) -> String {
    let counted = outbox_process::poll::poll_every(
        Duration::from_millis(20),
        Duration::from_secs(30),
        || async {
            let m = relay.metrics().await?;
            let count = stats::metric_value(&m, "outbox_publish_latency_seconds_count")?;
            (count >= n).then_some(m)
        },
    )
    .await;
    match counted {
        Some(m) => m,
        None => relay.metrics().await.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::IdleFigures;

    #[test]
    fn idle_cost_is_cpu_ms_per_second() {
        let cpu = crate::cpu::CpuFigures {
            postgres_s: Some(0.05),
            ..Default::default()
        };
        let f = IdleFigures::from_cpu(10.0, Some(0.02), &cpu);
        assert_eq!(f.relay_cpu_ms_per_s, Some(2.0));
        assert!((f.postgres_cpu_ms_per_s.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(f.broker_cpu_ms_per_s, None);
    }
}
