//! Secrets among the Kafka settings: a secret given directly or as a file (not both), which
//! librdkafka properties hold one ([`is_secret`]), and what stands in for one in `Debug`
//! output.

use std::path::Path;

use outbox_process::secret_file::{read_secret_file, SecretFileError};

use super::error::KafkaSecurityError;

/// What stands in for a secret in `Debug` output.
pub(crate) const REDACTED: &str = "<redacted>";

/// Whether librdkafka property `key` holds a secret (passwords, private keys, token
/// configuration).
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key == "ssl.key.pem"
        || key == "ssl_key"
        || key == "sasl.oauthbearer.config"
}

/// The secret given directly or as a file (not both).
pub(crate) fn secret(
    setting: &'static str,
    value: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, KafkaSecurityError> {
    match (value, file) {
        (Some(_), Some(_)) => Err(KafkaSecurityError::Twice(setting)),
        (Some(v), None) => Ok(Some(v.to_owned())),
        (None, Some(path)) => read_secret_file(path).map(Some).map_err(|e| match e {
            SecretFileError::Io(source) => KafkaSecurityError::File {
                setting,
                path: path.to_owned(),
                source,
            },
            SecretFileError::Empty => KafkaSecurityError::EmptyFile {
                setting,
                path: path.to_owned(),
            },
        }),
        (None, None) => Ok(None),
    }
}
