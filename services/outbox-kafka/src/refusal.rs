//! The refusal a Kafka client of this process is currently getting (a login the broker
//! refuses, a certificate that does not verify), for `/healthz`. librdkafka reports it through
//! the client context's error callback and then retries forever, like an outage; without this
//! the process would only log it. One process has one Kafka identity, so one record serves all
//! its clients: a context [`note`]s what it is told and [`clear`]s it once a request got through
//! again (the relay: a delivery). librdkafka reports an error once, not at every identical
//! retry, so the record cannot expire by itself.

use std::sync::Mutex;

use rdkafka::error::RDKafkaErrorCode;

static CURRENT: Mutex<Option<String>> = Mutex::new(None);

/// Records `reason` when `code` / `reason` is a refusal ([`super::probe::refusal_kind`]);
/// returns whether it was one.
pub fn note(code: Option<RDKafkaErrorCode>, reason: &str) -> bool {
    let Some(kind) = super::probe::refusal_kind(code, reason) else {
        return false;
    };
    *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{kind}: {reason}"));
    true
}

/// The broker answered again: the refusal is over.
pub fn clear() {
    CURRENT.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// The refusal in force, as `<kind>: <librdkafka's reason>` (`authentication: SASL ...`,
/// `tls: ... certificate verify failed ...`).
pub fn current() -> Option<String> {
    CURRENT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_kept_until_cleared_and_outages_are_not_refusals() {
        assert!(!note(
            Some(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down"
        ));
        assert!(note(
            Some(RDKafkaErrorCode::SSL),
            "SSL handshake failed: certificate verify failed"
        ));
        assert_eq!(
            current().as_deref(),
            Some("tls: SSL handshake failed: certificate verify failed")
        );
        clear();
        assert_eq!(current(), None);
    }
}
