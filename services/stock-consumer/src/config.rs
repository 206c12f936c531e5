//! Command-line and environment configuration of the `stock-consumer` binary: the flags every
//! consuming service takes ([`ConsumerServiceArgs`]), with this service's name and default
//! listen address.

use clap::Parser;
use outbox_consumer_service::ConsumerServiceArgs;

/// Stock consumer: reservations per paid order, releases, deductions and restocks, counts over
/// HTTP, decisions published through its own outbox.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "stock-consumer",
    version,
    about,
    long_about = None,
    mut_arg("listen", |a| a.default_value("127.0.0.1:8082").required(false))
)]
pub struct Config {
    /// The shared flags (database, brokers, consumer, `dlq` subcommand).
    #[command(flatten)]
    pub service: ConsumerServiceArgs,
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
        assert_eq!(c.service.service.listen, "127.0.0.1:8082");
        let r = crate::service().runtime_config(&c.service).unwrap();
        assert_eq!(r.consumer_name, "stock");
        assert_eq!(r.group_id, "stock-consumer");
        assert_eq!(r.topics, ["p.order", "p.outbound"]);
    }
}
