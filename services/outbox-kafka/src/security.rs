//! The Kafka security flags every binary takes ([`KafkaSecurityArgs`]), checked once and turned
//! into librdkafka settings ([`KafkaSettings`]) that every client of the process (producer,
//! consumer, dead-letter producer, admin client, readers) is built from.
//!
//! The flags only spell out what librdkafka already has (`security.protocol`, `sasl.*`,
//! `ssl.*`), so a user can keep `--kafka-config` for anything else; they add what librdkafka
//! lacks: secrets read from files, a check of the combination at start-up naming the setting
//! that is missing or contradicts another, and values that never reach a log line or `Debug`.
//!
//! Files: `flags` (the flags and the protocols and mechanisms they offer), `settings` (the
//! check of the combination and the librdkafka settings it gives), `secret` (secrets given
//! directly or as files, and which properties are secret), `error` (why the settings cannot be
//! used).

mod error;
mod flags;
mod secret;
mod settings;

pub use error::KafkaSecurityError;
pub use flags::{KafkaSecurityArgs, SaslMechanism, SecurityProtocol};
pub use secret::is_secret;
pub(crate) use secret::REDACTED;
pub use settings::KafkaSettings;

#[cfg(test)]
mod tests;
