//! Side claims taken while a relay drains (the `backlog` phase): one claim of a batch under a
//! lease of its own every few seconds, timed, deleting nothing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use outbox_relay::store::{ClaimLimits, ClaimedBatch, FailureFilter, IdRange};
use outbox_relay::Store;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;

/// One side claim taken while the relay drains (`backlog` phase).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProbeSample {
    /// Seconds since the relay was started.
    pub t_s: f64,
    /// Milliseconds of one `Store::claim` of a batch (under a lease of its own, nothing
    /// deleted), or `None` when it failed.
    pub claim_ms: Option<f64>,
    /// Rows it read.
    pub rows: u64,
    /// Events published by then (the relay's counter, last poll before the sample).
    pub published: u64,
}

/// Every `every`, one claim of a batch under the lease `bench-probe` (the relay's lease is
/// `default`): it reads the head of the outbox as the relay's next claim would, and deletes
/// nothing. Runs until aborted.
pub(crate) async fn side_claims(
    url: String,
    batch_size: i64,
    every: Duration,
    start: Instant,
    out: Arc<Mutex<Vec<ProbeSample>>>,
) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(outbox_process::pg::connect_options(&url)?)
        .await?;
    let store = Store::from_pool(pool);
    let Some(lease) = store
        .try_acquire_lease("bench-probe", "relay-bench", Duration::from_secs(86_400))
        .await?
    else {
        bail!("the lease bench-probe is taken");
    };
    let limits = ClaimLimits {
        rows: batch_size,
        bytes: 1 << 30,
        failures: FailureFilter::Off,
        ids: IdRange::ALL,
    };
    let mut next = Instant::now() + every;
    loop {
        tokio::time::sleep_until(next.into()).await;
        next += every;
        let t0 = Instant::now();
        let claimed = store.claim(&lease, limits).await;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let (claim_ms, rows) = match claimed {
            Ok(ClaimedBatch::Rows(r, _)) => (Some(ms), r.len() as u64),
            Ok(ClaimedBatch::LeaseLost) | Err(_) => (None, 0),
        };
        if let Ok(mut v) = out.lock() {
            v.push(ProbeSample {
                t_s: t0.duration_since(start).as_secs_f64(),
                claim_ms,
                rows,
                published: 0,
            });
        }
    }
}
