//! Retention: forgetting rows older than a window (inbox rows, idempotency keys, the relay's
//! `outbox_discarded` audit rows) from a background task, without hurting the service.
//!
//! The rows go in bounded batches, each its own short statement (`DELETE .. WHERE ctid IN
//! (SELECT ctid .. LIMIT n)`), with a pause between batches, so no transaction holds many row
//! locks or a long snapshot (which would hold back vacuum of the churned outbox), and the
//! service's own statements interleave with the purge. Every service uses this one loop
//! ([`run`]) with its own [`RetentionRule`]s; [`RetentionMetrics`] counts what it removed
//! (`retention_rows_deleted_total{table}`, `retention_batches_total{table}`) and what is still
//! past the window (`retention_rows_pending{table}`).
//!
//! Each statement runs unnamed (not prepared for reuse) in its own short transaction, so the
//! purge also works through PgBouncer's transaction pooling: PgBouncer keeps the server
//! connection from the statement's Parse to its Bind, and no named statement is left behind.

use std::time::Duration;

use prometheus::{IntCounterVec, IntGaugeVec, Registry};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// What one table forgets: rows whose `time_column` is older than `window`, optionally only
/// those where `scope.0 = scope.1` (the inbox rows of one consumer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionRule {
    /// The table; also the `table` label of the metrics. A constant of the calling code.
    pub table: &'static str,
    /// A `timestamptz` column (ideally indexed): rows older than the window go.
    pub time_column: &'static str,
    /// Only rows with this column equal to this value.
    pub scope: Option<(&'static str, String)>,
    /// How long rows are kept.
    pub window: Duration,
}

impl RetentionRule {
    fn predicate(&self) -> String {
        let mut p = format!(
            "{} < now() - make_interval(secs => $1::float8)",
            self.time_column
        );
        if let Some((column, _)) = &self.scope {
            p.push_str(&format!(" AND {column} = $3"));
        }
        p
    }
}

/// Batch size, pause and schedule of the purge; shared by every rule of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeSettings {
    /// Most rows one DELETE removes.
    pub batch_rows: i64,
    /// Pause between two batches.
    pub pause: Duration,
    /// Time between two purge rounds (the first one runs at start-up).
    pub every: Duration,
}

impl Default for PurgeSettings {
    fn default() -> Self {
        Self {
            batch_rows: 5_000,
            pause: Duration::from_millis(100),
            every: Duration::from_secs(600),
        }
    }
}

/// Purge flags with environment fallbacks, flattened into each service's configuration.
#[derive(Debug, Clone, clap::Args)]
pub struct PurgeArgs {
    /// Most rows one retention DELETE removes (each batch is its own short statement).
    #[arg(long, env = "RETENTION_BATCH_ROWS", default_value_t = 5_000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub retention_batch_rows: i64,
    /// Pause between two retention batches, in milliseconds.
    #[arg(long, env = "RETENTION_PAUSE_MS", default_value_t = 100)]
    pub retention_pause_ms: u64,
    /// Seconds between two retention rounds (the first runs at start-up).
    #[arg(long, env = "RETENTION_INTERVAL_S", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_interval_s: u64,
}

impl PurgeArgs {
    /// The purge settings these flags describe.
    pub fn settings(&self) -> PurgeSettings {
        PurgeSettings {
            batch_rows: self.retention_batch_rows,
            pause: Duration::from_millis(self.retention_pause_ms),
            every: Duration::from_secs(self.retention_interval_s),
        }
    }
}

/// The retention metrics, labelled by table.
#[derive(Debug, Clone)]
pub struct RetentionMetrics {
    /// Rows removed, by table.
    pub deleted: IntCounterVec,
    /// DELETE statements run, by table.
    pub batches: IntCounterVec,
    /// Rows past the window not removed yet (counted at the start of a round), by table.
    pub pending: IntGaugeVec,
}

impl RetentionMetrics {
    /// Creates the metrics and registers them in `registry`.
    ///
    /// # Errors
    /// When metrics of the same names are registered already.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let r = crate::metrics::Registrar::new(registry);
        Ok(Self {
            deleted: r.metric_vec(
                "retention_rows_deleted_total",
                "Rows removed by retention (older than the table's window), by table",
                &["table"],
            )?,
            batches: r.metric_vec(
                "retention_batches_total",
                "Bounded retention DELETE statements run, by table",
                &["table"],
            )?,
            pending: r.metric_vec(
                "retention_rows_pending",
                "Rows past the retention window not removed yet, by table",
                &["table"],
            )?,
        })
    }

    /// Shows the series of `table` at 0 before its first round.
    pub fn init(&self, table: &str) {
        self.deleted.with_label_values(&[table]);
        self.batches.with_label_values(&[table]);
        self.pending.with_label_values(&[table]);
    }
}

/// Rows of `rule` past its window, counted up to `cap` (the count stays cheap on a huge
/// backlog; the gauge then reads `cap` until the purge gets below it).
///
/// # Errors
/// Database errors.
pub async fn count_expired(
    pool: &PgPool,
    rule: &RetentionRule,
    cap: i64,
) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "SELECT count(*) FROM (SELECT 1 FROM {} WHERE {} LIMIT $2) expired",
        rule.table,
        rule.predicate()
    );
    let q = sqlx::query_scalar(&sql)
        .persistent(false)
        .bind(rule.window.as_secs_f64())
        .bind(cap);
    let q = match &rule.scope {
        Some((_, v)) => q.bind(v),
        None => q,
    };
    let mut tx = pool.begin().await?;
    let n = q.fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(n)
}

/// Deletes at most `limit` rows of `rule` past its window, in one short statement; returns
/// how many.
///
/// # Errors
/// Database errors; retrying is safe.
pub async fn delete_batch(
    pool: &PgPool,
    rule: &RetentionRule,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "DELETE FROM {t} WHERE ctid IN (SELECT ctid FROM {t} WHERE {p} LIMIT $2)",
        t = rule.table,
        p = rule.predicate()
    );
    let q = sqlx::query(&sql)
        .persistent(false)
        .bind(rule.window.as_secs_f64())
        .bind(limit);
    let q = match &rule.scope {
        Some((_, v)) => q.bind(v),
        None => q,
    };
    let mut tx = pool.begin().await?;
    let n = q.execute(&mut *tx).await?.rows_affected();
    tx.commit().await?;
    Ok(n)
}

/// Most rows [`purge`] counts as pending.
pub const PENDING_COUNT_CAP: i64 = 10_000_000;

/// One purge round of `rule`: batches until one comes back short, pausing between them.
/// Returns the rows removed; stops early (between batches) when `stop` fires.
///
/// # Errors
/// Database errors (the next round starts over).
pub async fn purge(
    pool: &PgPool,
    rule: &RetentionRule,
    settings: PurgeSettings,
    metrics: &RetentionMetrics,
    stop: &CancellationToken,
) -> Result<u64, sqlx::Error> {
    let table = rule.table;
    let mut pending = count_expired(pool, rule, PENDING_COUNT_CAP).await?;
    metrics.pending.with_label_values(&[table]).set(pending);
    let mut removed = 0u64;
    while pending > 0 && !stop.is_cancelled() {
        // `pending` may be capped: the batches go on until one comes back short.
        let n = delete_batch(pool, rule, settings.batch_rows).await?;
        removed += n;
        pending = (pending - i64::try_from(n).unwrap_or(i64::MAX)).max(1);
        metrics.batches.with_label_values(&[table]).inc();
        metrics.deleted.with_label_values(&[table]).inc_by(n);
        metrics.pending.with_label_values(&[table]).set(pending);
        if n < u64::try_from(settings.batch_rows).unwrap_or(u64::MAX) {
            metrics.pending.with_label_values(&[table]).set(0);
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(settings.pause) => {}
            () = stop.cancelled() => break,
        }
    }
    if removed > 0 {
        tracing::info!(
            retention.table = table,
            rows = removed,
            "Removed rows past the retention window"
        );
    }
    Ok(removed)
}

/// How often an inactive instance checks whether it became active.
const INACTIVE_RECHECK: Duration = Duration::from_secs(5);

/// Runs purge rounds of every rule until `stop`: one at start-up, then every
/// `settings.every`, each only while `active()` says so (the relay purges on its leader only).
/// Errors are logged and the round is retried at the next tick.
pub async fn run(
    pool: PgPool,
    rules: Vec<RetentionRule>,
    settings: PurgeSettings,
    metrics: RetentionMetrics,
    active: impl Fn() -> bool + Send + 'static,
    stop: CancellationToken,
) {
    for rule in &rules {
        metrics.init(rule.table);
    }
    loop {
        // An inactive instance (a standby relay) checks again soon, so a new leader purges
        // within seconds of taking over.
        let mut wait = settings.every.min(INACTIVE_RECHECK);
        if active() {
            wait = settings.every;
            for rule in &rules {
                if let Err(e) = purge(&pool, rule, settings, &metrics, &stop).await {
                    tracing::warn!(retention.table = rule.table, error = %e, "Retention round failed; retrying at the next round");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicate_scopes_by_column() {
        let mut rule = RetentionRule {
            table: "inbox",
            time_column: "processed_at",
            scope: None,
            window: Duration::from_secs(60),
        };
        assert_eq!(
            rule.predicate(),
            "processed_at < now() - make_interval(secs => $1::float8)"
        );
        rule.scope = Some(("consumer_name", "wms".into()));
        assert!(rule.predicate().ends_with("AND consumer_name = $3"));
    }
}
