//! The start-up check every binary runs on its secrets, so a deployment that forgot to replace
//! a placeholder does not run with it: a secret that appears in our own files (placeholders,
//! examples, compose defaults, the demo's and the tests' values) or that is shorter or simpler
//! than the rule below is refused, naming the setting and never echoing the value.
//!
//! The rule ([`weakness`]):
//! - signing keys (`JWT_HS256_SECRET`, `PAYMENT_CALLBACK_SECRET`, `MARKETPLACE_SECRET`) are at
//!   least [`MIN_SIGNING_KEY_LEN`] bytes, passwords (the one in `DATABASE_URL`) at least
//!   [`MIN_PASSWORD_LEN`];
//! - both have at least [`MIN_DISTINCT_CHARS`] distinct characters (no `aaaa…`, `abab…`);
//! - neither is one of [`SHIPPED`] nor contains, letters and digits only and case ignored, one
//!   of the words placeholders are made of ([`PLACEHOLDER_WORDS`]: `changeme`, `secret`, ...).
//!   A random value (`openssl rand -hex 32`) never does.
//!
//! `--allow-weak-secrets` / `ALLOW_WEAK_SECRETS=true` ([`SecretArgs`]) turns the refusal into a
//! warning: for the demo and the tests, never for a deployment.

use std::borrow::Cow;
use std::fmt;

/// Shortest accepted signing key (HMAC-SHA256 and HS256: at least the hash size, RFC 7518
/// §3.2).
pub const MIN_SIGNING_KEY_LEN: usize = 32;

/// Shortest accepted password.
pub const MIN_PASSWORD_LEN: usize = 16;

/// Fewest distinct characters of an accepted secret.
pub const MIN_DISTINCT_CHARS: usize = 8;

/// Values that appear in this project's files (deploy files, READMEs, the demo, the tests):
/// whoever read them knows them. Compared ignoring case.
pub const SHIPPED: &[&str] = &[
    // deploy/k8s/00-config.yaml (before it stopped shipping secrets), READMEs
    "CHANGE-ME-TO-32-OR-MORE-RANDOM-BYTES",
    "CHANGE-ME",
    // deploy/compose/compose.yaml defaults (before it stopped shipping secrets)
    "local-only-jwt-secret-change-me-32b",
    "change-me",
    "postgres",
    "admin",
    // deploy/local/demo-*.sh
    "demo-callback-secret",
    "demo-marketplace-secret",
    // the tests
    "e2e-jwt-secret-at-least-32-bytes-long",
    "test-jwt-secret-of-at-least-32-bytes",
    "e2e-callback-secret",
    "e2e-marketplace-secret",
    "test-callback-secret",
    "test-marketplace-secret",
    "chaos-marketplace-secret",
    "fuzz-callback-secret",
    "fuzz-marketplace-secret",
    "retention-secret",
    "0123456789abcdef0123456789abcdef",
];

/// Words placeholder secrets are made of; a value containing one (letters and digits only,
/// case ignored) is refused.
pub const PLACEHOLDER_WORDS: &[&str] = &[
    "changeme",
    "replaceme",
    "secret",
    "password",
    "passwd",
    "example",
    "placeholder",
    "localonly",
    "insecure",
];

/// What a secret is used for, which sets its minimum length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretKind {
    /// An HMAC or HS256 key: at least [`MIN_SIGNING_KEY_LEN`] bytes.
    SigningKey,
    /// A password: at least [`MIN_PASSWORD_LEN`] characters.
    Password,
}

impl SecretKind {
    fn min_len(self) -> usize {
        match self {
            Self::SigningKey => MIN_SIGNING_KEY_LEN,
            Self::Password => MIN_PASSWORD_LEN,
        }
    }
}

/// Why a secret is refused. Never holds the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Weakness {
    /// It is one of the values in this project's files ([`SHIPPED`]).
    Shipped,
    /// It contains a placeholder word ([`PLACEHOLDER_WORDS`]).
    Placeholder(&'static str),
    /// It is shorter than the minimum.
    TooShort {
        /// Its length in bytes.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// It has too few distinct characters.
    TooSimple {
        /// How many distinct characters it has.
        distinct: usize,
    },
}

impl fmt::Display for Weakness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shipped => f.write_str("it is a value published in this project's files"),
            Self::Placeholder(word) => write!(f, "it contains the placeholder word {word:?}"),
            Self::TooShort { len, min } => {
                write!(f, "it is {len} bytes long, shorter than the {min} required")
            }
            Self::TooSimple { distinct } => write!(
                f,
                "it has {distinct} distinct characters, fewer than the {MIN_DISTINCT_CHARS} required"
            ),
        }
    }
}

/// Why `value`, used as `kind`, is weak; `None` when it passes the rule (module docs).
pub fn weakness(kind: SecretKind, value: &str) -> Option<Weakness> {
    if SHIPPED.iter().any(|s| s.eq_ignore_ascii_case(value)) {
        return Some(Weakness::Shipped);
    }
    let folded: String = value
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if let Some(word) = PLACEHOLDER_WORDS.iter().find(|w| folded.contains(*w)) {
        return Some(Weakness::Placeholder(word));
    }
    if value.len() < kind.min_len() {
        return Some(Weakness::TooShort {
            len: value.len(),
            min: kind.min_len(),
        });
    }
    let mut chars: Vec<char> = value.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    if chars.len() < MIN_DISTINCT_CHARS {
        return Some(Weakness::TooSimple {
            distinct: chars.len(),
        });
    }
    None
}

/// The password of a PostgreSQL URL (`postgres://user:password@host/db`, or a `password=`
/// query parameter), percent-decoded; `None` without one (peer, certificate or `.pgpass`
/// authentication) or when the URL does not parse (the connection reports that).
pub fn database_password(database_url: &str) -> Option<String> {
    let url = url::Url::parse(database_url).ok()?;
    let from_query = url
        .query_pairs()
        .find(|(k, _)| k == "password")
        .map(|(_, v)| v.into_owned());
    let from_userinfo = url.password().map(|p| {
        url::form_urlencoded::parse(format!("p={p}").as_bytes())
            .next()
            .map_or_else(|| p.to_owned(), |(_, v)| v.into_owned())
    });
    from_query.or(from_userinfo).filter(|p| !p.is_empty())
}

/// One secret a binary was given.
#[derive(Clone)]
pub struct Secret<'a> {
    /// The setting, as the error names it: `JWT_HS256_SECRET (--jwt-hs256-secret)`.
    pub setting: &'static str,
    /// What it is used for.
    pub kind: SecretKind,
    /// Its value; `None` when unset.
    pub value: Option<Cow<'a, str>>,
}

impl fmt::Debug for Secret<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("setting", &self.setting)
            .field("kind", &self.kind)
            .field("set", &self.value.is_some())
            .finish()
    }
}

impl<'a> Secret<'a> {
    /// A signing key setting.
    pub fn signing_key(setting: &'static str, value: Option<&'a str>) -> Self {
        Self {
            setting,
            kind: SecretKind::SigningKey,
            value: value.map(Cow::Borrowed),
        }
    }

    /// A password setting (e.g. the Kafka SASL password).
    pub fn password(setting: &'static str, value: Option<&'a str>) -> Self {
        Self {
            setting,
            kind: SecretKind::Password,
            value: value.map(Cow::Borrowed),
        }
    }

    /// The password of the PostgreSQL URL of `setting`, if the URL has one.
    pub fn database_url(setting: &'static str, url: &str) -> Secret<'static> {
        Secret {
            setting,
            kind: SecretKind::Password,
            value: database_password(url).map(Cow::Owned),
        }
    }
}

/// The secrets that failed the rule, each with its setting and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to start with a weak or published secret: {}. Use random values (e.g. \
     `openssl rand -hex 32`); for local development only, set ALLOW_WEAK_SECRETS=true \
     (--allow-weak-secrets)",
    describe(.0)
)]
pub struct WeakSecrets(pub Vec<(&'static str, Weakness)>);

fn describe(found: &[(&'static str, Weakness)]) -> String {
    found
        .iter()
        .map(|(setting, why)| format!("{setting}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The secrets of `secrets` that are set and weak.
pub fn find_weak(secrets: &[Secret<'_>]) -> Vec<(&'static str, Weakness)> {
    secrets
        .iter()
        .filter_map(|s| {
            s.value
                .as_deref()
                .and_then(|v| weakness(s.kind, v))
                .map(|w| (s.setting, w))
        })
        .collect()
}

/// The development switch every binary takes (flatten into its `clap::Parser`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SecretArgs {
    /// Start even with weak or published secrets (placeholders, the demo's values), logging a
    /// warning instead of refusing. For local development and tests only: never set it in a
    /// deployment.
    #[arg(long, env = "ALLOW_WEAK_SECRETS", default_value_t = false)]
    pub allow_weak_secrets: bool,
}

impl SecretArgs {
    /// Checks `secrets` against the rule: refuses weak ones, or with `--allow-weak-secrets`
    /// logs one warning naming them and lets the process start.
    ///
    /// # Errors
    /// [`WeakSecrets`] naming every weak setting and why (never the values).
    pub fn check(&self, secrets: &[Secret<'_>]) -> Result<(), WeakSecrets> {
        let weak = find_weak(secrets);
        if weak.is_empty() {
            return Ok(());
        }
        if self.allow_weak_secrets {
            tracing::warn!(
                settings = %describe(&weak),
                "Starting with weak or published secrets because ALLOW_WEAK_SECRETS is set: for development only"
            );
            return Ok(());
        }
        Err(WeakSecrets(weak))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANDOM: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn every_shipped_value_is_refused_for_every_kind() {
        for kind in [SecretKind::SigningKey, SecretKind::Password] {
            for v in SHIPPED {
                assert!(weakness(kind, v).is_some(), "{v} accepted as {kind:?}");
                assert!(weakness(kind, &v.to_lowercase()).is_some(), "{v}");
            }
        }
        assert_eq!(
            weakness(
                SecretKind::SigningKey,
                "CHANGE-ME-TO-32-OR-MORE-RANDOM-BYTES"
            ),
            Some(Weakness::Shipped)
        );
    }

    #[test]
    fn placeholders_short_and_simple_values_are_refused() {
        let k = SecretKind::SigningKey;
        assert_eq!(
            weakness(k, "please-Change_Me-before-production-0001"),
            Some(Weakness::Placeholder("changeme"))
        );
        assert_eq!(
            weakness(k, "our-very-own-Secret-value-for-prod-42"),
            Some(Weakness::Placeholder("secret"))
        );
        assert_eq!(
            weakness(k, "Zq8#kd0!pW"),
            Some(Weakness::TooShort { len: 10, min: 32 })
        );
        assert_eq!(
            weakness(k, &"ab".repeat(20)),
            Some(Weakness::TooSimple { distinct: 2 })
        );
        assert_eq!(
            weakness(SecretKind::Password, "Zq8#kd0!pW"),
            Some(Weakness::TooShort { len: 10, min: 16 })
        );
    }

    #[test]
    fn random_values_pass() {
        assert_eq!(weakness(SecretKind::SigningKey, RANDOM), None);
        assert_eq!(weakness(SecretKind::Password, &RANDOM[..16]), None);
        assert_eq!(
            weakness(
                SecretKind::SigningKey,
                "demo-jwt-0f3c9a7e21b4d58c6e90a1f2b3c4d5e6"
            ),
            None,
            "the demo's generated JWT secret"
        );
    }

    #[test]
    fn database_passwords_come_from_the_url() {
        assert_eq!(
            database_password("postgres://order:CHANGE-ME@db:5432/order").as_deref(),
            Some("CHANGE-ME")
        );
        assert_eq!(
            database_password("postgres://u:p%40ss%2Fw0rd@h/x").as_deref(),
            Some("p@ss/w0rd")
        );
        assert_eq!(
            database_password("postgres://u@h/x?password=hunter2&sslmode=require").as_deref(),
            Some("hunter2")
        );
        assert_eq!(database_password("postgres://postgres@127.0.0.1:5/x"), None);
        assert_eq!(database_password("not a url"), None);
    }

    #[test]
    fn the_check_names_settings_not_values_and_the_flag_lets_it_start() {
        let secrets = [
            Secret::signing_key("PAYMENT_CALLBACK_SECRET", Some("change-me")),
            Secret::signing_key("MARKETPLACE_SECRET", None),
            Secret::database_url("DATABASE_URL", "postgres://u:CHANGE-ME@h/x"),
            Secret::signing_key("JWT_HS256_SECRET", Some(RANDOM)),
        ];
        let err = SecretArgs::default().check(&secrets).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("PAYMENT_CALLBACK_SECRET"), "{text}");
        assert!(text.contains("DATABASE_URL"), "{text}");
        assert!(!text.contains("JWT_HS256_SECRET"), "{text}");
        assert!(!text.contains("MARKETPLACE_SECRET"), "{text}");
        assert!(!text.to_lowercase().contains("change-me"), "{text}");
        assert!(text.contains("ALLOW_WEAK_SECRETS"), "{text}");
        let dev = SecretArgs {
            allow_weak_secrets: true,
        };
        assert_eq!(dev.check(&secrets), Ok(()));
    }
}
