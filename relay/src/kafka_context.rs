//! librdkafka client callbacks: broker-level errors are turned into one log line per outage
//! instead of one per reconnect attempt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Client context of the relay's producer; clones share the broker state.
#[derive(Debug, Default, Clone)]
pub struct RelayContext {
    broker_down: Arc<AtomicBool>,
}

impl RelayContext {
    /// True while librdkafka reports the brokers unreachable.
    pub fn broker_down(&self) -> bool {
        self.broker_down.load(Ordering::Relaxed)
    }

    /// Called when a delivery succeeded: the broker is reachable again.
    pub fn mark_broker_up(&self) {
        if self.broker_down.swap(false, Ordering::Relaxed) {
            tracing::info!("Kafka broker reachable again");
        }
    }
}

impl ClientContext for RelayContext {
    /// librdkafka logs every reconnect attempt; those go to debug level. The outage itself is
    /// reported once through [`ClientContext::error`].
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical => {
                tracing::error!(librdkafka.facility = fac, "{log_message}")
            }
            _ => tracing::debug!(librdkafka.facility = fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let transport = matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::AllBrokersDown
                    | RDKafkaErrorCode::BrokerTransportFailure
                    | RDKafkaErrorCode::Resolve
            )
        );
        if transport {
            if !self.broker_down.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %error, reason, "Kafka broker unreachable; librdkafka keeps retrying, in-flight events stay unmarked");
            }
        } else {
            tracing::error!(error = %error, reason, "Kafka client error");
        }
    }
}
