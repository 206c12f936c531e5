//! Active query compensation: pushes get lost, so a poller asks the platform's query API for
//! every change since a durable watermark (`channel_watermarks`) and applies each through the
//! same idempotent path as a push ([`super::apply`], source `query`). A change pushed already
//! is absorbed by layer 2; one that was lost applies now and counts as recovered.
//!
//! Runs every `--marketplace-compensation-interval-ms` (default 5 minutes) and once on
//! `POST /channels/marketplace/compensate`.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::client::{ClientError, PlatformClient};
use super::message::{ChannelMessage, PushBody};
use super::{apply, Outcome, Source, MARKETPLACE};
use crate::metrics::Metrics;

/// What one pass did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Pass {
    /// Changes the platform reported since the watermark.
    pub fetched: u64,
    /// Applied now: changes whose push never arrived.
    pub recovered: u64,
    /// Already known (absorbed by layer 1 or 2, or stale).
    pub known: u64,
    /// Refused (left for the next pass; the watermark stays below them).
    pub failed: u64,
    /// The watermark after the pass.
    pub watermark_ms: i64,
}

/// Why a pass failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum CompensationError {
    /// The query API failed.
    #[error("querying the platform failed")]
    Platform(#[from] ClientError),
    /// The database failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

async fn watermark(pool: &PgPool) -> Result<i64, sqlx::Error> {
    let wm: Option<i64> =
        sqlx::query_scalar("SELECT modified_ms FROM channel_watermarks WHERE channel = $1")
            .bind(MARKETPLACE)
            .fetch_optional(pool)
            .await?;
    Ok(wm.unwrap_or(0))
}

async fn set_watermark(pool: &PgPool, modified_ms: i64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO channel_watermarks (channel, modified_ms) VALUES ($1, $2) \
         ON CONFLICT (channel) DO UPDATE SET modified_ms = EXCLUDED.modified_ms, updated_at = now() \
         WHERE channel_watermarks.modified_ms < EXCLUDED.modified_ms",
    )
    .bind(MARKETPLACE)
    .bind(modified_ms)
    .execute(pool)
    .await?;
    Ok(())
}

/// One pass: fetch changes since the watermark, apply them oldest first, move the watermark
/// up to just below the first change that failed (or to the newest one).
///
/// # Errors
/// [`CompensationError`] when the platform or the database cannot be asked; a single change
/// that fails is counted and retried on the next pass instead.
pub async fn run_once(
    pool: &PgPool,
    client: &PlatformClient,
    metrics: &Metrics,
) -> Result<Pass, CompensationError> {
    let since = watermark(pool).await?;
    let (messages, until) = client.changes_since(since).await?;
    let mut pass = Pass {
        watermark_ms: since,
        ..Pass::default()
    };
    // A change may depend on a later one (a refund of a trade whose paid snapshot is newer):
    // what fails is tried once more after the others.
    let mut failed = Vec::new();
    for raw in messages {
        pass.fetched += 1;
        if let Err(raw) = apply_fetched(pool, metrics, raw, &mut pass).await {
            failed.push(raw);
        }
    }
    let mut first_failed: Option<i64> = None;
    for raw in failed {
        let modified = raw["modified"].as_i64().unwrap_or(since);
        if apply_fetched(pool, metrics, raw, &mut pass).await.is_err() {
            pass.failed += 1;
            metrics.channel_compensation_failed.inc();
            first_failed = Some(first_failed.map_or(modified, |m| m.min(modified)));
        }
    }
    let next = first_failed.map_or(until, |m| m - 1);
    if next > since {
        set_watermark(pool, next).await?;
        pass.watermark_ms = next;
    }
    if pass.failed == 0 {
        metrics
            .channel_compensation_last_success
            .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
    }
    tracing::info!(
        fetched = pass.fetched,
        recovered = pass.recovered,
        known = pass.known,
        failed = pass.failed,
        watermark_ms = pass.watermark_ms,
        "Compensation pass done"
    );
    Ok(pass)
}

/// Applies one fetched change through the push path; gives it back when it failed.
async fn apply_fetched(
    pool: &PgPool,
    metrics: &Metrics,
    raw: serde_json::Value,
    pass: &mut Pass,
) -> Result<(), serde_json::Value> {
    let applied = match serde_json::from_value::<PushBody>(raw.clone()) {
        Ok(body) => match ChannelMessage::try_from(body) {
            Ok(msg) => apply(pool, &msg, Source::Query)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    match applied {
        Ok(outcome) => {
            metrics
                .channel_messages
                .with_label_values(&[Source::Query.as_str(), outcome.as_str()])
                .inc();
            if outcome == Outcome::Applied {
                pass.recovered += 1;
                metrics.channel_recovered.inc();
            } else {
                pass.known += 1;
            }
            Ok(())
        }
        Err(error) => {
            tracing::warn!(
                modified_ms = raw["modified"].as_i64().unwrap_or(0),
                error = %error,
                "Compensated change not applied"
            );
            Err(raw)
        }
    }
}

/// Runs a pass every `interval` until `shutdown`.
pub async fn run(
    pool: PgPool,
    client: PlatformClient,
    metrics: Metrics,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        if let Err(e) = run_once(&pool, &client, &metrics).await {
            tracing::warn!(error = %e, "Compensation pass failed; trying again at the next interval");
        }
    }
}
