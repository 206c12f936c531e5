//! Phase `debezium-copy`: what the copy trigger of `outbox-relay debezium-install` costs the
//! writers of a Debezium outbox table. `W` connections each commit single-row `INSERT`
//! transactions into a Debezium-shaped table (`dbz.outbox`: id, aggregatetype, aggregateid,
//! type, payload jsonb) for `T` seconds, with the copy trigger (A: installed as the command
//! installs it, from JsonConverter properties with schemas, Debezium's default; each insert
//! is copied, encoded, into `outbox` through its insert lock) and without it (B: the trigger
//! disabled, the table as Debezium alone has it), interleaved A B B A on emptied tables after
//! an untimed warm-up. Figures: inserts per second and PostgreSQL CPU per insert of each, and
//! A over B, in the same invocation.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::Connection;

use crate::cpu::CpuFigures;
use crate::infra::{BenchDb, Infra};
use crate::schedule::interleaved;
use crate::workload::Workload;

/// The properties the copy is installed from: JsonConverter with schemas (keys and values),
/// Debezium's table and router defaults.
const PROPERTIES: &str = "\
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
table.include.list=dbz.outbox
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
";

/// One timed run of the writers.
#[derive(Debug, Clone, Serialize)]
pub struct CopyRun {
    /// `A` (with the copy) or `B` (without).
    pub variant: &'static str,
    /// Rows committed.
    pub inserts: u64,
    /// Seconds, first insert to the last commit.
    pub seconds: f64,
    /// Committed inserts per second, all writers.
    pub inserts_per_s: f64,
    /// CPU: PostgreSQL and relay-bench (the writers) per insert.
    pub cpu: CpuFigures,
}

/// One side over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct CopySide {
    /// Inserts per second over its runs (inserts / seconds, summed).
    pub inserts_per_s: f64,
    /// PostgreSQL CPU per insert, µs (all server processes).
    pub postgres_us_per_insert: Option<f64>,
}

/// Figures of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct CopyFigures {
    /// Writer connections.
    pub writers: u64,
    /// Seconds per run.
    pub seconds_per_run: u64,
    /// With the copy trigger.
    pub copy: CopySide,
    /// Without it (the baseline).
    pub no_copy: CopySide,
    /// Insert rate with the copy over without.
    pub rate_ratio: f64,
    /// PostgreSQL CPU per insert with the copy over without.
    pub postgres_cpu_ratio: Option<f64>,
    /// Every run, in order.
    pub runs: Vec<CopyRun>,
}

/// Runs the phase: `writers` connections, `seconds` per run.
///
/// # Errors
/// Database errors; the copy's configuration refused.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    writers: u64,
    seconds: u64,
) -> anyhow::Result<CopyFigures> {
    let db = infra.fresh_database("debezium_copy").await?;
    install(&db).await?;
    writers_run(infra, w, &db, writers, 1, "A").await?;
    let mut runs = Vec::new();
    for v in interleaved(2, 2, true) {
        let variant = ["A", "B"][v];
        empty_tables(infra, &db).await?;
        eprintln!("[relay-bench]   debezium-copy run: {variant}");
        let toggle = if variant == "A" {
            "ENABLE ALWAYS"
        } else {
            "DISABLE"
        };
        sqlx::query(&format!(
            "ALTER TABLE dbz.outbox {toggle} TRIGGER outbox_to_outbox_relay"
        ))
        .execute(&db.pool)
        .await?;
        runs.push(writers_run(infra, w, &db, writers, seconds, variant).await?);
    }
    let side = |variant: &str| {
        let mine: Vec<&CopyRun> = runs.iter().filter(|r| r.variant == variant).collect();
        let inserts: u64 = mine.iter().map(|r| r.inserts).sum();
        let secs: f64 = mine.iter().map(|r| r.seconds).sum();
        let pg: Option<f64> = mine.iter().map(|r| r.cpu.postgres_s).sum::<Option<f64>>();
        CopySide {
            inserts_per_s: inserts as f64 / secs.max(1e-9),
            postgres_us_per_insert: pg.map(|s| s * 1e6 / inserts.max(1) as f64),
        }
    };
    let (copy, no_copy) = (side("A"), side("B"));
    infra.drop_database(db).await?;
    Ok(CopyFigures {
        writers,
        seconds_per_run: seconds,
        rate_ratio: copy.inserts_per_s / no_copy.inserts_per_s.max(1e-9),
        postgres_cpu_ratio: copy
            .postgres_us_per_insert
            .zip(no_copy.postgres_us_per_insert)
            .map(|(a, b)| a / b.max(1e-9)),
        copy,
        no_copy,
        runs,
    })
}

/// The Debezium table and the copy, as `outbox-relay debezium-install` installs it.
async fn install(db: &BenchDb) -> anyhow::Result<()> {
    use outbox_relay::debezium::{install_sql, table_columns, RouterConfig};
    sqlx::raw_sql(
        "CREATE SCHEMA dbz; \
         CREATE TABLE dbz.outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, \
         aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)",
    )
    .execute(&db.pool)
    .await?;
    let mut p = BTreeMap::new();
    outbox_relay::debezium::parse_properties(PROPERTIES, &mut p).map_err(anyhow::Error::msg)?;
    let config = RouterConfig::from_properties(&p).map_err(anyhow::Error::msg)?;
    let mut conn = crate::infra::connect(&db.url).await?;
    let columns = table_columns(&mut conn, "dbz", "outbox")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no table dbz.outbox"))?;
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&mut conn)
        .await?;
    let mut tx = conn.begin().await?;
    for s in install_sql(&config, &columns, &schema).map_err(anyhow::Error::msg)? {
        sqlx::raw_sql(&s).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Every run starts from empty tables with their dirty buffers flushed.
async fn empty_tables(infra: &Infra, db: &BenchDb) -> Result<(), sqlx::Error> {
    sqlx::query("TRUNCATE outbox, dbz.outbox")
        .execute(&db.pool)
        .await?;
    infra.checkpoint().await;
    Ok(())
}

/// `writers` connections inserting one row per transaction into `dbz.outbox` for `seconds`.
async fn writers_run(
    infra: &Infra,
    w: &Workload,
    db: &BenchDb,
    writers: u64,
    seconds: u64,
    variant: &'static str,
) -> anyhow::Result<CopyRun> {
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
                let mut n = 0u64;
                while Instant::now() < until {
                    // Writers take turns over the aggregates: rarely the same one at once.
                    let aggregate = ((n * writers + k as u64) % aggregates).to_string();
                    sqlx::query(
                        "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
                         VALUES (gen_random_uuid(), 'order', $1, 'OrderPaid', $2::jsonb)",
                    )
                    .bind(&aggregate)
                    .bind(&payload)
                    .execute(&mut c)
                    .await?;
                    n += 1;
                }
                c.close().await?;
                Ok::<_, sqlx::Error>(n)
            })
        })
        .collect();
    let mut inserts = 0u64;
    for t in tasks {
        inserts += t.await??;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = CpuFigures::between(&cpu0, &infra.cpu.snapshot(), inserts, None);
    Ok(CopyRun {
        variant,
        inserts,
        seconds,
        inserts_per_s: inserts as f64 / seconds,
        cpu,
    })
}
