//! Phase `parked`: whether a parked aggregate's backlog slows the others.
//! Two databases, each with one parked event (an invalid topic) and a release relay of the
//! same settings; only the second gets `--parked-behind` events of the parked aggregate behind
//! it. Healthy events are then committed one at a time, alternating between the two (so both
//! see the same machine), each timed from its commit until the relay deleted it (the broker
//! acknowledged it). The figures: each side's percentiles and their ratio (backlog / none),
//! and the first event after the backlog was inserted (the claims that set the relay's floor
//! read the whole backlog once).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::PgPool;

use crate::infra::{BenchDb, Infra};
use crate::relay_proc::{RelayProc, RelaySpec};
use crate::stats::{self, Percentiles};

/// What the phase runs.
#[derive(Debug, Clone)]
pub struct ParkedSpec<'a> {
    /// Events of the parked aggregate behind its parked event.
    pub behind: u64,
    /// Healthy events timed on each side.
    pub samples: usize,
    /// The relay binary.
    pub binary: &'a Path,
    /// `--batch-size`.
    pub batch_size: i64,
    /// More relay arguments.
    pub extra: &'a [String],
    /// Where the relays' logs go.
    pub log_dir: &'a Path,
}

/// The phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ParkedFigures {
    /// Events behind the parked one on the backlog side.
    pub behind: u64,
    /// Seconds the backlog's insert took.
    pub insert_seconds: f64,
    /// The first healthy event after the backlog was inserted, commit → published, ms.
    pub first_after_backlog_ms: f64,
    /// Commit → published without the backlog, ms.
    pub without_ms: Percentiles,
    /// Commit → published with the backlog, ms.
    pub with_ms: Percentiles,
    /// Median with / median without.
    pub p50_ratio: f64,
    /// p99 with / p99 without.
    pub p99_ratio: f64,
}

const AGGREGATE: &str = "stuck";

/// One side: a database with one parked event and its relay.
struct Side {
    db: BenchDb,
    relay: RelayProc,
    topic: String,
}

async fn side(infra: &Infra, spec: &ParkedSpec<'_>, label: &str) -> anyhow::Result<Side> {
    let db = infra.fresh_database(label).await?;
    let prefix = infra.topic_prefix(label);
    let topic = format!("{prefix}order");
    infra.create_topic(&topic).await?;
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, topic) \
         VALUES ('order', $1, 'E', '{}', 'no such topic!')",
    )
    .bind(AGGREGATE)
    .execute(&db.pool)
    .await?;
    let mut relay = RelayProc::spawn(&RelaySpec {
        binary: spec.binary,
        database_url: &db.url,
        brokers: infra.brokers(),
        topic_prefix: &prefix,
        batch_size: spec.batch_size,
        extra: spec.extra,
        log: spec.log_dir.join(format!("relay-{label}.log")),
    })?;
    relay.wait_until_leading(Duration::from_secs(60)).await?;
    let parked = outbox_process::poll::poll_until(Duration::from_secs(60), || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox_failure WHERE parked_at IS NOT NULL")
                .fetch_one(&db.pool)
                .await
                .unwrap_or(0);
        (n == 1).then_some(())
    })
    .await;
    parked.context("the poison was not parked within 60 s")?;
    for n in 0..5 {
        commit_to_published(&db.pool, n).await?;
    }
    Ok(Side { db, relay, topic })
}

/// One healthy event's commit → published time, ms.
async fn commit_to_published(pool: &PgPool, n: usize) -> anyhow::Result<f64> {
    let took = test_support::db::commit_to_published(
        pool,
        &format!("healthy-{n}"),
        Duration::from_secs(120),
    )
    .await?
    .context("a healthy event was not published within 120 s")?;
    Ok(took.as_secs_f64() * 1e3)
}

/// Runs the phase.
///
/// # Errors
/// Database or broker errors, a relay exiting, an event not published in time.
pub async fn run(infra: &Infra, spec: &ParkedSpec<'_>) -> anyhow::Result<ParkedFigures> {
    let plain = side(infra, spec, "parked_none").await?;
    let backlog = side(infra, spec, "parked_backlog").await?;
    let started = Instant::now();
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', $1, 'E', jsonb_build_object('n', g) FROM generate_series(1, $2) g",
    )
    .bind(AGGREGATE)
    .bind(i64::try_from(spec.behind)?)
    .execute(&backlog.db.pool)
    .await?;
    let insert_seconds = started.elapsed().as_secs_f64();
    sqlx::query("ANALYZE outbox")
        .execute(&backlog.db.pool)
        .await?;
    let first_after_backlog_ms = commit_to_published(&backlog.db.pool, 10).await?;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for n in 0..spec.samples {
        without.push(commit_to_published(&plain.db.pool, 100 + n).await?);
        with.push(commit_to_published(&backlog.db.pool, 100 + n).await?);
    }
    for side in [plain, backlog] {
        side.relay.stop().await?;
        infra.drop_database(side.db).await?;
        infra.delete_topics(&[side.topic]).await;
    }
    let (without_ms, with_ms) = (
        stats::percentiles(&without).context("no samples")?,
        stats::percentiles(&with).context("no samples")?,
    );
    Ok(ParkedFigures {
        behind: spec.behind,
        insert_seconds,
        first_after_backlog_ms,
        p50_ratio: with_ms.p50 / without_ms.p50,
        p99_ratio: with_ms.p99 / without_ms.p99,
        without_ms,
        with_ms,
    })
}
