//! The Kafka security flags every binary takes ([`KafkaSecurityArgs`]), checked once and turned
//! into librdkafka settings ([`KafkaSettings`]) that every client of the process (producer,
//! consumer, dead-letter producer, admin client, readers) is built from.
//!
//! The flags only spell out what librdkafka already has (`security.protocol`, `sasl.*`,
//! `ssl.*`), so a user can keep `--kafka-config` for anything else; they add what librdkafka
//! lacks: secrets read from files, a check of the combination at start-up naming the setting
//! that is missing or contradicts another, and values that never reach a log line or `Debug`.

use std::path::{Path, PathBuf};

use rdkafka::config::ClientConfig;

use outbox_process::secret_file::{read_secret_file, SecretFileError};

/// `security.protocol` values this build supports (librdkafka is built with OpenSSL, SASL
/// `PLAIN` and `SCRAM`; no GSSAPI).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SecurityProtocol {
    /// No TLS, no authentication (librdkafka's default).
    #[value(name = "PLAINTEXT", alias = "plaintext")]
    Plaintext,
    /// TLS; with a client certificate, mutual TLS.
    #[value(name = "SSL", alias = "ssl")]
    Ssl,
    /// SASL authentication without TLS (the password crosses the network in the clear with
    /// `PLAIN`): for test set-ups and private networks only.
    #[value(name = "SASL_PLAINTEXT", alias = "sasl_plaintext")]
    SaslPlaintext,
    /// SASL authentication inside TLS: what managed Kafka services offer.
    #[value(name = "SASL_SSL", alias = "sasl_ssl")]
    SaslSsl,
}

impl SecurityProtocol {
    /// librdkafka's name of the protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    fn parse(value: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(value, true).ok()
    }

    fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// SASL mechanisms this build supports. `OAUTHBEARER` with a token endpoint (librdkafka's
/// `sasl.oauthbearer.method=oidc`) needs librdkafka built with libcurl, which this build leaves
/// out; `GSSAPI` (Kerberos) needs Cyrus SASL, left out too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SaslMechanism {
    /// User name and password as they are (only inside TLS in production).
    #[value(name = "PLAIN", alias = "plain")]
    Plain,
    /// Salted challenge-response with SHA-256.
    #[value(name = "SCRAM-SHA-256", alias = "scram-sha-256")]
    ScramSha256,
    /// Salted challenge-response with SHA-512.
    #[value(name = "SCRAM-SHA-512", alias = "scram-sha-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// librdkafka's name of the mechanism.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// How the process connects to Kafka securely; flatten it next to the binary's
/// `--kafka-config`. Every binary has the same flags and environment variables.
///
/// Secrets (`KAFKA_SASL_PASSWORD`, `KAFKA_SSL_KEY_PASSWORD`) are best given as files (the
/// `_FILE` variants, e.g. a mounted Kubernetes Secret) or environment variables; a flag on the
/// command line is visible to every user of the host in the process list.
#[derive(Clone, Default, clap::Args)]
pub struct KafkaSecurityArgs {
    /// `security.protocol`: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. Default: what
    /// `--kafka-config security.protocol=...` says, else PLAINTEXT.
    #[arg(long, env = "KAFKA_SECURITY_PROTOCOL", value_enum, ignore_case = true)]
    pub kafka_security_protocol: Option<SecurityProtocol>,

    /// `sasl.mechanism`: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; required with the SASL
    /// protocols.
    #[arg(long, env = "KAFKA_SASL_MECHANISM", value_enum, ignore_case = true)]
    pub kafka_sasl_mechanism: Option<SaslMechanism>,

    /// `sasl.username`.
    #[arg(long, env = "KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,

    /// `sasl.password` (prefer `KAFKA_SASL_PASSWORD_FILE` or the environment variable).
    #[arg(long, env = "KAFKA_SASL_PASSWORD", hide_env_values = true)]
    pub kafka_sasl_password: Option<String>,

    /// A file holding `sasl.password` (one trailing newline is dropped).
    #[arg(long, env = "KAFKA_SASL_PASSWORD_FILE")]
    pub kafka_sasl_password_file: Option<PathBuf>,

    /// `ssl.ca.location`: PEM file of the CA(s) that signed the brokers' certificates.
    /// Default: the system's trust store. The broker's host name is always checked against
    /// its certificate (`ssl.endpoint.identification.algorithm=https`).
    #[arg(long, env = "KAFKA_SSL_CA_LOCATION")]
    pub kafka_ssl_ca_location: Option<PathBuf>,

    /// `ssl.certificate.location`: PEM client certificate, for mutual TLS (with
    /// `--kafka-ssl-key-location`).
    #[arg(long, env = "KAFKA_SSL_CERTIFICATE_LOCATION")]
    pub kafka_ssl_certificate_location: Option<PathBuf>,

    /// `ssl.key.location`: PEM private key of the client certificate.
    #[arg(long, env = "KAFKA_SSL_KEY_LOCATION")]
    pub kafka_ssl_key_location: Option<PathBuf>,

    /// `ssl.key.password`: passphrase of an encrypted client key (prefer the `_FILE` variant).
    #[arg(long, env = "KAFKA_SSL_KEY_PASSWORD", hide_env_values = true)]
    pub kafka_ssl_key_password: Option<String>,

    /// A file holding `ssl.key.password` (one trailing newline is dropped).
    #[arg(long, env = "KAFKA_SSL_KEY_PASSWORD_FILE")]
    pub kafka_ssl_key_password_file: Option<PathBuf>,
}

impl std::fmt::Debug for KafkaSecurityArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSecurityArgs")
            .field("kafka_security_protocol", &self.kafka_security_protocol)
            .field("kafka_sasl_mechanism", &self.kafka_sasl_mechanism)
            .field("kafka_sasl_username", &self.kafka_sasl_username)
            .field(
                "kafka_sasl_password",
                &self.kafka_sasl_password.as_ref().map(|_| REDACTED),
            )
            .field("kafka_sasl_password_file", &self.kafka_sasl_password_file)
            .field("kafka_ssl_ca_location", &self.kafka_ssl_ca_location)
            .field(
                "kafka_ssl_certificate_location",
                &self.kafka_ssl_certificate_location,
            )
            .field("kafka_ssl_key_location", &self.kafka_ssl_key_location)
            .field(
                "kafka_ssl_key_password",
                &self.kafka_ssl_key_password.as_ref().map(|_| REDACTED),
            )
            .field(
                "kafka_ssl_key_password_file",
                &self.kafka_ssl_key_password_file,
            )
            .finish()
    }
}

/// What stands in for a secret in `Debug` output.
const REDACTED: &str = "<redacted>";

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

impl KafkaSecurityArgs {
    /// Checks the security flags against each other and against the user's `--kafka-config`
    /// (`user`), reads the secret files, and returns every librdkafka setting of the process:
    /// the security ones first, then `user` unchanged.
    ///
    /// # Errors
    /// [`KafkaSecurityError`]: a missing, contradicting or ignored setting; an unreadable or
    /// empty file.
    pub fn settings(&self, user: &[(String, String)]) -> Result<KafkaSettings, KafkaSecurityError> {
        let user_value = |key: &str| {
            user.iter()
                .rev()
                .find(|(k, _)| k == key)
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

/// The secret given directly or as a file (not both).
fn secret(
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

fn readable(setting: &'static str, path: &Path) -> Result<(), KafkaSecurityError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|source| KafkaSecurityError::File {
            setting,
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        security: KafkaSecurityArgs,
    }

    fn args(argv: &[&str]) -> KafkaSecurityArgs {
        let mut full = vec!["test"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full).unwrap().security
    }

    fn pairs(s: &KafkaSettings) -> Vec<(&str, &str)> {
        s.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    fn temp_file(name: &str, content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "outbox-kit-kafka-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn nothing_set_changes_nothing() {
        let user = vec![("linger.ms".to_owned(), "1".to_owned())];
        let s = args(&[]).settings(&user).unwrap();
        assert_eq!(pairs(&s), vec![("linger.ms", "1")]);
    }

    #[test]
    fn sasl_ssl_scram_with_a_password_file_and_a_ca() {
        let pw = temp_file("pw", "s3cret-pass\n");
        let ca = temp_file("ca.pem", "not parsed here");
        let s = args(&[
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-512",
            "--kafka-sasl-username",
            "relay",
            "--kafka-sasl-password-file",
            pw.to_str().unwrap(),
            "--kafka-ssl-ca-location",
            ca.to_str().unwrap(),
        ])
        .settings(&[])
        .unwrap();
        assert_eq!(s.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(s.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(s.get("sasl.username"), Some("relay"));
        assert_eq!(s.get("sasl.password"), Some("s3cret-pass"));
        assert_eq!(s.get("ssl.ca.location"), ca.to_str());
        assert_eq!(
            s.get("ssl.endpoint.identification.algorithm"),
            Some("https")
        );
        let shown = format!("{s:?}");
        assert!(!shown.contains("s3cret-pass"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn debug_of_the_flags_hides_the_passwords() {
        let a = args(&[
            "--kafka-sasl-password",
            "hunter2-hunter2",
            "--kafka-ssl-key-password",
            "key-pass-99",
        ]);
        let shown = format!("{a:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("key-pass-99"), "{shown}");
    }

    #[test]
    fn sasl_needs_a_mechanism_a_user_and_a_password() {
        let e = args(&["--kafka-security-protocol", "SASL_SSL"])
            .settings(&[])
            .unwrap_err();
        assert!(e.to_string().contains("KAFKA_SASL_MECHANISM"), "{e}");
        let e = args(&[
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "PLAIN",
        ])
        .settings(&[])
        .unwrap_err();
        assert!(e.to_string().contains("KAFKA_SASL_USERNAME"), "{e}");
        let e = args(&[
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-256",
            "--kafka-sasl-username",
            "u",
        ])
        .settings(&[])
        .unwrap_err();
        assert!(e.to_string().contains("KAFKA_SASL_PASSWORD"), "{e}");
    }

    #[test]
    fn sasl_settings_without_a_sasl_protocol_are_refused_not_ignored() {
        let e = args(&["--kafka-sasl-mechanism", "PLAIN"])
            .settings(&[])
            .unwrap_err();
        assert!(e.to_string().contains("KAFKA_SASL_MECHANISM"), "{e}");
        assert!(e.to_string().contains("PLAINTEXT"), "{e}");
        let ca = temp_file("ca.pem", "x");
        let e = args(&["--kafka-ssl-ca-location", ca.to_str().unwrap()])
            .settings(&[])
            .unwrap_err();
        assert!(e.to_string().contains("KAFKA_SSL_CA_LOCATION"), "{e}");
    }

    #[test]
    fn the_protocol_may_come_from_kafka_config() {
        let user = vec![("security.protocol".to_owned(), "sasl_ssl".to_owned())];
        let s = args(&[
            "--kafka-sasl-mechanism",
            "scram-sha-256",
            "--kafka-sasl-username",
            "u",
            "--kafka-sasl-password",
            "p-p-p-p",
        ])
        .settings(&user)
        .unwrap();
        assert_eq!(s.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
        assert_eq!(s.get("security.protocol"), Some("sasl_ssl"));
    }

    #[test]
    fn a_flag_and_kafka_config_that_disagree_are_refused() {
        let user = vec![("sasl.mechanism".to_owned(), "PLAIN".to_owned())];
        let e = args(&[
            "--kafka-security-protocol",
            "SASL_PLAINTEXT",
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-512",
            "--kafka-sasl-username",
            "u",
            "--kafka-sasl-password",
            "p",
        ])
        .settings(&user)
        .unwrap_err();
        assert!(e.to_string().contains("sasl.mechanism"), "{e}");
    }

    #[test]
    fn a_client_certificate_needs_its_key_and_files_must_exist() {
        let cert = temp_file("client.pem", "x");
        let e = args(&[
            "--kafka-security-protocol",
            "SSL",
            "--kafka-ssl-certificate-location",
            cert.to_str().unwrap(),
        ])
        .settings(&[])
        .unwrap_err();
        assert!(e.to_string().contains("KAFKA_SSL_KEY_LOCATION"), "{e}");
        let e = args(&[
            "--kafka-security-protocol",
            "SSL",
            "--kafka-ssl-ca-location",
            "/nonexistent/ca.pem",
        ])
        .settings(&[])
        .unwrap_err();
        assert!(e.to_string().contains("KAFKA_SSL_CA_LOCATION"), "{e}");
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn a_secret_given_twice_or_empty_is_refused_without_showing_it() {
        let pw = temp_file("pw", "from-file\n");
        let e = args(&[
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "PLAIN",
            "--kafka-sasl-username",
            "u",
            "--kafka-sasl-password",
            "inline-secret",
            "--kafka-sasl-password-file",
            pw.to_str().unwrap(),
        ])
        .settings(&[])
        .unwrap_err();
        assert!(!e.to_string().contains("inline-secret"), "{e}");
        assert!(e.to_string().contains("KAFKA_SASL_PASSWORD_FILE"), "{e}");
        let empty = temp_file("empty", "\n");
        let e = read_secret_file(&empty).unwrap_err();
        assert!(matches!(e, SecretFileError::Empty));
        assert_eq!(
            read_secret_file(&temp_file("crlf", "abc\r\n")).unwrap(),
            "abc"
        );
    }

    #[test]
    fn this_librdkafka_has_tls_and_scram_but_no_oidc_token_endpoint() {
        use rdkafka::producer::BaseProducer;
        let create = |pairs: &[(&str, &str)]| {
            let mut cfg = ClientConfig::new();
            cfg.set("bootstrap.servers", "127.0.0.1:1");
            for (k, v) in pairs {
                cfg.set(*k, *v);
            }
            cfg.create::<BaseProducer>().map(drop)
        };
        create(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ])
        .expect("built with OpenSSL and SCRAM");
        create(&[("security.protocol", "SSL")]).expect("built with OpenSSL");
        let e = create(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("oidc"), "{e}");
    }

    #[test]
    fn unsupported_mechanisms_are_refused_by_the_parser() {
        let mut argv = vec!["test", "--kafka-sasl-mechanism", "GSSAPI"];
        assert!(Cli::try_parse_from(argv.clone()).is_err());
        argv[2] = "OAUTHBEARER";
        assert!(Cli::try_parse_from(argv).is_err());
    }
}
