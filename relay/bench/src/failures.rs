//! Phase `failures`: what a large failure table costs the claim. The outbox
//! holds a healthy backlog (inserted with the aggregate lock off) and, after it, one failed
//! event on each of `F` other aggregates (UUID ids) with its `outbox_failure` row (half
//! parked, half retrying an hour from now), `ANALYZE`d. For each size `F` (growing), one claim of a batch
//! (`Store::claim` under a lease) is timed with each filter, interleaved, median of the
//! repeats: `Off` (no filter: the baseline), `Hashed` (hashed subplans, what main did before:
//! once the failure table no longer fits `work_mem` PostgreSQL scans it per outbox row) and
//! `Probed` (an index probe per row, what the relay uses past
//! `outbox_relay::store::SMALL_FAILURE_TABLE` rows). Also the relay's read of the failure
//! table before every batch: `Store::failure_view` against the query main ran.
//!
//! Every claim runs under `statement_timeout`: a filter that hits it is reported as over the
//! timeout and not run again (at that size or larger ones, where it can only be slower).

use std::time::{Duration, Instant};

use anyhow::bail;
use outbox_relay::store::{ClaimLimits, ClaimedBatch, FailureFilter, IdRange};
use outbox_relay::Store;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::infra::Infra;
use crate::schedule::{interleaved, median};
use crate::workload::{aggregate_lock_off, Workload, AGGREGATE_TYPE, EVENT_TYPE};

/// main's read of the failure table before every batch (`retrying_failures`, before
/// `Store::failure_view`).
const MAIN_FAILURE_READ: &str =
    "SELECT outbox_id, attempts FROM outbox_failure WHERE parked_at IS NULL \
     UNION ALL \
     SELECT -1, 1 WHERE EXISTS (SELECT 1 FROM outbox_failure WHERE parked_at IS NOT NULL)";

/// The claims of one filter at one size.
#[derive(Debug, Clone, Serialize)]
pub struct ClaimTiming {
    /// `off`, `hashed` or `probed`.
    pub filter: &'static str,
    /// Each timed claim, ms.
    pub ms: Vec<f64>,
    /// Their median, ms.
    pub median_ms: Option<f64>,
    /// Median over the `Off` claim's median at this size.
    pub over_off: Option<f64>,
    /// Rows the claims returned.
    pub rows: u64,
    /// A claim hit the statement timeout.
    pub timed_out: bool,
    /// Not run: it hit the timeout at a smaller size.
    pub skipped: bool,
}

/// One failure-table size.
#[derive(Debug, Clone, Serialize)]
pub struct FailureSize {
    /// Rows in `outbox_failure` (half parked).
    pub failure_rows: u64,
    /// `Off`, `Hashed`, `Probed`.
    pub claims: Vec<ClaimTiming>,
    /// `Store::failure_view`, median ms.
    pub view_ms: Option<f64>,
    /// main's read of the failure table, median ms.
    pub main_read_ms: Option<f64>,
    /// Rows main's read returned.
    pub main_read_rows: usize,
}

/// Figures of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct FailuresFigures {
    /// Healthy outbox rows (the failed events come after them).
    pub outbox_rows: u64,
    /// Rows per claim.
    pub batch_size: i64,
    /// Timed repeats of each claim and read.
    pub repeats: u32,
    /// `statement_timeout` of every claim, s.
    pub timeout_s: u64,
    /// `SHOW work_mem`.
    pub work_mem: String,
    /// One entry per failure-table size.
    pub sizes: Vec<FailureSize>,
}

const FILTERS: [(FailureFilter, &str); 3] = [
    (FailureFilter::Off, "off"),
    (FailureFilter::Hashed, "hashed"),
    (FailureFilter::Probed, "probed"),
];

/// Runs the phase.
///
/// # Errors
/// Database errors other than a claim's timeout.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    outbox_rows: u64,
    failure_sizes: &[u64],
    batch_size: i64,
    repeats: u32,
    timeout: Duration,
) -> anyhow::Result<FailuresFigures> {
    let db = infra.fresh_database("failures").await?;
    w.insert_backlog_unlocked(&db.pool, outbox_rows, 200_000)
        .await?;
    let work_mem: String = sqlx::query_scalar("SHOW work_mem")
        .fetch_one(&db.pool)
        .await?;
    // The claims' own connection, every statement under the timeout.
    let options: PgConnectOptions = db.url.parse()?;
    let options = options.options([("statement_timeout", format!("{}ms", timeout.as_millis()))]);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let store = Store::from_pool(pool.clone());
    let Some(lease) = store
        .try_acquire_lease("bench", "relay-bench", Duration::from_secs(86_400))
        .await?
    else {
        bail!("could not take the lease in a fresh database");
    };
    let limits = |failures| ClaimLimits {
        rows: batch_size,
        bytes: 1 << 30,
        failures,
        ids: IdRange::ALL,
    };

    let mut sizes = Vec::new();
    let mut have = 0u64;
    let mut timed_out = [false; 3];
    let mut sorted = failure_sizes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for &f in &sorted {
        add_failures(&db.pool, have + 1, f).await?;
        have = f;
        sqlx::query("ANALYZE outbox_failure")
            .execute(&db.pool)
            .await?;
        sqlx::query("ANALYZE outbox").execute(&db.pool).await?;
        infra.checkpoint().await;
        eprintln!("[relay-bench]   failures: {f} failure rows");

        let mut claims: Vec<ClaimTiming> = FILTERS
            .iter()
            .enumerate()
            .map(|(i, (_, name))| ClaimTiming {
                filter: name,
                ms: Vec::new(),
                median_ms: None,
                over_off: None,
                rows: 0,
                timed_out: false,
                skipped: timed_out[i],
            })
            .collect();
        for i in interleaved(FILTERS.len(), repeats as usize, true) {
            if timed_out[i] {
                continue;
            }
            let t0 = Instant::now();
            match store.claim(&lease, limits(FILTERS[i].0)).await {
                Ok(ClaimedBatch::Rows(rows, _)) => {
                    claims[i].ms.push(t0.elapsed().as_secs_f64() * 1e3);
                    claims[i].rows = rows.len() as u64;
                }
                Ok(ClaimedBatch::LeaseLost) => bail!("lease lost while claiming"),
                Err(e) if is_timeout(&e) => {
                    timed_out[i] = true;
                    claims[i].timed_out = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let off = median(&claims[0].ms);
        for c in &mut claims {
            c.median_ms = median(&c.ms);
            c.over_off = c.median_ms.zip(off).map(|(m, o)| m / o);
        }

        let (mut view, mut main, mut main_rows) = (Vec::new(), Vec::new(), 0);
        for i in interleaved(2, repeats as usize, true) {
            let t0 = Instant::now();
            if i == 0 {
                store.failure_view().await?;
                view.push(t0.elapsed().as_secs_f64() * 1e3);
            } else {
                let rows: Vec<(i64, i32)> =
                    sqlx::query_as(MAIN_FAILURE_READ).fetch_all(&pool).await?;
                main.push(t0.elapsed().as_secs_f64() * 1e3);
                main_rows = rows.len();
            }
        }
        sizes.push(FailureSize {
            failure_rows: f,
            claims,
            view_ms: median(&view),
            main_read_ms: median(&main),
            main_read_rows: main_rows,
        });
    }
    pool.close().await;
    infra.drop_database(db).await?;
    Ok(FailuresFigures {
        outbox_rows,
        batch_size,
        repeats,
        timeout_s: timeout.as_secs(),
        work_mem,
        sizes,
    })
}

/// Failed events `first..=last`, each on an aggregate of its own after the healthy backlog,
/// with their failure rows: even ids parked, odd ones retrying an hour from now. Their
/// aggregate ids are UUIDs (36 characters, as many applications key aggregates): the width
/// decides how many failure rows a hashed subplan fits in `work_mem`.
async fn add_failures(pool: &PgPool, first: u64, last: u64) -> Result<(), sqlx::Error> {
    if first > last {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    aggregate_lock_off(&mut tx).await?;
    sqlx::query(
        "WITH e AS ( \
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT $1, md5(g::text)::uuid::text, $2, jsonb_build_object('n', g) \
             FROM generate_series($3::bigint, $4::bigint) g \
             RETURNING id, event_id, aggregate_type, aggregate_id) \
         INSERT INTO outbox_failure (outbox_id, event_id, aggregate_type, aggregate_id, \
             error_class, error_message, attempts, retry_at, parked_at) \
         SELECT id, event_id, aggregate_type, aggregate_id, \
                CASE WHEN id % 2 = 0 THEN 'invalid_topic' ELSE 'delivery' END, \
                'relay-bench: a failure', 2, now() + interval '1 hour', \
                CASE WHEN id % 2 = 0 THEN now() END \
         FROM e",
    )
    .bind(AGGREGATE_TYPE)
    .bind(EVENT_TYPE)
    .bind(first as i64)
    .bind(last as i64)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// PostgreSQL cancelled the statement (`statement_timeout`, SQLSTATE 57014).
fn is_timeout(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "57014")
}
