//! Why a dead-letter command failed ([`DlqError`]).

use rdkafka::error::KafkaError;
use uuid::Uuid;

/// Why a dead-letter command failed.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// The consumer's database (its `dlq_redriven` table, migrated with the inbox) could not
    /// be read or written.
    #[error("the consumer's database (table dlq_redriven)")]
    Database(#[from] sqlx::Error),
    /// The broker could not be reached or refused a request.
    #[error("Kafka error")]
    Kafka(#[from] KafkaError),
    /// A dead-letter partition was not read up to its high watermark in time.
    #[error("timed out reading {topic} partition {partition} up to offset {high_watermark}")]
    ReadTimeout {
        /// Dead-letter topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset the read had to reach.
        high_watermark: i64,
    },
    /// No dead letter of this consumer carries the event id asked for.
    #[error("no dead letter of consumer `{consumer}` has event id {event_id}")]
    UnknownEventId {
        /// The consumer.
        consumer: String,
        /// The event id asked for.
        event_id: Uuid,
    },
    /// Writing the command's output failed.
    #[error("could not write the output")]
    Output(#[source] std::io::Error),
    /// The consumer's redrive topic does not exist; nothing was sent.
    #[error(
        "redrive topic {topic} does not exist: create it (the consumer does at start-up with \
         --create-missing-topics) and restart the consumer, so that it subscribes to it"
    )]
    NoRedriveTopic {
        /// The missing topic.
        topic: String,
    },
    /// A dead letter without the header naming where to send it back.
    #[error("dead letter {topic}/{partition}@{offset} has no `dlq.source.topic` header")]
    NoSourceTopic {
        /// Dead-letter topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
    },
}
