//! The latency runs of the `debezium` phase (writers on a fixed schedule, a consumer noting
//! each event's arrival) and the CPU of a publisher's own PostgreSQL backends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use super::figures::{DebeziumSpec, Side};
use crate::cpu::CpuFigures;
use crate::infra::{BenchDb, Infra};
use crate::latency::ends::{spawn_consumer, wall_ms, Committed, Seen};
use crate::stats::{self, Percentiles};

/// What one latency run measured.
pub(super) struct Load {
    pub(super) committed: u64,
    seen: Option<Percentiles>,
    cpu: CpuFigures,
    backends_s: f64,
    not_seen: u64,
}

impl Load {
    pub(super) fn fill(&self, side: &mut Side) {
        side.commit_to_seen_ms = self.seen;
        side.load_cpu = Some(self.cpu);
        side.load_backends_us_per_event =
            Some(self.backends_s * 1e6 / self.committed.max(1) as f64);
        side.not_seen = self.not_seen;
    }
}

/// `application_name` of the relay's connections in this phase.
pub(super) const RELAY_APPLICATION: &str = "relay-bench-relay";

/// A publisher's own PostgreSQL backends.
pub(super) enum Backends {
    /// The WAL sender of a replication slot (Debezium).
    Slot(String),
    /// The connections with this `application_name` (the relay).
    Application(&'static str),
}

impl Backends {
    /// CPU seconds of each of these backends now, by pid.
    pub(super) async fn seconds(
        &self,
        infra: &Infra,
        pool: &sqlx::PgPool,
    ) -> anyhow::Result<HashMap<u32, f64>> {
        let pids: Vec<i32> = match self {
            Self::Slot(slot) => {
                sqlx::query_scalar(
                    "SELECT active_pid FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                )
                .bind(slot)
                .fetch_all(pool)
                .await?
            }
            Self::Application(name) => {
                sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                    .bind(name)
                    .fetch_all(pool)
                    .await?
            }
        };
        Ok(pids
            .into_iter()
            .filter_map(|p| Some((p as u32, infra.cpu.process_seconds(p as u32, false)?)))
            .collect())
    }

    /// CPU seconds spent between two readings (a backend new since `start` from its start; one
    /// gone by `end` is not counted).
    pub(super) fn delta(start: &HashMap<u32, f64>, end: &HashMap<u32, f64>) -> f64 {
        end.iter()
            .map(|(pid, s)| s - start.get(pid).copied().unwrap_or(0.0))
            .sum()
    }
}

/// Commits `spec.rate` events per second for `spec.seconds` into the Debezium table (four
/// writers on a fixed schedule, one row per transaction), while a consumer of `topic`, which
/// holds `already` messages, notes each event's arrival; then waits for the last ones.
pub(super) async fn under_load(
    infra: &Infra,
    db: &BenchDb,
    spec: &DebeziumSpec<'_>,
    topic: &str,
    already: u64,
    publisher: impl Fn() -> u32,
    backends: &Backends,
) -> anyhow::Result<Load> {
    let seen: Arc<Mutex<HashMap<Uuid, Seen>>> = Arc::default();
    let (count_tx, mut count_rx) = watch::channel(0usize);
    let (stop_tx, stop_rx) = oneshot::channel();
    let consumer = spawn_consumer(infra, topic, "id", seen.clone(), count_tx, stop_rx)?;
    // The consumer reads from the beginning: let it pass what the topic already holds.
    let deadline = Instant::now() + spec.timeout;
    while (*count_rx.borrow() as u64) < already {
        if Instant::now() > deadline {
            bail!("the consumer did not read {already} messages of {topic} in time");
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), count_rx.changed()).await;
    }
    let cpu = &infra.cpu;
    let b0 = backends.seconds(infra, &db.pool).await?;
    let (start, p0) = (cpu.snapshot(), cpu.process_seconds(publisher(), false));
    let writers = 4u64;
    let total = spec.rate * spec.seconds;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for wr in 0..writers {
        let pool = db.pool.clone();
        let (rate, aggregates, pad) = (
            spec.rate,
            spec.aggregates.max(1),
            spec.payload_bytes.saturating_sub(60) as i32,
        );
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut i = wr;
            while i < total {
                let due = t0 + Duration::from_secs_f64(i as f64 / rate as f64);
                tokio::time::sleep_until(due.into()).await;
                let id = Uuid::new_v4();
                let begin_ms = wall_ms();
                sqlx::query(
                    "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
                     VALUES ($1, 'order', $2, 'BenchEvent', \
                             jsonb_build_object('i', $3::bigint, 'status', 'CREATED', 'pad', repeat('x', $4)))",
                )
                .bind(id)
                .bind(format!("agg-{}", i % aggregates))
                .bind(i as i64)
                .bind(pad)
                .execute(&pool)
                .await?;
                out.push(Committed {
                    id,
                    begin_ms,
                    commit_ms: wall_ms(),
                });
                i += writers;
            }
            anyhow::Ok(out)
        }));
    }
    let mut committed = Vec::new();
    for t in tasks {
        committed.extend(t.await??);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let missing = {
            let seen = seen.lock().unwrap();
            committed
                .iter()
                .filter(|c| !seen.contains_key(&c.id))
                .count()
        };
        if missing == 0 || Instant::now() > deadline {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), count_rx.changed()).await;
    }
    let (end, p1) = (cpu.snapshot(), cpu.process_seconds(publisher(), false));
    let b1 = backends.seconds(infra, &db.pool).await?;
    let _ = stop_tx.send(());
    let _ = consumer.await;
    let seen = seen.lock().unwrap();
    let latencies: Vec<f64> = committed
        .iter()
        .filter_map(|c| Some(seen.get(&c.id)?.at_ms - c.commit_ms))
        .collect();
    Ok(Load {
        committed: committed.len() as u64,
        seen: stats::percentiles(&latencies),
        cpu: CpuFigures::between(
            &start,
            &end,
            committed.len() as u64,
            p0.zip(p1).map(|(a, b)| b - a),
        ),
        backends_s: Backends::delta(&b0, &b1),
        not_seen: (committed.len() - latencies.len()) as u64,
    })
}
