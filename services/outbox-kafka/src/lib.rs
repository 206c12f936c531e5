#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! What every Kafka client of every binary shares: the security flags and the librdkafka
//! settings made from them ([`security`]), and the start-up check that tells a connection the
//! broker refuses (authentication, certificate) from a broker that is not up yet ([`probe`]),
//! and the refusal a running client is getting, for `/healthz` ([`refusal`]); a producer
//! whose delivery reports a thread of its own serves without busy looping ([`polled`]).
//!
//! Binaries flatten [`KafkaSecurityArgs`] next to their `--kafka-config`, call
//! [`KafkaSecurityArgs::settings`] once, and build every client from the [`KafkaSettings`] it
//! returns.

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

/// The settings among `extra` that concern the connection (security, sockets, client id)
/// rather than producing or consuming: what an admin client, a reader or a probe of the same
/// process needs.
pub fn connection_settings(extra: &[(String, String)]) -> impl Iterator<Item = (&str, &str)> {
    extra
        .iter()
        .filter(|(k, _)| {
            k.starts_with("security.")
                || k.starts_with("sasl.")
                || k.starts_with("ssl.")
                || k.starts_with("socket.")
                || k == "client.id"
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
}
