//! The publisher and its producer session: creating the producer, the settings a publisher is
//! built with, and replacing the session (after a fatal error, withdrawn messages, or when the
//! lease changed hands) without anything of the old session being sent after the new one
//! starts.

use std::time::Duration;

use outbox_kafka::PolledProducer;
use outbox_writer::EventEnvelope;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::util::Timeout;

use super::settings::transactional_producer_config;
use super::transaction::Transactions;
use crate::kafka_context::{BrokerGauge, RelayContext};

/// What the relay adds to every message beyond the contract (shared DESIGN.md, "On the
/// broker").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireSettings {
    /// CloudEvents attributes (Kafka protocol binding, binary mode) with this `ce_source`; off
    /// when `None`.
    pub cloudevents_source: Option<String>,
}

/// The Kafka side of the relay.
pub struct Publisher {
    /// The producer session; `None` once retired while unused ([`Publisher::retire_session`])
    /// until [`Publisher::ensure_session`] starts a new one.
    pub(super) producer: Option<PolledProducer<RelayContext>>,
    pub(super) context: RelayContext,
    pub(super) generation: std::sync::atomic::AtomicU32,
    brokers: String,
    extra: Vec<(String, String)>,
    topic_prefix: String,
    broker_down: Option<BrokerGauge>,
    pub(super) wire: WireSettings,
    /// Spans are exported: each message with a writer's `traceparent` gets a PRODUCER span.
    pub(super) spans: bool,
    /// How long a batch may go without an acknowledgement while the cluster answers (see
    /// [`Publisher::with_send_timeout`]); unbounded when `None`.
    pub(super) send_timeout: Option<Duration>,
    /// A send outlived `send_timeout` and its messages were withdrawn: the producer's session
    /// must be replaced (withdrawn messages leave gaps in its sequence numbers).
    pub(super) spent: std::sync::atomic::AtomicBool,
    /// With `--transactions`: the id (of generation 0: see [`Publisher::use_generation`]), and
    /// the session's transactional state.
    pub(super) transactional: Option<(String, Transactions)>,
    /// With transactions: the bucket record each transaction ends with ([`crate::records`]).
    pub(super) records: Option<super::record::Records>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("topic_prefix", &self.topic_prefix)
            .finish()
    }
}

/// A producer of [`transactional_producer_config`] whose delivery reports go to `context`.
fn new_producer(
    brokers: &str,
    extra: &[(String, String)],
    transactional_id: Option<&str>,
    context: &RelayContext,
) -> Result<PolledProducer<RelayContext>, KafkaError> {
    PolledProducer::create(
        &transactional_producer_config(brokers, extra, transactional_id),
        context.clone(),
        "relay-producer",
    )
}

/// Lets a replaced (and purged) producer report what was purged, then tears it down (its
/// threads joined, librdkafka's destroy): on the blocking pool when there is a runtime, whose
/// one thread would otherwise stand still meanwhile, lease renewals included.
fn retire_producer(old: PolledProducer<RelayContext>) {
    let teardown = move || {
        let _ = old.flush(Timeout::After(Duration::from_millis(100)));
        drop(old);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn_blocking(teardown);
        }
        Err(_) => teardown(),
    }
}

impl Publisher {
    /// Creates the producer (no connection is made until the first message).
    ///
    /// # Errors
    /// Invalid librdkafka settings.
    pub fn new(
        brokers: &str,
        extra: &[(String, String)],
        topic_prefix: &str,
    ) -> Result<Self, KafkaError> {
        Self::reporting(brokers, extra, topic_prefix, None)
    }

    /// [`Publisher::new`] that keeps `broker_down` at 1 while librdkafka reports every broker
    /// unreachable, and at 0 otherwise (also across [`Publisher::replace`]); only between
    /// [`Publisher::set_leading`] `true` and `false`.
    ///
    /// # Errors
    /// Invalid librdkafka settings.
    pub fn reporting(
        brokers: &str,
        extra: &[(String, String)],
        topic_prefix: &str,
        broker_down: Option<prometheus::IntGauge>,
    ) -> Result<Self, KafkaError> {
        let broker_down = broker_down.map(BrokerGauge::new);
        let context = RelayContext::reporting_on(broker_down.clone(), false);
        let producer = new_producer(brokers, extra, None, &context)?;
        Ok(Self {
            producer: Some(producer),
            context,
            generation: Default::default(),
            brokers: brokers.to_owned(),
            extra: extra.to_vec(),
            topic_prefix: topic_prefix.to_owned(),
            broker_down,
            wire: WireSettings::default(),
            spans: outbox_trace::exporting(),
            send_timeout: None,
            spent: Default::default(),
            transactional: None,
            records: None,
        })
    }

    /// The publisher with a transactional producer of id `transactional_id`: each batch is
    /// one Kafka transaction, its rows published once it committed; a relay that initialises
    /// the same id fences this one at the broker (see `transaction`).
    ///
    /// # Errors
    /// Invalid librdkafka settings.
    pub fn with_transactions(mut self, transactional_id: &str) -> Result<Self, KafkaError> {
        let timeout = self.send_timeout.unwrap_or(Duration::from_secs(30));
        self.transactional = Some((transactional_id.to_owned(), Transactions::new(timeout)));
        self.replace()?;
        Ok(self)
    }

    /// With transactions, while the current session is not initialised yet: how long its
    /// `init_transactions` may take. `None` without transactions or once initialised.
    pub fn init_timeout(&self) -> Option<Duration> {
        self.transactional
            .as_ref()
            .filter(|(_, t)| !t.initialised())
            .map(|(_, t)| t.timeout())
    }

    /// With transactions: initialises the producer session now, fencing every earlier producer
    /// of the id (a deposed leader's open transaction is aborted at once, so `read_committed`
    /// readers do not wait for its timeout). Call it only while nothing can take the lease
    /// over (under [`crate::store::Store::hold_lease`]): batches never initialise a session
    /// themselves.
    ///
    /// # Errors
    /// The broker did not answer in time, or refused.
    pub async fn fence(&self) -> Result<(), KafkaError> {
        match &self.transactional {
            Some((_, t)) => match &self.producer {
                Some(producer) => t.fence(producer).await,
                // Initialised only after `ensure_session`: nothing to initialise.
                None => Err(KafkaError::Canceled),
            },
            None => Ok(()),
        }
    }

    /// With transactions: the generation whose `transactional.id` is stranded, if any: a
    /// transaction of it aborted after messages of it were withdrawn (a partition that died or
    /// refused writes mid-transaction). The coordinator finishes that abort only once the
    /// partition is back, and until then refuses to initialise the id: the next
    /// initialisation must move the lease's producers on to a new generation of their id
    /// (unless the lease already moved past it).
    pub fn id_stranded(&self) -> Option<i32> {
        self.transactional.as_ref().and_then(|(_, t)| t.stranded())
    }

    /// With transactions: whether the current generation's id was initialised at the broker
    /// by this relay ([`Publisher::fence`]), or is stranded; true without transactions. A
    /// bucket moves past a generation only once both its ids are: a session of the previous
    /// holder under an id this relay never initialised could otherwise still commit.
    pub fn id_settled(&self) -> bool {
        self.transactional
            .as_ref()
            .is_none_or(|(_, t)| t.fenced_current() || t.stranded() == Some(t.generation()))
    }

    /// With transactions: an initialisation ([`Publisher::fence`]) `started` then failed with
    /// `e`; true when the id counts as stranded from now on (refused as concurrent for as long
    /// as a send may take: an earlier holder's transaction that a dead partition keeps from
    /// ending).
    pub fn init_refused(&self, e: &KafkaError, started: std::time::Instant) -> bool {
        self.transactional
            .as_ref()
            .is_some_and(|(_, t)| t.refused_as_concurrent(e, started))
    }

    /// With transactions: sessions use generation `generation` of the `transactional.id` (the
    /// lease row's, read under the lease before every initialisation, so that a relay taking
    /// the bucket over initialises, and fences, the id its holder used); a new session starts
    /// when it changes. Nothing without transactions.
    ///
    /// # Errors
    /// Invalid librdkafka settings (as [`Publisher::replace`]).
    pub fn use_generation(&mut self, generation: i32) -> Result<(), KafkaError> {
        let Some((base, t)) = &self.transactional else {
            return Ok(());
        };
        if t.generation() == generation {
            return Ok(());
        }
        t.set_generation(generation);
        tracing::info!(transactional.id = %t.id(base), generation, "Kafka producer sessions move to a new generation of their transactional id");
        if self.producer.is_none() {
            // Retired: the next session is made with the new id.
            return Ok(());
        }
        self.replace()
    }

    /// With transactions: a transaction is committed only while `lease` is known to be held;
    /// one whose lease is no longer trusted is aborted instead. Broker fencing stops a deposed
    /// relay's session only when the next holder initialised the same id; a holder that moved
    /// the bucket to a new generation past an id it could not initialise (see `batch::init`)
    /// left that session unfenced, and a relay paused or cut off mid-batch could otherwise
    /// commit it when it comes back.
    pub fn commit_under(&mut self, lease: crate::lease::LeaseCheck) {
        if let Some((_, t)) = &mut self.transactional {
            t.commit_under(lease);
        }
    }

    /// The session's initialisation ([`Publisher::fence`]) was confirmed under the lease: its
    /// transactions may begin. Until then every send of the session is refused.
    pub fn confirm_initialised(&self) {
        if let Some((_, t)) = &self.transactional {
            t.confirm();
        }
    }

    /// Bounds each send: when no acknowledgement of a batch arrived for `timeout` and the
    /// cluster still answers a metadata request, the messages not acknowledged are withdrawn
    /// (purged) and fail as
    /// [`FailureClass::Unacknowledged`](crate::failure::FailureClass::Unacknowledged) of their
    /// own aggregates: a partition without a leader, or without enough in-sync replicas, which
    /// librdkafka would retry for as long as the relay waits (it never times a message out
    /// itself, see `settings`). While the cluster does not answer (an outage), the batch waits
    /// on. The producer is then replaced ([`Publisher::must_replace`]).
    #[must_use]
    pub fn with_send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = Some(timeout);
        self
    }

    /// The publisher with these additions to every message.
    #[must_use]
    pub fn with_wire(mut self, wire: WireSettings) -> Self {
        self.wire = wire;
        self
    }

    /// Drops everything queued or in flight and starts a new producer session (after a fatal
    /// error, or when the lease changed hands). The dropped rows stay unmarked and are sent
    /// again.
    ///
    /// # Errors
    /// Invalid librdkafka settings (they were valid when the first producer was made).
    pub fn replace(&mut self) -> Result<(), KafkaError> {
        // Nothing queued in the old session is sent after this: the new one resends from the
        // outbox, in order.
        self.purge_queued();
        let context =
            RelayContext::reporting_on(self.broker_down.clone(), self.context.broker_down());
        let id = self.transactional.as_ref().map(|(base, t)| t.id(base));
        let producer = new_producer(&self.brokers, &self.extra, id.as_deref(), &context)?;
        if let Some((_, t)) = &self.transactional {
            t.reset();
        }
        // The old producer's errors are not the new one's.
        self.context.retire();
        let old = self.producer.replace(producer);
        self.context = context;
        self.spent
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(old) = old {
            retire_producer(old);
        }
        Ok(())
    }

    /// Ends the producer session without starting another: its librdkafka threads, which wake
    /// at least once a second each, and its connections go. For a producer that may stay
    /// unused for long (the lone sends'). Its transactional state stays (the id's generation,
    /// whether this relay fenced it); the next session ([`Publisher::ensure_session`]) must be
    /// initialised under the lease like any new one.
    pub fn retire_session(&mut self) {
        let Some(old) = self.producer.take() else {
            return;
        };
        self.context.retire();
        if let Some((_, t)) = &self.transactional {
            t.reset();
        }
        old.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        retire_producer(old);
    }

    /// Whether a producer session exists (see [`Publisher::retire_session`]).
    pub fn has_session(&self) -> bool {
        self.producer.is_some()
    }

    /// Starts a producer session if there is none ([`Publisher::retire_session`]).
    ///
    /// # Errors
    /// As [`Publisher::replace`].
    pub fn ensure_session(&mut self) -> Result<(), KafkaError> {
        if self.producer.is_some() {
            return Ok(());
        }
        self.replace()
    }

    /// The topic of a row.
    pub fn topic_of(&self, row: &EventEnvelope) -> String {
        row.topic(&self.topic_prefix)
    }

    /// Whether this relay leads (reports the broker state on its gauge) or stands by.
    pub fn set_leading(&self, leading: bool) {
        self.context.set_leading(leading);
    }

    /// The producer's client context (broker state).
    pub fn context(&self) -> &RelayContext {
        &self.context
    }

    /// The underlying producer, for metadata queries; `None` while the session is retired
    /// ([`Publisher::retire_session`]).
    pub fn producer(&self) -> Option<&PolledProducer<RelayContext>> {
        self.producer.as_ref()
    }

    /// True once librdkafka raised a fatal error; the producer must be replaced.
    pub fn is_fatal(&self) -> bool {
        self.producer
            .as_ref()
            .is_some_and(|p| p.client().fatal_error().is_some())
    }

    /// True once the producer must be replaced: a fatal error, or messages withdrawn after
    /// the send timeout.
    pub fn must_replace(&self) -> bool {
        self.is_fatal() || self.spent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drops the messages still waiting in librdkafka's queue (not those in flight).
    pub(super) fn purge_waiting(&self) {
        if let Some(p) = &self.producer {
            p.purge(rdkafka::producer::PurgeConfig::default().queue());
        }
    }

    pub(super) fn purge_queued(&self) {
        if let Some(p) = &self.producer {
            p.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        }
    }

    /// Drops everything queued or in flight (shutdown, producer replacement). Their rows stay
    /// unmarked and are published again.
    pub fn purge(&self) {
        self.purge_queued();
        if let Some(p) = &self.producer {
            let _ = p.flush(Timeout::After(Duration::from_millis(100)));
        }
    }
}
