//! Command-line and environment configuration of the `order-service` binary. Every setting is
//! a flag with an environment fallback.

use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use clap::Parser;
use outbox_kit::consumer::dlq_cli::ConsumerCommand;
use outbox_kit::consumer::{ConsumerArgs, RuntimeConfig};

/// HTTP order service: idempotent orders, signed payment and refund callbacks, events through
/// the transactional outbox.
#[derive(Debug, Clone, Parser)]
#[command(name = "order-service", version, about, long_about = None)]
pub struct Config {
    /// Address to listen on (`host:port`).
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen: String,

    /// PostgreSQL connection URL of the service's database (its tables and the outbox).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Shared secret of the payment provider: callbacks carry the hex HMAC-SHA256 of their
    /// body under it. Prefer the environment variable: flags show up in process listings.
    #[arg(
        long,
        env = "PAYMENT_CALLBACK_SECRET",
        hide_env_values = true,
        value_parser = NonEmptyStringValueParser::new()
    )]
    pub payment_callback_secret: String,

    /// Shared secret of the marketplace: its pushes to `/channels/marketplace/push` carry the
    /// hex HMAC-SHA256 of their body under it. Unset: the channel answers 404.
    #[arg(long, env = "MARKETPLACE_SECRET", hide_env_values = true, value_parser = NonEmptyStringValueParser::new())]
    pub marketplace_secret: Option<String>,

    /// Base URL of the marketplace's API (`http://host:port`): its query API feeds the
    /// compensation poller, its ship API receives ship-backs. Unset: neither runs.
    #[arg(long, env = "MARKETPLACE_URL")]
    pub marketplace_url: Option<String>,

    /// How often the compensation poller asks the marketplace for changes, in milliseconds.
    #[arg(long, env = "MARKETPLACE_COMPENSATION_INTERVAL_MS", default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub marketplace_compensation_interval_ms: u64,

    /// Most database connections. Concurrent requests with the same idempotency key each hold
    /// one while they wait for the first.
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub database_max_connections: u32,

    /// How long SIGTERM waits for requests in flight before the process exits anyway, in
    /// milliseconds. Their transactions roll back; clients retry with the same keys.
    #[arg(long, env = "SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// Kafka bootstrap servers, comma separated. When set, the service also consumes the
    /// fulfilment events (`OutboundShipped`, `StockReservationRejected`) that move orders;
    /// without it, it only serves HTTP.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,

    /// Hours an idempotency key (and its stored response) is kept; older keys are deleted in
    /// the background, and a retry with such a key creates a new order. Keep it longer than
    /// any client retries.
    #[arg(long, env = "IDEMPOTENCY_RETENTION_HOURS", default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..))]
    pub idempotency_retention_hours: u32,

    /// Consumer settings (used with `--kafka-brokers`; the retention purge settings apply to
    /// the idempotency keys too).
    #[command(flatten)]
    pub consumer: ConsumerArgs,

    /// An operator command for the fulfilment consumer (`dlq list`, `dlq redrive`; needs
    /// `--kafka-brokers`); without one, the service runs.
    #[command(subcommand)]
    pub command: Option<ConsumerCommand>,
}

impl Config {
    /// The retention rule of the idempotency keys.
    pub fn idempotency_retention(&self) -> outbox_kit::retention::RetentionRule {
        outbox_kit::retention::RetentionRule {
            table: "idempotency_keys",
            time_column: "created_at",
            scope: None,
            window: Duration::from_secs(u64::from(self.idempotency_retention_hours) * 3_600),
        }
    }

    /// The drain deadline on SIGTERM.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    /// The fulfilment consumer's configuration (default group `order-service`), when
    /// `--kafka-brokers` is set.
    pub fn runtime_config(&self) -> Option<RuntimeConfig> {
        let brokers = self.kafka_brokers.as_deref()?;
        Some(self.consumer.runtime_config(
            crate::fulfilment::CONSUMER_NAME,
            brokers,
            "order-service",
            &crate::fulfilment::CONSUMED_AGGREGATES,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults() {
        let c = Config::try_parse_from([
            "order-service",
            "--database-url",
            "postgres://x/db",
            "--payment-callback-secret",
            "s3cret",
        ])
        .unwrap();
        assert_eq!(c.database_url, "postgres://x/db");
        assert_eq!(c.payment_callback_secret, "s3cret");
        assert_eq!(c.database_max_connections, 20);
        assert_eq!(c.shutdown_timeout(), Duration::from_secs(10));
        if std::env::var_os("LISTEN_ADDR").is_none() {
            assert_eq!(c.listen, "127.0.0.1:8080");
        }
    }

    #[test]
    fn an_empty_secret_is_refused() {
        assert!(Config::try_parse_from([
            "order-service",
            "--database-url",
            "postgres://x/db",
            "--payment-callback-secret",
            "",
        ])
        .is_err());
    }
}
