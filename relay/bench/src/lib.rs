//! `relay-bench`: the outbox relay measured against the raw limits of one PostgreSQL and one
//! broker, in one invocation, so that the ratios between the figures hold even on a noisy
//! machine.
//!
//! - [`produce`]: phase 1, the broker's ceiling (and the relay's publish path without a database);
//! - [`db`]: phase 2, the database's ceiling with the relay's own SQL;
//! - [`drain`]: phase 3, the release relay binary draining a backlog, with its memory;
//! - [`naive`]: phase 4, a one-row-at-a-time relay;
//! - [`latency`]: phase 5, commit → ack / consumer latency at a fixed offered load;
//! - [`isolation`]: the healthy drain alone, behind poisoned and beside suspect aggregates;
//! - [`insert`]: what the per-aggregate insert lock costs a writer;
//! - [`debezium_copy`]: what the copy trigger of `debezium-install` costs a Debezium table's writers;
//! - [`failures`]: claim time with a large failure table, per claim filter;
//! - [`backlog`]: opt-in, a multi-million event backlog (claim time, leadership stability);
//! - [`growth`]: `sizes` and (opt-in) `topics`: raw produce and relay drain as payloads and
//!   topics grow;
//! - [`transactions`]: opt-in, the drain and the latency phase with the relay's
//!   `--transactions` off and on, alternating;
//! - [`curve`]: opt-in, the relay's CPU per event and latency at several rates and draining;
//! - [`relays`]: opt-in, one backlog drained by one relay and by three sharing its buckets;
//! - [`debezium`]: opt-in, Debezium's Outbox Event Router and the relay on the same Debezium
//!   table and backlog, one after the other;
//! - [`report`]: the JSON report and the table.

pub mod backlog;
pub mod cli;
pub mod cpu;
pub mod curve;
pub mod db;
pub mod debezium;
pub mod debezium_copy;
pub mod drain;
pub mod failures;
pub mod growth;
pub mod infra;
pub mod insert;
pub mod isolation;
pub mod latency;
pub mod naive;
pub mod parked;
pub mod probe;
pub mod produce;
pub mod relay_proc;
pub mod relays;
pub mod report;
pub mod schedule;
pub mod stats;
pub mod tail;
pub mod transactions;
pub mod workload;

use anyhow::Context as _;
use std::future::Future;
use std::time::Duration;

use cli::{Args, Phase};
use infra::Infra;
use report::{Ratios, Report, Rounds, Settings};
use workload::Workload;

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs `phase` unless deselected; a failure is recorded in `errors` and the run goes on.
async fn phase<T, F>(args: &Args, which: Phase, errors: &mut Vec<String>, f: F) -> Option<T>
where
    F: Future<Output = anyhow::Result<T>>,
{
    if !args.runs(which) {
        return None;
    }
    let name = format!("{which:?}").to_lowercase();
    eprintln!("[relay-bench] phase {name} ...");
    let start = std::time::Instant::now();
    match f.await {
        Ok(v) => {
            eprintln!(
                "[relay-bench] phase {name} done in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            Some(v)
        }
        Err(e) => {
            eprintln!("[relay-bench] phase {name} FAILED: {e:#}");
            errors.push(format!("phase {name}: {e:#}"));
            None
        }
    }
}

/// Keeps the faster of `best` and `new` (by `rate`), noting `new`'s rate in `rates`.
fn keep_best<T>(
    best: &mut Option<T>,
    new: Option<T>,
    rates: &mut Vec<f64>,
    rate: impl Fn(&T) -> f64,
) {
    let Some(new) = new else { return };
    rates.push(rate(&new));
    if best.as_ref().is_none_or(|b| rate(&new) > rate(b)) {
        *best = Some(new);
    }
}

/// Runs the selected phases and returns the report (also when some phases failed: see
/// [`Report::errors`]).
///
/// # Errors
/// When the servers cannot be reached at all.
pub async fn run(args: &Args) -> anyhow::Result<Report> {
    let sizes = args.sizes();
    let kafka = args
        .kafka_security
        .settings(&[])
        .context("Kafka security settings")?;
    let mut infra = Infra::new(
        &args.database_url,
        &args.kafka_brokers,
        &kafka,
        args.partitions,
    )?;
    infra.cpu = infra.cpu_probe().await;
    let postgres = infra.server_settings().await?;
    let w = Workload {
        traced: args.traced,
        ..Workload::new(args.aggregates, args.payload_bytes, args.payload_kind)
    };
    let relay_bin = args.relay_binary();
    let log_dir = args
        .out_path()
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    std::fs::create_dir_all(&log_dir)?;
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let load_start = loadavg();
    let mut errors = Vec::new();

    let drain_spec = drain::DrainSpec {
        events: sizes.events,
        binary: &relay_bin,
        batch_size: args.batch_size,
        extra: &args.relay_args,
        timeout: Duration::from_secs(args.drain_timeout_secs),
        log_dir: &log_dir,
        label: "drain",
        front: workload::Front::None,
        chunk: None,
        probe_every: None,
        relays: 1,
        buckets: None,
        warm: false,
    };
    // Rounds interleave the throughput phases so that each sees the same passing noise.
    let mut rounds = Rounds::default();
    let (mut raw_produce, mut raw_db, mut relay_drain) = (None, None, None);
    for _ in 0..args.repeat {
        let p = phase(
            args,
            Phase::Produce,
            &mut errors,
            produce::run(&infra, &w, sizes.events, args.batch_size),
        )
        .await;
        keep_best(&mut raw_produce, p, &mut rounds.raw_produce, |p| {
            p.msgs_per_s
        });
        let d = phase(
            args,
            Phase::Db,
            &mut errors,
            db::run(&infra, &w, sizes.events, args.batch_size),
        )
        .await;
        keep_best(&mut raw_db, d, &mut rounds.raw_db, |d| d.rows_per_s);
        let r = phase(
            args,
            Phase::Drain,
            &mut errors,
            drain::run(&infra, &w, &drain_spec),
        )
        .await;
        keep_best(&mut relay_drain, r, &mut rounds.relay_drain, |r| {
            r.events_per_s
        });
    }
    let naive = phase(
        args,
        Phase::Naive,
        &mut errors,
        naive::run(&infra, &w, sizes.naive_events, args.naive_linger_ms),
    )
    .await;
    let load_spec = latency::LoadSpec {
        rate: args.load_rate,
        seconds: sizes.load_seconds,
        writers: args.writers,
        binary: &relay_bin,
        batch_size: args.batch_size,
        extra: &args.relay_args,
        log_dir: &log_dir,
        idle_seconds: sizes.idle_seconds,
        label: "latency",
        drained_first: 0,
    };
    let latency = phase(
        args,
        Phase::Latency,
        &mut errors,
        latency::run(&infra, &w, &load_spec),
    )
    .await;
    let isolation_spec = drain::DrainSpec {
        events: sizes.isolation_events,
        ..drain_spec.clone()
    };
    let isolation = phase(
        args,
        Phase::Isolation,
        &mut errors,
        isolation::run(
            &infra,
            &w,
            &isolation_spec,
            args.poisoned_aggregates,
            args.suspect_aggregates,
        ),
    )
    .await;
    let insert = phase(
        args,
        Phase::Insert,
        &mut errors,
        insert::run(
            &infra,
            &w,
            args.insert_writers,
            sizes.insert_seconds,
            sizes.events,
        ),
    )
    .await;
    let debezium_copy = phase(
        args,
        Phase::DebeziumCopy,
        &mut errors,
        debezium_copy::run(&infra, &w, args.insert_writers, sizes.insert_seconds),
    )
    .await;
    let failures = phase(
        args,
        Phase::Failures,
        &mut errors,
        failures::run(
            &infra,
            &w,
            sizes.failure_outbox_rows,
            &args.failure_rows,
            args.batch_size,
            args.claim_repeats,
            Duration::from_secs(args.claim_timeout_secs),
        ),
    )
    .await;
    let backlog = phase(
        args,
        Phase::Backlog,
        &mut errors,
        backlog::run(
            &infra,
            &w,
            &drain_spec,
            sizes.backlog_events,
            args.backlog_probe_secs,
        ),
    )
    .await;
    let parked = phase(
        args,
        Phase::Parked,
        &mut errors,
        parked::run(
            &infra,
            &parked::ParkedSpec {
                behind: sizes.parked_behind,
                samples: usize::try_from(args.parked_samples)?,
                binary: &relay_bin,
                batch_size: args.batch_size,
                extra: &args.relay_args,
                log_dir: &log_dir,
            },
        ),
    )
    .await;
    let growth_sizes = phase(
        args,
        Phase::Sizes,
        &mut errors,
        growth::sizes(
            &infra,
            &w,
            &drain_spec,
            &args.size_payloads,
            sizes.size_budget_bytes,
            100,
        ),
    )
    .await;
    let topics_spec = drain::DrainSpec {
        events: sizes.topic_events,
        ..drain_spec.clone()
    };
    let growth_topics = phase(
        args,
        Phase::Topics,
        &mut errors,
        growth::topics(&infra, &w, &topics_spec, &args.topic_counts),
    )
    .await;
    let transactions = phase(
        args,
        Phase::Transactions,
        &mut errors,
        transactions::run(&infra, &w, &drain_spec, &load_spec, args.repeat),
    )
    .await;
    let curve = phase(
        args,
        Phase::Curve,
        &mut errors,
        curve::run(&infra, &w, &drain_spec, &load_spec, &args.curve_rates),
    )
    .await;
    for e in curve.iter().flat_map(|c| &c.errors) {
        errors.push(format!("phase curve: {e}"));
    }
    let tail = phase(
        args,
        Phase::Tail,
        &mut errors,
        tail::run(&infra, &w, &load_spec, sizes.events, args.repeat),
    )
    .await;
    for e in tail.iter().flat_map(|t| &t.errors) {
        errors.push(format!("phase tail: {e}"));
    }
    let relays = phase(
        args,
        Phase::Relays,
        &mut errors,
        relays::run(&infra, &w, &drain_spec, args.repeat),
    )
    .await;
    for e in relays.iter().flat_map(|r| &r.errors) {
        errors.push(format!("phase relays: {e}"));
    }
    let debezium_spec = debezium::DebeziumSpec {
        events: sizes.events,
        aggregates: args.aggregates,
        payload_bytes: args.payload_bytes,
        rate: args.load_rate,
        seconds: sizes.load_seconds,
        binary: &relay_bin,
        batch_size: args.batch_size,
        extra: &args.relay_args,
        timeout: Duration::from_secs(args.drain_timeout_secs),
        log_dir: &log_dir,
        connector: &args.debezium_config,
    };
    let debezium = phase(
        args,
        Phase::Debezium,
        &mut errors,
        debezium::run(&infra, &debezium_spec),
    )
    .await;
    for e in transactions.iter().flat_map(|t| &t.errors) {
        errors.push(format!("phase transactions: {e}"));
    }
    for g in [&growth_sizes, &growth_topics].into_iter().flatten() {
        for p in &g.points {
            for e in &p.errors {
                errors.push(format!(
                    "phase {} ({} B, {} topics): {e}",
                    g.phase, p.payload_bytes, p.topics
                ));
            }
        }
    }

    let mut report = Report {
        settings: Settings {
            started_at,
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            loadavg: (load_start, loadavg()),
            batch_size: args.batch_size,
            partitions: args.partitions,
            replication: 1,
            broker_storage: args.broker_storage.clone(),
            postgres,
            sizes,
            aggregates: args.aggregates,
            payload_bytes: args.payload_bytes,
            payload_kind: args.payload_kind,
            traced: args.traced,
            span_export: std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok(),
            load_rate: args.load_rate,
            writers: args.writers,
            relay_binary: relay_bin.display().to_string(),
            relay_args: args.relay_args.clone(),
            producer_settings: outbox_relay::publisher::PRODUCER_DEFAULTS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .chain([
                    ("enable.idempotence".to_owned(), "true".to_owned()),
                    ("acks".to_owned(), "all".to_owned()),
                ])
                .collect(),
        },
        raw_produce,
        raw_db,
        relay_drain,
        naive,
        latency,
        isolation,
        insert,
        debezium_copy,
        failures,
        backlog,
        parked,
        sizes: growth_sizes,
        topics: growth_topics,
        transactions,
        curve,
        tail,
        relays,
        debezium,
        rounds,
        ratios: Ratios::default(),
        serial_model: None,
        errors,
    };
    report.derive();
    Ok(report)
}
