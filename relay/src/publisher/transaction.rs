//! Kafka transactions of a publisher with `--transactions` on: each batch is one transaction,
//! and its rows count as published only once it committed.
//!
//! Every relay of one lease uses the same `transactional.id`. A new leader's
//! `init_transactions` bumps the id's producer epoch at the broker: the deposed leader's
//! producer is fenced (its open transaction is aborted, its later sends and commits fail), so
//! records it still had queued or in flight can never land after the new leader's, and
//! `read_committed` readers never see them.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;

use outbox_kafka::PolledProducer;

use crate::kafka_context::RelayContext;

/// The transactional state of one producer session.
#[derive(Debug)]
pub(super) struct Transactions {
    /// How long one `init_transactions`, commit or abort may take.
    timeout: Duration,
    /// `init_transactions` succeeded for the current producer session.
    initialised: AtomicBool,
    /// The generation of the `transactional.id` sessions are made with ([`Transactions::id`]).
    generation: AtomicI32,
    /// The generation whose id was stranded (-1: none): a transaction of it was aborted after
    /// messages of it were withdrawn (a partition that died or refused writes while the
    /// transaction held messages for it). The coordinator cannot finish that abort until the
    /// partition is back (its marker cannot be written), and until then refuses to initialise
    /// the id again. The next initialisation moves the lease on from that generation (see
    /// `batch::init`).
    stranded: AtomicI32,
    /// The last generation whose id this relay initialised at the broker (-1: none): every
    /// earlier session of that id, another relay's too, is fenced.
    fenced: AtomicI32,
    /// Since when the current id's initialisations have been refused because the coordinator
    /// is still ending an earlier transaction of it ([`Transactions::refused`]).
    refused_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// The lease transactions are committed under ([`Transactions::commit_under`]).
    lease: Option<crate::lease::LeaseCheck>,
}

/// How a batch's transaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ending {
    /// Committed: its acknowledged rows are published.
    Committed,
    /// Aborted (or never committed): none of its rows is published. The reason, and whether
    /// the producer session must be replaced (fenced, fatal).
    Aborted(String, bool),
    /// The commit failed and so did the abort: the coordinator may have committed it. The
    /// session must be replaced, and whether the rows were published is read from the bucket
    /// record once a new session is initialised (see [`crate::records`]).
    Unknown(String),
}

impl Transactions {
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            initialised: AtomicBool::new(false),
            generation: AtomicI32::new(0),
            stranded: AtomicI32::new(-1),
            fenced: AtomicI32::new(-1),
            refused_since: std::sync::Mutex::new(None),
            lease: None,
        }
    }

    /// The `transactional.id` of sessions of the current generation: `base` for generation 0
    /// (the id of relays without generations), else `<base>.g<generation>`.
    pub(super) fn id(&self, base: &str) -> String {
        match self.generation.load(Ordering::Relaxed) {
            0 => base.to_owned(),
            g => format!("{base}.g{g}"),
        }
    }

    /// The generation of the current id.
    pub(super) fn generation(&self) -> i32 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Sessions from now on use generation `g`.
    pub(super) fn set_generation(&self, g: i32) {
        self.generation.store(g, Ordering::Relaxed);
        *self.refused() = None;
    }

    fn refused(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.refused_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An initialisation of the current id, `started` then, failed with `e`. When the
    /// coordinator refused it because it is still ending an earlier transaction of the id
    /// (`CONCURRENT_TRANSACTIONS`, which librdkafka asks again until the call's timeout), and
    /// has refused them since the first such call started for as long as a send may take, that transaction is taken to hold a
    /// message for a partition without a leader (its marker cannot be written until the
    /// partition is back): the id is stranded ([`Transactions::strand`]) and true is returned.
    /// This is how a relay that took the bucket over learns what only the relay that left the
    /// transaction open could know. An abort of a transaction whose partitions all answer ends
    /// within a few round trips.
    pub(super) fn refused_as_concurrent(
        &self,
        e: &KafkaError,
        started: std::time::Instant,
    ) -> bool {
        if e.rdkafka_error_code() != Some(rdkafka::error::RDKafkaErrorCode::ConcurrentTransactions)
        {
            *self.refused() = None;
            return false;
        }
        let mut since = self.refused();
        let first = *since.get_or_insert(started);
        if first.elapsed() < self.timeout {
            return false;
        }
        *since = None;
        self.strand();
        true
    }

    /// The current id cannot be initialised until a dead partition is back (see `stranded`).
    pub(super) fn strand(&self) {
        self.stranded
            .store(self.generation.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The generation whose id is stranded, if any (see [`Transactions::strand`]).
    pub(super) fn stranded(&self) -> Option<i32> {
        Some(self.stranded.load(Ordering::Relaxed)).filter(|g| *g >= 0)
    }

    /// A new producer session starts uninitialised.
    pub(super) fn reset(&self) {
        self.initialised.store(false, Ordering::Relaxed);
    }

    /// True once `init_transactions` succeeded for the current session.
    pub(super) fn initialised(&self) -> bool {
        self.initialised.load(Ordering::Relaxed)
    }

    /// How long one `init_transactions`, commit or abort may take.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Begins a transaction on an initialised session. Never initialises one itself: a session
    /// is initialised only under the lease ([`crate::batch`], `init`), or a relay that lost
    /// the lease would fence the new leader's producer and commit its stale batch.
    ///
    /// # Errors
    /// The broker refused.
    pub(super) fn begin(&self, producer: &PolledProducer<RelayContext>) -> Result<(), KafkaError> {
        producer.begin_transaction()
    }

    /// `init_transactions` for this session: fences the producers that used the id before,
    /// aborting their open transaction.
    ///
    /// # Errors
    /// As [`Transactions::begin`].
    pub(super) async fn fence(
        &self,
        producer: &PolledProducer<RelayContext>,
    ) -> Result<(), KafkaError> {
        let shared = producer.shared();
        let timeout = self.timeout;
        let generation = self.generation();
        tokio::task::spawn_blocking(move || shared.init_transactions(timeout))
            .await
            .map_err(|_| KafkaError::Canceled)??;
        self.fenced.store(generation, Ordering::Relaxed);
        Ok(())
    }

    /// True once this relay initialised the current generation's id at the broker (whether or
    /// not that session is still in use): no earlier session of the id can commit any more.
    pub(super) fn fenced_current(&self) -> bool {
        self.fenced.load(Ordering::Relaxed) == self.generation()
    }

    /// The session's initialisation is confirmed (it happened under the lease): transactions
    /// may begin.
    pub(super) fn confirm(&self) {
        self.initialised.store(true, Ordering::Relaxed);
        self.stranded.store(-1, Ordering::Relaxed);
        *self.refused() = None;
    }

    /// Transactions commit only while `lease` is known to be held (see
    /// [`super::Publisher::commit_under`]).
    pub(super) fn commit_under(&mut self, lease: crate::lease::LeaseCheck) {
        self.lease = Some(lease);
    }

    /// Commits the open transaction, or aborts it when `abort` says why (or when the lease it
    /// commits under is no longer known to be held).
    pub(super) async fn end(
        &self,
        producer: &PolledProducer<RelayContext>,
        abort: Option<String>,
    ) -> Ending {
        let shared = producer.shared();
        let timeout = self.timeout;
        let abort = abort.or_else(|| {
            let lost = self.lease.as_ref().is_some_and(|l| !l.is_valid());
            lost.then(|| "the lease is no longer known to be held: not committed".to_owned())
        });
        let committed = match abort {
            Some(why) => Err(why),
            None => tokio::task::spawn_blocking({
                let shared = shared.clone();
                move || {
                    reports_served(&*shared, timeout);
                    shared.commit_transaction(timeout)
                }
            })
            .await
            .map_err(|_| "commit interrupted".to_owned())
            .and_then(|r| {
                r.map_err(|e| {
                    if is_fenced(&e) {
                        tracing::warn!("Fenced at the broker by a newer relay of the lease (it took over): this relay's batch is aborted, never published by it");
                    }
                    format!("transaction not committed: {e}")
                })
            }),
        };
        let Err(why) = committed else {
            return Ending::Committed;
        };
        let aborted = tokio::task::spawn_blocking(move || shared.abort_transaction(timeout))
            .await
            .map_err(|_| KafkaError::Canceled)
            .and_then(|r| r);
        match aborted {
            Ok(()) => Ending::Aborted(why, producer.client().fatal_error().is_some()),
            Err(e) => {
                // After a commit that got no answer (or one retried after another relay's
                // initialisation fenced this one), the coordinator may have committed: a new
                // session's initialisation waits for that commit to complete, or aborts the
                // transaction; the bucket record then says which.
                tracing::warn!(error = %e, reason = %why, "Could not abort the Kafka transaction after its commit failed; it may have committed: starting a new producer session and settling from the bucket record");
                Ending::Unknown(format!("{why}; abort failed: {e}"))
            }
        }
    }
}

/// Waits (up to `timeout`) until the producer's serving thread has let go of every delivery
/// report of the transaction, so that the commit starts at once.
///
/// Every message of the batch was acknowledged before the commit, but librdkafka counts a
/// message as outstanding until its report event is destroyed, just after the callback that
/// acknowledged it returns. rdkafka's `commit_transaction` first flushes, and when that finds
/// a message still counted, polls the producer's event queue itself for up to 100 ms: that
/// queue is the serving thread's, already empty, so the commit slept 100 ms, in about one
/// batch of ten under load (seen as commits of 2-9 ms or 103-104 ms, nothing between).
fn reports_served<C: rdkafka::producer::ProducerContext>(
    producer: &rdkafka::producer::BaseProducer<C>,
    timeout: Duration,
) {
    let deadline = std::time::Instant::now() + timeout;
    while producer.in_flight_count() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// True when `e` says another producer of the id fenced this one.
fn is_fenced(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_zero_is_the_id_of_relays_without_generations_and_later_ones_are_suffixed() {
        let t = Transactions::new(Duration::from_secs(1));
        assert_eq!(
            t.id("outbox-relay.db.default.l1.b3"),
            "outbox-relay.db.default.l1.b3"
        );
        t.set_generation(2);
        assert_eq!(
            t.id("outbox-relay.db.default"),
            "outbox-relay.db.default.g2"
        );
        assert_eq!(
            t.id("outbox-relay.db.default.lone"),
            "outbox-relay.db.default.lone.g2"
        );
    }

    #[test]
    fn an_id_refused_as_concurrent_for_as_long_as_a_send_may_take_is_stranded() {
        use rdkafka::error::RDKafkaErrorCode as C;
        let concurrent = KafkaError::Global(C::ConcurrentTransactions);
        let now = std::time::Instant::now();
        let t = Transactions::new(Duration::from_secs(30));
        t.set_generation(2);
        assert!(!t.refused_as_concurrent(&concurrent, now));
        assert_eq!(t.stranded(), None, "refused for less than a send may take");
        let long_ago = now - Duration::from_secs(40);
        assert!(!t.refused_as_concurrent(&KafkaError::Global(C::MessageTimedOut), long_ago));
        assert_eq!(t.stranded(), None, "other failures strand nothing");
        assert!(
            !t.refused_as_concurrent(&concurrent, now),
            "another failure in between starts the count again"
        );
        assert!(
            !t.refused_as_concurrent(&concurrent, long_ago),
            "the count runs from the first refused call's start"
        );
        let t = Transactions::new(Duration::from_secs(30));
        t.set_generation(2);
        assert!(
            t.refused_as_concurrent(&concurrent, long_ago),
            "one call refused for its whole timeout is enough"
        );
        assert_eq!(t.stranded(), Some(2));
    }

    #[test]
    fn a_stranded_id_stays_stranded_until_a_session_is_confirmed() {
        let t = Transactions::new(Duration::from_secs(1));
        t.set_generation(3);
        t.strand();
        t.reset();
        assert_eq!(
            t.stranded(),
            Some(3),
            "a new session alone does not unstrand the id"
        );
        t.confirm();
        assert_eq!(t.stranded(), None);
        assert!(t.initialised());
    }
}
