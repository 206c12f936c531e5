//! One chaos run from start to verdict: the world, a lag sampler, the load and the fault
//! schedule together; then the load stops, everything drains, and `outbox-audit` reconciles,
//! over the same secured stack as every process ([`super::world`]: SASL_SSL, the migrator's
//! `verify-full` URLs). The summary says how the run was secured (and which roles held the
//! databases' sessions at the end of the load), then the fault timeline with, per fault, the
//! time to recover (lag back under the threshold after it was healed), the peak lag and the
//! duplicates the inboxes absorbed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::time::{sleep, Instant};

use super::faults::{self, Applied};
use super::load::{self, LoadStats};
use super::world::World;
use super::{schedule, FaultKind};

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Orders per second.
    pub rate: f64,
    /// How long the load runs.
    pub duration: Duration,
    /// The schedule's seed.
    pub seed: u64,
    /// How many faults.
    pub faults: usize,
    /// Which kinds.
    pub mix: Vec<FaultKind>,
    /// Lag (unpublished events + orders paid but not yet reserved, or reserved but without an
    /// outbound) under which the system counts as recovered.
    pub lag_threshold: i64,
}

/// One fault with its effect.
#[derive(Debug, Clone, Serialize)]
pub struct FaultOutcome {
    /// What ran.
    #[serde(flatten)]
    pub applied: Applied,
    /// From the fault's start until the lag was back under the threshold after it was
    /// healed, ms; `None` when it never was.
    pub recovered_after_ms: Option<u64>,
    /// The highest lag from its start until it recovered (or the next fault).
    pub peak_lag: i64,
    /// Duplicates the inboxes absorbed from its start until the next fault (or the drain).
    pub duplicates_absorbed: i64,
}

/// The database sessions of one role.
#[derive(Debug, Clone, Serialize)]
pub struct Sessions {
    /// The role.
    pub role: String,
    /// Its client sessions on the three databases.
    pub sessions: i64,
    /// Of them over TLS.
    pub tls: i64,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// How every process logged in ([`super::world::SECURITY`]).
    pub security: String,
    /// The client sessions on the three databases at the end of the load, by role (the
    /// harness's own as `postgres`); empty when PostgreSQL did not answer.
    pub db_sessions: Vec<Sessions>,
    /// Seed.
    pub seed: u64,
    /// Orders per second.
    pub rate: f64,
    /// Load duration, s.
    pub duration_s: u64,
    /// The load's figures.
    pub load: LoadStats,
    /// Each fault.
    pub faults: Vec<FaultOutcome>,
    /// Faults per kind.
    pub faults_by_kind: BTreeMap<String, usize>,
    /// From the end of the load until every outbox was empty and every consumer caught up, ms.
    pub drain_ms: u64,
    /// Whether every outbox emptied within 300 s of the end of the load.
    pub drained: bool,
    /// The audit's JSON report.
    pub audit: Value,
    /// The audit's exit code.
    pub audit_code: i32,
    /// What the last audit wrote to stderr when it could not audit (exit 2), so a failed run
    /// says why (a partition not read to its end, a broker or database that did not answer).
    pub audit_error: Option<String>,
}

impl Summary {
    /// True when the audit found nothing and every fault recovered.
    pub fn passed(&self) -> bool {
        self.audit_code == 0
            && self.drained
            && self
                .faults
                .iter()
                .all(|f| f.recovered_after_ms.is_some() && f.applied.unhealed.is_none())
    }

    /// The summary as text (suitable for a dated report).
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let sessions: Vec<String> = self
            .db_sessions
            .iter()
            .map(|s| format!("{} {} ({} TLS)", s.role, s.sessions, s.tls))
            .collect();
        let _ = writeln!(
            o,
            "security: {}; database sessions at the end of the load: {}",
            self.security,
            sessions.join(", ")
        );
        let _ = writeln!(
            o,
            "chaos run: seed {}, {} orders/s for {} s: {} orders ({}), {} marketplace trades \
             (refunded on the platform: {}); refunds racing shipments: {}; \
             {} flows completed, {} abandoned, {} calls retried",
            self.seed,
            self.rate,
            self.duration_s,
            self.load.orders,
            pairs(&self.load.flows),
            self.load.trades,
            pairs(&self.load.trade_refunds),
            pairs(&self.load.races),
            self.load.completed,
            self.load.abandoned,
            self.load.retries
        );
        let kinds: Vec<String> = self
            .faults_by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(o, "faults: {} ({})", self.faults.len(), kinds.join(", "));
        let _ = writeln!(
            o,
            "\n| t (s) | fault | target | healed after (s) | recovered after (s) | peak lag | duplicates absorbed | note |\n|---|---|---|---|---|---|---|---|"
        );
        for f in &self.faults {
            let a = &f.applied;
            let _ = writeln!(
                o,
                "| {:.1} | {} | {} | {:.1} | {} | {} | {} | {} |",
                a.started_ms as f64 / 1e3,
                a.kind.name(),
                a.target,
                (a.healed_ms - a.started_ms) as f64 / 1e3,
                f.recovered_after_ms
                    .map_or("never".to_owned(), |ms| format!("{:.1}", ms as f64 / 1e3)),
                f.peak_lag,
                f.duplicates_absorbed,
                a.unhealed
                    .as_ref()
                    .map_or_else(|| a.note.clone(), |e| format!("NOT HEALED: {e}"))
            );
        }
        let _ = writeln!(
            o,
            "\n{} {:.1} s after the load stopped",
            if self.drained {
                "drained"
            } else {
                "NOT drained"
            },
            self.drain_ms as f64 / 1e3
        );
        let counts = &self.audit["counts"];
        let pick = |k: &str| counts[k].as_i64().unwrap_or(0);
        let _ = writeln!(
            o,
            "audit (exit {}): {} orders ({} paid), {} outbounds, {} reservations, {} stock movements, \
             {} messages on the broker ({} duplicates read_committed), {} published events checked against the ledgers, \
             inbox duplicates absorbed: order {}, wms {}, stock {}; violations: {}",
            self.audit_code,
            pick("orders"),
            pick("orders_paid"),
            pick("outbounds"),
            pick("reservations"),
            pick("stock_movements"),
            pick("broker.messages"),
            pick("broker.duplicate_messages"),
            pick("ledger.published_events_checked"),
            pick("inbox.order.duplicates_absorbed"),
            pick("inbox.wms.duplicates_absorbed"),
            pick("inbox.stock.duplicates_absorbed"),
            self.audit["violations"].as_array().map_or(0, Vec::len)
        );
        if let Some(e) = &self.audit_error {
            let _ = writeln!(o, "the audit could not audit: {e}");
        }
        if let Some(vs) = self.audit["violations"].as_array() {
            for v in vs.iter().take(50) {
                let _ = writeln!(o, "  violation: {v}");
            }
        }
        o
    }
}

/// A lag sample: ms from the start, unpublished events + orders in flight (`None`: a database
/// did not answer).
type Sample = (u64, Option<i64>);

async fn sample_lag(world: &World) -> Option<i64> {
    let backlog = world.backlog().await?;
    Some(backlog + world.orders_in_flight().await?)
}

/// Runs the chaos and returns its summary.
pub async fn run(spec: &Spec) -> Summary {
    let plan = schedule(spec.seed, spec.duration, spec.faults, &spec.mix);
    eprintln!("chaos: schedule {plan:?}");
    let world = Arc::new(World::start().await);
    eprintln!("chaos: system up (prefix {})", world.sys.prefix);
    let t0 = Instant::now();
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let sampler = {
        let (w, s) = (world.clone(), samples.clone());
        tokio::spawn(async move {
            // A sample every 500 ms until the run aborts the sampler.
            let mut every = tokio::time::interval(Duration::from_millis(500));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let lag = tokio::time::timeout(Duration::from_secs(2), sample_lag(&w))
                    .await
                    .ok()
                    .flatten();
                s.lock()
                    .unwrap()
                    .push((t0.elapsed().as_millis() as u64, lag));
            }
        })
    };
    let load = tokio::spawn(load::run(
        world.clone(),
        spec.rate,
        t0 + spec.duration,
        spec.seed,
    ));
    let mut applied = Vec::new();
    let mut duplicates_at = Vec::new();
    for p in &plan {
        let wait = (t0 + p.at).saturating_duration_since(Instant::now());
        sleep(wait).await;
        duplicates_at.push(world.inbox_duplicates().await);
        eprintln!(
            "chaos: t={:.1}s {} (hold {:?})",
            t0.elapsed().as_secs_f64(),
            p.kind.name(),
            p.hold
        );
        let a = faults::apply(&world, p, t0).await;
        eprintln!(
            "chaos:   healed {} at {:.1}s {}",
            a.target,
            a.healed_ms as f64 / 1e3,
            a.note
        );
        applied.push(a);
    }
    let stats = load.await.expect("the load task");
    let load_end = t0.elapsed().as_millis() as u64;
    let db_sessions = world
        .sessions()
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|(role, sessions, tls)| Sessions {
            role,
            sessions,
            tls,
        })
        .collect();
    eprintln!(
        "chaos: load done at {:.1}s: {stats:?}",
        load_end as f64 / 1e3
    );

    // Drain: every outbox empty (events on the broker not yet applied do not count), then the
    // audit until the system is at rest: every consumer's committed offsets at the end of its
    // topics, every outbox empty, twice in a row with nothing new on the broker.
    let drain_start = Instant::now();
    let drained = crate::poll_until(Duration::from_secs(300), || async {
        (world.backlog().await == Some(0)).then_some(())
    })
    .await
    .is_some();
    if !drained {
        eprintln!("chaos: the outboxes did not drain within 300 s of the end of the load");
    }
    let end_duplicates = world.inbox_duplicates().await;
    let sys = world.sys.clone();
    let brokers = world.brokers();
    // The audit logs in as every process does: SASL_SSL with the password file; the databases
    // as the migrator, `verify-full`, its password from the PGPASSFILE the world set.
    let flags: Vec<&str> = ["--settle-s", "0", "--max-unpublished-age-s", "600"]
        .into_iter()
        .chain(world.audit_flags.iter().map(String::as_str))
        .collect();
    // The first run to find the consumers caught up read the business tables before it knew
    // they were (`crate::audit::at_rest`).
    let caught_up =
        |r: &crate::audit::AuditRun| r.code != 2 && r.messages_ahead() == 0 && r.unpublished() == 0;
    let audit = crate::audit::run_until_at_rest(
        &sys,
        &brokers,
        &flags,
        Duration::from_secs(300),
        caught_up,
    )
    .await
    .unwrap_or_else(|r| {
        eprintln!(
            "chaos: the system did not settle: {} {}",
            r.report, r.stderr
        );
        r
    });
    let drain_ms = drain_start.elapsed().as_millis() as u64;
    sampler.abort();

    let samples = samples.lock().unwrap().clone();
    let mut outcomes = Vec::new();
    for (i, a) in applied.iter().enumerate() {
        // Recovery may reach past the next fault (then that one's effect counts too).
        let recovered = samples
            .iter()
            .find(|(t, lag)| *t >= a.healed_ms && lag.is_some_and(|l| l <= spec.lag_threshold))
            .map(|(t, _)| *t);
        let peak_lag = samples
            .iter()
            .filter(|(t, _)| *t >= a.started_ms)
            .take_while(|(t, _)| recovered.is_none_or(|r| *t <= r))
            .filter_map(|(_, l)| *l)
            .max()
            .unwrap_or(0);
        let from = duplicates_at[i];
        let to = duplicates_at.get(i + 1).copied().unwrap_or(end_duplicates);
        outcomes.push(FaultOutcome {
            applied: a.clone(),
            recovered_after_ms: recovered.map(|t| t - a.started_ms),
            peak_lag,
            duplicates_absorbed: match (from, to) {
                (Some(f), Some(t)) => t - f,
                _ => -1,
            },
        });
    }
    let failed = !drained
        || audit.code != 0
        || outcomes
            .iter()
            .any(|f| f.recovered_after_ms.is_none() || f.applied.unhealed.is_some());
    if failed {
        // Keep the broker's storage and log for a look (its Drop reads this), and say where the
        // processes' logs are.
        std::env::set_var("KEEP_KAFKA_DIR", "1");
        eprintln!(
            "chaos: failed; process logs in {} (order-service {}, wms {}, stock {})",
            crate::proc::log_dir().display(),
            world.sys.order.log.display(),
            world.sys.wms.log.display(),
            world.sys.stock.log.display()
        );
    }
    let mut by_kind = BTreeMap::new();
    for a in &applied {
        *by_kind.entry(a.kind.name().to_owned()).or_default() += 1;
    }
    Summary {
        security: super::world::SECURITY.to_owned(),
        db_sessions,
        seed: spec.seed,
        rate: spec.rate,
        duration_s: spec.duration.as_secs(),
        load: stats,
        faults: outcomes,
        faults_by_kind: by_kind,
        drain_ms,
        drained,
        audit_error: (audit.code == 2).then(|| audit.stderr.trim().to_owned()),
        audit: audit.report,
        audit_code: audit.code,
    }
}

/// `k v, k v` of a count map.
fn pairs(m: &std::collections::BTreeMap<String, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
