//! The steps of the `debezium` phase: Debezium drains the backlog, then the relay drains the
//! same rows, then each publishes under the offered load (`load`).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use test_support::debezium::{create_outbox_table, Converter, Debezium, DebeziumOptions};

use super::figures::{DebeziumFigures, DebeziumSpec, Side};
use super::load::{under_load, Backends, RELAY_APPLICATION};
use crate::cpu::CpuFigures;
use crate::infra::{BenchDb, Infra};
use crate::relay_proc::{Memory, RelayProc, RelaySpec};

/// Debezium's table in the phase's database.
const TABLE: &str = "dbz.outbox";

/// Runs the phase.
///
/// # Errors
/// Database, broker or process failures; a drain that does not finish in time.
pub async fn run(infra: &Infra, spec: &DebeziumSpec<'_>) -> anyhow::Result<DebeziumFigures> {
    let db = infra.fresh_database("debezium").await?;
    let result = run_in(infra, spec, &db).await;
    infra.drop_database(db).await?;
    result
}

async fn run_in(
    infra: &Infra,
    spec: &DebeziumSpec<'_>,
    db: &BenchDb,
) -> anyhow::Result<DebeziumFigures> {
    create_outbox_table(&db.pool, TABLE).await;
    let prefix = infra.topic_prefix("debezium");
    let mut options = DebeziumOptions::new(TABLE, &prefix);
    options.converter = Converter::Json;
    options.topic_partitions = infra.partitions() as u32;
    options.log = spec.log_dir.join("debezium.log");
    options.connector = spec.connector.to_vec();
    let debezium = Debezium::start(&db.url, infra.brokers(), &options).await;
    let jvm = debezium.worker_pid();
    let theirs = format!("{prefix}order");
    let ours = format!("{prefix}relay.order");
    install_relay(spec.binary, &db.url, &debezium, &prefix, spec.log_dir)?;
    infra.create_topics(std::slice::from_ref(&ours)).await?;

    signal(jvm, "STOP");
    insert_backlog(&db.pool, spec).await?;
    infra.checkpoint().await;

    // Debezium drains.
    let cpu = &infra.cpu;
    let slot = Backends::Slot(debezium.slot.clone());
    let b0 = slot.seconds(infra, &db.pool).await?;
    let (start, jvm0) = (cpu.snapshot(), cpu.process_seconds(jvm, false));
    let t0 = Instant::now();
    signal(jvm, "CONT");
    wait_messages(infra, &theirs, spec.events, spec.timeout, "Debezium").await?;
    let wall = t0.elapsed().as_secs_f64();
    let (end, jvm1) = (cpu.snapshot(), cpu.process_seconds(jvm, false));
    let b1 = slot.seconds(infra, &db.pool).await?;
    signal(jvm, "STOP");
    let mut dbz = Side {
        name: "debezium",
        drain_events_per_s: Some(spec.events as f64 / wall),
        drain_cpu: Some(CpuFigures::between(
            &start,
            &end,
            spec.events,
            jvm0.zip(jvm1).map(|(a, b)| b - a),
        )),
        drain_backends_us_per_event: Some(Backends::delta(&b0, &b1) * 1e6 / spec.events as f64),
        ..Side::default()
    };

    // The relay drains the same rows (their copies in the outbox).
    // The relay's connections are known by their application_name.
    let relay_url = format!(
        "{}{}application_name={RELAY_APPLICATION}",
        db.url,
        if db.url.contains('?') { '&' } else { '?' }
    );
    let relay_spec = |log: &str| RelaySpec {
        binary: spec.binary,
        database_url: &relay_url,
        brokers: infra.brokers(),
        topic_prefix: &prefix,
        batch_size: spec.batch_size,
        extra: spec.extra,
        log: spec.log_dir.join(log),
    };
    let start = cpu.snapshot();
    let t0 = Instant::now();
    let relay = RelayProc::spawn(&relay_spec("relay-dbz-drain.log"))?;
    wait_messages(infra, &ours, spec.events, spec.timeout, "the relay").await?;
    let wall = t0.elapsed().as_secs_f64();
    let relay_s = cpu.process_seconds(relay.pid(), false);
    let end = cpu.snapshot();
    let relay_backends = Backends::Application(RELAY_APPLICATION);
    let b1 = relay_backends.seconds(infra, &db.pool).await?;
    let mut mine = Side {
        name: "relay",
        drain_events_per_s: Some(spec.events as f64 / wall),
        drain_cpu: Some(CpuFigures::between(&start, &end, spec.events, relay_s)),
        drain_backends_us_per_event: Some(
            Backends::delta(&HashMap::new(), &b1) * 1e6 / spec.events as f64,
        ),
        peak_rss_kb: relay.memory().map(|m| m.hwm_kb),
        ..Side::default()
    };
    relay.stop().await?;

    // Latency: the relay, then Debezium, on the same offered load, each from a steady state:
    // the drains left 200 000 dead rows in the outbox (and WAL to recycle); vacuumed and
    // checkpointed before each run, as autovacuum would have done in time.
    settle(infra, db).await?;
    let mut relay = RelayProc::spawn(&relay_spec("relay-dbz-latency.log"))?;
    relay
        .wait_until_leading(Duration::from_secs(30))
        .await
        .context("the relay before its latency run")?;
    let before = spec.events;
    let load = under_load(
        infra,
        db,
        spec,
        &ours,
        before,
        || relay.pid(),
        &relay_backends,
    )
    .await?;
    relay.check_running()?;
    mine.peak_rss_kb = mine.peak_rss_kb.max(relay.memory().map(|m| m.hwm_kb));
    relay.stop().await?;
    load.fill(&mut mine);

    signal(jvm, "CONT");
    // Debezium first publishes what the relay's run wrote.
    let written = before + load.committed;
    wait_messages(
        infra,
        &theirs,
        written,
        spec.timeout,
        "Debezium catching up",
    )
    .await?;
    settle(infra, db).await?;
    let load = under_load(infra, db, spec, &theirs, written, || jvm, &slot).await?;
    load.fill(&mut dbz);
    dbz.peak_rss_kb = Memory::of(jvm).map(|m| m.hwm_kb);
    drop(debezium);

    for side in [&mut dbz, &mut mine] {
        side.drain_total_us_per_event = side
            .drain_cpu
            .and_then(|c| Some(c.relay_us_per_event? + c.postgres_us_per_event?));
        side.load_total_us_per_event = side
            .load_cpu
            .and_then(|c| Some(c.relay_us_per_event? + c.postgres_us_per_event?));
    }
    Ok(DebeziumFigures {
        events: spec.events,
        aggregates: spec.aggregates,
        payload_bytes: spec.payload_bytes,
        rate: spec.rate,
        seconds: spec.seconds,
        converters: "JsonConverter, schemas.enable=true (key and value)",
        debezium_config: spec.connector.to_vec(),
        debezium: dbz,
        relay: mine,
    })
}

/// `VACUUM ANALYZE` of both tables, then a checkpoint.
async fn settle(infra: &Infra, db: &BenchDb) -> anyhow::Result<()> {
    for table in ["outbox", TABLE] {
        sqlx::query(&format!("VACUUM ANALYZE {table}"))
            .execute(&db.pool)
            .await
            .with_context(|| format!("vacuuming {table}"))?;
    }
    infra.checkpoint().await;
    Ok(())
}

/// `kill -SIG pid`.
fn signal(pid: u32, sig: &str) {
    test_support::process::signal(pid as i32, sig);
}

/// `outbox-relay debezium-install` from the worker's properties, routed to
/// `<prefix>relay.<aggregatetype>`.
fn install_relay(
    binary: &Path,
    url: &str,
    debezium: &Debezium,
    prefix: &str,
    log_dir: &Path,
) -> anyhow::Result<()> {
    let topic = log_dir.join("relay-dbz-topic.properties");
    std::fs::write(
        &topic,
        format!("transforms.outbox.route.topic.replacement={prefix}relay.${{routedByValue}}\n"),
    )?;
    let [worker, connector] = debezium.properties_files();
    let out = std::process::Command::new(binary)
        .args(["debezium-install", "--database-url", url, "--config"])
        .arg(worker)
        .arg("--config")
        .arg(connector)
        .arg("--config")
        .arg(&topic)
        .output()
        .context("running outbox-relay debezium-install")?;
    if !out.status.success() {
        bail!(
            "outbox-relay debezium-install: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The backlog: `events` rows of `aggregates` aggregates with a payload of about
/// `payload_bytes`, in transactions of 2 000 rows (each holds the insert lock of its
/// aggregates until it commits).
async fn insert_backlog(pool: &sqlx::PgPool, spec: &DebeziumSpec<'_>) -> anyhow::Result<()> {
    let pad = spec.payload_bytes.saturating_sub(60) as i32;
    let mut from = 0u64;
    while from < spec.events {
        let to = (from + 2_000).min(spec.events);
        sqlx::query(
            "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'order', 'agg-' || (i % $3), 'BenchEvent', \
                    jsonb_build_object('i', i, 'status', 'CREATED', 'pad', repeat('x', $4)) \
             FROM generate_series($1::bigint, $2::bigint - 1) i",
        )
        .bind(from as i64)
        .bind(to as i64)
        .bind(spec.aggregates.max(1) as i64)
        .bind(pad)
        .execute(pool)
        .await
        .context("inserting the backlog")?;
        from = to;
    }
    Ok(())
}

/// Waits until `topic` holds at least `n` messages (the sum of its partitions' high
/// watermarks; the topic is the phase's own).
async fn wait_messages(
    infra: &Infra,
    topic: &str,
    n: u64,
    timeout: Duration,
    who: &str,
) -> anyhow::Result<()> {
    let consumer: BaseConsumer = infra
        .client_config()
        .set("group.id", "relay-bench-watermarks")
        .create()
        .context("creating the watermark reader")?;
    let deadline = Instant::now() + timeout;
    loop {
        let mut total = 0u64;
        for p in 0..infra.partitions() {
            if let Ok((_, high)) = consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
                total += high.max(0) as u64;
            }
        }
        if total >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{who}: {total} of {n} messages on {topic} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
