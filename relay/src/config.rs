//! Command-line and environment configuration of the `outbox-relay` binary.
//!
//! Every setting is a flag with an environment fallback, so the same binary is configured by
//! flags on a laptop and by environment variables in a container.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Publishes committed transactional-outbox rows from PostgreSQL to Kafka.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay: publish outbox rows to Kafka until SIGTERM. A second instance against
    /// the same database waits as a hot standby and takes over when the first one dies.
    Run(Box<RunArgs>),
    /// Apply the outbox schema (outbox table, relay lease table) to the database.
    Migrate(DbArgs),
    /// Print the backlog, the age of the oldest unpublished event, the lease holder and the
    /// parked events.
    Status(StatusArgs),
    /// List the events that failed: parked ones (waiting for an operator) and ones being
    /// retried, with their error, attempts, age and the events waiting behind each.
    Blocked(OpsArgs),
    /// Unpark events so they are sent again, before the later events of their aggregate.
    Redrive(RedriveArgs),
    /// Remove a parked event from the outbox into the `outbox_discarded` audit table; the
    /// later events of its aggregate then flow.
    Discard(DiscardArgs),
    /// Publish a Debezium outbox table as Debezium's Outbox Event Router does: reads the
    /// Kafka Connect properties Debezium runs with, refuses what the relay cannot reproduce
    /// (naming the option), and installs a trigger on the table that copies each inserted row
    /// into the outbox, encoded as Debezium's converters encode it. Run `migrate` first.
    DebeziumInstall(DebeziumInstallArgs),
    /// Show the outbox's buckets and who holds each; with `--set N`, change the bucket count
    /// (refused while any relay of the lease publishes: stop them with SIGTERM first). Several
    /// buckets let several relays publish at once, each its share.
    Buckets(BucketsArgs),
}

/// Settings of `outbox-relay buckets`.
#[derive(Debug, Clone, Args)]
pub struct BucketsArgs {
    /// Database settings.
    #[command(flatten)]
    pub db: DbArgs,
    /// Lease name of the relays.
    #[arg(long, env = "OUTBOX_LEASE_NAME", default_value = "default", value_parser = lease_name)]
    pub lease_name: String,
    /// Change the bucket count to this (1 to 256).
    #[arg(long)]
    pub set: Option<i64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Settings of `outbox-relay debezium-install`.
#[derive(Debug, Clone, Args)]
pub struct DebeziumInstallArgs {
    /// Database settings.
    #[command(flatten)]
    pub db: DbArgs,
    /// A Kafka Connect properties file: the worker's (its converters) and the connector's, in
    /// that order (repeat the flag). The first file that sets `connector.class` and the later
    /// ones are the connector's, the earlier ones the worker's; a later file overrides an
    /// earlier one's keys of its side. Converters are layered as Connect layers them: the
    /// connector's when it names the class, else the worker's, each with its own options.
    #[arg(long = "config", required = true)]
    pub config: Vec<std::path::PathBuf>,
    /// Print the statements instead of running them.
    #[arg(long)]
    pub print: bool,
    /// Debezium's replication slot (its `slot.name`): once the trigger is in place, wait until
    /// the slot confirms the position of that moment, i.e. Debezium published every row
    /// committed before the trigger. Start the relay after that (the cutover: README, "Coming
    /// from Debezium"). Debezium confirms positions as it publishes rows (or heartbeats), so
    /// writers (or `heartbeat.interval.ms`) must be active.
    #[arg(long)]
    pub slot: Option<String>,
    /// How long to wait for the slot, in seconds.
    #[arg(long, default_value_t = 600)]
    pub slot_timeout_secs: u64,
}

/// Settings shared by the operator commands.
#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    /// Database settings.
    #[command(flatten)]
    pub db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Settings of `outbox-relay redrive`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["event_id", "aggregate", "all"])))]
pub struct RedriveArgs {
    /// Database and output settings.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The event to unpark (its `event_id`).
    #[arg(long)]
    pub event_id: Option<uuid::Uuid>,
    /// Every failed event of one aggregate, as `TYPE:ID` (e.g. `order:42`).
    #[arg(long, value_parser = parse_aggregate)]
    pub aggregate: Option<(String, String)>,
    /// Every parked or retrying event.
    #[arg(long)]
    pub all: bool,
}

/// Settings of `outbox-relay discard`.
#[derive(Debug, Clone, Args)]
pub struct DiscardArgs {
    /// Database and output settings.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The parked event to discard (its `event_id`).
    #[arg(long)]
    pub event_id: uuid::Uuid,
    /// Why it is discarded (kept in the audit table).
    #[arg(long)]
    pub reason: String,
    /// Who discards it (kept in the audit table). Default: `$USER`.
    #[arg(long, env = "USER")]
    pub by: Option<String>,
}

/// Parses `TYPE:ID`.
///
/// # Errors
/// When there is no `:` or either side is empty.
pub fn parse_aggregate(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((t, id)) if !t.is_empty() && !id.is_empty() => Ok((t.to_owned(), id.to_owned())),
        _ => Err(format!("expected TYPE:ID (e.g. order:42), got `{s}`")),
    }
}

/// Database connection settings.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL connection URL of the database that holds the outbox table.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// The database is reached through PgBouncer with `pool_mode = transaction`: send no
    /// `extra_float_digits` startup parameter, prepare no named statement that outlives its
    /// transaction, run every statement in its own transaction, and do not LISTEN (the relay
    /// polls). Run `migrate` against PostgreSQL directly (migrations take a session advisory
    /// lock).
    #[arg(long, env = "OUTBOX_PGBOUNCER", default_value_t = false)]
    pub pgbouncer: bool,
}

/// Kafka producer and topic settings.
#[derive(Debug, Clone, Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers, comma separated (`host:port,host:port`).
    #[arg(long, env = "KAFKA_BROKERS")]
    pub kafka_brokers: String,

    /// Prefix of routed topics: an event goes to `<prefix><aggregate_type>` unless its row
    /// sets `topic`. The default matches Debezium's outbox event router.
    #[arg(long, env = "OUTBOX_TOPIC_PREFIX", default_value = outbox_writer::DEFAULT_TOPIC_PREFIX)]
    pub topic_prefix: String,

    /// Extra librdkafka producer settings as KEY=VALUE (repeatable, or comma separated), e.g.
    /// compression, linger, security settings. They override the relay's defaults; settings
    /// its guarantees depend on (idempotence, acks, delivery timeouts, partitioner, in-flight
    /// limits, gapless guarantee) are refused at start-up.
    #[arg(long = "kafka-config", env = "OUTBOX_KAFKA_CONFIG", hide_env_values = true, value_parser = outbox_kafka::parse_kafka_config)]
    pub kafka_config_lists: Vec<outbox_kafka::KafkaConfigList>,

    /// TLS and SASL settings (`KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_*`, `KAFKA_SSL_*`), the
    /// same in every binary.
    #[command(flatten)]
    pub security: outbox_kafka::KafkaSecurityArgs,

    /// Create a topic the relay is about to publish to when the broker does not have it.
    /// Off by default: in production, topics are usually owned by whoever runs the cluster.
    #[arg(long, env = "OUTBOX_CREATE_MISSING_TOPICS", default_value_t = false)]
    pub create_missing_topics: bool,

    /// Partitions of topics created by `--create-missing-topics`.
    #[arg(long, env = "OUTBOX_TOPIC_PARTITIONS", default_value_t = 6, value_parser = clap::value_parser!(i32).range(1..))]
    pub topic_partitions: i32,

    /// Replication factor of topics created by `--create-missing-topics` [default: the
    /// broker's `default.replication.factor`].
    #[arg(long, env = "OUTBOX_TOPIC_REPLICATION_FACTOR", value_parser = clap::value_parser!(i32).range(1..))]
    pub topic_replication_factor: Option<i32>,

    /// `min.insync.replicas` of topics created by `--create-missing-topics` [default: a
    /// majority of the replication factor, as Kafka recommends: 1 → 1, 2 → 2, 3 → 2, 5 → 3].
    /// The relay also warns, for every topic it publishes to, when more than one replica
    /// takes writes its leader alone acknowledged (`min.insync.replicas` 1).
    #[arg(long, env = "OUTBOX_TOPIC_MIN_INSYNC_REPLICAS", value_parser = clap::value_parser!(i32).range(1..))]
    pub topic_min_insync_replicas: Option<i32>,

    /// Publish every event as a CloudEvent (Kafka protocol binding, binary mode): headers
    /// `ce_specversion` 1.0, `ce_id` (the event id), `ce_source` (`--cloudevents-source`),
    /// `ce_type` (the event type), `ce_subject` (the aggregate id), `ce_time` (the row's
    /// `created_at`) and `content-type`, beside the relay's own headers. The value is
    /// unchanged.
    #[arg(long, env = "OUTBOX_CLOUDEVENTS", default_value_t = false)]
    pub cloudevents: bool,

    /// The `ce_source` of every CloudEvent (a URI reference naming the producing service, e.g.
    /// `/orders` or `urn:example:orders`).
    #[arg(long, env = "OUTBOX_CLOUDEVENTS_SOURCE", default_value = "outbox-relay", value_parser = parse_cloudevents_source)]
    pub cloudevents_source: String,
}

impl KafkaArgs {
    /// Every `--kafka-config` setting, in order.
    pub fn kafka_config(&self) -> Vec<(String, String)> {
        outbox_kafka::config_arg::pairs(&self.kafka_config_lists)
    }

    /// What the relay adds to every message.
    pub fn wire(&self) -> crate::publisher::WireSettings {
        crate::publisher::WireSettings {
            cloudevents_source: self.cloudevents.then(|| self.cloudevents_source.clone()),
        }
    }
}

/// A `ce_source`: non-empty, printable ASCII without spaces (a URI reference).
fn parse_cloudevents_source(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("a CloudEvents source cannot be empty".to_owned());
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "`{s}` is not a URI reference (printable ASCII without spaces)"
        ));
    }
    Ok(s.to_owned())
}

/// Settings of `outbox-relay run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Database settings.
    #[command(flatten)]
    pub db: DbArgs,

    /// The development switch of the weak-secret check (`DATABASE_URL`'s password).
    #[command(flatten)]
    pub secrets: outbox_process::secrets::SecretArgs,

    /// Kafka settings.
    #[command(flatten)]
    pub kafka: KafkaArgs,

    /// Most rows read and published per batch. Larger batches raise throughput; every row of
    /// a batch is in flight at once.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub batch_size: i64,

    /// Most bytes of payload and headers per batch (the first row of a batch is taken whatever
    /// its size). Bounds the relay's memory when events are large: it holds at most two
    /// batches, the one in flight and the next, claimed while the first is sent.
    #[arg(long, env = "OUTBOX_BATCH_MAX_BYTES", default_value_t = 64 << 20, value_parser = clap::value_parser!(i64).range(1..))]
    pub batch_max_bytes: i64,

    /// Failed attempts after which an event is parked (it then waits for `redrive` or
    /// `discard`; its aggregate's later events wait behind it, other aggregates flow). Events
    /// that can never be sent (undecodable, invalid or refused topic, refused by the producer,
    /// refused by the broker when sent alone) are parked at once. The other events of a record
    /// batch the broker refused are not judged by it: each is sent alone first, whatever this
    /// is. Retries wait 0.5 s, doubling up to 60 s.
    #[arg(long, env = "OUTBOX_PARK_AFTER", default_value_t = 10, value_parser = clap::value_parser!(i32).range(1..))]
    pub park_after: i32,

    /// Longest wait between two polls of an idle outbox, in milliseconds. After a non-empty
    /// batch the relay polls again at once, and keeps polling every `--min-poll-interval-ms`
    /// for 2 s; once the outbox has been empty that long, the wait doubles up to this value. A NOTIFY on channel `outbox_relay` wakes it
    /// at once (optional for writers).
    #[arg(long, env = "OUTBOX_POLL_INTERVAL_MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub poll_interval_ms: u64,

    /// Shortest wait between polls, in milliseconds (see `--poll-interval-ms`).
    #[arg(long, env = "OUTBOX_MIN_POLL_INTERVAL_MS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub min_poll_interval_ms: u64,

    /// Shortest time from the start of one batch to the start of the next, in milliseconds,
    /// unless a backlog is waiting (the last batch was full). Under a steady load each batch
    /// costs about the same CPU however few events it carries (a claim, a send, a commit, a
    /// mark, and the wake-ups of the threads between them): a longer interval gathers more
    /// events per batch, for less CPU per event and that much more latency. 0: a batch starts
    /// as soon as the last one ended.
    #[arg(long, env = "OUTBOX_MIN_BATCH_INTERVAL_MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub min_batch_interval_ms: u64,

    /// Name of the relay lease: relays sharing a lease name and a database elect one active
    /// publisher; the others are hot standbys.
    #[arg(long, env = "OUTBOX_LEASE_NAME", default_value = "default", value_parser = lease_name)]
    pub lease_name: String,

    /// Lease time-to-live in milliseconds. A standby takes over at most this long (plus one
    /// standby poll) after the active relay stopped renewing. Renewed every third of it.
    #[arg(long, env = "OUTBOX_LEASE_TTL_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(300..))]
    pub lease_ttl_ms: u64,

    /// This instance's name in the lease table (shown by `status`). Default: host name, process
    /// id and a random suffix.
    #[arg(long, env = "OUTBOX_INSTANCE_ID")]
    pub instance_id: Option<String>,

    /// Address of the HTTP server for `/metrics` (Prometheus text) and `/healthz`.
    #[arg(long, env = "METRICS_ADDR", default_value = "127.0.0.1:9187")]
    pub metrics_addr: SocketAddr,

    /// How long SIGTERM waits for acknowledgements of messages already in flight before the
    /// relay exits without marking them (they are published again later), in milliseconds.
    #[arg(long, env = "OUTBOX_SHUTDOWN_TIMEOUT_MS", default_value_t = 7000)]
    pub shutdown_timeout_ms: u64,

    /// How long a batch may go without any acknowledgement from the broker while the cluster
    /// still answers, in milliseconds. Then the events not acknowledged (a partition without
    /// a leader, or with too few in-sync replicas) are withdrawn and fail as `unacknowledged`
    /// for their own aggregates: retried alone with backoff, parked after `--park-after`
    /// attempts, while every other aggregate flows. During a broker outage (no answer at all)
    /// the batch waits, however long.
    #[arg(long, env = "OUTBOX_SEND_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(500..))]
    pub send_timeout_ms: u64,

    /// Publish each batch as one Kafka transaction (on by default), under a `transactional.id`
    /// that every relay of the lease shares: a new leader fences the one it replaced at the
    /// broker, so a deposed leader's queued or in-flight events can never land after the new
    /// leader's, and each transaction records what it published, so a relay taking over sends
    /// nothing twice (consumers must read `read_committed`; see the README's consumer
    /// section). Needs the `TransactionalId` WRITE and DESCRIBE ACLs on the id, and CREATE
    /// (or an existing topic) and WRITE on the records topic. `false` turns both off.
    #[arg(long, env = "OUTBOX_TRANSACTIONS", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    pub transactions: bool,

    /// The `transactional.id` of `--transactions` (the lone producer's is this with `.lone`).
    /// Relays of one outbox and lease must share it; relays of different outboxes must not.
    /// Default: `outbox-relay.<database name>.<lease name>`.
    #[arg(long, env = "OUTBOX_TRANSACTIONAL_ID")]
    pub transactional_id: Option<String>,

    /// With `--transactions`: the relay's compacted topic where each Kafka transaction also
    /// records which outbox rows it published, so that a relay taking a bucket over marks
    /// them instead of sending them again. The relay creates it (compacted) when missing, with
    /// `--create-missing-topics` or not, as it is the relay's own state.
    /// Default: `<topic prefix>outbox-relay.records`.
    #[arg(long, env = "OUTBOX_RECORDS_TOPIC")]
    pub records_topic: Option<String>,

    /// Days a row of the `outbox_discarded` audit table is kept; the leading relay deletes
    /// older ones in the background.
    #[arg(long, env = "OUTBOX_DISCARDED_RETENTION_DAYS", default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..))]
    pub discarded_retention_days: u32,

    /// How the retention purge runs (batch size, pause, interval).
    #[command(flatten)]
    pub purge: outbox_process::retention::PurgeArgs,
}

/// Settings of `outbox-relay status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Database settings.
    #[command(flatten)]
    pub db: DbArgs,
    /// Lease name to report on.
    #[arg(long, env = "OUTBOX_LEASE_NAME", default_value = "default", value_parser = lease_name)]
    pub lease_name: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

impl RunArgs {
    /// The shortest time between the starts of two batches (see `--min-batch-interval-ms`).
    pub fn min_batch_interval(&self) -> Duration {
        Duration::from_millis(self.min_batch_interval_ms)
    }

    /// Poll interval bounds.
    pub fn poll_bounds(&self) -> (Duration, Duration) {
        let max = Duration::from_millis(self.poll_interval_ms);
        let min = Duration::from_millis(self.min_poll_interval_ms).min(max);
        (min, max)
    }

    /// The lease time-to-live.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    /// The bound on a batch without acknowledgements (see `--send-timeout-ms`).
    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(self.send_timeout_ms)
    }

    /// The shutdown deadline for in-flight acknowledgements.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    /// Claim bounds.
    pub fn claim_limits(&self) -> crate::store::ClaimLimits {
        crate::store::ClaimLimits {
            rows: self.batch_size,
            bytes: self.batch_max_bytes,
            failures: crate::store::FailureFilter::Hashed,
            ids: crate::store::IdRange::ALL,
        }
    }

    /// How long `outbox_discarded` rows are kept.
    pub fn discarded_retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.discarded_retention_days) * 86_400)
    }

    /// The `transactional.id` when `--transactions` is on: the given one, or
    /// `outbox-relay.<database name>.<lease name>`.
    ///
    /// # Errors
    /// An invalid database URL.
    pub fn transactional_id(&self) -> anyhow::Result<Option<String>> {
        if !self.transactions {
            return Ok(None);
        }
        if let Some(id) = &self.transactional_id {
            return Ok(Some(id.clone()));
        }
        let options = outbox_process::pg::connect_options(&self.db.database_url)?;
        let database = options
            .get_database()
            .unwrap_or_else(|| options.get_username());
        Ok(Some(format!("outbox-relay.{database}.{}", self.lease_name)))
    }

    /// The instance id, or a generated one.
    pub fn instance_id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(default_instance_id)
    }
}

fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    let suffix: u16 = rand::random();
    format!("{host}-{}-{suffix:04x}", std::process::id())
}

/// A lease name: not empty, without `/` (the bucket leases are named `<lease>/l<layout>/b<n>`).
fn lease_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains('/') {
        return Err("a lease name is not empty and has no '/' (bucket leases are named <lease>/l<layout>/b<bucket>)".into());
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> RunArgs {
        let mut argv = vec!["outbox-relay", "run"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(r) => *r,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn transactions_are_on_by_default_and_share_an_id_per_database_and_lease() {
        let base = [
            "--database-url",
            "postgres://u@x/orders",
            "--kafka-brokers",
            "k:9092",
        ];
        let on = run_args(&base);
        assert!(on.transactions);
        assert_eq!(
            on.transactional_id().unwrap().as_deref(),
            Some("outbox-relay.orders.default")
        );
        assert_eq!(on.send_timeout(), Duration::from_secs(30));
        let mut off = base.to_vec();
        off.extend(["--transactions", "false"]);
        assert_eq!(run_args(&off).transactional_id().unwrap(), None);
        let mut on = base.to_vec();
        on.extend(["--lease-name", "eu"]);
        assert_eq!(
            run_args(&on).transactional_id().unwrap().as_deref(),
            Some("outbox-relay.orders.eu")
        );
        on.extend(["--transactional-id", "mine"]);
        assert_eq!(
            run_args(&on).transactional_id().unwrap().as_deref(),
            Some("mine")
        );
    }

    #[test]
    fn flags_parse_with_defaults() {
        let r = run_args(&[
            "--database-url",
            "postgres://x/db",
            "--kafka-brokers",
            "k:9092",
        ]);
        assert_eq!(r.db.database_url, "postgres://x/db");
        assert_eq!(r.kafka.kafka_brokers, "k:9092");
        assert_eq!(r.kafka.topic_prefix, "outbox.event.");
        assert_eq!(r.batch_size, 10_000);
        assert!(!r.kafka.create_missing_topics);
        assert_eq!(r.kafka.topic_partitions, 6);
        assert_eq!(r.lease_name, "default");
        assert_eq!(
            r.poll_bounds(),
            (Duration::from_millis(5), Duration::from_millis(500))
        );
        assert_eq!(
            r.min_batch_interval(),
            Duration::ZERO,
            "a batch starts as soon as the last one ended unless asked otherwise"
        );
    }

    #[test]
    fn librdkafka_settings_are_key_values() {
        let r = run_args(&[
            "--database-url",
            "postgres://x/db",
            "--kafka-brokers",
            "k:9092",
            "--kafka-config",
            "linger.ms=10",
            "--kafka-config",
            "compression.type = zstd",
        ]);
        assert_eq!(
            r.kafka.kafka_config(),
            vec![
                ("linger.ms".to_owned(), "10".to_owned()),
                ("compression.type".to_owned(), "zstd".to_owned())
            ]
        );
    }

    #[test]
    fn bad_values_are_rejected() {
        for bad in [
            &["--batch-size", "0"][..],
            &["--topic-partitions", "0"],
            &["--lease-ttl-ms", "10"],
        ] {
            let mut argv = vec![
                "outbox-relay",
                "run",
                "--database-url",
                "postgres://x/db",
                "--kafka-brokers",
                "k:9092",
            ];
            argv.extend_from_slice(bad);
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn operator_commands_parse() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["outbox-relay"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv)
        };
        let db = ["--database-url", "postgres://x/db"];
        let Command::Redrive(r) =
            parse(&[&["redrive", "--aggregate", "order:42"][..], &db].concat())
                .unwrap()
                .command
        else {
            panic!("not redrive")
        };
        assert_eq!(r.aggregate, Some(("order".into(), "42".into())));
        assert!(
            parse(&[&["redrive"][..], &db].concat()).is_err(),
            "a target is required"
        );
        assert!(parse(&[&["redrive", "--all", "--aggregate", "o:1"][..], &db].concat()).is_err());
        assert!(parse(&[&["redrive", "--aggregate", "nocolon"][..], &db].concat()).is_err());
        assert!(
            parse(&[&["discard", "--event-id", "x", "--reason", "r"][..], &db].concat()).is_err()
        );
        assert!(parse(&[&["blocked", "--json"][..], &db].concat()).is_ok());
    }

    #[test]
    fn missing_database_url_is_an_error() {
        // Only meaningful when the variable is not set in the test environment.
        if std::env::var_os("DATABASE_URL").is_none() {
            assert!(Cli::try_parse_from(["outbox-relay", "migrate"]).is_err());
        }
        assert!(Cli::try_parse_from([
            "outbox-relay",
            "migrate",
            "--database-url",
            "postgres://x/y"
        ])
        .is_ok());
    }
}
