//! Command-line and environment configuration of the `stock-consumer` binary. Every setting is a
//! flag with an environment fallback.

use std::time::Duration;

use clap::Parser;
use outbox_kit::consumer::dlq_cli::ConsumerCommand;
use outbox_kit::consumer::{ConsumerArgs, RuntimeConfig};

use crate::handler::{CONSUMED_AGGREGATES, CONSUMER_NAME};

/// Stock consumer: reservations per paid order, releases, deductions and restocks, counts over
/// HTTP, decisions published through its own outbox.
#[derive(Debug, Clone, Parser)]
#[command(name = "stock-consumer", version, about, long_about = None)]
pub struct Config {
    /// Address of the HTTP API (`host:port`).
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8082")]
    pub listen: String,

    /// PostgreSQL connection URL of the stock database (its tables, inbox and outbox).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub kafka_brokers: String,

    /// Consumer settings.
    #[command(flatten)]
    pub consumer: ConsumerArgs,

    /// Most database connections (HTTP requests and one per partition being applied).
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub database_max_connections: u32,

    /// How long SIGTERM waits for HTTP requests in flight, in milliseconds.
    #[arg(long, env = "SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// An operator command (`dlq list`, `dlq redrive`); without one, the service runs.
    #[command(subcommand)]
    pub command: Option<ConsumerCommand>,
}

impl Config {
    /// The HTTP drain deadline on SIGTERM.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    /// The consumer runtime's configuration (default group `stock-consumer`).
    pub fn runtime_config(&self) -> RuntimeConfig {
        self.consumer.runtime_config(
            CONSUMER_NAME,
            &self.kafka_brokers,
            "stock-consumer",
            &CONSUMED_AGGREGATES,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_name_the_topics() {
        let c = Config::try_parse_from([
            "stock-consumer",
            "--database-url",
            "postgres://x/stock",
            "--kafka-brokers",
            "k:9092",
            "--topic-prefix",
            "p.",
        ])
        .unwrap();
        let r = c.runtime_config();
        assert_eq!(r.consumer_name, "stock");
        assert_eq!(r.topics, ["p.order", "p.outbound"]);
        assert_eq!(c.shutdown_timeout(), Duration::from_secs(10));
        assert_eq!(c.command, None, "no subcommand: run the service");
        let dlq = Config::try_parse_from([
            "stock-consumer",
            "--database-url",
            "postgres://x/stock",
            "--kafka-brokers",
            "k:9092",
            "dlq",
            "list",
            "--json",
        ])
        .unwrap();
        assert_eq!(
            dlq.command,
            Some(ConsumerCommand::Dlq(
                outbox_kit::consumer::dlq_cli::DlqCommand::List { json: true }
            ))
        );
    }
}
