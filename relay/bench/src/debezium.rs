//! Phase `debezium` (opt-in): Debezium's Outbox Event Router (its PostgreSQL connector on a
//! Kafka Connect standalone worker, [`test_support::debezium`]) and the relay publishing the
//! same Debezium table, on the same database, broker and backlog, one after the other, with the
//! same message bytes (the relay installed by `outbox-relay debezium-install` from Debezium's own
//! properties; JsonConverter with schemas, Connect's default).
//!
//! 1. The worker starts (its slot exists), then is stopped (SIGSTOP); the backlog is inserted
//!    into the Debezium table; the relay's trigger copies each row into the outbox.
//! 2. Debezium drains: SIGCONT, until its topic holds the backlog. CPU: the worker's JVM, and
//!    the PostgreSQL server (its WAL sender decoding the WAL).
//! 3. The relay drains the copies (Debezium stopped again): from its start until its topic holds
//!    the backlog. CPU: the relay, and the PostgreSQL server.
//! 4. Latency at the offered load, the relay first (Debezium stopped), then Debezium (the relay
//!    stopped; Debezium first publishes what the relay's run wrote, then the measured events),
//!    each after a `VACUUM ANALYZE` of both tables and a checkpoint (a steady state):
//!    writers commit one row per transaction into the Debezium table on a fixed schedule, a
//!    consumer notes when each event id (the `id` header) arrives; commit → seen. CPU per event
//!    over the load as above.
//!
//! Peak RSS: `VmHWM` of the JVM and of the relay (the relay's from a fresh process per run).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;
use test_support::debezium::{create_outbox_table, Converter, Debezium, DebeziumOptions};
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use crate::cpu::CpuFigures;
use crate::infra::{BenchDb, Infra};
use crate::latency::ends::{spawn_consumer, wall_ms, Committed, Seen};
use crate::relay_proc::{Memory, RelayProc, RelaySpec};
use crate::stats::{self, Percentiles};

/// Debezium's table in the phase's database.
const TABLE: &str = "dbz.outbox";

/// What the phase needs to know.
#[derive(Debug, Clone)]
pub struct DebeziumSpec<'a> {
    /// Events in the backlog.
    pub events: u64,
    /// Distinct aggregates.
    pub aggregates: u64,
    /// Approximate payload size, bytes.
    pub payload_bytes: u64,
    /// Offered events per second in the latency runs.
    pub rate: u64,
    /// Seconds of each latency run.
    pub seconds: u64,
    /// The relay binary.
    pub binary: &'a Path,
    /// `--batch-size`.
    pub batch_size: i64,
    /// Extra relay arguments.
    pub extra: &'a [String],
    /// How long a drain may take.
    pub timeout: Duration,
    /// Directory of the logs.
    pub log_dir: &'a Path,
    /// Connector options beyond Debezium's defaults.
    pub connector: &'a [(String, String)],
}

/// One publisher's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Side {
    /// `debezium` or `relay`.
    pub name: &'static str,
    /// Backlog drained per second.
    pub drain_events_per_s: Option<f64>,
    /// CPU of the drain: `relay_s` is the publisher's (the JVM for Debezium), `postgres_s`
    /// the server's.
    pub drain_cpu: Option<CpuFigures>,
    /// Publisher + PostgreSQL CPU per drained event, µs.
    pub drain_total_us_per_event: Option<f64>,
    /// CPU of the publisher's own PostgreSQL backends per drained event (Debezium's WAL
    /// sender; the relay's connections), µs: the part of the server's CPU that is the
    /// publisher's, without the writers' and the server's housekeeping.
    pub drain_backends_us_per_event: Option<f64>,
    /// Commit → seen by a consumer under the offered load, ms.
    pub commit_to_seen_ms: Option<Percentiles>,
    /// CPU under the offered load, per event.
    pub load_cpu: Option<CpuFigures>,
    /// Publisher + PostgreSQL CPU per event under the load, µs.
    pub load_total_us_per_event: Option<f64>,
    /// CPU of the publisher's own PostgreSQL backends per event under the load, µs.
    pub load_backends_us_per_event: Option<f64>,
    /// Events committed under the load that the consumer did not see.
    pub not_seen: u64,
    /// Peak resident memory of the publisher process, KiB.
    pub peak_rss_kb: Option<u64>,
}

/// The phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct DebeziumFigures {
    /// Backlog events.
    pub events: u64,
    /// Aggregates.
    pub aggregates: u64,
    /// Payload bytes (approximate).
    pub payload_bytes: u64,
    /// Offered load, events per second.
    pub rate: u64,
    /// Seconds of load.
    pub seconds: u64,
    /// The converters both publish with.
    pub converters: &'static str,
    /// Debezium's connector options beyond its defaults.
    pub debezium_config: Vec<(String, String)>,
    /// Debezium.
    pub debezium: Side,
    /// The relay.
    pub relay: Side,
}

impl DebeziumFigures {
    /// Relay over Debezium of publisher + PostgreSQL CPU per drained event.
    pub fn drain_cpu_ratio(&self) -> Option<f64> {
        Some(self.relay.drain_total_us_per_event? / self.debezium.drain_total_us_per_event?)
    }
}

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

/// What one latency run measured.
struct Load {
    committed: u64,
    seen: Option<Percentiles>,
    cpu: CpuFigures,
    backends_s: f64,
    not_seen: u64,
}

impl Load {
    fn fill(&self, side: &mut Side) {
        side.commit_to_seen_ms = self.seen;
        side.load_cpu = Some(self.cpu);
        side.load_backends_us_per_event =
            Some(self.backends_s * 1e6 / self.committed.max(1) as f64);
        side.not_seen = self.not_seen;
    }
}

/// `application_name` of the relay's connections in this phase.
const RELAY_APPLICATION: &str = "relay-bench-relay";

/// A publisher's own PostgreSQL backends.
enum Backends {
    /// The WAL sender of a replication slot (Debezium).
    Slot(String),
    /// The connections with this `application_name` (the relay).
    Application(&'static str),
}

impl Backends {
    /// CPU seconds of each of these backends now, by pid.
    async fn seconds(
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
    fn delta(start: &HashMap<u32, f64>, end: &HashMap<u32, f64>) -> f64 {
        end.iter()
            .map(|(pid, s)| s - start.get(pid).copied().unwrap_or(0.0))
            .sum()
    }
}

/// Commits `spec.rate` events per second for `spec.seconds` into the Debezium table (four
/// writers on a fixed schedule, one row per transaction), while a consumer of `topic`, which
/// holds `already` messages, notes each event's arrival; then waits for the last ones.
async fn under_load(
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
