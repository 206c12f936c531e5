//! Phase `tail` (opt-in): how steady the latency phase's tail is, and whether a table the relay
//! has just drained a backlog from (as many dead rows as the backlog had, until autovacuum
//! clears them) slows the load that follows. Every round runs the latency phase on a fresh
//! table ("fresh") and on a table the relay drained `--events` from just before ("drained"),
//! each with a relay of its own; the rounds alternate A B B A, so the machine's drift falls on
//! both alike.

use serde::Serialize;

use crate::infra::Infra;
use crate::latency::{self, LoadSpec};
use crate::schedule::{interleaved, median};
use crate::transactions::LatencyRound;
use crate::workload::Workload;

const NAMES: [&str; 2] = ["fresh", "drained"];

/// The phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TailFigures {
    /// Events drained before each "drained" run.
    pub drained_events: u64,
    /// Every fresh run, in order.
    pub fresh: Vec<LatencyRound>,
    /// Every drained run, in order.
    pub drained: Vec<LatencyRound>,
    /// Highest commit → seen p99 of the fresh runs over their lowest.
    pub fresh_p99_spread: Option<f64>,
    /// Median commit → seen p99 of the drained runs over the fresh runs'.
    pub drained_over_fresh_p99: Option<f64>,
    /// Runs that failed, with why.
    pub errors: Vec<String>,
}

/// Runs the phase: `rounds` rounds of a fresh and a drained run of `load`.
///
/// # Errors
/// When every run failed.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    load: &LoadSpec<'_>,
    drained_events: u64,
    rounds: u32,
) -> anyhow::Result<TailFigures> {
    let rounds = rounds.max(1) as usize;
    let mut runs: [Vec<LatencyRound>; 2] = [Vec::new(), Vec::new()];
    let mut errors = Vec::new();
    for (i, v) in interleaved(2, rounds, true).into_iter().enumerate() {
        let label = format!("tail_{}{}", NAMES[v], i / 2 + 1);
        eprintln!("[relay-bench]   tail: {label}");
        let spec = LoadSpec {
            label: &label,
            idle_seconds: 0,
            drained_first: if v == 1 { drained_events } else { 0 },
            ..load.clone()
        };
        match latency::run(infra, w, &spec).await {
            Ok(l) => runs[v].push(LatencyRound::of(&l)),
            Err(e) => errors.push(format!("{label}: {e:#}")),
        }
    }
    let [fresh, drained] = runs;
    if fresh.is_empty() && drained.is_empty() {
        anyhow::bail!("every run failed: {}", errors.join("; "));
    }
    let p99s =
        |r: &[LatencyRound]| -> Vec<f64> { r.iter().filter_map(|r| r.seen_p99_ms).collect() };
    let (f, d) = (p99s(&fresh), p99s(&drained));
    Ok(TailFigures {
        drained_events,
        fresh_p99_spread: spread(&f),
        drained_over_fresh_p99: median(&d).zip(median(&f)).map(|(d, f)| d / f),
        fresh,
        drained,
        errors,
    })
}

/// Highest over lowest of `v`; `None` when empty.
fn spread(v: &[f64]) -> Option<f64> {
    let lo = v.iter().copied().reduce(f64::min)?;
    let hi = v.iter().copied().reduce(f64::max)?;
    Some(hi / lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_is_the_highest_over_the_lowest() {
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[10.0, 40.0, 20.0]), Some(4.0));
    }
}
