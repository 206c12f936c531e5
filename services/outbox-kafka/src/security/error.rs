//! Why the Kafka security settings cannot be used ([`KafkaSecurityError`]).

use std::path::PathBuf;

/// Why the Kafka security settings cannot be used. Messages name the setting, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSecurityError {
    /// A setting the chosen protocol or mechanism needs is missing.
    #[error("{missing} is required with {because}")]
    Missing {
        /// The missing setting (flag / environment variable).
        missing: &'static str,
        /// What needs it.
        because: String,
    },
    /// A setting has no effect with the chosen protocol (it would be silently ignored).
    #[error("{setting} is set, but security.protocol is {protocol}: {hint}")]
    Unused {
        /// The setting that would be ignored.
        setting: &'static str,
        /// The protocol in effect.
        protocol: &'static str,
        /// What to do instead.
        hint: &'static str,
    },
    /// A secret was given twice, directly and as a file.
    #[error("set either {0} or {0}_FILE, not both")]
    Twice(&'static str),
    /// A flag and `--kafka-config` set the same librdkafka property to different values.
    #[error("{flag} and --kafka-config {key}=... disagree: set it once")]
    Conflict {
        /// The flag / environment variable.
        flag: &'static str,
        /// The librdkafka property.
        key: &'static str,
    },
    /// `--kafka-config security.protocol=...` names a protocol this build does not know.
    #[error("unsupported security.protocol `{0}` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)")]
    Protocol(String),
    /// A file named by a setting cannot be read.
    #[error("{setting}: cannot read {path}")]
    File {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A secret file is empty.
    #[error("{setting}: {path} is empty")]
    EmptyFile {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
    },
}
