//! The tables of the phases beside the headline run: failure isolation, the insert lock,
//! claims over a large failure table, a parked aggregate's backlog, a large backlog, growth with
//! payload size and topics. (The relay's `--transactions` off and on, and Debezium beside the
//! relay, are `comparisons`.)

use std::fmt::Write as _;

use super::format::{bytes_label, group};
use crate::backlog::BacklogFigures;
use crate::failures::{ClaimTiming, FailuresFigures};
use crate::growth::GrowthFigures;
use crate::insert::InsertFigures;
use crate::isolation::IsolationFigures;

pub(super) fn isolation_table(o: &mut String, i: &IsolationFigures) {
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

pub(super) fn insert_table(o: &mut String, i: &InsertFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<52} {:>10} {:>10} {:>10} {:>12}",
        format!(
            "insert: {} writers, 1-row transactions, {} s, A B C C B A",
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
        (
            "B: outbox_aggregate_lock_off() in each transaction",
            &i.unlocked,
        ),
        ("C: lock on, the first release's trigger", &i.first_trigger),
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
    let _ = writeln!(
        o,
        "{:<52} {:>10} {:>+10.1} {:>10} {:>12}  (A over C; the trigger's later checks)",
        "checks on / first trigger",
        format!(
            "{:.2}",
            i.locked.inserts_per_s / i.first_trigger.inserts_per_s.max(1e-9)
        ),
        i.checks_us_per_insert,
        "",
        i.checks_postgres_us_per_insert
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

pub(super) fn failures_table(o: &mut String, f: &FailuresFigures) {
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

/// The `parked` phase: healthy latency with and without a parked aggregate's backlog.
pub(super) fn parked_table(o: &mut String, p: &crate::parked::ParkedFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "parked: one parked event, {} events of its aggregate behind it (inserted in {:.1} s)",
        group(p.behind as f64),
        p.insert_seconds
    );
    let _ = writeln!(
        o,
        "{:<52} {:>9} {:>9} {:>9} {:>7}",
        "commit → published, ms", "p50", "p99", "max", "n"
    );
    for (name, v) in [
        ("without the backlog", &p.without_ms),
        ("with the backlog", &p.with_ms),
    ] {
        let _ = writeln!(
            o,
            "{name:<52} {:>9.2} {:>9.2} {:>9.2} {:>7}",
            v.p50, v.p99, v.max, v.count
        );
    }
    let _ = writeln!(
        o,
        "{:<52} {:>9.2} {:>9.2}",
        "with / without", p.p50_ratio, p.p99_ratio
    );
    let _ = writeln!(
        o,
        "first event after the backlog's insert: {:.1} ms (the claims until the floor is set read the whole backlog)",
        p.first_after_backlog_ms
    );
}

pub(super) fn backlog_table(o: &mut String, b: &BacklogFigures) {
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

pub(super) fn growth_table(o: &mut String, g: &GrowthFigures) {
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

pub(super) fn debezium_copy_table(o: &mut String, c: &crate::debezium_copy::CopyFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<52} {:>10} {:>12}",
        format!(
            "debezium-copy: {} writers, 1-row transactions, {} s, A B B A",
            c.writers, c.seconds_per_run
        ),
        "inserts/s",
        "PG CPU µs"
    );
    let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    for (name, s) in [
        ("A: Debezium table with the relay's copy trigger", &c.copy),
        ("B: the same table without it", &c.no_copy),
    ] {
        let _ = writeln!(
            o,
            "{name:<52} {:>10} {:>12}",
            group(s.inserts_per_s),
            us(s.postgres_us_per_insert)
        );
    }
    let _ = writeln!(
        o,
        "{:<52} {:>10.2} {:>12}  (A over B)",
        "copy / no copy",
        c.rate_ratio,
        c.postgres_cpu_ratio
            .map_or("-".to_owned(), |v| format!("{v:.2}"))
    );
}

pub(super) fn tail_table(o: &mut String, t: &crate::tail::TailFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<30} {:>12} {:>12} {:>12} {:>12}",
        "tail: commit → seen, ms", "p50", "p99", "relay µs/ev", "not seen"
    );
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let runs = t
        .fresh
        .iter()
        .map(|r| ("fresh table", r))
        .chain(t.drained.iter().map(|r| ("after draining the backlog", r)));
    for (name, r) in runs {
        let _ = writeln!(
            o,
            "{:<30} {:>12} {:>12} {:>12} {:>12}",
            name,
            f(r.seen_p50_ms),
            f(r.seen_p99_ms),
            f(r.relay_us_per_event),
            r.not_seen
        );
    }
    let _ = writeln!(
        o,
        "  fresh p99 highest / lowest {} (target ≤ 2); drained / fresh median p99 {} (target ≤ 2); backlog {} events",
        t.fresh_p99_spread.map_or("-".to_owned(), |v| format!("{v:.2}")),
        t.drained_over_fresh_p99
            .map_or("-".to_owned(), |v| format!("{v:.2}")),
        group(t.drained_events as f64)
    );
}

pub(super) fn curve_table(o: &mut String, c: &crate::curve::CurveFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<30} {:>10} {:>12} {:>12} {:>9} {:>9}",
        "curve: offered load", "events/s", "relay µs/ev", "PG µs/ev", "p50 ms", "p99 ms"
    );
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
    for p in &c.points {
        let _ = writeln!(
            o,
            "{:<30} {:>10} {:>12} {:>12} {:>9} {:>9}",
            crate::curve::name(p),
            group(p.achieved_per_s),
            f(p.relay_us_per_event, 1),
            f(p.postgres_us_per_event, 1),
            f(p.seen_p50_ms, 1),
            f(p.seen_p99_ms, 1)
        );
        if p.not_seen > 0 {
            let _ = writeln!(
                o,
                "!! {} committed events not seen by the consumer",
                p.not_seen
            );
        }
    }
    for r in &c.rises {
        let _ = writeln!(o, "!! the relay's cost per event rose: {r}");
    }
    let _ = writeln!(
        o,
        "  (commit → seen by a read_committed consumer; PostgreSQL: the whole server's CPU, the writers' inserts included)"
    );
}

pub(super) fn relays_table(o: &mut String, r: &crate::relays::RelaysFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<30} {:>10} {:>10} {:>12} {:>12}  published by each",
        "relays: draining", "events/s", "× 1 relay", "relay µs/ev", "PG µs/ev"
    );
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
    let base = r.points.first().and_then(|p| p.events_per_s);
    for p in &r.points {
        let _ = writeln!(
            o,
            "{:<30} {:>10} {:>10} {:>12} {:>12}  {}",
            format!(
                "{} relay{}, {} bucket{}",
                p.relays,
                if p.relays == 1 { "" } else { "s" },
                p.buckets,
                if p.buckets == 1 { "" } else { "s" }
            ),
            p.events_per_s.map_or("-".to_owned(), group),
            f(p.events_per_s.zip(base).map(|(a, b)| a / b), 2),
            f(p.relay_us_per_event, 1),
            f(p.postgres_us_per_event, 1),
            p.published_per_relay
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" / ")
        );
    }
    let _ = writeln!(
        o,
        "  ({} events each, best of {} round(s); relay CPU: every relay process together)",
        group(r.events as f64),
        r.points.first().map_or(0, |p| p.rounds_events_per_s.len())
    );
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
}
