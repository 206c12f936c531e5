//! Phase `isolation`: how much failing aggregates slow the healthy
//! ones. The release relay drains the same healthy backlog (a) alone, (b) behind poisoned
//! aggregates (an event that can never be sent and two behind it, each: parked on the first
//! batch, they must hold back only their own aggregate), and (c) beside suspect aggregates (a
//! retryable `broker_rejected` failure on the first of three events, as a refused record batch
//! leaves it: the relay sends those alone on its second producer, and they succeed). The runs
//! interleave A B C C B A so that load drift falls on every variant alike; the figures are
//! ratios to the clean drain of the same invocation, never pass/fail thresholds.

use serde::Serialize;

use crate::drain::{self, DrainFigures, DrainSpec};
use crate::infra::Infra;
use crate::schedule::interleaved;
use crate::workload::{Front, Workload};

/// One drain of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct IsolationRun {
    /// Which variant.
    pub variant: &'static str,
    /// Seconds from starting the relay until the healthy events were out.
    pub seconds: f64,
    /// Healthy events per second over that time.
    pub events_per_s: f64,
    /// Healthy events per second from the first marked batch.
    pub steady_events_per_s: Option<f64>,
    /// Seconds until the front's sendable events were out too (suspects).
    pub all_seconds: Option<f64>,
    /// Front rows left in the outbox when the healthy events were out.
    pub front_rows_left: Option<i64>,
    /// Events sent alone and batches that sent any (`outbox_batch_lone_sends` sum, count).
    pub lone_sends: Option<(f64, f64)>,
    /// Relay CPU per healthy event, µs.
    pub relay_us_per_event: Option<f64>,
    /// PostgreSQL CPU per healthy event, µs.
    pub postgres_us_per_event: Option<f64>,
    /// The relay's log.
    pub relay_log: String,
    /// The run's topic prefix (its events are on `<prefix>order`).
    pub topic_prefix: String,
}

/// One variant over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    /// Which variant.
    pub variant: &'static str,
    /// Healthy events per second over all its runs (events / seconds, summed).
    pub events_per_s: f64,
    /// Each run's rate.
    pub runs_events_per_s: Vec<f64>,
    /// Relative to the clean variant's rate.
    pub over_clean: Option<f64>,
    /// Events sent alone over all its runs, and the batches that sent any.
    pub lone_sends: Option<(f64, f64)>,
    /// Longest time until the front's sendable events were out too, s.
    pub all_seconds_max: Option<f64>,
}

/// Figures of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct IsolationFigures {
    /// Healthy events per run.
    pub healthy_events: u64,
    /// Poisoned aggregates of variant (b).
    pub poisoned_aggregates: u64,
    /// Suspect aggregates of variant (c).
    pub suspect_aggregates: u64,
    /// Run order.
    pub order: Vec<&'static str>,
    /// (a) the healthy backlog alone.
    pub clean: Variant,
    /// (b) behind the poisoned aggregates.
    pub poisoned: Variant,
    /// (c) beside the suspect aggregates.
    pub suspects: Variant,
    /// Every run.
    pub runs: Vec<IsolationRun>,
}

const NAMES: [&str; 3] = ["clean", "poisoned", "suspects"];

/// Runs the phase: `base` is the drain phase's spec (binary, batch size, relay arguments).
///
/// # Errors
/// Any drain failing.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    base: &DrainSpec<'_>,
    poisoned: u64,
    suspects: u64,
) -> anyhow::Result<IsolationFigures> {
    let fronts = [
        Front::None,
        Front::Poisoned(poisoned),
        Front::Suspects(suspects),
    ];
    let order = interleaved(fronts.len(), 2, true);
    let mut runs = Vec::new();
    for (k, &v) in order.iter().enumerate() {
        let label = format!("isolation_{}{}", NAMES[v], k + 1);
        let spec = base.with_front(&label, fronts[v]);
        eprintln!("[relay-bench]   isolation run {}: {}", k + 1, NAMES[v]);
        let d = drain::run(infra, w, &spec).await?;
        runs.push(one_run(NAMES[v], &d));
    }
    let variant = |name: &'static str| -> Variant {
        let mine: Vec<&IsolationRun> = runs.iter().filter(|r| r.variant == name).collect();
        let secs: f64 = mine.iter().map(|r| r.seconds).sum();
        let lone = mine
            .iter()
            .filter_map(|r| r.lone_sends)
            .reduce(|a, b| (a.0 + b.0, a.1 + b.1));
        Variant {
            variant: name,
            events_per_s: (base.events * mine.len() as u64) as f64 / secs.max(1e-9),
            runs_events_per_s: mine.iter().map(|r| r.events_per_s).collect(),
            over_clean: None,
            lone_sends: lone,
            all_seconds_max: mine.iter().filter_map(|r| r.all_seconds).reduce(f64::max),
        }
    };
    let clean = variant("clean");
    let ratio = |mut v: Variant| {
        v.over_clean = Some(v.events_per_s / clean.events_per_s);
        v
    };
    let poisoned_v = ratio(variant("poisoned"));
    let suspects_v = ratio(variant("suspects"));
    Ok(IsolationFigures {
        healthy_events: base.events,
        poisoned_aggregates: poisoned,
        suspect_aggregates: suspects,
        order: order.iter().map(|&v| NAMES[v]).collect(),
        clean: ratio(clean.clone()),
        poisoned: poisoned_v,
        suspects: suspects_v,
        runs,
    })
}

fn one_run(variant: &'static str, d: &DrainFigures) -> IsolationRun {
    IsolationRun {
        variant,
        seconds: d.seconds,
        events_per_s: d.events_per_s,
        steady_events_per_s: d.steady_events_per_s,
        all_seconds: d.all_seconds,
        front_rows_left: d.front_rows_left,
        lone_sends: d.lone_sends,
        relay_us_per_event: d.cpu.relay_us_per_event,
        postgres_us_per_event: d.cpu.postgres_us_per_event,
        relay_log: d.relay_log.clone(),
        topic_prefix: d.topic_prefix.clone(),
    }
}
