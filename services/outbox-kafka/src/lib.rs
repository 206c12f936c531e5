#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! What every Kafka client of every binary shares: the security flags and the librdkafka
//! settings made from them ([`security`]), and the start-up check that tells a connection the
//! broker refuses (authentication, certificate) from a broker that is not up yet ([`probe`]),
//! and the refusal a running client is getting, for `/healthz` ([`refusal`]); a producer
//! whose delivery reports a thread of its own serves without busy looping ([`polled`]); what
//! every client context does with librdkafka's log lines ([`log_librdkafka!`], [`client_log`]).
//!
//! Binaries flatten [`KafkaSecurityArgs`] next to their `--kafka-config`, call
//! [`KafkaSecurityArgs::settings`] once, and build every client from the [`KafkaSettings`] it
//! returns.

pub mod client_log;
// The one module with `unsafe`: four librdkafka calls the safe API does not offer (the
// producer's queue as a handle, its length, its wake-up socket), each with its SAFETY note.
pub mod config_arg;
#[allow(unsafe_code)]
pub mod polled;
pub mod probe;
pub mod refusal;
pub mod security;

pub use config_arg::{parse_kafka_config, KafkaConfigList};
pub use polled::PolledProducer;
pub use probe::{check_connection, ProbeError};
pub use security::{
    is_secret, KafkaSecurityArgs, KafkaSecurityError, KafkaSettings, SaslMechanism,
    SecurityProtocol,
};

/// Prefixes of the librdkafka properties that concern the connection to the brokers (how to
/// find, reach, authenticate and trust them) rather than producing or consuming.
pub const CONNECTION_PREFIXES: [&str; 11] = [
    "security.",
    "sasl.",
    "ssl",
    "socket.",
    "enable.ssl.",
    "enable.sasl.",
    "https.",
    "api.version.",
    "broker.address.",
    "broker.version.",
    "reconnect.backoff",
];

/// Connection properties that no prefix of [`CONNECTION_PREFIXES`] covers.
pub const CONNECTION_KEYS: [&str; 5] = [
    "client.id",
    "client.dns.lookup",
    "client.rack",
    "connections.max.idle.ms",
    "metadata.recovery.strategy",
];

/// The settings among `extra` that concern the connection (security, trust, sockets, name
/// resolution, client id) rather than producing or consuming: what every other client of the
/// same process (start-up check, admin, dead-letter producer and reader) gets, so that a
/// setting the main client needs to reach the brokers is never dropped for the others.
pub fn connection_settings(extra: &[(String, String)]) -> impl Iterator<Item = (&str, &str)> {
    extra
        .iter()
        .filter(|(k, _)| {
            CONNECTION_PREFIXES.iter().any(|p| k.starts_with(p))
                || CONNECTION_KEYS.contains(&k.as_str())
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

/// What an error librdkafka reports to a client's context says about reaching the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connectivity {
    /// No broker of the cluster is reachable (`AllBrokersDown`): an outage.
    ClusterDown,
    /// One broker's connection failed or its name did not resolve: the others may serve on;
    /// if it was the last one, `AllBrokersDown` follows.
    BrokerLost,
    /// Not about connectivity.
    Other,
}

/// Classifies the code of an error reported to a client context ([`Connectivity`]).
pub fn connectivity(code: Option<rdkafka::types::RDKafkaErrorCode>) -> Connectivity {
    use rdkafka::types::RDKafkaErrorCode as C;
    match code {
        Some(C::AllBrokersDown) => Connectivity::ClusterDown,
        Some(C::BrokerTransportFailure | C::Resolve) => Connectivity::BrokerLost,
        _ => Connectivity::Other,
    }
}
