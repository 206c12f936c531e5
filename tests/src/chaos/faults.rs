//! Applying one planned fault to the world, for real (signals, a server stopped, a proxy
//! stalled or cut), and healing it after its hold. The broker's faults hit Apache Kafka itself:
//! its JVM SIGKILLed and started again on its storage, or the proxy in front of its SASL_SSL
//! listener stalled or cut (every client's TLS session with it); PostgreSQL's hit the secured
//! cluster the same way, every client's TLS session going through its proxy.

use std::time::Duration;

use serde::Serialize;
use tokio::time::{sleep, Instant};

use super::world::World;
use super::{FaultKind, Planned};
use crate::proc::{signal, RelayProcess};

/// What happened when a fault ran.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    /// The fault.
    pub kind: FaultKind,
    /// What it hit (a process name, `broker`, `postgres`).
    pub target: String,
    /// When it started, ms from the start of the load.
    pub started_ms: u64,
    /// When it was healed (process running again, server up, proxy forwarding), ms.
    pub healed_ms: u64,
    /// Extra facts (e.g. who took the lease from the paused leader).
    pub note: String,
    /// Why the fault could not be healed (e.g. a restarted consumer never got partitions);
    /// `None` when it was.
    pub unhealed: Option<String>,
}

/// Runs `fault` against `world` and heals it; `t0` is the start of the load.
pub async fn apply(world: &World, fault: &Planned, t0: Instant) -> Applied {
    let started_ms = t0.elapsed().as_millis() as u64;
    let mut unhealed = None;
    let (target, note) = match fault.kind {
        FaultKind::KillRelay => kill_relay(world, fault).await,
        FaultKind::KillConsumer => {
            let s = if fault.target.is_multiple_of(2) {
                &world.sys.wms
            } else {
                &world.sys.stock
            };
            s.kill();
            sleep(fault.hold).await;
            (s.name.clone(), restart(s, &mut unhealed).await)
        }
        FaultKind::KillOrderService => {
            let s = &world.sys.order;
            s.kill();
            sleep(fault.hold).await;
            let note = restart(s, &mut unhealed).await;
            world.point_pushes().await;
            (s.name.clone(), note)
        }
        FaultKind::PauseLeader => pause_leader(world, fault).await,
        FaultKind::RestartBroker => {
            blocking(|| world.kafka.lock().unwrap().broker.stop());
            sleep(fault.hold).await;
            blocking(|| world.kafka.lock().unwrap().broker.start_again());
            ("broker".to_owned(), String::new())
        }
        FaultKind::RestartPostgres => {
            blocking(|| world.pg.cluster.stop_immediate());
            sleep(fault.hold).await;
            blocking(|| world.pg.cluster.start_again());
            ("postgres".to_owned(), String::new())
        }
        FaultKind::StallBroker => {
            world.kafka_proxy.stall();
            sleep(fault.hold).await;
            world.kafka_proxy.resume();
            ("broker proxy".to_owned(), String::new())
        }
        FaultKind::CutBroker => {
            world.kafka_proxy.cut();
            ("broker proxy".to_owned(), String::new())
        }
        FaultKind::StallPostgres => {
            world.pg_proxy.stall();
            sleep(fault.hold).await;
            world.pg_proxy.resume();
            ("postgres proxy".to_owned(), String::new())
        }
        FaultKind::CutPostgres => {
            world.pg_proxy.cut();
            ("postgres proxy".to_owned(), String::new())
        }
    };
    Applied {
        kind: fault.kind,
        target,
        started_ms,
        healed_ms: t0.elapsed().as_millis() as u64,
        note,
        unhealed,
    }
}

/// Starts a killed service again and waits until it has partitions; the note says how long
/// it took, `unhealed` why it never got any.
async fn restart(s: &crate::fulfilment::Service, unhealed: &mut Option<String>) -> String {
    match s.try_start_again_until_assigned().await {
        Ok(took) => format!("assigned {:.1} s after its start", took.as_secs_f64()),
        Err(e) => {
            eprintln!("chaos:   {e}");
            *unhealed = Some(e);
            "never assigned".to_owned()
        }
    }
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn kill_relay(world: &World, fault: &Planned) -> (String, String) {
    let (name, args) = {
        let mut relays = world.relays.lock().unwrap();
        let n = relays.len();
        let slot = &mut relays[fault.target as usize % n];
        if let Some(mut p) = slot.process.take() {
            p.kill();
        }
        (slot.name.clone(), slot.args.clone())
    };
    sleep(fault.hold).await;
    let process = RelayProcess::start(&args);
    let mut relays = world.relays.lock().unwrap();
    let slot = relays.iter_mut().find(|s| s.name == name).unwrap();
    slot.process = Some(process);
    (name, String::new())
}

/// SIGSTOP of the relay holding the most buckets of the orders database until the other relays
/// hold every one of them (and a moment more, so they publish), then SIGCONT: the paused relay
/// wakes up with its leases lost and batches in its hands.
async fn pause_leader(world: &World, fault: &Planned) -> (String, String) {
    let held = world.order_buckets().await.unwrap_or_default();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for (_, holder) in &held {
        *counts.entry(holder.as_str()).or_default() += 1;
    }
    let Some((leader, _)) = counts.into_iter().max_by_key(|(h, n)| (*n, *h)) else {
        return (
            "(no holder)".to_owned(),
            "no bucket holder to pause".to_owned(),
        );
    };
    let leader = leader.to_owned();
    let mine: Vec<String> = held
        .iter()
        .filter(|(_, h)| *h == leader)
        .map(|(b, _)| b.clone())
        .collect();
    let pid = {
        let relays = world.relays.lock().unwrap();
        relays
            .iter()
            .find(|s| s.name == leader)
            .and_then(|s| s.process.as_ref().map(|p| p.pid()))
    };
    let Some(pid) = pid else {
        return (leader, "bucket holder not running".to_owned());
    };
    signal(pid, "STOP");
    let taken_by = outbox_process::poll::poll_every(
        Duration::from_millis(200),
        Duration::from_secs(60),
        || async {
            let now = world.order_buckets().await?;
            let others: Vec<&str> = mine
                .iter()
                .map(|b| {
                    now.iter()
                        .find(|(n, h)| n == b && *h != leader)
                        .map(|(_, h)| h.as_str())
                })
                .collect::<Option<_>>()?;
            let mut others: Vec<String> = others.into_iter().map(str::to_owned).collect();
            others.sort();
            others.dedup();
            Some(others)
        },
    )
    .await;
    sleep(fault.hold).await;
    signal(pid, "CONT");
    let note = match taken_by {
        Some(h) => format!("its {} buckets taken by {}", mine.len(), h.join(", ")),
        None => format!("its {} buckets not all taken within 60 s", mine.len()),
    };
    (leader, note)
}
