//! `--create-missing-topics`: create the consumed topics, their dead-letter topics and the
//! consumer's redrive topics at start-up, before subscribing. A broker without topic auto-creation would otherwise leave
//! the subscription empty until some producer created them, and dead letters undeliverable.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::config::{
    connection_settings, dead_letter_topic, redrive_topic, RuntimeConfig, TopicSpec,
};

/// The topics consumer `consumer_name` of `topics` needs: the consumed ones, their dead-letter
/// topics and its redrive topics.
pub fn needed_topics(topics: &[String], consumer_name: &str) -> Vec<String> {
    topics
        .iter()
        .cloned()
        .chain(topics.iter().map(|t| dead_letter_topic(t)))
        .chain(topics.iter().map(|t| redrive_topic(t, consumer_name)))
        .collect()
}

/// Creates the missing ones of [`needed_topics`]; existing topics are left as they are.
///
/// The broker's metadata is read first and only topics it does not list are asked for, so a
/// restart sends no CreateTopics at all: it needs no create permission once the topics exist,
/// and costs a loaded broker one metadata answer (a chaos run on an earlier test broker saw
/// CreateTopics of existing topics time out for minutes while metadata was answered).
///
/// It returns once the broker's metadata lists every topic it asked for: a KRaft broker answers
/// CreateTopics before its metadata shows the new topics, and a consumer that subscribed in
/// that moment was told "unknown topic" and looked again only at its next metadata refresh
/// (`topic.metadata.refresh.interval.ms`, 5 minutes), consuming nothing of those topics until
/// then (seen on Apache Kafka 4.1 with three tests starting consumers at once).
///
/// # Errors
/// When the broker refuses to create a topic (other than "already exists"), is unreachable, or
/// does not list the topics within [`VISIBLE_WITHIN`].
pub async fn create_missing(config: &RuntimeConfig, spec: TopicSpec) -> Result<(), KafkaError> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &config.brokers);
    cfg.set("enable.metrics.push", "false");
    for (k, v) in connection_settings(&config.client_config) {
        cfg.set(k, v);
    }
    let admin: AdminClient<DefaultClientContext> = cfg.create()?;
    // A blocking call: on a blocking thread, with the client handed there and back.
    let (admin, metadata) = tokio::task::spawn_blocking(move || {
        let metadata = admin.inner().fetch_metadata(None, Duration::from_secs(30));
        (admin, metadata)
    })
    .await
    .map_err(|_| KafkaError::Canceled)?;
    let existing: Vec<String> = metadata?
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.name().to_owned())
        .collect();
    let names = missing(
        &needed_topics(&config.topics, &config.consumer_name),
        &existing,
    );
    if names.is_empty() {
        return Ok(());
    }
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|t| {
            NewTopic::new(
                t,
                spec.partitions,
                TopicReplication::Fixed(spec.replication_factor.unwrap_or(-1)),
            )
        })
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(&new, &opts).await? {
        match result {
            Ok(name) => {
                tracing::info!(topic = %name, partitions = spec.partitions, "Created missing topic")
            }
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                tracing::warn!(topic = %name, error = %code, "Could not create topic");
                return Err(KafkaError::AdminOp(code));
            }
        }
    }
    wait_visible(admin, names).await
}

/// How long [`create_missing`] waits for the broker's metadata to list the topics it created.
pub const VISIBLE_WITHIN: Duration = Duration::from_secs(30);

/// Asks for metadata every 100 ms until every one of `names` is listed with its partitions.
async fn wait_visible(
    admin: AdminClient<DefaultClientContext>,
    names: Vec<String>,
) -> Result<(), KafkaError> {
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + VISIBLE_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let listed: Vec<String> = admin
                .inner()
                .fetch_metadata(None, left.max(Duration::from_secs(1)))?
                .topics()
                .iter()
                .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                .map(|t| t.name().to_owned())
                .collect();
            let absent = missing(&names, &listed);
            if absent.is_empty() {
                return Ok(());
            }
            if left.is_zero() {
                tracing::warn!(
                    topics = ?absent,
                    "Created topics are not in the broker's metadata after {} s",
                    VISIBLE_WITHIN.as_secs()
                );
                return Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .map_err(|_| KafkaError::Canceled)?
}

/// The topics of `needed` that are not in `existing`, in `needed`'s order.
fn missing(needed: &[String], existing: &[String]) -> Vec<String> {
    needed
        .iter()
        .filter(|t| !existing.contains(t))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_topics_the_broker_does_not_list_are_created() {
        let needed = needed_topics(&["a.order".to_owned(), "a.stock".to_owned()], "wms");
        let existing = [
            "a.stock".to_owned(),
            "a.order.dlq".to_owned(),
            "a.order.wms.redrive".to_owned(),
            "b".to_owned(),
        ];
        assert_eq!(
            missing(&needed, &existing),
            ["a.order", "a.stock.dlq", "a.stock.wms.redrive"]
        );
        assert!(missing(&needed, &needed).is_empty());
    }

    #[test]
    fn every_consumed_topic_gets_a_dead_letter_topic_and_a_redrive_topic() {
        let t = needed_topics(&["a.order".to_owned(), "a.stock".to_owned()], "wms");
        assert_eq!(
            t,
            [
                "a.order",
                "a.stock",
                "a.order.dlq",
                "a.stock.dlq",
                "a.order.wms.redrive",
                "a.stock.wms.redrive"
            ]
        );
    }
}
