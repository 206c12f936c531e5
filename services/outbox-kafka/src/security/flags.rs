//! The Kafka security flags every binary takes ([`KafkaSecurityArgs`]), with the protocols
//! ([`SecurityProtocol`]) and SASL mechanisms ([`SaslMechanism`]) this build supports. `Debug`
//! of the flags never shows a password.

use std::path::PathBuf;

use super::secret::REDACTED;

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

    pub(crate) fn parse(value: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(value, true).ok()
    }

    pub(crate) fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub(crate) fn uses_sasl(self) -> bool {
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
