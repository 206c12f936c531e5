//! Phase `relays` (opt-in): what several relays on one outbox give. The same backlog is
//! drained by one relay on an outbox of one bucket (the layout of the migrations), by one
//! relay on the outbox split into [`BUCKETS`] buckets (all of them its own), and by three
//! relays sharing those buckets. The relays start on the empty outbox; once they hold every
//! bucket, balanced, the backlog is inserted (one transaction) and the clock starts: what is
//! measured is the drain, not how fast relays find their share. `--repeat` rounds, the three
//! variants interleaved in each so that the machine's passing load falls on all alike, the
//! best round of each kept. Each variant's CPU is the sum over its relay processes, from the
//! insert on.

use serde::Serialize;

use crate::drain::{self, DrainSpec};
use crate::infra::Infra;
use crate::workload::Workload;

/// The bucket count of the split variants.
pub const BUCKETS: i16 = 8;

/// The variants: `(relays, buckets)`.
const VARIANTS: [(usize, i16); 3] = [(1, 1), (1, BUCKETS), (3, BUCKETS)];

/// One variant over its rounds.
#[derive(Debug, Clone, Serialize)]
pub struct RelaysPoint {
    /// Relay processes.
    pub relays: usize,
    /// The outbox's bucket count.
    pub buckets: i16,
    /// The best round's events per second (start to empty outbox).
    pub events_per_s: Option<f64>,
    /// The best round's steady rate (from the first marked batch).
    pub steady_events_per_s: Option<f64>,
    /// Every round's events per second.
    pub rounds_events_per_s: Vec<f64>,
    /// The best round's relay CPU per event (every relay process), µs.
    pub relay_us_per_event: Option<f64>,
    /// The best round's PostgreSQL CPU per event, µs.
    pub postgres_us_per_event: Option<f64>,
    /// The best round's events published by each relay.
    pub published_per_relay: Vec<u64>,
    /// The best round's first relay log.
    pub relay_log: Option<String>,
}

/// The phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RelaysFigures {
    /// Events of each backlog.
    pub events: u64,
    /// One relay on one bucket, one relay on [`BUCKETS`], three relays on [`BUCKETS`].
    pub points: Vec<RelaysPoint>,
    /// Rounds that failed, with why.
    pub errors: Vec<String>,
}

/// Runs the phase: `repeat` rounds of the three variants of `drain`.
///
/// # Errors
/// Never for one round (a failed round is in [`RelaysFigures::errors`]).
pub async fn run(
    infra: &Infra,
    w: &Workload,
    drain: &DrainSpec<'_>,
    repeat: u32,
) -> anyhow::Result<RelaysFigures> {
    let mut points: Vec<RelaysPoint> = VARIANTS
        .iter()
        .map(|&(relays, buckets)| RelaysPoint {
            relays,
            buckets,
            events_per_s: None,
            steady_events_per_s: None,
            rounds_events_per_s: Vec::new(),
            relay_us_per_event: None,
            postgres_us_per_event: None,
            published_per_relay: Vec::new(),
            relay_log: None,
        })
        .collect();
    let mut errors = Vec::new();
    for round in 1..=repeat {
        for p in &mut points {
            let label = format!("relays_{}r_{}b_{round}", p.relays, p.buckets);
            eprintln!(
                "[relay-bench]   relays: {} relay(s), {} bucket(s), round {round}/{repeat}",
                p.relays, p.buckets
            );
            let spec = DrainSpec {
                label: &label,
                relays: p.relays,
                buckets: (p.buckets > 1).then_some(p.buckets),
                warm: true,
                ..drain.clone()
            };
            match drain::run(infra, w, &spec).await {
                Ok(d) => {
                    p.rounds_events_per_s.push(d.events_per_s);
                    if p.events_per_s.is_none_or(|best| d.events_per_s > best) {
                        p.events_per_s = Some(d.events_per_s);
                        p.steady_events_per_s = d.steady_events_per_s;
                        p.relay_us_per_event = d.cpu.relay_us_per_event;
                        p.postgres_us_per_event = d.cpu.postgres_us_per_event;
                        p.published_per_relay = d.published_per_relay;
                        p.relay_log = Some(d.relay_log);
                    }
                }
                Err(e) => errors.push(format!("{label}: {e:#}")),
            }
        }
    }
    Ok(RelaysFigures {
        events: drain.events,
        points,
        errors,
    })
}
