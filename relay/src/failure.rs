//! Why an event was not published, sorted by what the relay does about it.
//!
//! - [`Scope::Event`]: the event itself (or its topic) is the problem. Only its aggregate
//!   waits: the failure is recorded durably (`outbox_failure`), the event is retried with a
//!   growing delay and parked after `--park-after` attempts, or parked at once when it can
//!   never be sent ([`FailureClass::is_permanent`]).
//! - [`Scope::Relay`]: the producer or the broker as a whole (fatal producer error, purged
//!   messages): nothing is recorded against the event; the relay replaces the producer or backs
//!   off and sends it again.

use rdkafka::error::RDKafkaErrorCode;

/// The kind of failure of one event, as stored in `outbox_failure.error_class` and used as the
/// `class` label of the parked-events metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The row cannot be read into a message (e.g. headers PostgreSQL accepts but JSON
    /// consumers cannot represent, like `1e400`). Permanent.
    Undecodable,
    /// The topic name is not a valid Kafka topic name. Permanent.
    InvalidTopic,
    /// `--create-missing-topics` could not create the topic for a reason no retry fixes
    /// (policy, invalid settings). Permanent.
    TopicRefused,
    /// The topic does not exist (and is not created by the relay), or creating it failed for a
    /// reason that may pass. Retried, parked after `--park-after` attempts.
    UnknownTopic,
    /// The producer refused the message (too large for `message.max.bytes`, invalid).
    /// Permanent.
    Refused,
    /// The broker refused the record batch holding the message (too large for the topic's
    /// `max.message.bytes`, invalid record, corrupt). A batch fails as a whole, so the event is
    /// first retried alone; refused alone, it is parked.
    BrokerRejected,
    /// Not authorized to write to the topic. Retried (an ACL can be fixed), then parked.
    Unauthorized,
    /// Any other delivery error. Retried, then parked.
    Delivery,
    /// No acknowledgement within `--send-timeout-ms` while the cluster answered: the
    /// partition has no leader, or too few in-sync replicas. The message is withdrawn; retried,
    /// then parked.
    Unacknowledged,
}

/// What a failure holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Only the event's aggregate.
    Event(FailureClass),
    /// The producer as a whole: the event is sent again, nothing is recorded against it.
    Relay,
}

impl FailureClass {
    /// Stored and exported name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Undecodable => "undecodable",
            Self::InvalidTopic => "invalid_topic",
            Self::TopicRefused => "topic_refused",
            Self::UnknownTopic => "unknown_topic",
            Self::Refused => "refused",
            Self::BrokerRejected => "broker_rejected",
            Self::Unauthorized => "unauthorized",
            Self::Delivery => "delivery",
            Self::Unacknowledged => "unacknowledged",
        }
    }

    /// Every class, for metrics that show zeros.
    pub const ALL: [FailureClass; 9] = [
        Self::Undecodable,
        Self::InvalidTopic,
        Self::TopicRefused,
        Self::UnknownTopic,
        Self::Refused,
        Self::BrokerRejected,
        Self::Unauthorized,
        Self::Delivery,
        Self::Unacknowledged,
    ];

    /// True when no retry can succeed without an operator: the event is parked at once.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            Self::Undecodable | Self::InvalidTopic | Self::TopicRefused | Self::Refused
        )
    }

    /// True when the error may belong to another message of the same record batch: the
    /// event is retried alone before it is judged.
    pub fn is_batch_wide(self) -> bool {
        self == Self::BrokerRejected
    }
}

/// Sorts a delivery-report error.
pub fn classify_delivery(code: RDKafkaErrorCode) -> Scope {
    use RDKafkaErrorCode as C;
    match code {
        // Raised for every message the producer drops once it is unusable, or that we purged:
        // not the message's fault.
        C::Fatal | C::GaplessGuarantee | C::PurgeQueue | C::PurgeInflight | C::DestroyBroker => {
            Scope::Relay
        }
        C::MessageSizeTooLarge
        | C::InvalidRecord
        | C::InvalidMessage
        | C::InvalidMessageSize
        | C::InvalidRequiredAcks
        | C::MessageBatchTooLarge => Scope::Event(FailureClass::BrokerRejected),
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => {
            Scope::Event(FailureClass::Unauthorized)
        }
        C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition => {
            Scope::Event(FailureClass::UnknownTopic)
        }
        C::InvalidTopic => Scope::Event(FailureClass::InvalidTopic),
        _ => Scope::Event(FailureClass::Delivery),
    }
}

/// Sorts a synchronous refusal by the producer (the message was never queued).
pub fn classify_refusal(code: RDKafkaErrorCode) -> Scope {
    use RDKafkaErrorCode as C;
    match code {
        // `State`: a transaction that can only abort any more (a record batch of it refused
        // while the batch was still being handed over) refuses every later message; the
        // producer's state, not the message's fault.
        C::Fatal | C::DestroyBroker | C::State => Scope::Relay,
        C::UnknownTopic | C::UnknownTopicOrPartition | C::UnknownPartition => {
            Scope::Event(FailureClass::UnknownTopic)
        }
        C::InvalidTopic => Scope::Event(FailureClass::InvalidTopic),
        _ => Scope::Event(FailureClass::Refused),
    }
}

/// Sorts an error from creating a topic.
pub fn classify_topic_creation(code: RDKafkaErrorCode) -> FailureClass {
    use RDKafkaErrorCode as C;
    match code {
        C::InvalidTopic
        | C::PolicyViolation
        | C::InvalidPartitions
        | C::InvalidReplicationFactor
        | C::InvalidReplicaAssignment
        | C::InvalidConfig => FailureClass::TopicRefused,
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => FailureClass::Unauthorized,
        _ => FailureClass::UnknownTopic,
    }
}

/// Kafka's rule for topic names: 1 to 249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
///
/// # Errors
/// A sentence saying what is wrong with the name.
pub fn check_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("topic name `{name}` is not allowed"));
    }
    if name.len() > 249 {
        return Err(format!(
            "topic name is {} characters long, Kafka allows 249",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic name `{}` contains {c:?}; Kafka allows only [a-zA-Z0-9._-]",
            name.escape_debug()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(check_topic_name("outbox.event.order").is_ok());
        assert!(check_topic_name("a-b_c.1").is_ok());
        for bad in ["", ".", "..", "has space", "ünï", "a/b", &"x".repeat(250)] {
            assert!(check_topic_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_topic_name(&"x".repeat(249)).is_ok());
    }

    #[test]
    fn producer_wide_errors_hold_nobody_back() {
        for c in [
            RDKafkaErrorCode::Fatal,
            RDKafkaErrorCode::GaplessGuarantee,
            RDKafkaErrorCode::PurgeInflight,
            RDKafkaErrorCode::PurgeQueue,
        ] {
            assert_eq!(classify_delivery(c), Scope::Relay, "{c:?}");
        }
        assert_eq!(classify_refusal(RDKafkaErrorCode::Fatal), Scope::Relay);
        // A transaction that failed while its batch was being handed over refuses the rest.
        assert_eq!(classify_refusal(RDKafkaErrorCode::State), Scope::Relay);
    }

    #[test]
    fn message_errors_hold_back_their_aggregate() {
        assert_eq!(
            classify_delivery(RDKafkaErrorCode::InvalidRecord),
            Scope::Event(FailureClass::BrokerRejected)
        );
        assert_eq!(
            classify_delivery(RDKafkaErrorCode::MessageSizeTooLarge),
            Scope::Event(FailureClass::BrokerRejected)
        );
        assert_eq!(
            classify_refusal(RDKafkaErrorCode::MessageSizeTooLarge),
            Scope::Event(FailureClass::Refused)
        );
        assert_eq!(
            classify_delivery(RDKafkaErrorCode::TopicAuthorizationFailed),
            Scope::Event(FailureClass::Unauthorized)
        );
        assert_eq!(
            classify_delivery(RDKafkaErrorCode::MessageTimedOut),
            Scope::Event(FailureClass::Delivery)
        );
    }

    #[test]
    fn only_hopeless_classes_park_at_once() {
        let permanent: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| c.is_permanent())
            .map(FailureClass::as_str)
            .collect();
        assert_eq!(
            permanent,
            ["undecodable", "invalid_topic", "topic_refused", "refused"]
        );
        assert!(FailureClass::BrokerRejected.is_batch_wide());
        assert!(!FailureClass::Refused.is_batch_wide());
    }

    #[test]
    fn topic_creation_errors_are_sorted() {
        assert_eq!(
            classify_topic_creation(RDKafkaErrorCode::PolicyViolation),
            FailureClass::TopicRefused
        );
        assert_eq!(
            classify_topic_creation(RDKafkaErrorCode::RequestTimedOut),
            FailureClass::UnknownTopic
        );
    }
}
