//! The tables of the phases that compare two ways of publishing the same events: the relay's
//! `--transactions` off and on, and Debezium beside the relay.

use std::fmt::Write as _;

use super::format::group;
use super::Settings;
use crate::drain::DrainFigures;
use crate::transactions::{LatencyRound, TransactionsFigures, TxVariant};

/// A figure with `p` decimals (0: digits grouped), `-` when absent.
fn figure(v: Option<f64>, p: usize) -> String {
    match (v, p) {
        (Some(v), 0) => group(v),
        (Some(v), p) => format!("{v:.p$}"),
        (None, _) => "-".to_owned(),
    }
}

/// A row of the `transactions` table: name, the figure of a variant, the ratio on / off,
/// decimals (0: digits grouped).
type TxRow<'a> = (
    String,
    &'a dyn Fn(&TxVariant) -> Option<f64>,
    Option<f64>,
    usize,
);

pub(super) fn transactions_table(o: &mut String, t: &TransactionsFigures, s: &Settings) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<56} {:>9} {:>9} {:>7}",
        format!(
            "transactions: relay --transactions off / on, {} round{} ({})",
            t.rounds,
            if t.rounds == 1 { "" } else { "s" },
            t.order.join(" ")
        ),
        "off",
        "on",
        "on/off"
    );
    let f = figure;
    let drain =
        |g: fn(&DrainFigures) -> Option<f64>| move |v: &TxVariant| v.drain.as_ref().and_then(g);
    let lat = |g: fn(&LatencyRound) -> Option<f64>| {
        move |v: &TxVariant| v.latency_round().as_ref().and_then(g)
    };
    let r = &t.ratios;
    let rows: [TxRow; 8] = [
        (
            format!(
                "drain of {} events, events/s (best round)",
                group(s.sizes.events as f64)
            ),
            &drain(|d| Some(d.events_per_s)),
            r.drain_events_per_s,
            0,
        ),
        (
            "  relay CPU µs per event".to_owned(),
            &drain(|d| d.cpu.relay_us_per_event),
            r.drain_relay_us_per_event,
            2,
        ),
        (
            "  postgres CPU µs per event".to_owned(),
            &drain(|d| d.cpu.postgres_us_per_event),
            r.drain_postgres_us_per_event,
            2,
        ),
        (
            format!(
                "latency at {}/s for {} s: commit → ack p50, ms",
                group(s.load_rate as f64),
                s.sizes.load_seconds
            ),
            &lat(|l| l.ack_p50_ms),
            r.ack_p50,
            1,
        ),
        (
            "  commit → ack p99, ms (relay histogram)".to_owned(),
            &lat(|l| l.ack_p99_ms),
            r.ack_p99,
            1,
        ),
        (
            "  commit → seen p50, ms (read_committed consumer)".to_owned(),
            &lat(|l| l.seen_p50_ms),
            r.seen_p50,
            1,
        ),
        (
            "  commit → seen p99, ms".to_owned(),
            &lat(|l| l.seen_p99_ms),
            r.seen_p99,
            1,
        ),
        (
            "  relay CPU µs per event under the load".to_owned(),
            &lat(|l| l.relay_us_per_event),
            r.latency_relay_us_per_event,
            1,
        ),
    ];
    for (name, figure, ratio, p) in rows {
        let _ = writeln!(
            o,
            "{name:<56} {:>9} {:>9} {:>7}",
            f(figure(&t.off), p),
            f(figure(&t.on), p),
            f(ratio, 2)
        );
    }
    for v in [&t.off, &t.on] {
        let drains: Vec<String> = v
            .drain_rounds_events_per_s
            .iter()
            .zip(&v.drain_rounds_relay_us_per_event)
            .map(|(e, c)| format!("{}/s {} µs", group(*e), f(*c, 2)))
            .collect();
        let lats: Vec<String> = v
            .latency_rounds
            .iter()
            .map(|l| {
                format!(
                    "ack {}/{} seen {}/{}",
                    f(l.ack_p50_ms, 1),
                    f(l.ack_p99_ms, 1),
                    f(l.seen_p50_ms, 1),
                    f(l.seen_p99_ms, 1)
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "  {:<3} rounds: drain [{}] · latency p50/p99 ms [{}]",
            v.variant,
            drains.join(", "),
            lats.join(", ")
        );
        let not_seen: u64 = v.latency_rounds.iter().map(|l| l.not_seen).sum();
        if not_seen > 0 {
            let _ = writeln!(
                o,
                "!! {not_seen} committed events not seen by the consumer ({})",
                v.variant
            );
        }
    }
    let _ = writeln!(
        o,
        "  (best drain round and lowest-p99 latency round shown; off / on = the relay arguments plus {} / {}; with transactions both the ack histogram and \"seen\" include the commit)",
        crate::transactions::TRANSACTIONS_OFF,
        crate::transactions::TRANSACTIONS_ON
    );
}

/// The `debezium` phase: Debezium and the relay side by side, and relay / Debezium.
pub(super) fn debezium_table(o: &mut String, d: &crate::debezium::DebeziumFigures) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<58} {:>10} {:>10} {:>8}",
        format!(
            "debezium: {} events, {} aggregates, ~{} B, {}",
            group(d.events as f64),
            group(d.aggregates as f64),
            d.payload_bytes,
            d.converters
        ),
        "Debezium",
        "relay",
        "relay/D"
    );
    type Get = fn(&crate::debezium::Side) -> Option<f64>;
    let rows: [(&str, Get, usize); 13] = [
        ("drain, events/s", |s| s.drain_events_per_s, 0),
        (
            "drain CPU µs/event: publisher (JVM | relay)",
            |s| s.drain_cpu.and_then(|c| c.relay_us_per_event),
            2,
        ),
        (
            "drain CPU µs/event: PostgreSQL",
            |s| s.drain_cpu.and_then(|c| c.postgres_us_per_event),
            2,
        ),
        (
            "drain CPU µs/event: both",
            |s| s.drain_total_us_per_event,
            2,
        ),
        (
            "drain CPU µs/event: publisher's own PG backends",
            |s| s.drain_backends_us_per_event,
            2,
        ),
        (
            "drain CPU µs/event: publisher + own backends",
            |s| Some(s.drain_cpu?.relay_us_per_event? + s.drain_backends_us_per_event?),
            2,
        ),
        (
            "load: commit → seen p50, ms",
            |s| s.commit_to_seen_ms.map(|p| p.p50),
            1,
        ),
        (
            "load: commit → seen p99, ms",
            |s| s.commit_to_seen_ms.map(|p| p.p99),
            1,
        ),
        (
            "load: CPU µs/event: publisher",
            |s| s.load_cpu.and_then(|c| c.relay_us_per_event),
            1,
        ),
        (
            "load: CPU µs/event: PostgreSQL",
            |s| s.load_cpu.and_then(|c| c.postgres_us_per_event),
            1,
        ),
        ("load: CPU µs/event: both", |s| s.load_total_us_per_event, 1),
        (
            "load: CPU µs/event: publisher + own backends",
            |s| Some(s.load_cpu?.relay_us_per_event? + s.load_backends_us_per_event?),
            1,
        ),
        (
            "peak RSS of the publisher, MiB",
            |s| s.peak_rss_kb.map(|k| k as f64 / 1024.0),
            1,
        ),
    ];
    let f = figure;
    for (name, get, p) in rows {
        let (a, b) = (get(&d.debezium), get(&d.relay));
        let ratio = a.zip(b).map(|(a, b)| b / a);
        let _ = writeln!(
            o,
            "  {:<56} {:>10} {:>10} {:>8}",
            if name.starts_with("load") {
                format!("{name} ({} ev/s, {} s)", d.rate, d.seconds)
            } else {
                name.to_owned()
            },
            f(a, p),
            f(b, p),
            f(ratio, 2)
        );
    }
    let _ = writeln!(
        o,
        "  (not seen under load: Debezium {}, relay {}; PostgreSQL = the whole server, writers included; own backends = Debezium's WAL sender, the relay's connections; Debezium options: {})",
        d.debezium.not_seen,
        d.relay.not_seen,
        if d.debezium_config.is_empty() {
            "its defaults".to_owned()
        } else {
            d.debezium_config
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
}
