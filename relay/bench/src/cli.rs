//! Command-line settings of `relay-bench`, and the figures they resolve to (`--quick` changes
//! the defaults, explicit flags still win).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde::Serialize;

/// Measures the outbox relay against the raw limits of one PostgreSQL and one broker, in one
/// invocation: raw produce rate, raw database rate, the relay draining a backlog, a naive
/// relay, end-to-end latency at a fixed offered load (and the relay's idle cost), and what
/// failures, the per-aggregate insert lock and a large backlog cost (as ratios to a baseline of
/// the same invocation), and how the cost per event grows with payload size (`sizes`) and,
/// opt-in (`--phases`), topic count (`topics`) against raw produce; `backlog` and
/// `transactions` (the relay's `--transactions` on against off) are opt-in too.
#[derive(Debug, Clone, Parser)]
#[command(name = "relay-bench", version, about, long_about = None)]
pub struct Args {
    /// Admin URL of the PostgreSQL server; every phase creates (and drops) a fresh database.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Kafka bootstrap servers; every phase uses fresh topics.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub kafka_brokers: String,

    /// TLS and SASL settings of the bench's own clients (`KAFKA_SECURITY_PROTOCOL`,
    /// `KAFKA_SASL_*`, `KAFKA_SSL_*`). The relay it starts reads the same environment
    /// variables; flags given here reach it only through `--relay-arg`.
    #[command(flatten)]
    pub kafka_security: outbox_kafka::KafkaSecurityArgs,

    /// What the broker stores messages in, reported with the figures (e.g. `Apache Kafka 4.1.1, KRaft, one node`).
    #[arg(long, env = "BENCH_BROKER_STORAGE", default_value = "unknown")]
    pub broker_storage: String,

    /// Smoke-run sizes: 20 000 events, naive 1 000, load 10 s, isolation 20 000 healthy
    /// events, inserts 2 s per run, failures over 20 000 outbox rows, backlog 500 000
    /// (explicit flags still win).
    #[arg(long)]
    pub quick: bool,

    /// Events for the raw produce, raw database and relay drain phases [default: 200 000;
    /// --quick: 20 000].
    #[arg(long)]
    pub events: Option<u64>,

    /// Events for the naive relay [default: 5 000; --quick: 1 000].
    #[arg(long)]
    pub naive_events: Option<u64>,

    /// Rows per batch, for the relay (`--batch-size`) and the raw database phase.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub batch_size: i64,

    /// Distinct aggregates (Kafka keys).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub aggregates: u64,

    /// Approximate size of a payload as JSON text, in bytes.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(100..=100_000))]
    pub payload_bytes: u64,

    /// Which payload column the events use: `json` (`payload jsonb`) or `binary`
    /// (`payload_bytes bytea`, the same bytes).
    #[arg(long, value_enum, default_value_t = crate::workload::PayloadKind::Json)]
    pub payload_kind: crate::workload::PayloadKind,

    /// The main phases' rows carry a `traceparent` header each (a trace of its own per event).
    /// With `OTEL_EXPORTER_OTLP_ENDPOINT` set for relay-bench (the relay it starts inherits
    /// it), the relay exports one PRODUCER span per event: compare the drain's CPU per event
    /// with and without to see what the spans cost; without the variable, what traced rows
    /// cost with export off.
    #[arg(long)]
    pub traced: bool,

    /// Partitions of every topic the bench creates.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: i32,

    /// Offered load of the latency phase, events per second (all writers together).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub load_rate: u64,

    /// Duration of the latency phase in seconds [default: 30; --quick: 10].
    #[arg(long)]
    pub load_seconds: Option<u64>,

    /// Concurrent writer tasks of the latency phase (one event per transaction).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub writers: u64,

    /// `linger.ms` of the naive relay's producer (librdkafka's default is 5).
    #[arg(long, default_value_t = 5)]
    pub naive_linger_ms: u64,

    /// Rounds of the throughput phases (produce, db, drain, interleaved) and of the
    /// `transactions` phase; each drain figure is the best round, all rounds are in the JSON.
    /// Use 3 or more on a busy machine.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,

    /// Phases to run, comma separated [default: all but the opt-in `backlog`, `topics` and
    /// `transactions`].
    #[arg(long, value_delimiter = ',')]
    pub phases: Vec<Phase>,

    /// Extra argument for `outbox-relay run` (repeatable), e.g.
    /// `--relay-arg=--kafka-config=linger.ms=1`.
    #[arg(long = "relay-arg", allow_hyphen_values = true)]
    pub relay_args: Vec<String>,

    /// A Debezium connector option for the `debezium` phase (repeatable, `KEY=VALUE`), e.g.
    /// `poll.interval.ms=10`; none: Debezium's defaults.
    #[arg(long = "debezium-config", value_parser = parse_key_value)]
    pub debezium_config: Vec<(String, String)>,

    /// The relay binary [default: target/release/outbox-relay of this workspace].
    #[arg(long, env = "OUTBOX_RELAY_BIN")]
    pub relay_bin: Option<PathBuf>,

    /// Where to write the JSON results [default: target/bench/relay-bench.json].
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Longest a relay may take to drain its backlog, in seconds.
    #[arg(long, default_value_t = 900)]
    pub drain_timeout_secs: u64,

    /// Healthy events of each `isolation` run [default: 100 000; --quick: 20 000].
    #[arg(long)]
    pub isolation_events: Option<u64>,

    /// Poisoned aggregates in front of the healthy events (`isolation`, variant "poisoned"):
    /// each an undecodable or misrouted event and two events behind it.
    #[arg(long, default_value_t = 2_000)]
    pub poisoned_aggregates: u64,

    /// Suspect aggregates in front of the healthy events (`isolation`, variant "suspects"):
    /// each three events, the first with a `broker_rejected` failure due for a retry.
    #[arg(long, default_value_t = 300)]
    pub suspect_aggregates: u64,

    /// Concurrent writer connections of the `insert` phase (single-row INSERT transactions).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub insert_writers: u64,

    /// Seconds of each `insert` run [default: 5; --quick: 2].
    #[arg(long)]
    pub insert_seconds: Option<u64>,

    /// Outbox rows of the `failures` phase [default: 200 000; --quick: 20 000].
    #[arg(long)]
    pub failure_outbox_rows: Option<u64>,

    /// Failure-table sizes of the `failures` phase, comma separated, growing.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000u64, 10_000, 100_000, 200_000])]
    pub failure_rows: Vec<u64>,

    /// Longest one timed claim of the `failures` phase may take (`statement_timeout`); a
    /// filter that hits it is reported as "over N s" and not run again at larger sizes.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub claim_timeout_secs: u64,

    /// Timed repeats of each claim and failure read in the `failures` phase (median shown).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub claim_repeats: u32,

    /// Events of the opt-in `backlog` phase [default: 5 000 000; --quick: 500 000].
    #[arg(long)]
    pub backlog_events: Option<u64>,

    /// Events of the parked aggregate behind its parked event in the `parked` phase
    /// [default: 1 000 000; --quick: 100 000].
    #[arg(long)]
    pub parked_behind: Option<u64>,

    /// Healthy events timed on each side of the `parked` phase.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub parked_samples: u64,

    /// Payload sizes of the `sizes` phase, bytes, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = [100u64, 1_024, 16_384, 262_144],
          value_parser = clap::value_parser!(u64).range(100..=900_000))]
    pub size_payloads: Vec<u64>,

    /// Payload megabytes (10^6 bytes) each run of the `sizes` phase moves at most: large sizes
    /// get fewer events (never more than `--events`, never fewer than 100) [default: 256;
    /// --quick: 32].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub size_budget_mb: Option<u64>,

    /// Topic counts of the opt-in `topics` phase, comma separated (one aggregate type per
    /// topic, the events spread evenly).
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 100, 1_000],
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub topic_counts: Vec<u64>,

    /// Offered rates of the opt-in `curve` phase, events per second, comma separated: the
    /// latency phase at each (`--load-seconds`, `--writers`), then a drain (`--events`).
    #[arg(long, value_delimiter = ',', default_values_t = [100u64, 1_000, 10_000],
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub curve_rates: Vec<u64>,

    /// Events of each run of the `topics` phase [default: 50 000; --quick: 10 000].
    #[arg(long)]
    pub topic_events: Option<u64>,

    /// Seconds over which the latency phase measures the relay's idle cost (CPU with nothing
    /// to send, after the load) [default: 10; --quick: 5].
    #[arg(long)]
    pub idle_seconds: Option<u64>,

    /// Seconds between the side claims that sample claim time during the `backlog` drain.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub backlog_probe_secs: u64,
}

/// One part of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Raw produce rate (and the relay's publish path without a database).
    Produce,
    /// Raw database rate with the relay's SQL.
    Db,
    /// The relay binary draining a backlog.
    Drain,
    /// The naive one-row-at-a-time relay.
    Naive,
    /// End-to-end latency at a fixed offered load.
    Latency,
    /// Healthy drain rate alone, behind poisoned aggregates, and beside suspect aggregates
    /// sent alone.
    Isolation,
    /// Cost per insert of the per-aggregate lock trigger (single-row and bulk).
    Insert,
    /// What the copy trigger of `debezium-install` costs the writers of a Debezium outbox
    /// table: inserts/s and PostgreSQL CPU per insert with and without it (`--insert-writers`,
    /// `--insert-seconds`).
    DebeziumCopy,
    /// Claim time and failure reads with a large failure table, per claim filter.
    Failures,
    /// Opt-in, heavy: the relay draining a multi-million event backlog (claim time as the
    /// table shrinks, leadership stability).
    Backlog,
    /// Raw produce and relay drain at each payload size of `--size-payloads` (incompressible
    /// padding, at most `--size-budget-mb` a run), CPU per event and MB/s.
    Sizes,
    /// Opt-in (minutes): raw produce and relay drain over each topic count of
    /// `--topic-counts`.
    Topics,
    /// Opt-in (minutes): the relay's `--transactions` off and on, alternating for `--repeat`
    /// rounds: the drain, then the latency phase; the figures and their ratios on / off.
    Transactions,
    /// Opt-in (minutes): the cost curve, the latency phase at each rate of `--curve-rates`
    /// and a drain: relay and PostgreSQL CPU per event and commit → seen p50 / p99 at each.
    Curve,
    /// Opt-in (minutes): the latency phase on a fresh table and on a table the relay has
    /// just drained `--events` from, alternating for `--repeat` rounds: each round's p50 and
    /// p99, their spread, and the drained table's p99 against the fresh table's.
    Tail,
    /// Opt-in (minutes): one backlog drained by one relay on one bucket, one relay on 8
    /// buckets and three relays sharing the 8 (`--repeat` rounds, interleaved).
    Relays,
    /// One event parked with `--parked-behind` events of its aggregate behind it: healthy
    /// events' commit → published latency against the same relay without that backlog.
    Parked,
    /// Opt-in (minutes, needs Kafka Connect and Debezium from `install-deps.sh` and
    /// `wal_level=logical`): Debezium's Outbox Event Router and the relay on the same Debezium
    /// table, backlog (`--events`) and broker, one after the other: drain, CPU per event, peak
    /// RSS, and commit → seen under `--load-rate` for `--load-seconds`.
    Debezium,
}

impl Phase {
    /// True for the phases a run without `--phases` includes: those of about a minute or less
    /// at default sizes (`sizes`: 40 s at load average 9). `backlog` (many minutes, gigabytes
    /// of disk), `topics` (minutes: 1 000 topics of 6 partitions each) and `transactions`
    /// (minutes: two drains and two latency runs a round) are opt-in.
    pub fn in_default_run(self) -> bool {
        !matches!(
            self,
            Self::Backlog
                | Self::Topics
                | Self::Transactions
                | Self::Debezium
                | Self::Curve
                | Self::Tail
                | Self::Relays
        )
    }
}

/// The sizes in effect after `--quick` and explicit flags.
#[derive(Debug, Clone, Serialize)]
pub struct Sizes {
    /// Events of the produce, database and drain phases.
    pub events: u64,
    /// Events of the naive relay.
    pub naive_events: u64,
    /// Seconds of offered load.
    pub load_seconds: u64,
    /// Healthy events of each isolation run.
    pub isolation_events: u64,
    /// Seconds of each insert run.
    pub insert_seconds: u64,
    /// Outbox rows of the failures phase.
    pub failure_outbox_rows: u64,
    /// Events of the backlog phase.
    pub backlog_events: u64,
    /// Events behind the parked one in the parked phase.
    pub parked_behind: u64,
    /// Payload bytes each `sizes` run moves at most.
    pub size_budget_bytes: u64,
    /// Events of each `topics` run.
    pub topic_events: u64,
    /// Seconds of the latency phase's idle measurement.
    pub idle_seconds: u64,
}

impl Args {
    /// Resolves the sizes.
    pub fn sizes(&self) -> Sizes {
        let (events, naive, secs) = if self.quick {
            (20_000, 1_000, 10)
        } else {
            (200_000, 5_000, 30)
        };
        let (isolation, insert_s, failure_rows, backlog) = if self.quick {
            (20_000, 2, 20_000, 500_000)
        } else {
            (100_000, 5, 200_000, 5_000_000)
        };
        let (budget_mb, idle_s) = if self.quick { (32, 5) } else { (256, 10) };
        let events = self.events.unwrap_or(events);
        Sizes {
            events,
            size_budget_bytes: self.size_budget_mb.unwrap_or(budget_mb) * 1_000_000,
            topic_events: self
                .topic_events
                .unwrap_or(if self.quick { 10_000 } else { 50_000 }),
            idle_seconds: self.idle_seconds.unwrap_or(idle_s),
            naive_events: self.naive_events.unwrap_or(naive),
            load_seconds: self.load_seconds.unwrap_or(secs),
            isolation_events: self.isolation_events.unwrap_or(isolation),
            insert_seconds: self.insert_seconds.unwrap_or(insert_s),
            failure_outbox_rows: self.failure_outbox_rows.unwrap_or(failure_rows),
            backlog_events: self.backlog_events.unwrap_or(backlog),
            parked_behind: self.parked_behind.unwrap_or(if self.quick {
                100_000
            } else {
                1_000_000
            }),
        }
    }

    /// True when `phase` is selected (without `--phases`: the default run's phases).
    pub fn runs(&self, phase: Phase) -> bool {
        if self.phases.is_empty() {
            phase.in_default_run()
        } else {
            self.phases.contains(&phase)
        }
    }

    /// The relay binary to spawn.
    pub fn relay_binary(&self) -> PathBuf {
        self.relay_bin
            .clone()
            .unwrap_or_else(|| target_dir().join("release/outbox-relay"))
    }

    /// The JSON output path.
    pub fn out_path(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| target_dir().join("bench/relay-bench.json"))
    }
}

/// The workspace's target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
            std::fs::canonicalize(&p).unwrap_or(p)
        })
}

/// `KEY=VALUE`.
fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s}: give it as KEY=VALUE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        let mut argv = vec![
            "relay-bench",
            "--database-url",
            "postgres://x/y",
            "--kafka-brokers",
            "k:9092",
        ];
        argv.extend_from_slice(args);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn quick_changes_defaults_but_not_explicit_flags() {
        let s = parse(&[]).sizes();
        assert_eq!(
            (s.events, s.naive_events, s.load_seconds),
            (200_000, 5_000, 30)
        );
        let s = parse(&["--quick"]).sizes();
        assert_eq!(
            (s.events, s.naive_events, s.load_seconds),
            (20_000, 1_000, 10)
        );
        let s = parse(&["--quick", "--events", "5000"]).sizes();
        assert_eq!(s.events, 5000);
    }

    #[test]
    fn phases_and_relay_args_parse() {
        let a = parse(&[
            "--phases",
            "produce,drain",
            "--relay-arg=--kafka-config=linger.ms=1",
        ]);
        assert!(a.runs(Phase::Drain) && !a.runs(Phase::Naive));
        assert_eq!(a.relay_args, vec!["--kafka-config=linger.ms=1"]);
        assert!(parse(&[]).runs(Phase::Latency));
    }

    #[test]
    fn backlog_is_opt_in_and_the_new_phases_parse() {
        let all = parse(&[]);
        assert!(all.runs(Phase::Isolation) && all.runs(Phase::Insert) && all.runs(Phase::Failures));
        assert!(!all.runs(Phase::Backlog));
        let a = parse(&["--phases", "isolation,insert,failures,backlog"]);
        assert!(a.runs(Phase::Backlog) && !a.runs(Phase::Drain));
        assert_eq!(a.failure_rows, vec![1_000, 10_000, 100_000, 200_000]);
        let q = parse(&["--quick"]).sizes();
        assert_eq!(
            (q.isolation_events, q.insert_seconds, q.backlog_events),
            (20_000, 2, 500_000)
        );
        assert_eq!(parse(&[]).sizes().backlog_events, 5_000_000);
    }

    #[test]
    fn topics_is_opt_in_and_growth_scales_with_quick() {
        let all = parse(&[]);
        assert!(all.runs(Phase::Sizes) && !all.runs(Phase::Topics));
        assert_eq!(all.size_payloads, vec![100, 1_024, 16_384, 262_144]);
        assert_eq!(all.topic_counts, vec![1, 100, 1_000]);
        assert!(!all.runs(Phase::Curve));
        assert!(!all.runs(Phase::Relays));
        assert!(parse(&["--phases", "relays"]).runs(Phase::Relays));
        assert_eq!(all.curve_rates, vec![100, 1_000, 10_000]);
        let c = parse(&["--phases", "curve", "--curve-rates", "50,500"]);
        assert!(c.runs(Phase::Curve) && !c.runs(Phase::Drain));
        assert_eq!(c.curve_rates, vec![50, 500]);
        let s = all.sizes();
        assert_eq!(
            (s.size_budget_bytes, s.topic_events, s.idle_seconds),
            (256_000_000, 50_000, 10)
        );
        let q = parse(&["--quick", "--phases", "sizes,topics"]);
        assert!(q.runs(Phase::Sizes) && q.runs(Phase::Topics) && !q.runs(Phase::Latency));
        let s = q.sizes();
        assert_eq!(
            (s.size_budget_bytes, s.topic_events, s.idle_seconds),
            (32_000_000, 10_000, 5)
        );
        let e = parse(&["--topic-events", "7000", "--size-payloads", "100,4096"]);
        assert_eq!((e.sizes().topic_events, e.size_payloads.len()), (7000, 2));
        assert!(Args::try_parse_from([
            "relay-bench",
            "--database-url",
            "x",
            "--kafka-brokers",
            "k",
            "--size-payloads",
            "2000000"
        ])
        .is_err());
    }

    #[test]
    fn transactions_is_opt_in_and_parses() {
        assert!(!Phase::Transactions.in_default_run());
        assert!(!parse(&[]).runs(Phase::Transactions));
        let a = parse(&["--phases", "transactions", "--repeat", "2"]);
        assert_eq!(a.phases, vec![Phase::Transactions]);
        assert!(a.runs(Phase::Transactions) && !a.runs(Phase::Drain) && !a.runs(Phase::Latency));
        assert_eq!(a.repeat, 2);
    }
}
