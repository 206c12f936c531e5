//! Command-line and environment configuration of the `wms-consumer` binary: the flags every
//! consuming service takes ([`ConsumerServiceArgs`]), with this service's name and default
//! listen address.

use clap::Parser;
use outbox_consumer_service::ConsumerServiceArgs;

/// WMS outbound consumer: one outbound per paid and reserved order, interception and recall on
/// refunds, warehouse actions over HTTP, events through its own outbox.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "wms-consumer",
    version,
    about,
    long_about = None,
    mut_arg("listen", |a| a.default_value("127.0.0.1:8081").required(false))
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
            "wms-consumer",
            "--database-url",
            "postgres://x/wms",
            "--kafka-brokers",
            "k:9092",
            "--topic-prefix",
            "p.",
        ])
        .unwrap();
        assert_eq!(c.service.service.listen, "127.0.0.1:8081");
        let r = crate::service().runtime_config(&c.service).unwrap();
        assert_eq!(r.consumer_name, "wms");
        assert_eq!(r.group_id, "wms-consumer");
        assert_eq!(r.topics, ["p.order", "p.stock"]);
    }
}
