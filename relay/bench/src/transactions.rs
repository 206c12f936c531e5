//! Phase `transactions` (opt-in): what the relay's `--transactions` (each batch one Kafka
//! transaction, the default) costs. Every round drains the same backlog with the relay
//! arguments as given plus `--transactions=false` ("off") and plus `--transactions=true`
//! ("on"), then runs the latency phase likewise,
//! so that the machine's passing load falls on both variants alike. The drain keeps each
//! variant's best round (as the `drain` phase does); the latency keeps each variant's round
//! with the lowest commit → seen p99; every round is in the JSON. The latency phase's consumer
//! reads `read_committed`, so "seen" includes the transaction's commit; so does the relay's
//! own commit → ack histogram, which with transactions counts an event published when its
//! transaction committed.

use serde::Serialize;

use crate::drain::{self, DrainFigures, DrainSpec};
use crate::infra::Infra;
use crate::latency::{self, LatencyFigures, LoadSpec};
use crate::schedule::interleaved;
use crate::workload::Workload;

/// The relay argument that turns transactions on.
pub const TRANSACTIONS_ON: &str = "--transactions=true";

/// The relay argument that turns them off (they are on by default).
pub const TRANSACTIONS_OFF: &str = "--transactions=false";

const NAMES: [&str; 2] = ["off", "on"];

/// One latency run, in short.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LatencyRound {
    /// Commit → broker ack (relay histogram, interpolated), p50 and p99, ms.
    pub ack_p50_ms: Option<f64>,
    /// See `ack_p50_ms`.
    pub ack_p99_ms: Option<f64>,
    /// Commit → seen by the `read_committed` consumer, p50 and p99, ms.
    pub seen_p50_ms: Option<f64>,
    /// See `seen_p50_ms`.
    pub seen_p99_ms: Option<f64>,
    /// Relay CPU per event under the load, µs.
    pub relay_us_per_event: Option<f64>,
    /// Committed events the consumer did not see.
    pub not_seen: u64,
}

impl LatencyRound {
    /// The short form of `l`.
    pub fn of(l: &LatencyFigures) -> Self {
        Self {
            ack_p50_ms: l.commit_to_ack_ms.p50,
            ack_p99_ms: l.commit_to_ack_ms.p99,
            seen_p50_ms: l.commit_to_seen_ms.map(|p| p.p50),
            seen_p99_ms: l.commit_to_seen_ms.map(|p| p.p99),
            relay_us_per_event: l.cpu.relay_us_per_event,
            not_seen: l.not_seen,
        }
    }

    /// What picks the round kept: the lowest commit → seen p99 (else ack p99).
    fn p99(&self) -> f64 {
        self.seen_p99_ms
            .or(self.ack_p99_ms)
            .unwrap_or(f64::INFINITY)
    }
}

/// One variant (`off` or `on`) over its rounds.
#[derive(Debug, Clone, Serialize)]
pub struct TxVariant {
    /// `off` or `on`.
    pub variant: &'static str,
    /// The relay arguments of its runs.
    pub relay_args: Vec<String>,
    /// The best drain round.
    pub drain: Option<DrainFigures>,
    /// Every drain round's events per second.
    pub drain_rounds_events_per_s: Vec<f64>,
    /// Every drain round's relay CPU per event, µs.
    pub drain_rounds_relay_us_per_event: Vec<Option<f64>>,
    /// The latency round with the lowest commit → seen p99.
    pub latency: Option<LatencyFigures>,
    /// Every latency round.
    pub latency_rounds: Vec<LatencyRound>,
}

impl TxVariant {
    fn new(variant: &'static str, relay_args: &[String]) -> Self {
        Self {
            variant,
            relay_args: relay_args.to_vec(),
            drain: None,
            drain_rounds_events_per_s: Vec::new(),
            drain_rounds_relay_us_per_event: Vec::new(),
            latency: None,
            latency_rounds: Vec::new(),
        }
    }

    fn add_drain(&mut self, d: DrainFigures) {
        self.drain_rounds_relay_us_per_event
            .push(d.cpu.relay_us_per_event);
        crate::keep_best(
            &mut self.drain,
            Some(d),
            &mut self.drain_rounds_events_per_s,
            |d| d.events_per_s,
        );
    }

    fn add_latency(&mut self, l: LatencyFigures) {
        let round = LatencyRound::of(&l);
        let better = self
            .latency
            .as_ref()
            .is_none_or(|kept| round.p99() < LatencyRound::of(kept).p99());
        self.latency_rounds.push(round);
        if better {
            self.latency = Some(l);
        }
    }

    /// The kept latency round, in short.
    pub fn latency_round(&self) -> Option<LatencyRound> {
        self.latency.as_ref().map(LatencyRound::of)
    }
}

/// The figures of `on` over those of `off` (above 1: more with transactions).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TxRatios {
    /// Drain events per second (best rounds).
    pub drain_events_per_s: Option<f64>,
    /// Relay CPU per event while draining.
    pub drain_relay_us_per_event: Option<f64>,
    /// PostgreSQL CPU per event while draining.
    pub drain_postgres_us_per_event: Option<f64>,
    /// Commit → broker ack p50 (relay histogram).
    pub ack_p50: Option<f64>,
    /// Commit → broker ack p99.
    pub ack_p99: Option<f64>,
    /// Commit → seen (`read_committed`) p50.
    pub seen_p50: Option<f64>,
    /// Commit → seen p99.
    pub seen_p99: Option<f64>,
    /// Relay CPU per event under the latency phase's load.
    pub latency_relay_us_per_event: Option<f64>,
}

/// Figures of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct TransactionsFigures {
    /// Rounds run.
    pub rounds: u32,
    /// Run order within the drains and within the latency runs.
    pub order: Vec<&'static str>,
    /// The relay arguments as given plus `--transactions=false`.
    pub off: TxVariant,
    /// Those as given plus `--transactions=true`.
    pub on: TxVariant,
    /// On over off.
    pub ratios: TxRatios,
    /// Runs that failed (the others still count).
    pub errors: Vec<String>,
}

/// Runs the phase: `drain` and `load` are the `drain` and `latency` phases' specs (their
/// labels and relay arguments are replaced per run).
///
/// # Errors
/// When no run at all succeeded.
pub async fn run(
    infra: &Infra,
    w: &Workload,
    drain: &DrainSpec<'_>,
    load: &LoadSpec<'_>,
    rounds: u32,
) -> anyhow::Result<TransactionsFigures> {
    let with = |flag: &str| -> Vec<String> {
        drain
            .extra
            .iter()
            .cloned()
            .chain([flag.to_owned()])
            .collect()
    };
    let (off_args, on_args) = (with(TRANSACTIONS_OFF), with(TRANSACTIONS_ON));
    let extras: [&[String]; 2] = [&off_args, &on_args];
    let mut variants = [
        TxVariant::new(NAMES[0], extras[0]),
        TxVariant::new(NAMES[1], extras[1]),
    ];
    let order = interleaved(NAMES.len(), rounds as usize, false);
    let mut errors = Vec::new();
    for round in 1..=rounds {
        let this_round = &order[(round as usize - 1) * NAMES.len()..][..NAMES.len()];
        each_variant(
            ("drain", round, this_round),
            &mut errors,
            async |v, label| {
                let extra = extras[v];
                drain::run(
                    infra,
                    w,
                    &DrainSpec {
                        label,
                        extra,
                        ..drain.clone()
                    },
                )
                .await
            },
            |v, d| variants[v].add_drain(d),
        )
        .await;
        each_variant(
            ("latency", round, this_round),
            &mut errors,
            async |v, label| {
                let extra = extras[v];
                latency::run(
                    infra,
                    w,
                    &LoadSpec {
                        label,
                        extra,
                        ..load.clone()
                    },
                )
                .await
            },
            |v, l| variants[v].add_latency(l),
        )
        .await;
    }
    let [off, on] = variants;
    if off.drain.is_none() && off.latency.is_none() && on.drain.is_none() && on.latency.is_none() {
        anyhow::bail!("every run failed: {}", errors.join("; "));
    }
    let ratios = ratios(&off, &on);
    Ok(TransactionsFigures {
        rounds,
        order: order.iter().map(|&v| NAMES[v]).collect(),
        off,
        on,
        ratios,
        errors,
    })
}

/// Runs `one` for each variant of the round (`what`, the round's number, its variants in
/// order), labelled `tx_<what>_<variant><round>`; hands each result to `keep`, each failure to
/// `errors`.
async fn each_variant<T>(
    (what, round, variants): (&str, u32, &[usize]),
    errors: &mut Vec<String>,
    mut one: impl AsyncFnMut(usize, &str) -> anyhow::Result<T>,
    mut keep: impl FnMut(usize, T),
) {
    for &v in variants {
        let label = format!("tx_{what}_{}{round}", NAMES[v]);
        eprintln!(
            "[relay-bench]   transactions round {round}: {what}, {}",
            NAMES[v]
        );
        match one(v, &label).await {
            Ok(t) => keep(v, t),
            Err(e) => errors.push(format!("{what} {} round {round}: {e:#}", NAMES[v])),
        }
    }
}

/// On over off, where both are known.
pub fn ratios(off: &TxVariant, on: &TxVariant) -> TxRatios {
    let r = |f: &dyn Fn(&TxVariant) -> Option<f64>| Some(f(on)? / f(off)?);
    let lat = |f: fn(&LatencyRound) -> Option<f64>| {
        move |v: &TxVariant| v.latency_round().as_ref().and_then(f)
    };
    TxRatios {
        drain_events_per_s: r(&|v| v.drain.as_ref().map(|d| d.events_per_s)),
        drain_relay_us_per_event: r(&|v| v.drain.as_ref()?.cpu.relay_us_per_event),
        drain_postgres_us_per_event: r(&|v| v.drain.as_ref()?.cpu.postgres_us_per_event),
        ack_p50: r(&lat(|l| l.ack_p50_ms)),
        ack_p99: r(&lat(|l| l.ack_p99_ms)),
        seen_p50: r(&lat(|l| l.seen_p50_ms)),
        seen_p99: r(&lat(|l| l.seen_p99_ms)),
        latency_relay_us_per_event: r(&lat(|l| l.relay_us_per_event)),
    }
}
