//! `chaos` (`make chaos`): the whole system under load through a fault schedule, then the
//! audit, all on the secured stack (SASL_SSL with SCRAM-SHA-512, PostgreSQL `verify-full`,
//! least-privilege roles, passwords from files: `e2e::chaos::world`). Prints how it was
//! secured, the fault timeline and the verdict; exits 0 only when the audit is clean and every
//! fault recovered. Needs PostgreSQL's binaries, Apache Kafka's jars and openssl (`make deps`)
//! and a debug build of the workspace's binaries (`cargo build --workspace --bins`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::chaos::run::{run, Spec};
use e2e::chaos::FaultKind;

/// The chaos run.
#[derive(Debug, Parser)]
#[command(name = "chaos", about)]
struct Args {
    /// Orders per second (the whole system and its faults share the machine: 8 keeps a
    /// 2-core machine's CI run within its recovery deadlines).
    #[arg(long, default_value_t = 8.0)]
    rate: f64,
    /// How long the load runs, in seconds (the faults fall in its first 75 %).
    #[arg(long, default_value_t = 180)]
    duration_s: u64,
    /// Seed of the fault schedule (the same seed gives the same schedule).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of faults.
    #[arg(long, default_value_t = 10)]
    faults: usize,
    /// Fault kinds, comma separated (default: all of them).
    #[arg(long, value_delimiter = ',', value_parser = FaultKind::parse)]
    mix: Vec<FaultKind>,
    /// Lag (unpublished events + orders paid but not yet reserved, or reserved but without an
    /// outbound) under which a fault counts as recovered.
    #[arg(long, default_value_t = 50)]
    lag_threshold: i64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let default_hook = std::panic::take_hook();
    // The load runs each client call in a task of its own: a panic there is an expected failed
    // call (a service down, an unexpected answer) and is retried, so it prints nothing. The run
    // itself (start-up, faults, drain, verdict) is on the main thread and panics loudly.
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("main") {
            default_hook(info);
        }
    }));
    let spec = Spec {
        rate: args.rate,
        duration: Duration::from_secs(args.duration_s),
        seed: args.seed,
        faults: args.faults,
        mix: if args.mix.is_empty() {
            FaultKind::ALL.to_vec()
        } else {
            args.mix
        },
        lag_threshold: args.lag_threshold,
    };
    // Interrupted (Ctrl-C, SIGTERM): returning drops the runtime, its tasks and so the world,
    // whose servers and services are stopped by their `Drop`s instead of being left running.
    let summary = tokio::select! {
        s = run(&spec) => s,
        signal = stop_signal() => {
            eprintln!("chaos: {signal}: stopping everything it started");
            return ExitCode::from(130);
        }
    };
    println!("{}", summary.to_text());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&summary).expect("summary as JSON");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("chaos: could not write {}: {e}", path.display());
        }
    }
    if summary.passed() {
        println!("PASSED: clean audit, every fault recovered");
        ExitCode::SUCCESS
    } else {
        println!("FAILED");
        ExitCode::from(1)
    }
}

/// The first SIGINT or SIGTERM.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).expect("a SIGINT handler");
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::select! {
        _ = int.recv() => "interrupted",
        _ = term.recv() => "terminated",
    }
}
