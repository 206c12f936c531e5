//! The results: one serializable report (written as JSON) and the table printed on stdout.

use std::fmt::Write as _;

use serde::Serialize;

use crate::backlog::BacklogFigures;
use crate::cli::Sizes;
use crate::db::DbFigures;
use crate::drain::DrainFigures;
use crate::failures::{ClaimTiming, FailuresFigures};
use crate::growth::GrowthFigures;
use crate::infra::ServerSettings;
use crate::insert::InsertFigures;
use crate::isolation::IsolationFigures;
use crate::latency::LatencyFigures;
use crate::naive::NaiveFigures;
use crate::produce::ProduceFigures;
use crate::stats::Percentiles;

/// How the figures were obtained.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// When the run started (UTC, RFC 3339).
    pub started_at: String,
    /// CPUs available to this process.
    pub cpus: usize,
    /// `/proc/loadavg` at the start and at the end (other work on the machine).
    pub loadavg: (String, String),
    /// Relay batch size (also the raw database phase's).
    pub batch_size: i64,
    /// Partitions of every topic.
    pub partitions: i32,
    /// Replication factor of every topic.
    pub replication: i32,
    /// Broker storage engine (`BENCH_BROKER_STORAGE`).
    pub broker_storage: String,
    /// PostgreSQL settings as read from the server.
    pub postgres: ServerSettings,
    /// Event counts and load duration.
    pub sizes: Sizes,
    /// Distinct aggregates (keys).
    pub aggregates: u64,
    /// Requested payload size, bytes.
    pub payload_bytes: u64,
    /// The payload column (`--payload-kind`).
    pub payload_kind: crate::workload::PayloadKind,
    /// Rows with a `traceparent` each (`--traced`).
    pub traced: bool,
    /// Where the relay exports its spans (`OTEL_EXPORTER_OTLP_ENDPOINT`; `None`: export off).
    pub span_export: Option<String>,
    /// Offered load of the latency phase, events/s.
    pub load_rate: u64,
    /// Writer tasks of the latency phase.
    pub writers: u64,
    /// The relay binary.
    pub relay_binary: String,
    /// Extra relay arguments.
    pub relay_args: Vec<String>,
    /// The relay's librdkafka defaults (also used by the raw producer).
    pub producer_settings: Vec<(String, String)>,
}

/// The headline ratios.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    /// Relay drain rate / raw produce rate (target ≥ 0.6).
    pub relay_over_raw_produce: Option<f64>,
    /// Relay drain rate / naive relay rate (target ≥ 10).
    pub relay_over_naive: Option<f64>,
    /// Relay drain rate / raw database rate.
    pub relay_over_raw_db: Option<f64>,
}

/// What a relay that runs claim, publish and mark one after the other could reach, from the
/// separately measured parts: per event `claim + publish path + mark`.
#[derive(Debug, Clone, Serialize)]
pub struct SerialModel {
    /// Claim share of an event's time.
    pub claim_share: f64,
    /// Publish share.
    pub publish_share: f64,
    /// Mark share.
    pub mark_share: f64,
    /// Events per second predicted.
    pub events_per_s: f64,
}

/// Rates of every round of the throughput phases (`--repeat`), per second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rounds {
    /// Raw produce, msgs/s.
    pub raw_produce: Vec<f64>,
    /// Raw database, rows/s.
    pub raw_db: Vec<f64>,
    /// Relay drain, events/s.
    pub relay_drain: Vec<f64>,
}

/// Every figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Settings.
    pub settings: Settings,
    /// Phase 1.
    pub raw_produce: Option<ProduceFigures>,
    /// Phase 2.
    pub raw_db: Option<DbFigures>,
    /// Phase 3.
    pub relay_drain: Option<DrainFigures>,
    /// Phase 4.
    pub naive: Option<NaiveFigures>,
    /// Phase 5.
    pub latency: Option<LatencyFigures>,
    /// Healthy drain alone, behind poisoned and beside suspect aggregates.
    pub isolation: Option<IsolationFigures>,
    /// Cost per insert of the per-aggregate lock.
    pub insert: Option<InsertFigures>,
    /// Claim time with a large failure table.
    pub failures: Option<FailuresFigures>,
    /// The large backlog (opt-in).
    pub backlog: Option<BacklogFigures>,
    /// Payload sizes (opt-in).
    pub sizes: Option<GrowthFigures>,
    /// Topic counts (opt-in).
    pub topics: Option<GrowthFigures>,
    /// Every round's rate; the phase figures above are the best round.
    pub rounds: Rounds,
    /// Ratios of phase 3 to phases 1, 2 and 4.
    pub ratios: Ratios,
    /// Serial model from phases 1 and 2.
    pub serial_model: Option<SerialModel>,
    /// Phases that failed.
    pub errors: Vec<String>,
}

impl Report {
    /// Fills in the ratios and the serial model from the phase figures.
    pub fn derive(&mut self) {
        let relay = self.relay_drain.as_ref().map(|d| d.events_per_s);
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        self.ratios = Ratios {
            relay_over_raw_produce: ratio(relay, self.raw_produce.as_ref().map(|p| p.msgs_per_s)),
            relay_over_naive: ratio(relay, self.naive.as_ref().map(|n| n.events_per_s)),
            relay_over_raw_db: ratio(relay, self.raw_db.as_ref().map(|d| d.rows_per_s)),
        };
        self.serial_model = match (&self.raw_produce, &self.raw_db) {
            (Some(p), Some(d)) => {
                let claim = d.claim_seconds / d.rows as f64;
                let mark = d.mark_seconds / d.rows as f64;
                let publish = 1.0 / p.publish_path_msgs_per_s;
                let total = claim + mark + publish;
                Some(SerialModel {
                    claim_share: claim / total,
                    publish_share: publish / total,
                    mark_share: mark / total,
                    events_per_s: 1.0 / total,
                })
            }
            _ => None,
        };
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut o = String::new();
        let storage_note = if s.broker_storage.starts_with("memory") {
            " (in memory: a throughput run, nothing is durable)"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "relay-bench {} · {} CPUs, load avg at start {} · broker storage {}{}",
            s.started_at, s.cpus, s.loadavg.0, s.broker_storage, storage_note
        );
        let _ = writeln!(
            o,
            "PostgreSQL {} synchronous_commit={} fsync={} · {} partitions, replication {} · batch {} · {} aggregates · ~{} B {:?} payloads",
            s.postgres.server_version,
            s.postgres.synchronous_commit,
            s.postgres.fsync,
            s.partitions,
            s.replication,
            s.batch_size,
            s.aggregates,
            s.payload_bytes,
            s.payload_kind
        );
        if s.traced {
            let _ = writeln!(
                o,
                "traced rows (a traceparent each) · span export to {}",
                s.span_export.as_deref().unwrap_or("nowhere (off)")
            );
        }
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{:<52} {:>9} {:>9} {:>12}",
            "throughput", "events", "seconds", "per second"
        );
        let row = |o: &mut String, name: &str, n: u64, secs: f64, rate: f64, note: &str| {
            let _ = writeln!(
                o,
                "{name:<52} {n:>9} {secs:>9.2} {:>12}  {note}",
                group(rate)
            );
        };
        if let Some(p) = &self.raw_produce {
            row(
                &mut o,
                "raw produce (idempotent, all in flight)",
                p.messages,
                p.seconds,
                p.msgs_per_s,
                "",
            );
            row(
                &mut o,
                &format!("relay publish path, batches of {} (no DB)", s.batch_size),
                p.messages,
                p.publish_path_seconds,
                p.publish_path_msgs_per_s,
                &format!("{:.1} ms per batch", p.publish_path_ms_per_batch),
            );
        }
        if let Some(d) = &self.raw_db {
            row(
                &mut o,
                "raw db: one INSERT ... SELECT generate_series",
                d.rows,
                d.insert_seconds,
                d.insert_rows_per_s,
                &format!("{:.0} B payloads stored", d.payload_bytes),
            );
            row(
                &mut o,
                "raw db: claim_batch + mark_published (relay SQL)",
                d.rows,
                d.seconds,
                d.rows_per_s,
                &format!(
                    "claim {:.1} ms + mark {:.1} ms per batch",
                    d.claim_ms_per_batch, d.mark_ms_per_batch
                ),
            );
        }
        if let Some(d) = &self.relay_drain {
            let steady = d
                .steady_events_per_s
                .map(|r| format!("steady {}/s", group(r)))
                .unwrap_or_default();
            let halves = match (d.first_half_events_per_s, d.second_half_events_per_s) {
                (Some(a), Some(b)) => format!(", halves {} → {}/s", group(a), group(b)),
                _ => String::new(),
            };
            row(
                &mut o,
                "relay binary draining the backlog",
                d.events,
                d.seconds,
                d.events_per_s,
                &format!("{steady}{halves}"),
            );
        }
        if let Some(n) = &self.naive {
            row(
                &mut o,
                &format!("naive relay (row by row, linger.ms={})", n.linger_ms),
                n.events,
                n.seconds,
                n.events_per_s,
                "",
            );
        }
        if let Some(m) = &self.serial_model {
            let _ = writeln!(
                o,
                "{:<52} {:>9} {:>9} {:>12}  claim {:.0} % · publish {:.0} % · mark {:.0} %",
                "serial model: claim + publish path + mark",
                "",
                "",
                group(m.events_per_s),
                m.claim_share * 100.0,
                m.publish_share * 100.0,
                m.mark_share * 100.0
            );
        }
        // CPU per event, per process: the headline next to the throughput ratios.
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{:<52} {:>9} {:>9} {:>9} {:>9} {:>6}",
            "CPU µs per event", "relay", "postgres", "broker", "bench", "busy"
        );
        let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
        let cpu_row = |o: &mut String, name: &str, c: &crate::cpu::CpuFigures| {
            let _ = writeln!(
                o,
                "{name:<52} {:>9} {:>9} {:>9} {:>9} {:>6}",
                us(c.relay_us_per_event),
                us(c.postgres_us_per_event),
                us(c.broker_us_per_event),
                us(c.bench_us_per_event),
                c.machine_utilisation
                    .map_or("-".to_owned(), |u| format!("{:.0} %", u * 100.0))
            );
        };
        if let Some(p) = &self.raw_produce {
            cpu_row(&mut o, "raw produce (bench is the producer)", &p.cpu);
            cpu_row(
                &mut o,
                "relay publish path (bench runs it)",
                &p.publish_path_cpu,
            );
        }
        if let Some(d) = &self.raw_db {
            cpu_row(&mut o, "raw db: claim + mark (bench is the client)", &d.cpu);
        }
        if let Some(d) = &self.relay_drain {
            cpu_row(&mut o, "relay draining the backlog", &d.cpu);
        }
        let rs = &self.rounds;
        if rs.raw_produce.len() > 1 || rs.relay_drain.len() > 1 || rs.raw_db.len() > 1 {
            let list = |v: &[f64]| v.iter().map(|r| group(*r)).collect::<Vec<_>>().join(", ");
            let _ = writeln!(
                o,
                "rounds (best shown above): produce [{}] · db [{}] · relay [{}]",
                list(&rs.raw_produce),
                list(&rs.raw_db),
                list(&rs.relay_drain)
            );
        }
        let _ = writeln!(o);
        let r = &self.ratios;
        let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.0} %", v * 100.0));
        let _ = writeln!(
            o,
            "{:<52} {:>9}   (target ≥ 60 %)",
            "relay / raw produce",
            pct(r.relay_over_raw_produce)
        );
        let _ = writeln!(
            o,
            "{:<52} {:>9}   (target ≥ 10×)",
            "relay / naive",
            r.relay_over_naive
                .map_or("-".to_owned(), |v| format!("{v:.1}×"))
        );
        let _ = writeln!(
            o,
            "{:<52} {:>9}",
            "relay / raw db",
            pct(r.relay_over_raw_db)
        );

        if let Some(l) = &self.latency {
            let _ = writeln!(o);
            let _ = writeln!(
                o,
                "{:<52} {:>7} {:>7} {:>7} {:>7}",
                format!(
                    "latency, ms: {}/s offered ({} writers, {} s), {:.0}/s achieved",
                    l.offered_per_s, l.writers, l.seconds, l.achieved_per_s
                ),
                "p50",
                "p95",
                "p99",
                "max"
            );
            let prow = |o: &mut String, name: &str, p: &Option<Percentiles>| match p {
                Some(p) => {
                    let _ = writeln!(
                        o,
                        "{name:<52} {:>7.1} {:>7.1} {:>7.1} {:>7.1}",
                        p.p50, p.p95, p.p99, p.max
                    );
                }
                None => {
                    let _ = writeln!(o, "{name:<52} {:>7}", "-");
                }
            };
            prow(
                &mut o,
                "commit → handed to producer (message CreateTime)",
                &l.commit_to_produce_ms,
            );
            let a = &l.commit_to_ack_ms;
            let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
            let _ = writeln!(
                o,
                "{:<52} {:>7} {:>7} {:>7} {:>7}  {} within 50 ms",
                "commit → broker ack (relay histogram, interpolated)",
                f(a.p50),
                f(a.p95),
                f(a.p99),
                "",
                a.within_50ms
                    .map_or("-".to_owned(), |v| format!("{:.2} %", v * 100.0))
            );
            prow(&mut o, "commit → seen by consumer", &l.commit_to_seen_ms);
            for (name, q) in [
                ("claim", &l.stages.claim),
                ("publish: sent → every ack", &l.stages.publish),
                ("mark", &l.stages.mark),
            ] {
                let _ = writeln!(
                    o,
                    "{:<52} {:>7} {:>7} {:>7} {:>7}  {:.0} batches",
                    format!("  relay batch step: {name}"),
                    f(q.p50),
                    f(q.p95),
                    f(q.p99),
                    "",
                    q.count
                );
            }
            let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
            let _ = writeln!(
                o,
                "{:<52} relay {} · postgres {} · broker {} µs per event",
                "CPU under load (with the writers and the consumer)",
                us(l.cpu.relay_us_per_event),
                us(l.cpu.postgres_us_per_event),
                us(l.cpu.broker_us_per_event)
            );
            if let Some(i) = &l.idle {
                let _ = writeln!(
                    o,
                    "{:<52} relay {} · postgres {} · broker {} ms CPU per s",
                    format!("idle, nothing to send ({:.0} s)", i.seconds),
                    us(i.relay_cpu_ms_per_s),
                    us(i.postgres_cpu_ms_per_s),
                    us(i.broker_cpu_ms_per_s)
                );
            }
            prow(
                &mut o,
                "(transaction start → commit, for reference)",
                &l.txn_ms,
            );
            if l.not_seen > 0 {
                let _ = writeln!(
                    o,
                    "!! {} committed events were not seen by the consumer",
                    l.not_seen
                );
            }
        }
        if let Some(i) = &self.isolation {
            isolation_table(&mut o, i);
        }
        if let Some(i) = &self.insert {
            insert_table(&mut o, i);
        }
        if let Some(f) = &self.failures {
            failures_table(&mut o, f);
        }
        if let Some(b) = &self.backlog {
            backlog_table(&mut o, b);
        }
        for g in [&self.sizes, &self.topics].into_iter().flatten() {
            growth_table(&mut o, g);
        }
        if let Some(d) = &self.relay_drain {
            let _ = writeln!(o);
            let range = d.rss_range_kb.map_or("-".to_owned(), |(a, b)| {
                format!("{:.1}–{:.1} MiB", a as f64 / 1024.0, b as f64 / 1024.0)
            });
            let _ = writeln!(
                o,
                "relay memory while draining: peak RSS (VmHWM) {:.1} MiB; RSS sampled every 0.5 s after the first second {range}",
                d.peak_rss_kb as f64 / 1024.0
            );
        }
        for e in &self.errors {
            let _ = writeln!(o, "!! {e}");
        }
        let _ = writeln!(o, "load avg at end {}", s.loadavg.1);
        o
    }
}

fn isolation_table(o: &mut String, i: &IsolationFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<52} {:>12} {:>7}",
        format!(
            "isolation: {} healthy events, A B C C B A",
            group(i.healthy_events as f64)
        ),
        "events/s",
        "ratio"
    );
    let ratio = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    let runs = |v: &[f64]| v.iter().map(|r| group(*r)).collect::<Vec<_>>().join(", ");
    for (name, v, note) in [
        (
            "A: the healthy backlog alone".to_owned(),
            &i.clean,
            String::new(),
        ),
        (
            format!(
                "B: behind {} poisoned aggregates",
                group(i.poisoned_aggregates as f64)
            ),
            &i.poisoned,
            String::new(),
        ),
        (
            format!(
                "C: beside {} suspect aggregates (sent alone)",
                group(i.suspect_aggregates as f64)
            ),
            &i.suspects,
            match (i.suspects.lone_sends, i.suspects.all_seconds_max) {
                (Some((sum, count)), all) => format!(
                    "; lone sends {sum:.0} in {count:.0} batches{}",
                    all.map_or(String::new(), |a| format!(", all out within {a:.1} s"))
                ),
                (None, _) => "; no lone-send metric".to_owned(),
            },
        ),
    ] {
        let _ = writeln!(
            o,
            "{name:<52} {:>12} {:>7}  runs {}{note}",
            group(v.events_per_s),
            ratio(v.over_clean),
            runs(&v.runs_events_per_s)
        );
    }
    let left: Vec<String> = i
        .runs
        .iter()
        .filter(|r| r.variant == "poisoned")
        .filter_map(|r| r.front_rows_left)
        .map(|n| n.to_string())
        .collect();
    if !left.is_empty() {
        let _ = writeln!(
            o,
            "  (B: poisoned rows left in the outbox at the end: {} of {})",
            left.join(", "),
            3 * i.poisoned_aggregates
        );
    }
}

fn insert_table(o: &mut String, i: &InsertFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<52} {:>10} {:>10} {:>10} {:>12}",
        format!(
            "insert: {} writers, 1-row transactions, {} s, A B B A",
            i.writers, i.seconds_per_run
        ),
        "inserts/s",
        "µs/insert",
        "latency µs",
        "PG CPU µs"
    );
    let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    for (name, s) in [
        ("A: per-aggregate lock on (default)", &i.locked),
        ("B: SET outbox.aggregate_lock = 'off'", &i.unlocked),
    ] {
        let _ = writeln!(
            o,
            "{name:<52} {:>10} {:>10.1} {:>10.0} {:>12}",
            group(s.inserts_per_s),
            s.us_per_insert,
            s.latency_us,
            us(s.postgres_us_per_insert)
        );
    }
    let _ = writeln!(
        o,
        "{:<52} {:>10.2} {:>+10.1} {:>10} {:>12}  (A over B; lock's cost per insert)",
        "lock on / off",
        i.locked_over_unlocked,
        i.lock_us_per_insert,
        "",
        i.lock_postgres_us_per_insert
            .map_or("-".to_owned(), |v| format!("{v:+.1}"))
    );
    let b = &i.bulk;
    let locked = match (b.locked_seconds, &b.locked_error) {
        (Some(s), _) => format!(
            "{s:.2} s locked, {:.2} s off ({:.2}×)",
            b.unlocked_seconds,
            s / b.unlocked_seconds.max(1e-9)
        ),
        (None, e) => format!(
            "locked failed ({}), {:.2} s off",
            e.as_deref().unwrap_or("?"),
            b.unlocked_seconds
        ),
    };
    let _ = writeln!(
        o,
        "bulk INSERT ... SELECT of {} rows over {} aggregates: {locked}",
        group(b.rows as f64),
        group(b.aggregates as f64)
    );
}

fn failures_table(o: &mut String, f: &FailuresFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<52} {:>9} {:>16} {:>16} {:>7} {:>14}",
        format!(
            "failures: claim of {} rows, median of {}, ms",
            group(f.batch_size as f64),
            f.repeats
        ),
        "off",
        "hashed (main)",
        "probed (new)",
        "view",
        "main's read"
    );
    let cell = |c: &ClaimTiming| {
        if c.skipped {
            format!("(> {} s)", f.timeout_s)
        } else if c.timed_out && c.ms.is_empty() {
            format!("over {} s", f.timeout_s)
        } else {
            match (c.median_ms, c.over_off) {
                (Some(m), Some(r)) if c.filter != "off" => format!("{m:.1} ({r:.1}×)"),
                (Some(m), _) => format!("{m:.1}"),
                (None, _) => "-".to_owned(),
            }
        }
    };
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    for s in &f.sizes {
        let _ = writeln!(
            o,
            "{:<52} {:>9} {:>16} {:>16} {:>7} {:>14}",
            format!(
                "{} failure rows (half parked)",
                group(s.failure_rows as f64)
            ),
            cell(&s.claims[0]),
            cell(&s.claims[1]),
            cell(&s.claims[2]),
            ms(s.view_ms),
            format!("{} ({} rows)", ms(s.main_read_ms), s.main_read_rows)
        );
    }
    let _ = writeln!(
        o,
        "  ({} outbox rows; statement_timeout {} s; work_mem {}; view = Store::failure_view, main's read = every retrying row)",
        group(f.outbox_rows as f64),
        f.timeout_s,
        f.work_mem
    );
}

fn backlog_table(o: &mut String, b: &BacklogFigures) {
    let d = &b.drain;
    let _ = writeln!(o);
    let halves = match (d.first_half_events_per_s, d.second_half_events_per_s) {
        (Some(a), Some(c)) => format!(", halves {} → {}/s", group(a), group(c)),
        _ => String::new(),
    };
    let _ = writeln!(
        o,
        "backlog: {} events (inserted in {:.0} s), --lease-ttl-ms {}: drained in {:.1} s, {}/s{halves}",
        group(d.events as f64),
        d.insert_seconds,
        b.lease_ttl_ms,
        d.seconds,
        group(d.events_per_s)
    );
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let _ = writeln!(
        o,
        "  side claim of a batch every {} s, ms: first {}, median {}, last full {}, max {} ({} claims)",
        b.probe_every_s,
        ms(b.claim_ms_first),
        ms(b.claim_ms_median),
        ms(b.claim_ms_last_full),
        ms(b.claim_ms_max),
        d.probes.len()
    );
    let _ = writeln!(
        o,
        "  leadership: lease epochs seen {:?} ({} changes), \"Lost the relay lease\" logged {} times",
        d.lease_epochs, b.lease_changes, d.lease_lost_logged
    );
}

/// `262144` → `256 KiB`, `1000` → `1000 B`.
pub fn bytes_label(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

fn growth_table(o: &mut String, g: &GrowthFigures) {
    let _ = writeln!(o);
    let budget = g.budget_bytes.map_or(String::new(), |b| {
        format!(", ≤ {} MB of payload a run", group(b as f64 / 1e6))
    });
    let _ = writeln!(
        o,
        "{:<28} {:>8} {:>10} {:>8} {:>10} {:>8} {:>6} | {:>6} {:>6} {:>6} | {:>6} {:>6} {:>6}",
        format!("{}{budget}", g.phase),
        "events",
        "raw/s",
        "MB/s",
        "relay/s",
        "MB/s",
        "ratio",
        "relay",
        "pg",
        "broker",
        "prod.",
        "broker",
        "×prod"
    );
    let f = |v: Option<f64>, p: usize| v.map_or("-".to_owned(), |v| format!("{v:.p$}"));
    for p in &g.points {
        let name = if g.phase == "sizes" {
            format!("{} payloads", bytes_label(p.payload_bytes))
        } else {
            format!(
                "{} topic{}",
                group(p.topics as f64),
                if p.topics == 1 { "" } else { "s" }
            )
        };
        let raw = p.raw.as_ref();
        let relay = p.relay.as_ref();
        let _ = writeln!(
            o,
            "{name:<28} {:>8} {:>10} {:>8} {:>10} {:>8} {:>6} | {:>6} {:>6} {:>6} | {:>6} {:>6} {:>6}",
            group(p.events as f64),
            raw.map_or("-".to_owned(), |r| group(r.msgs_per_s)),
            f(raw.map(|r| r.mb_per_s), 1),
            relay.map_or("-".to_owned(), |r| group(r.events_per_s)),
            f(relay.map(|r| r.mb_per_s), 1),
            p.relay_over_raw
                .map_or("-".to_owned(), |v| format!("{:.0} %", v * 100.0)),
            f(relay.and_then(|r| r.cpu.relay_us_per_event), 1),
            f(relay.and_then(|r| r.cpu.postgres_us_per_event), 1),
            f(relay.and_then(|r| r.cpu.broker_us_per_event), 1),
            f(raw.and_then(|r| r.cpu.bench_us_per_event), 1),
            f(raw.and_then(|r| r.cpu.broker_us_per_event), 1),
            f(p.relay_cpu_over_producer_cpu, 1),
        );
    }
    let _ = writeln!(
        o,
        "  (CPU µs per event: relay run | raw produce run, prod. = the bench's producer; ×prod = relay process over the bare producer; ratio = relay / raw events per s)"
    );
}

/// `1234567.8` → `1 234 568`.
pub fn group(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::growth::GrowthPoint;
    use crate::workload::{PayloadKind, Workload};

    #[test]
    fn growth_rows_show_rates_ratios_and_cpu() {
        let w = Workload::new(10, 262_144, PayloadKind::Json);
        let raw = crate::produce::RawProduce {
            messages: 976,
            payload_bytes: 255_852_544,
            topics: 1,
            seconds: 2.0,
            msgs_per_s: 488.0,
            mb_per_s: 127.9,
            cpu: crate::cpu::CpuFigures {
                bench_us_per_event: Some(100.0),
                broker_us_per_event: Some(300.0),
                ..Default::default()
            },
        };
        let relay = crate::growth::RelaySide {
            seconds: 4.0,
            events_per_s: 244.0,
            steady_events_per_s: None,
            mb_per_s: 64.0,
            avg_batch_rows: Some(256.0),
            peak_rss_kb: 90_000,
            insert_seconds: 3.0,
            cpu: crate::cpu::CpuFigures {
                relay_us_per_event: Some(250.0),
                postgres_us_per_event: Some(400.0),
                broker_us_per_event: Some(310.0),
                ..Default::default()
            },
            relay_log: String::new(),
        };
        let g = GrowthFigures {
            phase: "sizes",
            budget_bytes: Some(256_000_000),
            points: vec![
                GrowthPoint::new(&w, 976, 255_852_544, Some(raw), Some(relay), vec![]),
                GrowthPoint::new(
                    &Workload {
                        payload_bytes: 100,
                        ..w
                    },
                    200_000,
                    0,
                    None,
                    None,
                    vec!["raw produce: down".into()],
                ),
            ],
        };
        let mut o = String::new();
        growth_table(&mut o, &g);
        let lines: Vec<&str> = o.lines().collect();
        assert!(
            lines[1].starts_with("sizes, ≤ 256 MB of payload a run"),
            "{o}"
        );
        let big = lines[2];
        assert!(big.starts_with("256 KiB payloads"), "{o}");
        for cell in [
            "976", "488", "127.9", "244", "64.0", "250.0", "400.0", "2.5",
        ] {
            assert!(big.split_whitespace().any(|c| c == cell), "{cell} in {big}");
        }
        assert!(big.contains(" 50 % |"), "{big}");
        assert!(
            lines[3].starts_with("100 B payloads") && lines[3].contains(" - "),
            "{o}"
        );
        let t = GrowthFigures {
            phase: "topics",
            budget_bytes: None,
            points: vec![GrowthPoint::new(
                &Workload { topics: 1_000, ..w },
                1,
                0,
                None,
                None,
                vec![],
            )],
        };
        let mut o = String::new();
        growth_table(&mut o, &t);
        assert!(o.lines().nth(2).unwrap().starts_with("1 000 topics"), "{o}");
    }

    #[test]
    fn byte_labels() {
        assert_eq!(bytes_label(100), "100 B");
        assert_eq!(bytes_label(1_024), "1 KiB");
        assert_eq!(bytes_label(16_384), "16 KiB");
        assert_eq!(bytes_label(262_144), "256 KiB");
        assert_eq!(bytes_label(1_000), "1000 B");
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(group(1_234_567.8), "1 234 568");
        assert_eq!(group(999.0), "999");
        assert_eq!(group(0.2), "0");
    }
}
