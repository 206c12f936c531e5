//! The chaos run: the whole system (order service, WMS and stock consumers, several active
//! relays per database sharing its outbox's buckets, the marketplace channel) on a private
//! PostgreSQL and a private Apache Kafka broker, each behind a [`crate::proxy`], over the
//! secured stack ([`world`]: SASL_SSL with SCRAM-SHA-512, PostgreSQL `verify-full`, each
//! process as its least-privilege role, passwords from files), under steady load ([`load`])
//! while a fault schedule ([`schedule`]) kills, pauses, restarts and partitions its parts
//! ([`faults`]); at the end, once everything drained, `outbox-audit`, logged in the same way,
//! gives the verdict ([`run`]).
//!
//! The schedule is a pure function of the seed, the duration, the fault count and the mix, so
//! the same seed gives the same faults at the same times against the same targets.

pub mod faults;
pub mod load;
pub mod run;
pub mod world;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL of a relay (any of them), started again after a moment.
    KillRelay,
    /// SIGKILL of the WMS or stock consumer, started again until it has partitions.
    KillConsumer,
    /// SIGKILL of the order service (HTTP, fulfilment consumer, marketplace channel).
    KillOrderService,
    /// SIGSTOP of the relay holding the most buckets of the orders database until the others
    /// took them over, then SIGCONT: a zombie holder waking up.
    PauseLeader,
    /// The broker's JVM SIGKILLed and started again on its storage.
    RestartBroker,
    /// PostgreSQL stopped with `-m immediate` (a crash) and started again.
    RestartPostgres,
    /// The broker's proxy (in front of its SASL_SSL listener) stops moving bytes for a while.
    StallBroker,
    /// The broker's proxy closes every connection.
    CutBroker,
    /// PostgreSQL's proxy stops moving bytes for a while.
    StallPostgres,
    /// PostgreSQL's proxy closes every connection.
    CutPostgres,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [Self; 10] = [
        Self::KillRelay,
        Self::KillConsumer,
        Self::KillOrderService,
        Self::PauseLeader,
        Self::RestartBroker,
        Self::RestartPostgres,
        Self::StallBroker,
        Self::CutBroker,
        Self::StallPostgres,
        Self::CutPostgres,
    ];

    /// The name used in flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::KillRelay => "kill_relay",
            Self::KillConsumer => "kill_consumer",
            Self::KillOrderService => "kill_order_service",
            Self::PauseLeader => "pause_leader",
            Self::RestartBroker => "restart_broker",
            Self::RestartPostgres => "restart_postgres",
            Self::StallBroker => "stall_broker",
            Self::CutBroker => "cut_broker",
            Self::StallPostgres => "stall_postgres",
            Self::CutPostgres => "cut_postgres",
        }
    }

    /// Parses [`FaultKind::name`].
    ///
    /// # Errors
    /// An unknown name, listing the known ones.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                format!("unknown fault `{s}`; known: {}", names.join(", "))
            })
    }
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Planned {
    /// When, from the start of the load.
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
    /// Which target of the kind (an index the fault maps onto its candidates).
    pub target: u32,
    /// How long it lasts (stalls, outages, a process down) before it is healed.
    pub hold: Duration,
}

/// The fault schedule: `count` faults spread over `[10 %, 75 %]` of `duration` (the rest is
/// the load running clean before the drain), kinds from `mix` so that every kind comes once
/// before any comes twice (shuffled), targets and holds drawn from the seed.
pub fn schedule(seed: u64, duration: Duration, count: usize, mix: &[FaultKind]) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds = Vec::with_capacity(count);
    while kinds.len() < count && !mix.is_empty() {
        let mut round = mix.to_vec();
        round.shuffle(&mut rng);
        kinds.extend(round);
    }
    kinds.truncate(count);
    let start = duration.mul_f64(0.10);
    let span = duration.mul_f64(0.65);
    let slot = if count == 0 {
        Duration::ZERO
    } else {
        span / count as u32
    };
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| {
            let jitter = slot.mul_f64(rng.gen_range(0.0..0.4));
            let hold = Duration::from_millis(match kind {
                FaultKind::CutBroker | FaultKind::CutPostgres => 0,
                FaultKind::StallBroker | FaultKind::StallPostgres => rng.gen_range(2_000..6_000),
                FaultKind::RestartBroker | FaultKind::RestartPostgres => {
                    rng.gen_range(2_000..5_000)
                }
                _ => rng.gen_range(500..3_000),
            });
            Planned {
                at: start + slot * i as u32 + jitter,
                kind,
                target: rng.gen_range(0..1_000),
                hold,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_every_kind_comes_first() {
        let d = Duration::from_secs(180);
        let a = schedule(7, d, 12, &FaultKind::ALL);
        assert_eq!(a, schedule(7, d, 12, &FaultKind::ALL));
        assert_ne!(a, schedule(8, d, 12, &FaultKind::ALL));
        let first: std::collections::HashSet<FaultKind> = a[..10].iter().map(|p| p.kind).collect();
        assert_eq!(first.len(), 10);
        assert!(a.windows(2).all(|w| w[0].at < w[1].at));
        assert!(a.iter().all(|p| p.at < d.mul_f64(0.8)));
        assert_eq!(FaultKind::parse("pause_leader"), Ok(FaultKind::PauseLeader));
        assert!(FaultKind::parse("nope").is_err());
    }
}
