//! `--create-missing-topics`: create a topic the first time the relay is about to publish to
//! it and the broker does not have it. Off by default; then a missing topic shows up as a
//! delivery failure (unknown topic) that is retried with backoff.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::kafka_context::RelayContext;

/// Creates missing topics, remembering the ones known to exist.
pub struct TopicCreator {
    admin: AdminClient<RelayContext>,
    partitions: i32,
    replication: i32,
    known: HashSet<String>,
}

impl std::fmt::Debug for TopicCreator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicCreator")
            .field("known", &self.known)
            .finish()
    }
}

impl TopicCreator {
    /// An admin client for the given brokers.
    ///
    /// # Errors
    /// Invalid client settings.
    pub fn new(
        brokers: &str,
        extra: &[(String, String)],
        partitions: i32,
        replication: i32,
    ) -> Result<Self, KafkaError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", brokers);
        cfg.set("enable.metrics.push", "false");
        // Only connection-level settings of the user's producer config apply to the admin
        // client (security, client id); producer-only keys would be rejected.
        for (k, v) in extra {
            if k.starts_with("security.")
                || k.starts_with("sasl.")
                || k.starts_with("ssl.")
                || k == "client.id"
            {
                cfg.set(k, v);
            }
        }
        Ok(Self {
            admin: cfg.create_with_context(RelayContext::default())?,
            partitions,
            replication,
            known: HashSet::new(),
        })
    }

    /// Makes sure each topic exists, creating the missing ones.
    ///
    /// # Errors
    /// When a topic could not be created (other than "already exists").
    pub async fn ensure<'a>(
        &mut self,
        topics: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), KafkaError> {
        let missing: Vec<String> = topics
            .into_iter()
            .filter(|t| !self.known.contains(*t))
            .map(str::to_owned)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|t| {
                NewTopic::new(
                    t,
                    self.partitions,
                    TopicReplication::Fixed(self.replication),
                )
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = self.admin.create_topics(&new, &opts).await?;
        for r in results {
            match r {
                Ok(name) => {
                    tracing::info!(topic = %name, partitions = self.partitions, "Created missing topic");
                    self.known.insert(name);
                }
                Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    self.known.insert(name);
                }
                Err((name, code)) => {
                    tracing::warn!(topic = %name, error = %code, "Could not create topic");
                    return Err(KafkaError::AdminOp(code));
                }
            }
        }
        Ok(())
    }
}
