//! `--kafka-config`, the user's librdkafka settings, as every binary parses it: `KEY=VALUE`
//! pairs, comma separated (in one flag or the environment variable) or repeated.
//!
//! - A comma that is not followed by a new `KEY=` belongs to the value before it, so a
//!   password with a comma is kept whole (a value holding `,KEY=` cannot be told from two
//!   settings: give such a secret as a file, `KAFKA_SASL_PASSWORD_FILE`).
//! - A property librdkafka knows by two names is checked under the name the checks use
//!   ([`canonical_key`]: `sasl.mechanisms` as `sasl.mechanism`, ...), so a check of a setting
//!   cannot be bypassed by its other name; messages name it as the user wrote it.
//! - No error message and no `Debug` output shows a value of a secret property; the flag's
//!   environment value is hidden from `--help` where it is declared (`hide_env_values`).

use crate::security::is_secret;

/// Property names librdkafka accepts for one property, and the one name this code checks
/// (librdkafka's CONFIGURATION.md: "Alias for ..."): each pair is `(other name, checked name)`.
pub const ALIASES: [(&str, &str); 8] = [
    ("metadata.broker.list", "bootstrap.servers"),
    ("sasl.mechanisms", "sasl.mechanism"),
    ("request.required.acks", "acks"),
    ("max.in.flight", "max.in.flight.requests.per.connection"),
    ("message.send.max.retries", "retries"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("queue.buffering.max.ms", "linger.ms"),
    ("compression.codec", "compression.type"),
];

/// The name this code checks for librdkafka property `key` (itself unless it has another).
pub fn canonical_key(key: &str) -> &str {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, canonical)| canonical)
}

/// The pairs of one `--kafka-config` value (one flag, or the environment variable). `Debug`
/// hides the values of secret properties.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaConfigList(pub Vec<(String, String)>);

impl std::fmt::Debug for KafkaConfigList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let shown = if is_secret(k) {
                    crate::security::REDACTED
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            }))
            .finish()
    }
}

/// Whether `segment` (after a comma) starts a new setting: `KEY=` with a plausible librdkafka
/// property name (letters, digits, `.`, `_`, `-`).
fn starts_setting(segment: &str) -> bool {
    segment.split_once('=').is_some_and(|(k, _)| {
        let k = k.trim();
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    })
}

/// Parses one `--kafka-config` value: `KEY=VALUE[,KEY=VALUE...]`.
///
/// # Errors
/// A value that does not start with `KEY=`, or a pair with an empty key; the message never
/// shows the value.
pub fn parse_kafka_config(s: &str) -> Result<KafkaConfigList, String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for segment in s.split(',') {
        if starts_setting(segment) {
            let (k, v) = segment.split_once('=').unwrap_or_default();
            pairs.push((k.trim().to_owned(), v.trim().to_owned()));
            continue;
        }
        match pairs.last_mut() {
            // A comma inside the value before.
            Some((_, value)) => {
                value.push(',');
                value.push_str(segment.trim_end());
            }
            None if segment.trim().is_empty() && s.trim().is_empty() => {}
            None => {
                return Err(
                    "expected KEY=VALUE[,KEY=VALUE...] (a librdkafka property name, then `=`)"
                        .to_owned(),
                )
            }
        }
    }
    Ok(KafkaConfigList(pairs))
}

/// Every pair of `lists`, in order (the last setting of a key wins, as in librdkafka).
pub fn pairs(lists: &[KafkaConfigList]) -> Vec<(String, String)> {
    lists.iter().flat_map(|l| l.0.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(s: &str) -> Vec<(String, String)> {
        parse_kafka_config(s).unwrap().0
    }

    fn kv(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    #[test]
    fn settings_are_comma_separated_and_trimmed() {
        assert_eq!(
            parsed(" linger.ms = 5 ,compression.type=zstd"),
            vec![kv("linger.ms", "5"), kv("compression.type", "zstd")]
        );
        assert_eq!(parsed("a.b=c=d"), vec![kv("a.b", "c=d")]);
    }

    #[test]
    fn a_comma_inside_a_value_stays_in_it() {
        assert_eq!(
            parsed("sasl.password=p,ss wo,rd,linger.ms=5"),
            vec![kv("sasl.password", "p,ss wo,rd"), kv("linger.ms", "5")]
        );
    }

    #[test]
    fn other_names_are_checked_as_the_checked_name() {
        assert_eq!(canonical_key("sasl.mechanisms"), "sasl.mechanism");
        assert_eq!(canonical_key("metadata.broker.list"), "bootstrap.servers");
        assert_eq!(canonical_key("linger.ms"), "linger.ms");
        assert_eq!(
            parsed("sasl.mechanisms=PLAIN"),
            vec![kv("sasl.mechanisms", "PLAIN")],
            "kept as written, for messages"
        );
    }

    #[test]
    fn errors_and_debug_never_show_a_secret() {
        let err = parse_kafka_config("hunter2secret").unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        let err = parse_kafka_config("=hunter2").unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        let shown = format!(
            "{:?}",
            parse_kafka_config("sasl.password=hunter2,a=b").unwrap()
        );
        assert!(
            !shown.contains("hunter2") && shown.contains("\"a\": \"b\""),
            "{shown}"
        );
    }
}
