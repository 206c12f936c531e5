//! What every client context does with librdkafka's own log lines ([`log_librdkafka!`]):
//! librdkafka logs every reconnect attempt, so all but its emergencies go to debug level; an
//! outage is reported once, by the context's error callback, not here.
//!
//! A macro rather than a function so that each line keeps the target of the context that
//! forwards it (`outbox_relay::kafka_context`, `outbox_consumer::context`, ...): a `RUST_LOG`
//! that turns one client's debug lines on keeps showing its librdkafka lines.

use rdkafka::config::RDKafkaLogLevel;

#[doc(hidden)]
pub use tracing as __tracing;

/// Whether librdkafka's `level` goes to error level (emergency, alert, critical); every other
/// level goes to debug.
pub fn is_severe(level: RDKafkaLogLevel) -> bool {
    matches!(
        level,
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical
    )
}

/// Forwards one librdkafka log line (`level`, `facility`, `message`: the arguments of
/// `rdkafka::ClientContext::log`) to `tracing`, at error level when [`is_severe`] and at debug
/// level otherwise, with the facility as `librdkafka.facility`.
///
/// ```
/// use rdkafka::client::ClientContext;
/// use rdkafka::config::RDKafkaLogLevel;
///
/// struct Context;
///
/// impl ClientContext for Context {
///     fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
///         outbox_kafka::log_librdkafka!(level, fac, log_message);
///     }
/// }
/// ```
#[macro_export]
macro_rules! log_librdkafka {
    ($level:expr, $facility:expr, $message:expr $(,)?) => {
        if $crate::client_log::is_severe($level) {
            $crate::client_log::__tracing::error!(librdkafka.facility = $facility, "{}", $message)
        } else {
            $crate::client_log::__tracing::debug!(librdkafka.facility = $facility, "{}", $message)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_librdkafkas_emergencies_are_errors() {
        use RDKafkaLogLevel as L;
        for level in [L::Emerg, L::Alert, L::Critical] {
            assert!(is_severe(level), "{level:?}");
        }
        for level in [L::Error, L::Warning, L::Notice, L::Info, L::Debug] {
            assert!(!is_severe(level), "{level:?}");
        }
    }
}
