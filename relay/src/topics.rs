//! Which topics a batch can be sent to. Before the first message to a topic the relay checks
//! it: a name Kafka does not allow, a topic the broker does not have (created first with
//! `--create-missing-topics`), or one it may not create, fails the topic's rows only — their
//! aggregates wait (see [`crate::failure`]) while the rest of the batch is sent. Without the
//! check, librdkafka would hold an unknown topic's messages for
//! `topic.metadata.propagation.max.ms` and the whole batch with them.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use outbox_kafka::PolledProducer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::failure::{check_topic_name, classify_topic_creation, FailureClass};
use crate::kafka_context::RelayContext;

mod dead;
mod metadata;

pub use dead::DeadPartitions;

use metadata::{any_broker, describe, partitions, METADATA_TIMEOUT};
pub(crate) use metadata::{exists, replicas};

/// Partitions and replication of topics the relay creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicSpec {
    /// Partitions.
    pub partitions: i32,
    /// Replication factor; `None`: the broker's default (`default.replication.factor`, asked
    /// for with -1, KIP-464).
    pub replication: Option<i32>,
    /// `min.insync.replicas`; `None`: a majority of the replicas ([`majority`]).
    pub min_insync_replicas: Option<i32>,
}

/// The `min.insync.replicas` Kafka recommends for a replication factor: a majority of the
/// replicas (replication 3 → 2), so an acknowledged write is on more than one broker whenever
/// there is more than one.
pub fn majority(replication: i32) -> i32 {
    replication.max(1) / 2 + 1
}

/// Why a topic cannot take messages now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicProblem {
    /// Failure class of the rows routed to it.
    pub class: FailureClass,
    /// What is wrong.
    pub detail: String,
}

/// Topics known to exist, and the admin client that checks their durability settings and
/// creates missing ones.
///
/// The admin client lives only while a check or a creation needs it: it is a librdkafka
/// client of its own (threads, a connection to every broker) whose poll thread wakes ten
/// times a second, per bucket, for the life of the relay; most of an idle relay's CPU when
/// it held several buckets. Topics are checked once each, so one comes and goes with each
/// new topic.
pub struct TopicCatalog {
    known: HashSet<String>,
    /// Per topic, the partitions without a leader as the last metadata said, and when.
    leaders: HashMap<String, Leaders>,
    /// The admin client's settings.
    admin_config: ClientConfig,
    /// The admin client while a check or a creation runs.
    admin: Option<AdminClient<RelayContext>>,
    create: Option<TopicSpec>,
    /// The broker's `default.replication.factor`, once asked (for topics created without
    /// `--topic-replication-factor`).
    default_replication: Option<i32>,
}

impl std::fmt::Debug for TopicCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicCatalog")
            .field("known", &self.known.len())
            .finish()
    }
}

impl Drop for TopicCatalog {
    fn drop(&mut self) {
        // A check cut short (a shutdown) left its admin client.
        self.retire_admin();
    }
}

/// How long the relay trusts what the metadata said about a topic's partition leaders.
const LEADERS_EVERY: Duration = Duration::from_secs(1);

/// A topic's partitions as the metadata last showed them.
#[derive(Debug, Clone)]
struct Leaders {
    at: std::time::Instant,
    count: i32,
    leaderless: HashSet<i32>,
}

impl TopicCatalog {
    /// A catalog that creates missing topics with `create`, or only checks them. Its admin
    /// client is created when needed: settings it refuses are refused first by the producer
    /// the relay creates from the same ones.
    pub fn new(brokers: &str, extra: &[(String, String)], create: Option<TopicSpec>) -> Self {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", brokers);
        cfg.set("enable.metrics.push", "false");
        // Only connection-level settings of the user's producer config apply to the admin
        // client (security, trust, sockets, client id); producer-only keys would be rejected.
        for (k, v) in outbox_kafka::connection_settings(extra) {
            cfg.set(k, v);
        }
        Self {
            known: HashSet::new(),
            leaders: HashMap::new(),
            admin_config: cfg,
            admin: None,
            create,
            default_replication: None,
        }
    }

    /// The admin client, created if there is none.
    fn admin(&mut self) -> Result<&AdminClient<RelayContext>, KafkaError> {
        let admin = match self.admin.take() {
            Some(admin) => admin,
            None => self
                .admin_config
                .create_with_context(RelayContext::default())?,
        };
        Ok(self.admin.insert(admin))
    }

    /// Lets the admin client go, on the blocking pool when there is a runtime (off the
    /// runtime's thread: dropping it joins its poll thread, up to 100 ms).
    fn retire_admin(&mut self) {
        if let Some(admin) = self.admin.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn_blocking(move || drop(admin));
                }
                Err(_) => drop(admin),
            }
        }
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
        let checked = self.check_unknown(producer, topics).await;
        self.retire_admin();
        checked
    }

    async fn check_unknown<'a>(
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
            match replicas(producer, &topic).await? {
                Some(replication) => {
                    self.warn_if_leader_alone(&topic, replication).await;
                    self.known.insert(topic);
                }
                None => missing.push(topic),
            }
        }
        if missing.is_empty() {
            return Ok(problems);
        }
        let Some(spec) = self.create else {
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
        let (replication, min_insync) = self.creation(producer, spec).await;
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|t| {
                let topic = NewTopic::new(
                    t,
                    spec.partitions,
                    TopicReplication::Fixed(spec.replication.unwrap_or(-1)),
                );
                match &min_insync {
                    Some(n) => topic.set("min.insync.replicas", n),
                    None => topic,
                }
            })
            .collect();
        let opts = creation_options();
        for r in self.admin()?.create_topics(&new, &opts).await? {
            match r {
                Ok(name) => {
                    tracing::info!(
                        topic = %name,
                        partitions = spec.partitions,
                        replication = replication.unwrap_or(-1),
                        min.insync.replicas = min_insync.as_deref().unwrap_or("broker default"),
                        "Created missing topic"
                    );
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

impl TopicCatalog {
    /// The topics among `topics` with partitions the metadata shows without a leader, asked at
    /// most every second per topic (a topic that cannot be asked counts as healthy: its events
    /// are sent, and the send timeout judges them).
    pub async fn dead_partitions<'a>(
        &mut self,
        producer: &PolledProducer<RelayContext>,
        topics: impl IntoIterator<Item = &'a str>,
    ) -> HashMap<String, DeadPartitions> {
        let mut dead = HashMap::new();
        for topic in topics.into_iter().collect::<HashSet<_>>() {
            let fresh = self
                .leaders
                .get(topic)
                .is_some_and(|l| l.at.elapsed() < LEADERS_EVERY);
            if !fresh {
                match leaders(producer, topic).await {
                    Ok(Some(l)) => {
                        self.leaders.insert(topic.to_owned(), l);
                    }
                    _ => {
                        self.leaders.remove(topic);
                    }
                }
            }
            if let Some(l) = self.leaders.get(topic) {
                if !l.leaderless.is_empty() {
                    dead.insert(
                        topic.to_owned(),
                        DeadPartitions {
                            count: l.count,
                            leaderless: l.leaderless.clone(),
                        },
                    );
                }
            }
        }
        dead
    }

    /// The partition count of `topic` as the metadata last read for
    /// [`TopicCatalog::dead_partitions`] said, if it was read.
    pub fn partition_count(&self, topic: &str) -> Option<i32> {
        self.leaders.get(topic).map(|l| l.count)
    }

    /// The number of partitions of the relay's records topic `name` ([`crate::records`]),
    /// creating it (compacted, [`crate::records::MIN_PARTITIONS`] or `buckets` partitions,
    /// whichever is more) when missing. The topic is the relay's own state, as Kafka Connect's
    /// offsets topic is the worker's: it is created whether or not the relay may create event
    /// topics (`--create-missing-topics`), with that flag's replication settings when given,
    /// else the broker's default replication factor and a majority of it in sync.
    ///
    /// # Errors
    /// `Err(Ok(why))` when the topic is missing and its creation was refused (no `CREATE`
    /// ACL); `Err(Err(e))` when the broker could not be asked.
    pub async fn records_topic(
        &mut self,
        producer: &PolledProducer<RelayContext>,
        name: &str,
        buckets: i16,
    ) -> Result<i32, Result<String, KafkaError>> {
        let found = self
            .find_or_create_records_topic(producer, name, buckets)
            .await;
        self.retire_admin();
        found
    }

    async fn find_or_create_records_topic(
        &mut self,
        producer: &PolledProducer<RelayContext>,
        name: &str,
        buckets: i16,
    ) -> Result<i32, Result<String, KafkaError>> {
        if let Some(n) = partitions(producer, name).await.map_err(Err)? {
            return Ok(n);
        }
        let spec = self.create.unwrap_or(TopicSpec {
            partitions: crate::records::MIN_PARTITIONS,
            replication: None,
            min_insync_replicas: None,
        });
        let (_, min_insync) = self.creation(producer, spec).await;
        let count = crate::records::MIN_PARTITIONS.max(i32::from(buckets));
        let mut topic = NewTopic::new(
            name,
            count,
            TopicReplication::Fixed(spec.replication.unwrap_or(-1)),
        )
        .set("cleanup.policy", "compact");
        if let Some(n) = &min_insync {
            topic = topic.set("min.insync.replicas", n);
        }
        let opts = creation_options();
        let created = self
            .admin()
            .map_err(Err)?
            .create_topics(&[topic], &opts)
            .await
            .map_err(Err)?;
        match created.into_iter().next() {
            Some(Ok(_)) => {
                tracing::info!(
                    topic = name,
                    partitions = count,
                    "Created the relay's records topic (compacted)"
                );
                Ok(count)
            }
            // Another relay (of another outbox, sharing the topic) created it a moment ago:
            // until the metadata shows its partitions, asked again like an outage.
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => partitions(producer, name)
                .await
                .map_err(Err)?
                .ok_or(Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                ))),
            Some(Err((_, code))) => Err(Ok(format!(
                "could not create the relay's records topic {name}: {code}; create it with cleanup.policy=compact and at least {count} partitions, or allow the relay to (CREATE on the topic)"
            ))),
            None => Err(Ok(format!("could not create the records topic {name}"))),
        }
    }

    /// Warns when `topic` (with `replication` replicas) takes writes its leader alone
    /// acknowledged: `min.insync.replicas` 1 with more than one replica, so an acknowledged
    /// event (the relay then deletes its row) can be lost with that one broker. Once per
    /// topic; a topic whose settings the relay may not read is not checked.
    async fn warn_if_leader_alone(&mut self, topic: &str, replication: usize) {
        if replication <= 1 {
            return;
        }
        let opts = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        let Ok(admin) = self.admin() else {
            return;
        };
        let Ok(results) = admin
            .describe_configs(&[ResourceSpecifier::Topic(topic)], &opts)
            .await
        else {
            return;
        };
        let min_insync = results
            .into_iter()
            .flatten()
            .filter_map(|r| r.get("min.insync.replicas")?.value.clone())
            .find_map(|v| v.parse::<i32>().ok());
        match min_insync {
            Some(n) if n <= 1 => tracing::warn!(
                topic,
                replication,
                min.insync.replicas = n,
                "Topic accepts writes acknowledged by its leader alone: an event the relay saw acknowledged (and deleted) can be lost with that broker; set its min.insync.replicas to {}",
                majority(i32::try_from(replication).unwrap_or(i32::MAX))
            ),
            Some(_) => {}
            None => tracing::debug!(topic, "Could not read the topic's min.insync.replicas"),
        }
    }

    /// The replication factor topics are created with (the flag's, else the broker's
    /// default) and their `min.insync.replicas` (the flag's, else a majority of it). Without
    /// the broker's default replication factor (not allowed to ask), the broker's own
    /// `min.insync.replicas` applies, unless the flag sets one.
    async fn creation(
        &mut self,
        producer: &PolledProducer<RelayContext>,
        spec: TopicSpec,
    ) -> (Option<i32>, Option<String>) {
        let replication = match spec.replication {
            Some(r) => Some(r),
            None => self.default_replication(producer).await,
        };
        let min_insync = spec
            .min_insync_replicas
            .or(replication.map(majority))
            .map(|n| n.to_string());
        (replication, min_insync)
    }

    /// The broker's `default.replication.factor` (asked once); `None` when it cannot be read
    /// (no DESCRIBE_CONFIGS on the cluster).
    async fn default_replication(
        &mut self,
        producer: &PolledProducer<RelayContext>,
    ) -> Option<i32> {
        if self.default_replication.is_none() {
            let broker = any_broker(producer).await?;
            let opts = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
            let results = self
                .admin()
                .ok()?
                .describe_configs(&[ResourceSpecifier::Broker(broker)], &opts)
                .await
                .ok()?;
            self.default_replication = results
                .into_iter()
                .flatten()
                .filter_map(|r| r.get("default.replication.factor")?.value.clone())
                .find_map(|v| v.parse().ok());
        }
        self.default_replication
    }
}

/// A topic creation's options: the broker's own wait bounded (10 s), and the request too. Left
/// at librdkafka's default (`socket.timeout.ms`, 60 s), a creation sent to a broker that has
/// stopped but is still listed in the metadata (the cluster forgets it only after its session
/// times out) held the relay that long, silent, before it could report an outage.
fn creation_options() -> AdminOptions {
    AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(15)))
}

/// `topic`'s partitions and those without a leader, `None` when the broker does not have it.
async fn leaders(
    producer: &PolledProducer<RelayContext>,
    topic: &str,
) -> Result<Option<Leaders>, KafkaError> {
    Ok(describe(producer, topic).await?.map(|t| Leaders {
        at: std::time::Instant::now(),
        count: t.count,
        leaderless: t.leaderless,
    }))
}
