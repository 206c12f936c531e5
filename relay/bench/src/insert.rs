//! Phase `insert`: what the per-aggregate lock trigger (`20260101000003_aggregate_order.sql`)
//! costs a writer. `W` connections each commit single-row `INSERT` transactions (plain SQL, as
//! a producer in any language would) for `T` seconds, the trigger's lock on (A, the default) or
//! off (B, each statement's transaction calls `outbox_aggregate_lock_off()` in the same
//! statement: only a transaction-local opt-out counts), interleaved A B B A (a linear drift of
//! the machine's load then costs both alike; A B A B would favour B) on an emptied outbox,
//! after an untimed one-second warm-up; with a third variant (C: lock on, the trigger as
//! migration `20260101000003` created it, swapped in for its runs), what the trigger's later
//! checks cost (explicit ids refused, a transaction-local opt-out, the transaction id taken
//! before the outbox id). Then one bulk `INSERT ... SELECT generate_series` with and without
//! the lock.

use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::Connection;

use crate::cpu::CpuFigures;
use crate::infra::{BenchDb, Infra};
use crate::schedule::interleaved;
use crate::workload::{aggregate_lock_off, Workload, AGGREGATE_TYPE, EVENT_TYPE};

/// The insert trigger as migration `20260101000003` created it (the lock, nothing else): the
/// `C` variant, the baseline of what the later checks cost (migrations `…06`, `…07`).
const FIRST_TRIGGER: &str =
    include_str!("../../../migrations/outbox/20260101000003_aggregate_order.sql");

/// The insert trigger as it is now (the last migration that replaced it), to restore it.
const CURRENT_TRIGGER: &str =
    include_str!("../../../migrations/outbox/20260101000007_claim_floor.sql");

/// How migration `20260101000008` enables the insert trigger (for every writer).
const ENABLE_ALWAYS: &str = "ALTER TABLE outbox ENABLE ALWAYS TRIGGER outbox_order_by_aggregate";

/// One timed run of the writers.
#[derive(Debug, Clone, Serialize)]
pub struct InsertRun {
    /// `A` (lock on, the trigger as it is), `B` (lock off) or `C` (lock on, the first
    /// release's trigger).
    pub variant: &'static str,
    /// The trigger's lock on.
    pub locked: bool,
    /// Rows committed.
    pub inserts: u64,
    /// Seconds, first insert to the last commit.
    pub seconds: f64,
    /// Committed inserts per second, all writers.
    pub inserts_per_s: f64,
    /// Mean time of one insert (statement and commit) as a writer sees it, µs.
    pub latency_us: f64,
    /// CPU: PostgreSQL and relay-bench (the writers) per insert.
    pub cpu: CpuFigures,
}

/// One side (lock on or off) over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct InsertSide {
    /// Inserts per second over its runs (inserts / seconds, summed).
    pub inserts_per_s: f64,
    /// Wall-clock µs per insert, all writers together (1e6 / inserts_per_s).
    pub us_per_insert: f64,
    /// Mean latency of one insert as a writer sees it, µs.
    pub latency_us: f64,
    /// PostgreSQL CPU per insert, µs (all server processes).
    pub postgres_us_per_insert: Option<f64>,
}

/// The bulk insert with and without the lock.
#[derive(Debug, Clone, Serialize)]
pub struct BulkFigures {
    /// Rows of the one statement.
    pub rows: u64,
    /// Distinct aggregates in it.
    pub aggregates: u64,
    /// Seconds with the lock (statement and commit).
    pub locked_seconds: Option<f64>,
    /// Why the locked insert failed (e.g. PostgreSQL's lock table full).
    pub locked_error: Option<String>,
    /// Seconds with `outbox_aggregate_lock_off()`.
    pub unlocked_seconds: f64,
}

/// Figures of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct InsertFigures {
    /// Writer connections.
    pub writers: u64,
    /// Seconds per run.
    pub seconds_per_run: u64,
    /// Lock on (default).
    pub locked: InsertSide,
    /// Lock off.
    pub unlocked: InsertSide,
    /// Lock on, with the first release's trigger (no id or opt-out checks, no transaction id
    /// taken first).
    pub first_trigger: InsertSide,
    /// Wall-clock µs per insert the trigger's later checks add (A - C).
    pub checks_us_per_insert: f64,
    /// PostgreSQL CPU µs per insert they add (A - C).
    pub checks_postgres_us_per_insert: Option<f64>,
    /// Wall-clock µs per insert the lock adds (locked - unlocked).
    pub lock_us_per_insert: f64,
    /// PostgreSQL CPU µs per insert the lock adds.
    pub lock_postgres_us_per_insert: Option<f64>,
    /// Insert rate with the lock over without.
    pub locked_over_unlocked: f64,
    /// Every run, in order.
    pub runs: Vec<InsertRun>,
    /// The bulk insert.
    pub bulk: BulkFigures,
}

/// Runs the phase: `writers` connections, `seconds` per run, `bulk_rows` for the bulk insert.
///
/// # Errors
/// Database errors (but a locked bulk insert that PostgreSQL refuses is reported).
pub async fn run(
    infra: &Infra,
    w: &Workload,
    writers: u64,
    seconds: u64,
    bulk_rows: u64,
) -> anyhow::Result<InsertFigures> {
    let db = infra.fresh_database("insert").await?;
    // Untimed warm-up: the first run on a fresh database (and server caches) was several
    // times slower than the rest, whichever variant it was.
    writers_run(infra, w, &db, writers, 1, true).await?;
    let mut runs = Vec::new();
    for v in interleaved(3, 2, true) {
        let (variant, locked) = [("A", true), ("B", false), ("C", true)][v];
        empty_outbox(infra, &db).await?;
        eprintln!("[relay-bench]   insert run: {variant}");
        if variant == "C" {
            replace_trigger(&db, FIRST_TRIGGER).await?;
        }
        let run = writers_run(infra, w, &db, writers, seconds, locked).await;
        if variant == "C" {
            replace_trigger(&db, CURRENT_TRIGGER).await?;
            // The first trigger's CREATE OR REPLACE TRIGGER enabled it the default way; it
            // fires for every writer since migration `…08`.
            replace_trigger(&db, ENABLE_ALWAYS).await?;
        }
        runs.push(InsertRun { variant, ..run? });
    }
    let side = |variant: &str| {
        let mine: Vec<&InsertRun> = runs.iter().filter(|r| r.variant == variant).collect();
        let inserts: u64 = mine.iter().map(|r| r.inserts).sum();
        let secs: f64 = mine.iter().map(|r| r.seconds).sum();
        let pg: Option<f64> = mine.iter().map(|r| r.cpu.postgres_s).sum::<Option<f64>>();
        let rate = inserts as f64 / secs.max(1e-9);
        InsertSide {
            inserts_per_s: rate,
            us_per_insert: 1e6 / rate.max(1e-9),
            latency_us: mine
                .iter()
                .map(|r| r.latency_us * r.inserts as f64)
                .sum::<f64>()
                / inserts.max(1) as f64,
            postgres_us_per_insert: pg.map(|s| s * 1e6 / inserts.max(1) as f64),
        }
    };
    let (locked, unlocked, first_trigger) = (side("A"), side("B"), side("C"));

    empty_outbox(infra, &db).await?;
    let (locked_seconds, locked_error) = match bulk(&db, w, bulk_rows, true).await {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e.to_string())),
    };
    empty_outbox(infra, &db).await?;
    let unlocked_seconds = bulk(&db, w, bulk_rows, false).await?;
    infra.drop_database(db).await?;
    Ok(InsertFigures {
        writers,
        seconds_per_run: seconds,
        lock_us_per_insert: locked.us_per_insert - unlocked.us_per_insert,
        lock_postgres_us_per_insert: locked
            .postgres_us_per_insert
            .zip(unlocked.postgres_us_per_insert)
            .map(|(a, b)| a - b),
        locked_over_unlocked: locked.inserts_per_s / unlocked.inserts_per_s.max(1e-9),
        checks_us_per_insert: locked.us_per_insert - first_trigger.us_per_insert,
        checks_postgres_us_per_insert: locked
            .postgres_us_per_insert
            .zip(first_trigger.postgres_us_per_insert)
            .map(|(a, b)| a - b),
        locked,
        unlocked,
        first_trigger,
        runs,
        bulk: BulkFigures {
            rows: bulk_rows,
            aggregates: w.aggregates.min(bulk_rows),
            locked_seconds,
            locked_error,
            unlocked_seconds,
        },
    })
}

/// Runs a migration's SQL that replaces the insert trigger, in one transaction (as the
/// migrator does).
async fn replace_trigger(db: &BenchDb, sql: &str) -> Result<(), sqlx::Error> {
    let mut tx = db.pool.begin().await?;
    sqlx::raw_sql(sql).execute(&mut *tx).await?;
    tx.commit().await
}

/// Every run starts from an empty table with its dirty buffers flushed.
async fn empty_outbox(infra: &Infra, db: &BenchDb) -> Result<(), sqlx::Error> {
    sqlx::query("TRUNCATE outbox").execute(&db.pool).await?;
    infra.checkpoint().await;
    Ok(())
}

/// `writers` connections inserting one row per transaction for `seconds`.
async fn writers_run(
    infra: &Infra,
    w: &Workload,
    db: &BenchDb,
    writers: u64,
    seconds: u64,
    locked: bool,
) -> anyhow::Result<InsertRun> {
    let mut conns = Vec::new();
    for _ in 0..writers {
        conns.push(crate::infra::connect(&db.url).await?);
    }
    let payload = w.payload(1);
    let cpu0 = infra.cpu.snapshot();
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(k, mut c)| {
            let payload = payload.clone();
            let (writers, aggregates) = (writers, w.aggregates);
            tokio::spawn(async move {
                let (mut n, mut busy) = (0u64, Duration::ZERO);
                while Instant::now() < until {
                    // Writers take turns over the aggregates: rarely the same one at once.
                    let aggregate = ((n * writers + k as u64) % aggregates).to_string();
                    let t0 = Instant::now();
                    // Unlocked: the statement's own transaction opts out (only a
                    // transaction-local opt-out counts), in the same round trip.
                    sqlx::query(if locked {
                        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                         VALUES ($1, $2, $3, $4::jsonb)"
                    } else {
                        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                         SELECT $1, $2, $3, $4::jsonb FROM (SELECT outbox_aggregate_lock_off()) off"
                    })
                    .bind(AGGREGATE_TYPE)
                    .bind(&aggregate)
                    .bind(EVENT_TYPE)
                    .bind(&payload)
                    .execute(&mut c)
                    .await?;
                    busy += t0.elapsed();
                    n += 1;
                }
                c.close().await?;
                Ok::<_, sqlx::Error>((n, busy))
            })
        })
        .collect();
    let (mut inserts, mut busy) = (0u64, Duration::ZERO);
    for t in tasks {
        let (n, b) = t.await??;
        inserts += n;
        busy += b;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = CpuFigures::between(&cpu0, &infra.cpu.snapshot(), inserts, None);
    Ok(InsertRun {
        variant: if locked { "A" } else { "B" },
        locked,
        inserts,
        seconds,
        inserts_per_s: inserts as f64 / seconds,
        latency_us: busy.as_secs_f64() * 1e6 / inserts.max(1) as f64,
        cpu,
    })
}

/// One `INSERT ... SELECT generate_series` of `rows` rows in its own transaction; seconds
/// including the commit.
async fn bulk(db: &BenchDb, w: &Workload, rows: u64, locked: bool) -> Result<f64, sqlx::Error> {
    let start = Instant::now();
    let mut tx = db.pool.begin().await?;
    if !locked {
        aggregate_lock_off(&mut tx).await?;
    }
    w.insert_range(&mut tx, 1, rows).await?;
    tx.commit().await?;
    Ok(start.elapsed().as_secs_f64())
}
