//! Phase `backlog` (opt-in, heavy): whether a large backlog slows the claim or costs the lease.
//! The release relay drains a backlog of millions of events (inserted in chunks with the
//! aggregate lock off) with `--lease-ttl-ms 3000`, so that a lease renewal starved by the
//! batches or the backlog gauges shows up as a leadership change. Reports the drain rate, a
//! side claim of one batch every few seconds (claim time as the table shrinks, under a lease of
//! its own: it reads, never deletes), the lease epochs the relay reported and its "Lost the
//! relay lease" log lines (none when leadership is stable).

use std::time::Duration;

use serde::Serialize;

use crate::drain::{self, DrainFigures, DrainSpec};
use crate::infra::Infra;
use crate::workload::{Front, Workload};

/// Rows per insert transaction of the backlog.
const CHUNK: u64 = 250_000;

/// The relay's lease TTL in this phase, ms.
pub const LEASE_TTL_MS: u64 = 3_000;

/// Figures of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct BacklogFigures {
    /// The relay's `--lease-ttl-ms`.
    pub lease_ttl_ms: u64,
    /// Seconds between side claims.
    pub probe_every_s: u64,
    /// First side claim, ms.
    pub claim_ms_first: Option<f64>,
    /// Median side claim, ms.
    pub claim_ms_median: Option<f64>,
    /// Last side claim that returned a full batch, ms.
    pub claim_ms_last_full: Option<f64>,
    /// Largest side claim, ms.
    pub claim_ms_max: Option<f64>,
    /// Leadership changes seen (distinct lease epochs - 1).
    pub lease_changes: usize,
    /// The drain itself (probes, epochs, log lines included).
    pub drain: DrainFigures,
}

/// Runs the phase; `base` is the drain phase's spec.
///
/// # Errors
/// The drain failing.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    base: &DrainSpec<'_>,
    events: u64,
    probe_every_s: u64,
) -> anyhow::Result<BacklogFigures> {
    let mut extra = base.extra.to_vec();
    extra.extend(["--lease-ttl-ms".to_owned(), LEASE_TTL_MS.to_string()]);
    let spec = DrainSpec {
        events,
        extra: &extra,
        label: "backlog",
        front: Front::None,
        chunk: Some(CHUNK),
        probe_every: Some(Duration::from_secs(probe_every_s)),
        relays: 1,
        buckets: None,
        warm: false,
        ..base.clone()
    };
    let d = drain::run(infra, w, &spec).await?;
    let answered: Vec<f64> = d.probes.iter().filter_map(|p| p.claim_ms).collect();
    let full = base.batch_size as u64;
    Ok(BacklogFigures {
        lease_ttl_ms: LEASE_TTL_MS,
        probe_every_s,
        claim_ms_first: answered.first().copied(),
        claim_ms_median: crate::schedule::median(&answered),
        claim_ms_last_full: d
            .probes
            .iter()
            .rev()
            .find(|p| p.rows >= full)
            .and_then(|p| p.claim_ms),
        claim_ms_max: answered.iter().copied().reduce(f64::max),
        lease_changes: d.lease_epochs.len().saturating_sub(1),
        drain: d,
    })
}
