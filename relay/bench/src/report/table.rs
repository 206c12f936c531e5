//! The headline table: the settings of the run, throughput of the raw limits and the relay,
//! CPU per event, the ratios, and latency under load; then the phases' own tables.

use std::fmt::Write as _;

use super::comparisons::{debezium_table, transactions_table};
use super::format::group;
use super::phases::{
    backlog_table, failures_table, growth_table, insert_table, isolation_table, parked_table,
};
use super::Report;
use crate::stats::Percentiles;

impl Report {
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
        if let Some(c) = &self.debezium_copy {
            super::phases::debezium_copy_table(&mut o, c);
        }
        if let Some(f) = &self.failures {
            failures_table(&mut o, f);
        }
        if let Some(b) = &self.backlog {
            backlog_table(&mut o, b);
        }
        if let Some(p) = &self.parked {
            parked_table(&mut o, p);
        }
        for g in [&self.sizes, &self.topics].into_iter().flatten() {
            growth_table(&mut o, g);
        }
        if let Some(t) = &self.transactions {
            transactions_table(&mut o, t, s);
        }
        if let Some(c) = &self.curve {
            super::phases::curve_table(&mut o, c);
        }
        if let Some(t) = &self.tail {
            super::phases::tail_table(&mut o, t);
        }
        if let Some(r) = &self.relays {
            super::phases::relays_table(&mut o, r);
        }
        if let Some(d) = &self.debezium {
            debezium_table(&mut o, d);
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
