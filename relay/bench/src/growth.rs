//! Phases `sizes` and `topics` (how the cost grows; `topics` is opt-in): the raw producer and
//! the release relay draining the same events, at each payload size (100 B to 256 KiB,
//! incompressible padding, event counts scaled so that each run moves a bounded number of
//! bytes) and over 1, 100 and 1 000 topics (one aggregate type per topic). Each point reports
//! CPU per event of the relay, PostgreSQL and the broker, and its ratios to the raw produce of
//! the same point, measured just before it in the same invocation.

use serde::Serialize;

use crate::cpu::CpuFigures;
use crate::drain::{self, DrainSpec};
use crate::infra::Infra;
use crate::produce::{self, RawProduce};
use crate::workload::{Front, Padding, Workload};

/// The events of a `sizes` run at `payload_bytes`: as many as move `budget_bytes` of payload,
/// at most `base`, at least `floor` (both capped by `base`).
pub fn events_for_size(base: u64, payload_bytes: u64, budget_bytes: u64, floor: u64) -> u64 {
    (budget_bytes / payload_bytes.max(1))
        .min(base)
        .max(floor.min(base))
}

/// The relay's side of one point.
#[derive(Debug, Clone, Serialize)]
pub struct RelaySide {
    /// Seconds from starting the relay until the outbox was empty.
    pub seconds: f64,
    /// Events per second over that time.
    pub events_per_s: f64,
    /// Events per second from the first marked batch (start-up excluded).
    pub steady_events_per_s: Option<f64>,
    /// Payload megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Average rows per batch (`outbox_batch_rows`; `--batch-max-bytes` caps large payloads).
    pub avg_batch_rows: Option<f64>,
    /// Peak resident set size of the relay, KiB.
    pub peak_rss_kb: u64,
    /// Seconds of inserting the backlog (not timed).
    pub insert_seconds: f64,
    /// CPU: the relay process, PostgreSQL, the broker.
    pub cpu: CpuFigures,
    /// The relay's log.
    pub relay_log: String,
}

/// One payload size or topic count.
#[derive(Debug, Clone, Serialize)]
pub struct GrowthPoint {
    /// Target payload size, bytes.
    pub payload_bytes: u64,
    /// Topics.
    pub topics: u64,
    /// Events of each run.
    pub events: u64,
    /// Payload bytes of each run.
    pub bytes: u64,
    /// The raw producer over the same events and topics.
    pub raw: Option<RawProduce>,
    /// The relay draining them.
    pub relay: Option<RelaySide>,
    /// Relay events/s over raw produce msgs/s.
    pub relay_over_raw: Option<f64>,
    /// Relay process CPU per event over the raw producer's (relay-bench's) CPU per event.
    pub relay_cpu_over_producer_cpu: Option<f64>,
    /// Broker CPU per event under the relay over broker CPU per event under the raw producer.
    pub broker_cpu_over_raw: Option<f64>,
    /// What failed at this point.
    pub errors: Vec<String>,
}

impl GrowthPoint {
    /// A point from its two runs, with the ratios.
    pub fn new(
        w: &Workload,
        events: u64,
        bytes: u64,
        raw: Option<RawProduce>,
        relay: Option<RelaySide>,
        errors: Vec<String>,
    ) -> Self {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let (r, d) = (raw.as_ref(), relay.as_ref());
        Self {
            payload_bytes: w.payload_bytes,
            topics: w.topics,
            events,
            bytes,
            relay_over_raw: ratio(d.map(|d| d.events_per_s), r.map(|r| r.msgs_per_s)),
            relay_cpu_over_producer_cpu: ratio(
                d.and_then(|d| d.cpu.relay_us_per_event),
                r.and_then(|r| r.cpu.bench_us_per_event),
            ),
            broker_cpu_over_raw: ratio(
                d.and_then(|d| d.cpu.broker_us_per_event),
                r.and_then(|r| r.cpu.broker_us_per_event),
            ),
            raw,
            relay,
            errors,
        }
    }
}

/// Figures of a growth phase.
#[derive(Debug, Clone, Serialize)]
pub struct GrowthFigures {
    /// `sizes` or `topics`.
    pub phase: &'static str,
    /// Payload budget of each run, bytes (`sizes`).
    pub budget_bytes: Option<u64>,
    /// The points, in the order run.
    pub points: Vec<GrowthPoint>,
}

/// Raw produce then relay drain of `events` events of `w`; failures are noted in the point.
async fn point(infra: &Infra, w: &Workload, events: u64, base: &DrainSpec<'_>) -> GrowthPoint {
    let label = format!("{}b{}t", w.payload_bytes, w.topics);
    let mut errors = Vec::new();
    let bytes: u64 = (1..=events).map(|i| w.payload(i).len() as u64).sum();
    eprintln!(
        "[relay-bench]   {} events of ~{} B over {} topics ({:.0} MB) ...",
        events,
        w.payload_bytes,
        w.topics,
        bytes as f64 / 1e6
    );
    let raw = match produce::raw(infra, w, events, &format!("raw{label}")).await {
        Ok(r) => Some(r),
        Err(e) => {
            errors.push(format!("raw produce: {e:#}"));
            None
        }
    };
    let spec = DrainSpec {
        events,
        label: &label,
        front: Front::None,
        chunk: None,
        probe_every: None,
        relays: 1,
        buckets: None,
        warm: false,
        ..base.clone()
    };
    let relay = match drain::run(infra, w, &spec).await {
        Ok(d) => {
            infra.delete_topics(&w.topic_names(&d.topic_prefix)).await;
            Some(RelaySide {
                seconds: d.seconds,
                events_per_s: d.events_per_s,
                steady_events_per_s: d.steady_events_per_s,
                mb_per_s: bytes as f64 / d.seconds / 1e6,
                avg_batch_rows: d.avg_batch_rows,
                peak_rss_kb: d.peak_rss_kb,
                insert_seconds: d.insert_seconds,
                cpu: d.cpu,
                relay_log: d.relay_log,
            })
        }
        Err(e) => {
            errors.push(format!("relay drain: {e:#}"));
            None
        }
    };
    for e in &errors {
        eprintln!("[relay-bench]   {label}: {e}");
    }
    let p = GrowthPoint::new(w, events, bytes, raw, relay, errors);
    // Each point as it comes, so a run cut short still tells something.
    let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    eprintln!(
        "[relay-bench]   {label}: raw {}/s, relay {}/s ({}), relay {} · postgres {} · broker {} µs/event",
        p.raw.as_ref().map_or("-".to_owned(), |r| format!("{:.0}", r.msgs_per_s)),
        p.relay.as_ref().map_or("-".to_owned(), |r| format!("{:.0}", r.events_per_s)),
        p.relay_over_raw.map_or("-".to_owned(), |v| format!("{:.0} %", v * 100.0)),
        us(p.relay.as_ref().and_then(|r| r.cpu.relay_us_per_event)),
        us(p.relay.as_ref().and_then(|r| r.cpu.postgres_us_per_event)),
        us(p.relay.as_ref().and_then(|r| r.cpu.broker_us_per_event)),
    );
    p
}

/// Phase `sizes`: each payload size of `sizes_bytes`, incompressible padding, one topic.
///
/// # Errors
/// None of its own: a failed point is reported in its `errors`.
pub async fn sizes(
    infra: &Infra,
    w: &Workload,
    base: &DrainSpec<'_>,
    sizes_bytes: &[u64],
    budget_bytes: u64,
    floor: u64,
) -> anyhow::Result<GrowthFigures> {
    let mut points = Vec::new();
    for &size in sizes_bytes {
        let ws = Workload {
            payload_bytes: size,
            padding: Padding::Random,
            topics: 1,
            ..*w
        };
        let events = events_for_size(base.events, size, budget_bytes, floor);
        points.push(point(infra, &ws, events, base).await);
    }
    Ok(GrowthFigures {
        phase: "sizes",
        budget_bytes: Some(budget_bytes),
        points,
    })
}

/// Phase `topics`: the drain's events spread over each topic count of `counts`.
///
/// # Errors
/// None of its own: a failed point is reported in its `errors`.
pub async fn topics(
    infra: &Infra,
    w: &Workload,
    base: &DrainSpec<'_>,
    counts: &[u64],
) -> anyhow::Result<GrowthFigures> {
    let mut points = Vec::new();
    for &topics in counts {
        let wt = Workload {
            topics: topics.max(1),
            ..*w
        };
        points.push(point(infra, &wt, base.events, base).await);
    }
    Ok(GrowthFigures {
        phase: "topics",
        budget_bytes: None,
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PayloadKind;

    #[test]
    fn large_payloads_get_fewer_events() {
        let mb = 1_000_000;
        assert_eq!(events_for_size(200_000, 100, 256 * mb, 100), 200_000);
        assert_eq!(events_for_size(200_000, 1024, 256 * mb, 100), 200_000);
        assert_eq!(events_for_size(200_000, 16 << 10, 256 * mb, 100), 15_625);
        assert_eq!(events_for_size(200_000, 256 << 10, 256 * mb, 100), 976);
        // The floor wins over the budget, the base over the floor.
        assert_eq!(events_for_size(200_000, 256 << 10, mb, 100), 100);
        assert_eq!(events_for_size(50, 256 << 10, mb, 100), 50);
        assert_eq!(events_for_size(50, 0, mb, 100), 50);
    }

    fn raw(rate: f64, bench_us: f64, broker_us: f64) -> RawProduce {
        RawProduce {
            messages: 1000,
            payload_bytes: 100_000,
            topics: 1,
            seconds: 1000.0 / rate,
            msgs_per_s: rate,
            mb_per_s: 0.1,
            cpu: CpuFigures {
                bench_us_per_event: Some(bench_us),
                broker_us_per_event: Some(broker_us),
                ..CpuFigures::default()
            },
        }
    }

    pub(crate) fn relay(rate: f64, relay_us: f64, broker_us: f64) -> RelaySide {
        RelaySide {
            seconds: 1000.0 / rate,
            events_per_s: rate,
            steady_events_per_s: None,
            mb_per_s: 0.05,
            avg_batch_rows: Some(500.0),
            peak_rss_kb: 20_000,
            insert_seconds: 0.1,
            cpu: CpuFigures {
                relay_us_per_event: Some(relay_us),
                postgres_us_per_event: Some(6.0),
                broker_us_per_event: Some(broker_us),
                ..CpuFigures::default()
            },
            relay_log: String::new(),
        }
    }

    #[test]
    fn ratios_are_against_the_raw_produce_of_the_point() {
        let w = Workload::new(10, 1024, PayloadKind::Json);
        let p = GrowthPoint::new(
            &w,
            1000,
            1_024_000,
            Some(raw(400_000.0, 2.0, 3.0)),
            Some(relay(100_000.0, 5.0, 6.0)),
            vec![],
        );
        assert_eq!(p.relay_over_raw, Some(0.25));
        assert_eq!(p.relay_cpu_over_producer_cpu, Some(2.5));
        assert_eq!(p.broker_cpu_over_raw, Some(2.0));
        let lone = GrowthPoint::new(
            &w,
            1000,
            0,
            None,
            Some(relay(1.0, 1.0, 1.0)),
            vec!["x".into()],
        );
        assert_eq!(
            (lone.relay_over_raw, lone.relay_cpu_over_producer_cpu),
            (None, None)
        );
    }
}
