//! Phase 2, the database's ceiling: the relay's own SQL (`Store::claim_batch` and the
//! lease-fenced `Store::mark_published`) over a backlog, batch after batch, without Kafka.
//! Claim and mark are timed separately: together with phase 1 they show where a relay batch
//! spends its time.

use std::time::Instant;

use anyhow::bail;
use outbox_relay::store::{ClaimedBatch, Marked};
use outbox_relay::Store;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;

use crate::infra::Infra;
use crate::workload::Workload;

/// Figures of phase 2.
#[derive(Debug, Clone, Serialize)]
pub struct DbFigures {
    /// Rows inserted and then claimed and deleted.
    pub rows: u64,
    /// Seconds of the one `INSERT ... SELECT generate_series`.
    pub insert_seconds: f64,
    /// Rows per second of that insert.
    pub insert_rows_per_s: f64,
    /// Average payload of the stored rows, bytes of JSON text.
    pub payload_bytes: f64,
    /// Seconds of claim + mark over the whole backlog.
    pub seconds: f64,
    /// Rows per second, claim + mark: the database's ceiling for this relay.
    pub rows_per_s: f64,
    /// Batches.
    pub batches: u64,
    /// Seconds spent in `claim_batch`.
    pub claim_seconds: f64,
    /// Seconds spent in `mark_published`.
    pub mark_seconds: f64,
    /// Average `claim_batch` time per batch, ms.
    pub claim_ms_per_batch: f64,
    /// Average `mark_published` time per batch, ms.
    pub mark_ms_per_batch: f64,
    /// Rows per second of claiming alone.
    pub claim_rows_per_s: f64,
    /// Rows per second of marking alone.
    pub mark_rows_per_s: f64,
    /// CPU of claim + mark (PostgreSQL; relay-bench is the client).
    pub cpu: crate::cpu::CpuFigures,
}

/// Runs phase 2.
///
/// # Errors
/// Database errors, or a lease that was lost.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    n: u64,
    batch_size: i64,
) -> anyhow::Result<DbFigures> {
    let db = infra.fresh_database("db").await?;
    let insert_seconds = w.insert_backlog(&db.pool, n).await?;
    let payload_bytes = Workload::stored_payload_bytes(&db.pool).await?;
    infra.checkpoint().await;

    // Like the relay: its own small pool, the lease taken first.
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(outbox_process::pg::connect_options(&db.url)?)
        .await?;
    let store = Store::from_pool(pool.clone());
    let Some(lease) = store
        .try_acquire_lease("bench", "relay-bench", std::time::Duration::from_secs(600))
        .await?
    else {
        bail!("could not take the lease in a fresh database");
    };
    let (mut claim_s, mut mark_s, mut batches, mut rows) = (0.0, 0.0, 0u64, 0u64);
    let cpu0 = infra.cpu.snapshot();
    let start = Instant::now();
    loop {
        let t0 = Instant::now();
        let claimed = match store.claim_batch(&lease, batch_size).await? {
            ClaimedBatch::Rows(r, _) => r,
            ClaimedBatch::LeaseLost => bail!("lease lost while claiming"),
        };
        claim_s += t0.elapsed().as_secs_f64();
        if claimed.is_empty() {
            break;
        }
        let ids: Vec<i64> = claimed.iter().map(|r| r.id()).collect();
        let t1 = Instant::now();
        match store.mark_published(&lease, &ids).await? {
            Marked::Deleted(d) => rows += d,
            Marked::LeaseLost => bail!("lease lost while marking"),
        }
        mark_s += t1.elapsed().as_secs_f64();
        batches += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = crate::cpu::CpuFigures::between(&cpu0, &infra.cpu.snapshot(), n, None);
    pool.close().await;
    infra.drop_database(db).await?;
    if rows != n {
        bail!("deleted {rows} rows, expected {n}");
    }
    Ok(DbFigures {
        rows: n,
        insert_seconds,
        insert_rows_per_s: n as f64 / insert_seconds,
        payload_bytes,
        seconds,
        rows_per_s: n as f64 / seconds,
        batches,
        claim_seconds: claim_s,
        mark_seconds: mark_s,
        claim_ms_per_batch: claim_s * 1000.0 / batches.max(1) as f64,
        mark_ms_per_batch: mark_s * 1000.0 / batches.max(1) as f64,
        claim_rows_per_s: n as f64 / claim_s,
        mark_rows_per_s: n as f64 / mark_s,
        cpu,
    })
}
