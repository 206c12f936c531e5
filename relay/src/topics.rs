//! Which topics a batch can be sent to. Before the first message to a topic the relay checks
//! it: a name Kafka does not allow, a topic the broker does not have (created first with
//! `--create-missing-topics`), or one it may not create, fails the topic's rows only — their
//! aggregates wait (see [`crate::failure`]) while the rest of the batch is sent. Without the
//! check, librdkafka would hold an unknown topic's messages for
//! `topic.metadata.propagation.max.ms` and the whole batch with them.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use outbox_kit::kafka::PolledProducer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::failure::{check_topic_name, classify_topic_creation, FailureClass};
use crate::kafka_context::RelayContext;

/// Partitions and replication of topics the relay creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicSpec {
    /// Partitions.
    pub partitions: i32,
    /// Replication factor; `None`: the broker's default (`default.replication.factor`, asked
    /// for with -1, KIP-464).
    pub replication: Option<i32>,
}

/// Why a topic cannot take messages now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicProblem {
    /// Failure class of the rows routed to it.
    pub class: FailureClass,
    /// What is wrong.
    pub detail: String,
}

/// Topics known to exist, and the admin client that creates missing ones.
pub struct TopicCatalog {
    known: HashSet<String>,
    creator: Option<(AdminClient<RelayContext>, TopicSpec)>,
}

impl std::fmt::Debug for TopicCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicCatalog")
            .field("known", &self.known.len())
            .finish()
    }
}

const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

impl TopicCatalog {
    /// A catalog that creates missing topics with `create`, or only checks them.
    ///
    /// # Errors
    /// Invalid client settings.
    pub fn new(
        brokers: &str,
        extra: &[(String, String)],
        create: Option<TopicSpec>,
    ) -> Result<Self, KafkaError> {
        let creator = match create {
            None => None,
            Some(spec) => {
                let mut cfg = ClientConfig::new();
                cfg.set("bootstrap.servers", brokers);
                cfg.set("enable.metrics.push", "false");
                // Only connection-level settings of the user's producer config apply to the
                // admin client (security, trust, sockets, client id); producer-only keys would
                // be rejected.
                for (k, v) in outbox_kit::kafka::connection_settings(extra) {
                    cfg.set(k, v);
                }
                Some((cfg.create_with_context(RelayContext::default())?, spec))
            }
        };
        Ok(Self {
            known: HashSet::new(),
            creator,
        })
    }

    /// Checks the topics not known yet; returns the ones that cannot take messages. Known
    /// topics cost nothing.
    ///
    /// # Errors
    /// When the broker cannot be asked (it is down): the caller backs off as a whole.
    pub async fn check<'a>(
        &mut self,
        producer: &PolledProducer<RelayContext>,
        topics: impl IntoIterator<Item = &'a str>,
    ) -> Result<HashMap<String, TopicProblem>, KafkaError> {
        let mut problems = HashMap::new();
        let mut unknown = Vec::new();
        for t in topics.into_iter().collect::<HashSet<_>>() {
            if self.known.contains(t) {
                continue;
            }
            match check_topic_name(t) {
                Ok(()) => unknown.push(t.to_owned()),
                Err(detail) => {
                    problems.insert(
                        t.to_owned(),
                        TopicProblem {
                            class: FailureClass::InvalidTopic,
                            detail,
                        },
                    );
                }
            }
        }
        if unknown.is_empty() {
            return Ok(problems);
        }
        let mut missing = Vec::new();
        for topic in unknown {
            if exists(producer, &topic).await? {
                self.known.insert(topic);
            } else {
                missing.push(topic);
            }
        }
        if missing.is_empty() {
            return Ok(problems);
        }
        let Some((admin, spec)) = &self.creator else {
            for t in missing {
                problems.insert(
                    t.clone(),
                    TopicProblem {
                        class: FailureClass::UnknownTopic,
                        detail: format!(
                            "topic {t} does not exist (create it, or run the relay with --create-missing-topics)"
                        ),
                    },
                );
            }
            return Ok(problems);
        };
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|t| {
                NewTopic::new(
                    t,
                    spec.partitions,
                    TopicReplication::Fixed(spec.replication.unwrap_or(-1)),
                )
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for r in admin.create_topics(&new, &opts).await? {
            match r {
                Ok(name) => {
                    tracing::info!(topic = %name, partitions = spec.partitions, "Created missing topic");
                    self.known.insert(name);
                }
                Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    self.known.insert(name);
                }
                Err((name, code)) => {
                    tracing::warn!(topic = %name, error = %code, "Could not create topic; its events wait");
                    problems.insert(
                        name.clone(),
                        TopicProblem {
                            class: classify_topic_creation(code),
                            detail: format!("could not create topic {name}: {code}"),
                        },
                    );
                }
            }
        }
        Ok(problems)
    }
}

/// Asks the broker whether `topic` exists (an error: no broker answered in time).
pub(crate) async fn exists(
    producer: &PolledProducer<RelayContext>,
    topic: &str,
) -> Result<bool, KafkaError> {
    use rdkafka::producer::Producer;
    let producer = producer.shared();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let md = producer
            .client()
            .fetch_metadata(Some(&topic), METADATA_TIMEOUT)?;
        Ok(md
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
    })
    .await
    .map_err(|_| KafkaError::Canceled)?
}
