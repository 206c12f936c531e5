//! Command-line and environment configuration of `outbox-audit`: where the three databases and
//! the broker are, which consumer groups to check, and the thresholds.

use std::time::Duration;

use clap::Parser;

/// Reconciles a deployment: the order, WMS and stock databases (their business tables,
/// outboxes, ledgers and inboxes), the broker's topics and every consumer group's committed
/// offsets. Read-only: it commits no offset and writes no row. Exits 0 when it found nothing,
/// 1 when it found violations, 2 when it could not audit (a database or the broker unreachable).
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-audit", version, about, long_about = None)]
pub struct Config {
    /// PostgreSQL URL of the order service's database.
    #[arg(long, env = "ORDER_DATABASE_URL", hide_env_values = true)]
    pub order_database_url: String,

    /// PostgreSQL URL of the WMS consumer's database.
    #[arg(long, env = "WMS_DATABASE_URL", hide_env_values = true)]
    pub wms_database_url: String,

    /// PostgreSQL URL of the stock consumer's database.
    #[arg(long, env = "STOCK_DATABASE_URL", hide_env_values = true)]
    pub stock_database_url: String,

    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub kafka_brokers: String,

    /// Prefix of the topics (`<prefix><aggregate_type>`), the same as the relays' and the
    /// consumers'.
    #[arg(long, env = "OUTBOX_TOPIC_PREFIX", default_value = outbox_writer::DEFAULT_TOPIC_PREFIX)]
    pub topic_prefix: String,

    /// Consumer group of the order service's fulfilment consumer.
    #[arg(long, env = "AUDIT_ORDER_GROUP", default_value = "order-service")]
    pub order_group: String,

    /// Consumer group of the WMS consumer.
    #[arg(long, env = "AUDIT_WMS_GROUP", default_value = "wms-consumer")]
    pub wms_group: String,

    /// Consumer group of the stock consumer.
    #[arg(long, env = "AUDIT_STOCK_GROUP", default_value = "stock-consumer")]
    pub stock_group: String,

    /// An outbox row unpublished for longer than this (seconds) is a violation.
    #[arg(long, env = "AUDIT_MAX_UNPUBLISHED_AGE_S", default_value_t = 60)]
    pub max_unpublished_age_s: u64,

    /// Orders changed within this many seconds are left out of the cross-database checks
    /// (their events may still be on the way); 0 on a drained system.
    #[arg(long, env = "AUDIT_SETTLE_S", default_value_t = 60)]
    pub settle_s: u64,

    /// Messages older than this many days are not looked up in the inboxes (the consumers'
    /// retention may have deleted their rows); keep it at the consumers' `INBOX_RETENTION_DAYS`.
    #[arg(long, env = "INBOX_RETENTION_DAYS", default_value_t = 14, value_parser = clap::value_parser!(u32).range(1..))]
    pub inbox_retention_days: u32,

    /// Extra librdkafka settings as KEY=VALUE (security, sockets, client id; repeatable, or
    /// comma separated).
    #[arg(long = "kafka-config", env = "AUDIT_KAFKA_CONFIG", hide_env_values = true, value_parser = outbox_kafka::parse_kafka_config)]
    pub kafka_config: Vec<outbox_kafka::KafkaConfigList>,

    /// TLS and SASL settings (`KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_*`, `KAFKA_SSL_*`), the
    /// same as every other binary's.
    #[command(flatten)]
    pub security: outbox_kafka::KafkaSecurityArgs,

    /// Longest wait for the broker (metadata, offsets, reading a topic to its end), seconds.
    #[arg(long, env = "AUDIT_BROKER_TIMEOUT_S", default_value_t = 120)]
    pub broker_timeout_s: u64,

    /// The report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Config {
    /// The broker deadline.
    pub fn broker_timeout(&self) -> Duration {
        Duration::from_secs(self.broker_timeout_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults() {
        let c = Config::try_parse_from([
            "outbox-audit",
            "--order-database-url",
            "postgres://x/o",
            "--wms-database-url",
            "postgres://x/w",
            "--stock-database-url",
            "postgres://x/s",
            "--kafka-brokers",
            "k:9092",
            "--json",
        ])
        .unwrap();
        assert!(c.json);
        assert_eq!(c.wms_group, "wms-consumer");
        assert_eq!(c.broker_timeout(), Duration::from_secs(120));
        if std::env::var_os("OUTBOX_TOPIC_PREFIX").is_none() {
            assert_eq!(c.topic_prefix, "outbox.event.");
        }
    }
}
