//! The librdkafka settings of one process ([`KafkaSettings`]), made once from the security flags
//! and the user's `--kafka-config` ([`KafkaSecurityArgs::settings`]): the combination is
//! checked, naming the setting that is missing, ignored or contradicts another, and the secret
//! files are read.

use std::path::Path;

use rdkafka::config::ClientConfig;

use super::error::KafkaSecurityError;
use super::flags::{KafkaSecurityArgs, SecurityProtocol};
use super::secret::{is_secret, secret, REDACTED};

/// librdkafka settings of one process: the security settings, then the user's
/// `--kafka-config`. `Debug` hides the values of secret properties.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaSettings(Vec<(String, String)>);

impl KafkaSettings {
    /// Sets every property on `cfg`.
    pub fn apply(&self, cfg: &mut ClientConfig) {
        for (k, v) in &self.0 {
            cfg.set(k, v);
        }
    }

    /// The SASL password among these settings (from the flag, its file or `--kafka-config
    /// sasl.password`), for the weak-secret rule of [`outbox_process::secrets`].
    pub fn password_secret(&self) -> outbox_process::secrets::Secret<'_> {
        outbox_process::secrets::Secret::password(
            "KAFKA_SASL_PASSWORD (--kafka-sasl-password, KAFKA_SASL_PASSWORD_FILE or sasl.password)",
            self.get("sasl.password"),
        )
    }

    /// The value of property `key`, the last one set wins (as in librdkafka).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl From<Vec<(String, String)>> for KafkaSettings {
    fn from(pairs: Vec<(String, String)>) -> Self {
        Self(pairs)
    }
}

impl std::ops::Deref for KafkaSettings {
    type Target = [(String, String)];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'a> IntoIterator for &'a KafkaSettings {
    type Item = &'a (String, String);
    type IntoIter = std::slice::Iter<'a, (String, String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let shown = if is_secret(k) { REDACTED } else { v.as_str() };
                (k.as_str(), shown)
            }))
            .finish()
    }
}

impl KafkaSecurityArgs {
    /// Checks the security flags against each other and against the user's `--kafka-config`
    /// (`user`), reads the secret files, and returns every librdkafka setting of the process:
    /// the security ones first, then `user` unchanged.
    ///
    /// # Errors
    /// [`KafkaSecurityError`]: a missing, contradicting or ignored setting; an unreadable or
    /// empty file.
    pub fn settings(&self, user: &[(String, String)]) -> Result<KafkaSettings, KafkaSecurityError> {
        // librdkafka's other name of a property counts as the property (`sasl.mechanisms`).
        let user_value = |key: &str| {
            user.iter()
                .rev()
                .find(|(k, _)| crate::config_arg::canonical_key(k) == key)
                .map(|(_, v)| v.as_str())
        };
        let protocol = match (
            self.kafka_security_protocol,
            user_value("security.protocol"),
        ) {
            (Some(p), Some(u)) if !p.as_str().eq_ignore_ascii_case(u) => {
                return Err(KafkaSecurityError::Conflict {
                    flag: "KAFKA_SECURITY_PROTOCOL",
                    key: "security.protocol",
                })
            }
            (Some(p), _) => p,
            (None, Some(u)) => SecurityProtocol::parse(u)
                .ok_or_else(|| KafkaSecurityError::Protocol(u.to_owned()))?,
            (None, None) => SecurityProtocol::Plaintext,
        };
        let mut out: Vec<(String, String)> = Vec::new();
        let mut set = |key: &'static str,
                       flag: &'static str,
                       value: String|
         -> Result<(), KafkaSecurityError> {
            if user_value(key).is_some_and(|u| u != value) {
                return Err(KafkaSecurityError::Conflict { flag, key });
            }
            out.push((key.to_owned(), value));
            Ok(())
        };
        if let Some(p) = self.kafka_security_protocol {
            set(
                "security.protocol",
                "KAFKA_SECURITY_PROTOCOL",
                p.as_str().to_owned(),
            )?;
        }

        let password = secret(
            "KAFKA_SASL_PASSWORD",
            self.kafka_sasl_password.as_deref(),
            self.kafka_sasl_password_file.as_deref(),
        )?;
        if protocol.uses_sasl() {
            let mechanism = match (self.kafka_sasl_mechanism, user_value("sasl.mechanism")) {
                (Some(m), _) => m.as_str().to_owned(),
                (None, Some(u)) => u.to_owned(),
                (None, None) => {
                    return Err(KafkaSecurityError::Missing {
                        missing: "KAFKA_SASL_MECHANISM",
                        because: format!("security.protocol {}", protocol.as_str()),
                    })
                }
            };
            if self.kafka_sasl_mechanism.is_some() {
                set("sasl.mechanism", "KAFKA_SASL_MECHANISM", mechanism.clone())?;
            }
            let needs_password = matches!(
                mechanism.to_ascii_uppercase().as_str(),
                "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512"
            );
            match &self.kafka_sasl_username {
                Some(u) => set("sasl.username", "KAFKA_SASL_USERNAME", u.clone())?,
                None if needs_password && user_value("sasl.username").is_none() => {
                    return Err(KafkaSecurityError::Missing {
                        missing: "KAFKA_SASL_USERNAME",
                        because: format!("sasl.mechanism {mechanism}"),
                    })
                }
                None => {}
            }
            match password {
                Some(p) => set("sasl.password", "KAFKA_SASL_PASSWORD", p)?,
                None if needs_password && user_value("sasl.password").is_none() => {
                    return Err(KafkaSecurityError::Missing {
                        missing: "KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE)",
                        because: format!("sasl.mechanism {mechanism}"),
                    })
                }
                None => {}
            }
        } else {
            let sasl_setting = if self.kafka_sasl_mechanism.is_some() {
                Some("KAFKA_SASL_MECHANISM")
            } else if self.kafka_sasl_username.is_some() {
                Some("KAFKA_SASL_USERNAME")
            } else if password.is_some() {
                Some("KAFKA_SASL_PASSWORD")
            } else {
                None
            };
            if let Some(setting) = sasl_setting {
                return Err(KafkaSecurityError::Unused {
                    setting,
                    protocol: protocol.as_str(),
                    hint: "SASL settings need SASL_SSL (or SASL_PLAINTEXT)",
                });
            }
        }

        let key_password = secret(
            "KAFKA_SSL_KEY_PASSWORD",
            self.kafka_ssl_key_password.as_deref(),
            self.kafka_ssl_key_password_file.as_deref(),
        )?;
        let files = [
            (
                "KAFKA_SSL_CA_LOCATION",
                "ssl.ca.location",
                &self.kafka_ssl_ca_location,
            ),
            (
                "KAFKA_SSL_CERTIFICATE_LOCATION",
                "ssl.certificate.location",
                &self.kafka_ssl_certificate_location,
            ),
            (
                "KAFKA_SSL_KEY_LOCATION",
                "ssl.key.location",
                &self.kafka_ssl_key_location,
            ),
        ];
        if protocol.uses_tls() {
            match (
                &self.kafka_ssl_certificate_location,
                &self.kafka_ssl_key_location,
            ) {
                (Some(_), None) => {
                    return Err(KafkaSecurityError::Missing {
                        missing: "KAFKA_SSL_KEY_LOCATION",
                        because: "KAFKA_SSL_CERTIFICATE_LOCATION (a client certificate)".into(),
                    })
                }
                (None, Some(_)) => {
                    return Err(KafkaSecurityError::Missing {
                        missing: "KAFKA_SSL_CERTIFICATE_LOCATION",
                        because: "KAFKA_SSL_KEY_LOCATION (a client key)".into(),
                    })
                }
                _ => {}
            }
            for (flag, key, path) in files {
                if let Some(path) = path {
                    readable(flag, path)?;
                    set(key, flag, path.display().to_string())?;
                }
            }
            if let Some(p) = key_password {
                set("ssl.key.password", "KAFKA_SSL_KEY_PASSWORD", p)?;
            }
            // librdkafka's default since 1.9; set so that no older default or profile turns
            // the host-name check off. `--kafka-config` may still say `none`, on purpose.
            if user_value("ssl.endpoint.identification.algorithm").is_none() {
                out.push((
                    "ssl.endpoint.identification.algorithm".into(),
                    "https".into(),
                ));
            }
        } else {
            let tls_setting = files
                .iter()
                .find(|(_, _, p)| p.is_some())
                .map(|(flag, _, _)| *flag)
                .or(key_password.as_ref().map(|_| "KAFKA_SSL_KEY_PASSWORD"));
            if let Some(setting) = tls_setting {
                return Err(KafkaSecurityError::Unused {
                    setting,
                    protocol: protocol.as_str(),
                    hint: "TLS settings need SSL or SASL_SSL",
                });
            }
        }
        out.extend(user.iter().cloned());
        Ok(KafkaSettings(out))
    }
}

fn readable(setting: &'static str, path: &Path) -> Result<(), KafkaSecurityError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|source| KafkaSecurityError::File {
            setting,
            path: path.to_owned(),
            source,
        })
}
