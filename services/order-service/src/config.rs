//! Command-line and environment configuration of the `order-service` binary. Every setting is
//! a flag with an environment fallback.

use clap::builder::NonEmptyStringValueParser;
use clap::Parser;
use outbox_consumer::dlq_cli::ConsumerCommand;
use outbox_consumer::{ConsumerArgs, RuntimeConfig};
use outbox_http::auth::AuthArgs;
use outbox_http::service::ServiceArgs;

/// HTTP order service: idempotent orders, signed payment and refund callbacks, events through
/// the transactional outbox.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "order-service",
    version,
    about,
    long_about = None,
    mut_arg("listen", |a| a.default_value("127.0.0.1:8080").required(false))
)]
pub struct Config {
    /// Listen address, database and drain deadline. Requests still in flight at the deadline
    /// roll back; clients retry with the same keys. Concurrent requests with the same
    /// idempotency key each hold a connection while they wait for the first.
    #[command(flatten)]
    pub service: ServiceArgs,

    /// Bearer-token verification (customer endpoints take the user from `sub`; catalog,
    /// deliver and compensate need `roles: ["operator"]`). A key is required to serve.
    #[command(flatten)]
    pub auth: AuthArgs,

    /// Shared secret of the payment provider: callbacks carry `X-Signature-Timestamp` and, as
    /// `X-Signature`, the hex HMAC-SHA256 of `"<timestamp>.<body>"` under it. Required to
    /// serve (not with `--migrations only`). Prefer the environment variable: flags show up in
    /// process listings.
    #[arg(
        long,
        env = "PAYMENT_CALLBACK_SECRET",
        hide_env_values = true,
        value_parser = NonEmptyStringValueParser::new()
    )]
    pub payment_callback_secret: Option<String>,

    /// How far a callback's `X-Signature-Timestamp` may be from this server's clock, in
    /// seconds; older (replayed) or future callbacks answer 401.
    #[arg(long, env = "CALLBACK_REPLAY_WINDOW_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub callback_replay_window_secs: u64,

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

    /// Seconds an order may wait for its payment: older unpaid orders are closed
    /// (`CANCELLED`, `OrderCancelled`) in the background, and a payment arriving later is
    /// flagged for refund. Marketplace orders are left to the platform. 0: never close.
    #[arg(long, env = "PAYMENT_TIMEOUT_SECS", default_value_t = 1_800)]
    pub payment_timeout_secs: u64,

    /// How often expired unpaid orders are looked for, in milliseconds.
    #[arg(long, env = "PAYMENT_TIMEOUT_INTERVAL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub payment_timeout_interval_ms: u64,

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
    /// Refuses weak or published secrets (`DATABASE_URL`'s password, `JWT_HS256_SECRET`,
    /// `PAYMENT_CALLBACK_SECRET`, `MARKETPLACE_SECRET`) unless `--allow-weak-secrets`.
    ///
    /// # Errors
    /// [`outbox_process::secrets::WeakSecrets`] naming each weak setting.
    pub fn check_secrets(&self) -> Result<(), outbox_process::secrets::WeakSecrets> {
        use outbox_process::secrets::Secret;
        let mut secrets = self.auth.secrets().to_vec();
        secrets.push(Secret::signing_key(
            "PAYMENT_CALLBACK_SECRET (--payment-callback-secret)",
            self.payment_callback_secret.as_deref(),
        ));
        secrets.push(Secret::signing_key(
            "MARKETPLACE_SECRET (--marketplace-secret)",
            self.marketplace_secret.as_deref(),
        ));
        // Incomplete Kafka settings are reported when the consumer is built.
        let kafka = self.runtime_config().ok().flatten();
        if let Some(runtime) = &kafka {
            secrets.push(runtime.client_config.password_secret());
        }
        self.service.check_secrets(&secrets)
    }

    /// The retention rule of the idempotency keys.
    pub fn idempotency_retention(&self) -> outbox_process::retention::RetentionRule {
        outbox_process::retention::RetentionRule {
            table: "idempotency_keys",
            time_column: "created_at",
            scope: None,
            window: std::time::Duration::from_secs(
                u64::from(self.idempotency_retention_hours) * 3_600,
            ),
        }
    }

    /// The fulfilment consumer's configuration (default group `order-service`), when
    /// `--kafka-brokers` is set.
    ///
    /// # Errors
    /// Incomplete or contradicting Kafka security settings.
    pub fn runtime_config(
        &self,
    ) -> Result<Option<RuntimeConfig>, outbox_kafka::KafkaSecurityError> {
        self.kafka_brokers
            .as_deref()
            .map(|brokers| crate::subscription::IDENTITY.runtime_config(&self.consumer, brokers))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        assert_eq!(c.service.database_url, "postgres://x/db");
        assert_eq!(c.payment_callback_secret.as_deref(), Some("s3cret"));
        assert_eq!(c.callback_replay_window_secs, 300);
        assert_eq!(c.service.database_max_connections, 20);
        assert_eq!(c.service.shutdown_timeout(), Duration::from_secs(10));
        if std::env::var_os("LISTEN_ADDR").is_none() {
            assert_eq!(c.service.listen, "127.0.0.1:8080");
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

    #[test]
    fn the_fulfilment_consumer_is_configured_only_with_brokers() {
        let flags = ["order-service", "--database-url", "postgres://x/db"];
        if std::env::var_os("KAFKA_BROKERS").is_none() {
            let c = Config::try_parse_from(flags).unwrap();
            assert!(c.runtime_config().unwrap().is_none());
        }
        let c = Config::try_parse_from(flags.into_iter().chain([
            "--kafka-brokers",
            "k:9092",
            "--topic-prefix",
            "p.",
        ]))
        .unwrap();
        let runtime = c.runtime_config().unwrap().unwrap();
        assert_eq!(runtime.consumer_name, "order");
        assert_eq!(runtime.group_id, "order-service");
        let topics: Vec<String> = crate::subscription::CONSUMED_AGGREGATES
            .iter()
            .map(|a| format!("p.{a}"))
            .collect();
        assert_eq!(runtime.topics, topics);
    }
}
