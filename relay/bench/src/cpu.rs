//! CPU accounting per process from `/proc`: the relay, the PostgreSQL server (the postmaster,
//! its live children and the children it reaped), the broker, and this benchmark itself, plus
//! how busy the whole machine was. A phase takes a [`Snapshot`] when its clock starts and one
//! when it stops; [`CpuFigures::between`] turns the two into CPU seconds and microseconds per
//! event. Servers not on this machine (or whose pid is unknown) are reported as absent.

use std::time::Instant;

use serde::Serialize;

/// Which processes to account, found once at start-up.
#[derive(Debug, Clone, Default)]
pub struct CpuProbe {
    /// The PostgreSQL postmaster, when the server runs on this machine.
    pub postmaster: Option<u32>,
    /// The broker, from `BENCH_BROKER_PID` (set by `deploy/local/bench.sh`).
    pub broker: Option<u32>,
    ticks_per_s: f64,
}

/// CPU counters at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    postgres_s: Option<f64>,
    broker_s: Option<f64>,
    bench_s: Option<f64>,
    machine_busy_s: Option<f64>,
}

/// CPU spent by each process over a phase.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuFigures {
    /// Wall-clock seconds of the phase.
    pub wall_s: f64,
    /// CPU seconds of the relay process (drain phases only).
    pub relay_s: Option<f64>,
    /// CPU seconds of the PostgreSQL server processes.
    pub postgres_s: Option<f64>,
    /// CPU seconds of the broker.
    pub broker_s: Option<f64>,
    /// CPU seconds of relay-bench itself (the client in the raw phases).
    pub bench_s: Option<f64>,
    /// Relay CPU per event, microseconds.
    pub relay_us_per_event: Option<f64>,
    /// PostgreSQL CPU per event, microseconds.
    pub postgres_us_per_event: Option<f64>,
    /// Broker CPU per event, microseconds.
    pub broker_us_per_event: Option<f64>,
    /// relay-bench CPU per event, microseconds.
    pub bench_us_per_event: Option<f64>,
    /// Busy CPU of the whole machine over `cpus × wall` (0..1).
    pub machine_utilisation: Option<f64>,
}

impl CpuProbe {
    /// Finds the postmaster from a backend's pid (`SELECT pg_backend_pid()`), and the broker
    /// from `BENCH_BROKER_PID`.
    pub fn new(backend_pid: Option<u32>) -> Self {
        let postmaster = backend_pid
            .and_then(parent_of)
            .filter(|p| comm(*p).is_some_and(|c| c.starts_with("postgres")));
        let broker = std::env::var("BENCH_BROKER_PID")
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .filter(|p| comm(*p).is_some());
        Self {
            postmaster,
            broker,
            ticks_per_s: clock_ticks(),
        }
    }

    /// Reads every counter now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            at: Instant::now(),
            postgres_s: self.postmaster.and_then(|p| self.tree_seconds(p)),
            broker_s: self.broker.and_then(|p| self.process_seconds(p, true)),
            bench_s: self.process_seconds(std::process::id(), true),
            machine_busy_s: machine_busy_ticks().map(|t| t / self.ticks_per_s),
        }
    }

    /// CPU seconds of one process (`utime + stime`, plus its reaped children when asked).
    pub fn process_seconds(&self, pid: u32, with_children: bool) -> Option<f64> {
        let f = stat_fields(pid)?;
        let mut ticks = f.utime + f.stime;
        if with_children {
            ticks += f.cutime + f.cstime;
        }
        Some(ticks / self.ticks_per_s)
    }

    /// A server and everything it forked: its own time, its reaped children's, and each live
    /// child's (PostgreSQL backends, autovacuum, checkpointer, ...).
    fn tree_seconds(&self, root: u32) -> Option<f64> {
        let mut total = self.process_seconds(root, true)?;
        for pid in children_of(root) {
            total += self.process_seconds(pid, true).unwrap_or(0.0);
        }
        Some(total)
    }
}

impl CpuFigures {
    /// The CPU spent between `start` and `end` for `events` events; `relay_s` is the relay's
    /// total (a fresh process per drain).
    pub fn between(start: &Snapshot, end: &Snapshot, events: u64, relay_s: Option<f64>) -> Self {
        let wall_s = end.at.duration_since(start.at).as_secs_f64();
        let delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a).max(0.0));
        let per = |s: Option<f64>| s.map(|s| s * 1e6 / events.max(1) as f64);
        let postgres_s = delta(start.postgres_s, end.postgres_s);
        let broker_s = delta(start.broker_s, end.broker_s);
        let bench_s = delta(start.bench_s, end.bench_s);
        let cpus = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        Self {
            wall_s,
            relay_s,
            postgres_s,
            broker_s,
            bench_s,
            relay_us_per_event: per(relay_s),
            postgres_us_per_event: per(postgres_s),
            broker_us_per_event: per(broker_s),
            bench_us_per_event: per(bench_s),
            machine_utilisation: delta(start.machine_busy_s, end.machine_busy_s)
                .map(|busy| busy / (wall_s * cpus).max(1e-9)),
        }
    }
}

struct StatFields {
    ppid: u32,
    utime: f64,
    stime: f64,
    cutime: f64,
    cstime: f64,
}

fn stat_fields(pid: u32) -> Option<StatFields> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    Some(StatFields {
        ppid: f.get(1)?.parse().ok()?,
        utime: num(11)?,
        stime: num(12)?,
        cutime: num(13)?,
        cstime: num(14)?,
    })
}

fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid).map(|f| f.ppid)
}

fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

fn children_of(root: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(root))
        .collect()
}

/// Busy ticks of all CPUs since boot (`/proc/stat`: everything but idle and iowait).
fn machine_busy_ticks() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is already in user)
    Some(v.iter().take(8).sum::<f64>() - v.get(3)? - v.get(4)?)
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_burns_measurable_cpu() {
        let probe = CpuProbe::new(None);
        let a = probe.snapshot();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed().as_millis() < 200 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = probe.snapshot();
        let f = CpuFigures::between(&a, &b, 1000, None);
        // How much of the 200 ms this thread got depends on the machine's load; what cannot
        // depend on it: some CPU was counted, and no more than the wall time on every core.
        let bench = f.bench_s.unwrap();
        let cpus = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        assert!(bench > 0.0 && bench <= f.wall_s * cpus + 0.02, "{f:?}");
        assert_eq!(f.bench_us_per_event, Some(bench * 1e6 / 1000.0));
        assert!(f.machine_utilisation.unwrap() > 0.0);
        assert!(f.postgres_s.is_none(), "no postmaster given");
    }
}
