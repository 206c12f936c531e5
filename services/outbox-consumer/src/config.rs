//! Consumer settings: the flags every consuming service shares ([`ConsumerArgs`], flattened
//! into its own `clap` configuration), what the runtime needs ([`RuntimeConfig`]), and the
//! librdkafka settings derived from them ([`consumer_client_config`]).

use std::time::Duration;

use rdkafka::config::ClientConfig;

use super::apply::RetryPolicy;

/// Consumer flags with environment fallbacks, shared by every consuming service. The brokers
/// (`--kafka-brokers` / `KAFKA_BROKERS`) are the service's own flag, since some services run
/// without a consumer.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsumerArgs {
    /// Kafka consumer group id. Processes of one service share it, so each partition is
    /// consumed by one of them. Default: the service's name.
    #[arg(long = "group-id", env = "KAFKA_GROUP_ID")]
    pub group_id: Option<String>,

    /// Prefix of the consumed topics (`<prefix><aggregate_type>`); the same as the relays'.
    #[arg(long, env = "OUTBOX_TOPIC_PREFIX", default_value = outbox_writer::DEFAULT_TOPIC_PREFIX)]
    pub topic_prefix: String,

    /// Extra librdkafka consumer settings as KEY=VALUE (repeatable, or comma separated).
    /// Manual offset storing and auto-commit of stored offsets cannot be
    /// turned off.
    #[arg(long = "kafka-config", env = "KAFKA_CONSUMER_CONFIG", hide_env_values = true, value_parser = outbox_kafka::parse_kafka_config)]
    pub kafka_config: Vec<outbox_kafka::KafkaConfigList>,

    /// TLS and SASL settings (`KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_*`, `KAFKA_SSL_*`), for the
    /// consumer, its dead-letter producer and its admin client alike.
    #[command(flatten)]
    pub security: outbox_kafka::KafkaSecurityArgs,

    /// Create the consumed topics, their dead-letter topics and this consumer's redrive topics
    /// (`<topic>.<consumer>.redrive`) at start-up when the broker does
    /// not have them (needed on brokers without auto-creation). Off by default: in production,
    /// topics are usually owned by whoever runs the cluster.
    #[arg(long, env = "CONSUMER_CREATE_MISSING_TOPICS", default_value_t = false)]
    pub create_missing_topics: bool,

    /// Partitions of topics created by `--create-missing-topics`.
    #[arg(long, env = "CONSUMER_TOPIC_PARTITIONS", default_value_t = 6, value_parser = clap::value_parser!(i32).range(1..))]
    pub topic_partitions: i32,

    /// Replication factor of topics created by `--create-missing-topics` [default: the
    /// broker's `default.replication.factor`].
    #[arg(long, env = "CONSUMER_TOPIC_REPLICATION_FACTOR", value_parser = clap::value_parser!(i32).range(1..))]
    pub topic_replication_factor: Option<i32>,

    /// Longest wait between two attempts at an event whose handling failed with a retryable
    /// error, in milliseconds. The first wait is 100 ms and doubles.
    #[arg(long, env = "CONSUMER_RETRY_MAX_BACKOFF_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub retry_max_backoff_ms: u64,

    /// Attempts at an event failing with an error that comes back the same every time (a row
    /// not found, a value that does not decode, a handler panic) before it is dead-lettered.
    /// Infrastructure errors (connection lost, pool timeout, deadlock) are retried without
    /// limit.
    #[arg(long, env = "CONSUMER_MAX_ATTEMPTS_DETERMINISTIC", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts_deterministic: u32,

    /// How long SIGTERM waits for the events being applied to finish before the consumer
    /// leaves without them (they are delivered again), in milliseconds.
    #[arg(long, env = "CONSUMER_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub consumer_shutdown_timeout_ms: u64,

    /// Days an inbox row is kept after its event was applied; older rows of this consumer are
    /// deleted in the background. Keep it longer than any redelivery can come late (topic
    /// retention, a `dlq redrive` of an old dead letter): a redelivery after that is applied
    /// again, with only the business unique keys to stop it.
    #[arg(long, env = "INBOX_RETENTION_DAYS", default_value_t = 14, value_parser = clap::value_parser!(u32).range(1..))]
    pub inbox_retention_days: u32,

    /// How the retention purge runs (batch size, pause, interval).
    #[command(flatten)]
    pub purge: outbox_process::retention::PurgeArgs,
}

impl ConsumerArgs {
    /// The runtime configuration for consumer `consumer_name` reading the topics of
    /// `aggregate_types` (`<prefix><aggregate_type>` each) from `brokers`; the group id
    /// defaults to `default_group_id`.
    ///
    /// # Errors
    /// When the Kafka security settings are incomplete or contradict each other, or a file
    /// they name cannot be read ([`outbox_kafka::KafkaSecurityError`]).
    pub fn runtime_config(
        &self,
        consumer_name: &str,
        brokers: &str,
        default_group_id: &str,
        aggregate_types: &[&str],
    ) -> Result<RuntimeConfig, outbox_kafka::KafkaSecurityError> {
        Ok(RuntimeConfig {
            consumer_name: consumer_name.to_owned(),
            brokers: brokers.to_owned(),
            group_id: self
                .group_id
                .clone()
                .unwrap_or_else(|| default_group_id.to_owned()),
            topics: aggregate_types
                .iter()
                .map(|a| format!("{}{a}", self.topic_prefix))
                .collect(),
            client_config: self
                .security
                .settings(&outbox_kafka::config_arg::pairs(&self.kafka_config))?,
            create_topics: self.create_missing_topics.then_some(TopicSpec {
                partitions: self.topic_partitions,
                replication_factor: self.topic_replication_factor,
            }),
            retry: RetryPolicy {
                max: Duration::from_millis(self.retry_max_backoff_ms),
                ..RetryPolicy::default()
            },
            max_attempts_deterministic: self.max_attempts_deterministic,
            shutdown_timeout: Duration::from_millis(self.consumer_shutdown_timeout_ms),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            inbox_retention: Some(Duration::from_secs(
                u64::from(self.inbox_retention_days) * 86_400,
            )),
            purge: self.purge.settings(),
        })
    }
}

/// Messages queued per partition between the fetch loop and the partition's worker. When a
/// queue is full the partition is paused and what is fetched meanwhile waits in the fetch
/// loop's overflow buffer of that partition.
pub const DEFAULT_QUEUE_CAPACITY: usize = 256;

/// Partitions and replication of topics the runtime creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicSpec {
    /// Partitions.
    pub partitions: i32,
    /// Replication factor; `None`: the broker's default (`default.replication.factor`).
    pub replication_factor: Option<i32>,
}

/// Everything the consumer runtime needs besides the pool, the handler and the metrics.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The inbox's `consumer_name`, and the metrics' `consumer` label.
    pub consumer_name: String,
    /// Bootstrap servers.
    pub brokers: String,
    /// Consumer group id.
    pub group_id: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// Extra librdkafka settings: the security flags' and `--kafka-config` (`Debug` hides
    /// secrets).
    pub client_config: outbox_kafka::KafkaSettings,
    /// Create missing topics (and their dead-letter and redrive topics) at start-up.
    pub create_topics: Option<TopicSpec>,
    /// Backoff between attempts at a message.
    pub retry: RetryPolicy,
    /// Attempts at a message failing with a [`super::Disposition::RetryThenDeadLetter`] error
    /// (or a panic) before it is dead-lettered; at least 1.
    pub max_attempts_deterministic: u32,
    /// Drain deadline on shutdown.
    pub shutdown_timeout: Duration,
    /// Messages buffered per partition.
    pub queue_capacity: usize,
    /// How long this consumer's inbox rows are kept (`None`: forever).
    pub inbox_retention: Option<Duration>,
    /// How the inbox purge runs.
    pub purge: outbox_process::retention::PurgeSettings,
}

/// The dead-letter topic of `topic`.
pub fn dead_letter_topic(topic: &str) -> String {
    format!("{topic}.dlq")
}

/// The redrive topic of consumer `consumer_name` for `topic`: `dlq redrive` sends that
/// consumer's dead letters of `topic` there, and only that consumer subscribes to it, so no
/// other consumer of `topic` sees a redriven event again.
pub fn redrive_topic(topic: &str, consumer_name: &str) -> String {
    format!("{topic}.{consumer_name}.redrive")
}

/// The consumed topic whose events `topic` carries: `topic` itself, or for one of
/// `consumer_name`'s redrive topics of `consumed` the topic it belongs to.
pub fn consumed_topic<'a>(topic: &'a str, consumed: &'a [String], consumer_name: &str) -> &'a str {
    consumed
        .iter()
        .find(|t| redrive_topic(t, consumer_name) == topic)
        .map_or(topic, String::as_str)
}

impl RuntimeConfig {
    /// The consumer's redrive topics, one per consumed topic ([`redrive_topic`]).
    pub fn redrive_topics(&self) -> Vec<String> {
        self.topics
            .iter()
            .map(|t| redrive_topic(t, &self.consumer_name))
            .collect()
    }

    /// Every topic the consumer subscribes to: the consumed ones and its redrive topics.
    pub fn subscribed_topics(&self) -> Vec<String> {
        let mut all = self.topics.clone();
        all.extend(self.redrive_topics());
        all
    }
}

/// librdkafka consumer defaults; the user's settings override them.
pub const CONSUMER_DEFAULTS: [(&str, &str); 6] = [
    ("auto.offset.reset", "earliest"),
    ("enable.partition.eof", "false"),
    // Commit what was stored once a second, and on revoke and close.
    ("auto.commit.interval.ms", "1000"),
    // A consumer killed with SIGKILL holds its partitions until this expires.
    ("session.timeout.ms", "10000"),
    ("heartbeat.interval.ms", "1000"),
    ("enable.metrics.push", "false"),
];

/// Settings the runtime's guarantees rest on; applied last, so nothing overrides them. Offsets
/// are stored by the runtime only after the event's transaction committed, and only stored
/// offsets are ever committed. `read_committed`: a relay with `--transactions` publishes each
/// batch as a Kafka transaction, and a deposed relay's records are aborted, never committed;
/// a `read_uncommitted` reader would apply them (librdkafka's default, said here so that no
/// `--kafka-config` changes it).
pub const CONSUMER_FORCED: [(&str, &str); 3] = [
    ("enable.auto.offset.store", "false"),
    ("enable.auto.commit", "true"),
    ("isolation.level", "read_committed"),
];

/// Refuses `--kafka-config` settings that would make the consumer skip events: an
/// `auto.offset.reset` other than `earliest` starts a new group (or one whose offsets expired)
/// at the end of each partition, so every event already on the topic is never applied.
///
/// # Errors
/// A message naming the refused setting and why.
pub fn check_overrides(extra: &[(String, String)]) -> Result<(), String> {
    for (k, v) in extra {
        let key = k.trim();
        if key == "isolation.level" && v.trim() != "read_committed" {
            return Err(format!(
                "--kafka-config {key}={v} is refused: the consumer reads read_committed, so that \
                 records of aborted Kafka transactions (a relay fenced after a failover) are \
                 never applied"
            ));
        }
        if key == "auto.offset.reset" && !matches!(v.trim(), "earliest" | "smallest" | "beginning")
        {
            return Err(format!(
                "--kafka-config {key}={v} is refused: a group without committed offsets would start \
                 at the end of each partition and never apply the events already there; the \
                 consumer always starts from the earliest offset (events it applied before are \
                 skipped by the inbox)"
            ));
        }
    }
    Ok(())
}

/// `max.poll.interval.ms` unless the user sets it (never below `session.timeout.ms`, which
/// librdkafka refuses).
///
/// It is also the rebalance timeout this member announces and, plus 3 s, how long librdkafka
/// waits for a JoinGroup answer before it drops the connection and joins again: with
/// librdkafka's 300 s default, a JoinGroup lost on a connection that stays up (seen in a chaos
/// run after a broker stall) left a consumer without partitions for five minutes.
/// The runtime polls all the time (a busy partition is paused, never the poll loop), so 30 s
/// between polls is never reached in normal operation.
pub const DEFAULT_MAX_POLL_INTERVAL_MS: u64 = 30_000;

/// The librdkafka consumer configuration: defaults, the user's settings, the forced ones.
pub fn consumer_client_config(config: &RuntimeConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &config.brokers);
    cfg.set("group.id", &config.group_id);
    cfg.set("client.id", format!("{}-consumer", config.consumer_name));
    for (k, v) in CONSUMER_DEFAULTS {
        cfg.set(k, v);
    }
    for (k, v) in &config.client_config {
        cfg.set(k, v);
    }
    if cfg.get("max.poll.interval.ms").is_none() {
        let session = cfg
            .get("session.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        cfg.set(
            "max.poll.interval.ms",
            DEFAULT_MAX_POLL_INTERVAL_MS.max(session).to_string(),
        );
    }
    for (k, v) in CONSUMER_FORCED {
        cfg.set(k, v);
    }
    cfg
}

/// The librdkafka configuration of the dead-letter producer: idempotent, acknowledged by all
/// replicas, keyed like the source message. Connection-level user settings (security, client
/// id) apply to it too.
pub fn dead_letter_producer_config(config: &RuntimeConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &config.brokers);
    cfg.set(
        "client.id",
        format!("{}-dead-letters", config.consumer_name),
    );
    cfg.set("partitioner", "murmur2_random");
    cfg.set("message.timeout.ms", "30000");
    cfg.set("linger.ms", "0");
    cfg.set("enable.metrics.push", "false");
    for (k, v) in connection_settings(&config.client_config) {
        cfg.set(k, v);
    }
    cfg.set("enable.idempotence", "true");
    cfg.set("acks", "all");
    cfg
}

/// The user settings that concern the connection (security, sockets, client id) rather than
/// consuming, for the runtime's admin client and producer.
pub fn connection_settings(extra: &[(String, String)]) -> impl Iterator<Item = (&str, &str)> {
    outbox_kafka::connection_settings(extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        consumer: ConsumerArgs,
    }

    fn config(args: &[&str]) -> RuntimeConfig {
        let mut argv = vec!["svc"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .unwrap()
            .consumer
            .runtime_config("wms", "b:9092", "wms-consumer", &["order", "stock"])
            .unwrap()
    }

    #[test]
    fn connection_settings_are_what_reaches_and_trusts_the_brokers_only() {
        let extra: Vec<(String, String)> = [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("ssl.ca.location", "/ca.pem"),
            ("socket.timeout.ms", "10000"),
            ("client.id", "audit"),
            ("enable.ssl.certificate.verification", "false"),
            (
                "client.dns.lookup",
                "resolve_canonical_bootstrap_servers_only",
            ),
            ("fetch.max.bytes", "1"),
            ("session.timeout.ms", "6000"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let keys: Vec<&str> = connection_settings(&extra).map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "security.protocol",
                "sasl.mechanism",
                "ssl.ca.location",
                "socket.timeout.ms",
                "client.id",
                "enable.ssl.certificate.verification",
                "client.dns.lookup"
            ]
        );
    }

    #[test]
    fn flags_give_the_topics_group_and_defaults() {
        let c = config(&["--topic-prefix", "t1.", "--group-id", "g7"]);
        assert_eq!(c.topics, ["t1.order", "t1.stock"]);
        assert_eq!(c.group_id, "g7");
        assert_eq!(c.create_topics, None);
        assert_eq!(c.retry.max, Duration::from_secs(5));
        assert_eq!(c.shutdown_timeout, Duration::from_secs(10));
        if std::env::var_os("CONSUMER_MAX_ATTEMPTS_DETERMINISTIC").is_none() {
            assert_eq!(c.max_attempts_deterministic, 5);
        }
        let c3 = config(&["--max-attempts-deterministic", "3"]);
        assert_eq!(c3.max_attempts_deterministic, 3);
        assert_eq!(dead_letter_topic(&c.topics[0]), "t1.order.dlq");
        assert_eq!(
            c.subscribed_topics(),
            [
                "t1.order",
                "t1.stock",
                "t1.order.wms.redrive",
                "t1.stock.wms.redrive"
            ]
        );
        assert_eq!(
            consumed_topic("t1.stock.wms.redrive", &c.topics, "wms"),
            "t1.stock"
        );
        assert_eq!(consumed_topic("t1.stock", &c.topics, "wms"), "t1.stock");
        assert_eq!(
            consumed_topic("t1.stock.other.redrive", &c.topics, "wms"),
            "t1.stock.other.redrive",
            "another consumer's redrive topic is not ours"
        );
        if std::env::var_os("KAFKA_GROUP_ID").is_none()
            && std::env::var_os("OUTBOX_TOPIC_PREFIX").is_none()
        {
            let d = config(&[]);
            assert_eq!(d.group_id, "wms-consumer");
            assert_eq!(d.topics, ["outbox.event.order", "outbox.event.stock"]);
        }
        let c = config(&["--create-missing-topics", "--topic-partitions", "3"]);
        assert_eq!(
            c.create_topics,
            Some(TopicSpec {
                partitions: 3,
                replication_factor: None
            })
        );
    }

    #[test]
    fn starting_at_the_latest_offset_is_refused() {
        let kv = |v: &str| vec![("auto.offset.reset".to_owned(), v.to_owned())];
        for v in ["latest", "largest", "end", "error"] {
            let err = check_overrides(&kv(v)).unwrap_err();
            assert!(err.contains("auto.offset.reset"), "{err}");
        }
        for v in ["earliest", "smallest", "beginning"] {
            assert!(check_overrides(&kv(v)).is_ok(), "{v}");
        }
        assert!(check_overrides(&[("session.timeout.ms".into(), "6000".into())]).is_ok());
        let err =
            check_overrides(&[("isolation.level".into(), "read_uncommitted".into())]).unwrap_err();
        assert!(err.contains("read_committed"), "{err}");
    }

    #[test]
    fn users_cannot_turn_off_manual_offsets() {
        let c = config(&[
            "--kafka-config",
            "enable.auto.offset.store=true",
            "--kafka-config",
            "enable.auto.commit=false",
            "--kafka-config",
            "session.timeout.ms=6000",
        ]);
        let cfg = consumer_client_config(&c);
        assert_eq!(cfg.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(cfg.get("enable.auto.commit"), Some("true"));
        assert_eq!(cfg.get("isolation.level"), Some("read_committed"));
        assert_eq!(cfg.get("session.timeout.ms"), Some("6000"));
        assert_eq!(cfg.get("enable.metrics.push"), Some("false"));
        assert_eq!(cfg.get("group.id"), Some(c.group_id.as_str()));
        assert_eq!(cfg.get("max.poll.interval.ms"), Some("30000"));
        let producer = dead_letter_producer_config(&c);
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        assert_eq!(
            producer.get("session.timeout.ms"),
            None,
            "consumer-only keys stay out"
        );
    }

    #[test]
    fn the_poll_interval_defaults_to_30_s_but_never_below_the_session_timeout() {
        let cfg = |args: &[&str]| consumer_client_config(&config(args));
        let long_session = cfg(&["--kafka-config", "session.timeout.ms=45000"]);
        assert_eq!(long_session.get("max.poll.interval.ms"), Some("45000"));
        let users = cfg(&["--kafka-config", "max.poll.interval.ms=600000"]);
        assert_eq!(users.get("max.poll.interval.ms"), Some("600000"));
        assert_eq!(cfg(&[]).get("max.poll.interval.ms"), Some("30000"));
    }
}
