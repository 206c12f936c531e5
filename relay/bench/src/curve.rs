//! Phase `curve` (opt-in): what the relay costs per event as the load rises, in one
//! invocation. It runs the latency phase at each rate of `--curve-rates` (writers committing
//! single-event transactions at that rate, a `read_committed` consumer) and then drains a
//! backlog, each on a fresh database, with the relay as configured. Each point gives the
//! relay's and PostgreSQL's CPU per event and commit → seen p50 / p99. A relay's work per
//! batch (a claim, a transaction, a mark) is spread over the events of the batch, so its
//! cost per event must fall as the rate rises; a rise from one point to the next is flagged.

use serde::Serialize;

use crate::drain::{self, DrainSpec};
use crate::infra::Infra;
use crate::latency::{self, LoadSpec};
use crate::workload::Workload;

/// One point of the curve.
#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    /// Offered events per second; `None` for the drain.
    pub rate: Option<u64>,
    /// Events per second achieved (the drain's rate for the drain).
    pub achieved_per_s: f64,
    /// Relay CPU per event, µs.
    pub relay_us_per_event: Option<f64>,
    /// PostgreSQL CPU per event (the whole server), µs.
    pub postgres_us_per_event: Option<f64>,
    /// Commit → seen by the `read_committed` consumer, p50 and p99, ms (not for the drain).
    pub seen_p50_ms: Option<f64>,
    /// See `seen_p50_ms`.
    pub seen_p99_ms: Option<f64>,
    /// Committed events the consumer did not see.
    pub not_seen: u64,
    /// The relay's log.
    pub relay_log: String,
}

/// The curve, lowest rate first, the drain last.
#[derive(Debug, Clone, Serialize)]
pub struct CurveFigures {
    /// The points.
    pub points: Vec<CurvePoint>,
    /// Points whose relay CPU per event is higher than the point before (a lower rate's).
    pub rises: Vec<String>,
    /// Points that failed, with why.
    pub errors: Vec<String>,
}

/// Runs the phase: each rate of `rates` for `load.seconds`, then the drain of `drain`.
///
/// # Errors
/// Never for one point (a failed point is in [`CurveFigures::errors`]).
pub async fn run(
    infra: &Infra,
    w: &Workload,
    drain: &DrainSpec<'_>,
    load: &LoadSpec<'_>,
    rates: &[u64],
) -> anyhow::Result<CurveFigures> {
    let mut points = Vec::new();
    let mut errors = Vec::new();
    for &rate in rates {
        let label = format!("curve_{rate}");
        eprintln!("[relay-bench]   curve: {rate} events/s");
        let spec = LoadSpec {
            rate,
            label: &label,
            idle_seconds: 0,
            ..load.clone()
        };
        match latency::run(infra, w, &spec).await {
            Ok(l) => points.push(CurvePoint {
                rate: Some(rate),
                achieved_per_s: l.achieved_per_s,
                relay_us_per_event: l.cpu.relay_us_per_event,
                postgres_us_per_event: l.cpu.postgres_us_per_event,
                seen_p50_ms: l.commit_to_seen_ms.map(|p| p.p50),
                seen_p99_ms: l.commit_to_seen_ms.map(|p| p.p99),
                not_seen: l.not_seen,
                relay_log: l.relay_log,
            }),
            Err(e) => errors.push(format!("{rate} events/s: {e:#}")),
        }
    }
    eprintln!("[relay-bench]   curve: drain");
    match drain::run(infra, w, &drain.with_front("curve_drain", drain.front)).await {
        Ok(d) => points.push(CurvePoint {
            rate: None,
            achieved_per_s: d.events_per_s,
            relay_us_per_event: d.cpu.relay_us_per_event,
            postgres_us_per_event: d.cpu.postgres_us_per_event,
            seen_p50_ms: None,
            seen_p99_ms: None,
            not_seen: 0,
            relay_log: d.relay_log,
        }),
        Err(e) => errors.push(format!("drain: {e:#}")),
    }
    let rises = rises(&points);
    Ok(CurveFigures {
        points,
        rises,
        errors,
    })
}

/// The points whose relay CPU per event is above the previous point's.
fn rises(points: &[CurvePoint]) -> Vec<String> {
    points
        .windows(2)
        .filter_map(|p| {
            let (a, b) = (p[0].relay_us_per_event?, p[1].relay_us_per_event?);
            (b > a).then(|| {
                format!(
                    "{}: {b:.1} µs per event, above {}'s {a:.1}",
                    name(&p[1]),
                    name(&p[0])
                )
            })
        })
        .collect()
}

/// A point's name in the table.
pub fn name(p: &CurvePoint) -> String {
    p.rate
        .map_or_else(|| "drain".to_owned(), |r| format!("{r} events/s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(rate: Option<u64>, relay: f64) -> CurvePoint {
        CurvePoint {
            rate,
            achieved_per_s: 0.0,
            relay_us_per_event: Some(relay),
            postgres_us_per_event: None,
            seen_p50_ms: None,
            seen_p99_ms: None,
            not_seen: 0,
            relay_log: String::new(),
        }
    }

    #[test]
    fn a_point_costlier_per_event_than_the_lower_rate_before_it_is_a_rise() {
        let falling = [
            point(Some(100), 900.0),
            point(Some(1000), 150.0),
            point(None, 5.0),
        ];
        assert!(rises(&falling).is_empty());
        let rising = [
            point(Some(100), 900.0),
            point(Some(1000), 950.0),
            point(None, 5.0),
        ];
        assert_eq!(
            rises(&rising),
            vec!["1000 events/s: 950.0 µs per event, above 100 events/s's 900.0"]
        );
    }
}
