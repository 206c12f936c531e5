//! Initialising a transactional producer under the lease.
//!
//! Kafka fences by "the latest `InitProducerId` of a `transactional.id` wins"; the lease
//! fences by "the highest epoch wins". A relay that re-initialises its producer session after
//! losing the lease (its session was replaced after a failed commit, and the batch it claimed
//! while it still led goes on) would fence the new leader's producer and commit its stale
//! batch: a `read_committed` reader would see an aggregate's older event after a newer one.
//!
//! So a session is initialised only inside a PostgreSQL transaction that first renews the
//! lease under this relay's epoch and keeps its row locked through `init_transactions`, and is
//! used only once that transaction committed ([`Store::hold_lease`]). A takeover updates the
//! same row, so it waits: if the commit succeeded, this relay's `InitProducerId` was handled
//! before it saw the answer, before the commit, before the new leader's epoch existed, before
//! the new leader's own `InitProducerId` (which fences this session). If the commit failed,
//! the session is destroyed unused; its `InitProducerId` may still reach the coordinator late
//! and fence the new leader's session, whose next commit then fails and whose batch is sent
//! again after it re-initialised under its own lease: nothing stale is ever committed.
//!
//! [`Store::hold_lease`]: crate::store::Store::hold_lease

use super::{BatchEnd, Batcher};

/// How much longer than the initialisation's own timeout PostgreSQL lets the lease row stay
/// locked: a relay that stops or is cut off mid-initialisation holds up a takeover that long.
const HOLD_SLACK: std::time::Duration = std::time::Duration::from_secs(5);

impl Batcher<'_> {
    /// Initialises the producers that need it (a transactional producer's new session), each
    /// under the lease: the main producer always, the lone producer only with `lone` (it sends
    /// only events retried alone, so a failure to initialise it must not stop the others'
    /// batches). Nothing to do without transactions.
    ///
    /// # Errors
    /// [`BatchEnd::LeaseLost`] when the lease is no longer this relay's; [`BatchEnd::Backoff`]
    /// when the database or the broker failed (the next batch tries again).
    pub(crate) async fn initialise(&mut self, lone: bool) -> Result<(), BatchEnd> {
        // A stranded lone producer moves the bucket on now, not at its next lone send (which
        // may never come, its event parked): a takeover would find the id stuck.
        let lone = lone || self.lone.id_stranded().is_some();
        // Before the bucket moves past its generation, this relay initialises (fences) the id
        // of that generation that is not stranded, if it has not yet: the previous holder's
        // session of it may hold a transaction (a batch claimed before it was deposed) that
        // only that initialisation fences, and no relay initialises an older generation.
        if self.publisher.id_stranded().is_some() || self.lone.id_stranded().is_some() {
            for which in [false, true] {
                if !self.producer(which).id_settled() {
                    self.initialise_one(which).await?;
                }
            }
        }
        self.initialise_one(false).await?;
        if lone {
            self.initialise_one(true).await?;
            // The lone producer's initialisation moved both to a new generation.
            self.initialise_one(false).await?;
        }
        Ok(())
    }

    async fn initialise_one(&mut self, lone: bool) -> Result<(), BatchEnd> {
        let producer = if lone { "lone" } else { "main" };
        if lone {
            // The lone producer's session is retired while it goes unused (see
            // `Batcher::retire_idle_lone`): a new one, initialised below like any.
            self.lone_used = std::time::Instant::now();
            if let Err(e) = self.lone.ensure_session() {
                tracing::error!(error = %e, producer, "Could not start a new Kafka producer session");
                return Err(BatchEnd::Backoff);
            }
        }
        let Some(timeout) = self.producer(lone).init_timeout() else {
            return Ok(());
        };
        let ttl = self.guard.ttl();
        // A stranded id moves to the next generation, recorded in the lease row under the
        // lease.
        let stranded = self.producer(lone).id_stranded();
        let (hold, generation) = match self
            .store
            .hold_lease(self.token, ttl, timeout + HOLD_SLACK, stranded)
            .await
        {
            Ok(Some(hold)) => hold,
            Ok(None) => return Err(self.not_held(producer)),
            Err(e) => return Err(self.db_failed(&e)),
        };
        if stranded.is_some_and(|g| generation > g) {
            tracing::warn!(
                generation,
                producer,
                "The bucket's producers move to a new generation of their transactional id: a transaction of the last one cannot end until a partition that died or refused writes is back"
            );
        }
        // Both producers of the lease move together: a relay taking the bucket over
        // initialises (and fences) both ids of the row's generation, so neither may go on
        // under an older one.
        for which in [lone, !lone] {
            if let Err(e) = self.producer_mut(which).use_generation(generation) {
                drop(hold);
                tracing::error!(error = %e, producer, "Could not start a new Kafka producer session");
                return Err(BatchEnd::Backoff);
            }
        }
        let initialising = std::time::Instant::now();
        if let Err(e) = self.producer(lone).fence().await {
            match self.commit_hold(hold).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(lease.epoch = self.token.epoch, producer, "The lease row no longer carries this relay's epoch after a failed producer initialisation"),
                Err(e) => tracing::warn!(error = %e, producer, "Could not renew the lease after a failed producer initialisation; the background renewal goes on"),
            }
            if self.producer(lone).init_refused(&e, initialising) {
                tracing::warn!(
                    generation,
                    producer,
                    "The coordinator has refused to initialise the transactional id for as long as a send may take: an earlier transaction of it holds a partition that cannot be written, so the id counts as stranded"
                );
            }
            // A session that cannot be initialised any more (a fatal or non-retriable error:
            // an authorisation refused, say) is replaced; a timeout is retried on it.
            let dead = self.producer(lone).is_fatal()
                || matches!(&e, rdkafka::error::KafkaError::Transaction(t) if t.is_fatal() || !t.is_retriable());
            if dead {
                self.replace(lone, producer);
            }
            self.metrics.set_healthy(false);
            self.kafka.failed(&format_args!(
                "initialising the {producer} transactional producer: {e}"
            ));
            return Err(BatchEnd::Backoff);
        }
        // The initialisation may have outlasted the lease's local trust: renew it once more
        // under the lock, and trust it from then on once the hold committed.
        match self.commit_hold(hold).await {
            Ok(true) => {
                self.producer(lone).confirm_initialised();
                Ok(())
            }
            Ok(false) => {
                self.replace(lone, producer);
                Err(self.not_held(producer))
            }
            Err(e) => {
                // Whether the initialisation came before a takeover cannot be known: the
                // session is never used.
                tracing::warn!(error = %e, producer, "Could not confirm the lease after initialising a Kafka producer; starting a new session instead");
                self.replace(lone, producer);
                Err(self.db_failed(&e))
            }
        }
    }

    /// Renews the lease once more under `hold` and commits it: the lease is trusted from the
    /// renewal on. False when the row no longer carries this relay's epoch (a defect: the
    /// hold keeps it locked); the hold is then rolled back.
    ///
    /// A hold whose initialisation failed is committed too: the lease was held throughout (a
    /// generation the hold moved on to is kept; no session used it yet). Rolled back, the
    /// renewals the hold kept the background renewal from making would be lost with it, and a
    /// relay whose initialisations keep failing (refused until a dead partition is back, say)
    /// would let its lease lapse and start its producers afresh every few seconds.
    async fn commit_hold(
        &self,
        mut hold: crate::store::session::Session,
    ) -> Result<bool, sqlx::Error> {
        let renewing = tokio::time::Instant::now();
        if !self
            .store
            .renew_in_hold(&mut hold, self.token, self.guard.ttl())
            .await?
        {
            return Ok(false);
        }
        hold.finish().await?;
        self.guard.renewed(renewing);
        Ok(true)
    }

    fn producer(&self, lone: bool) -> &crate::publisher::Publisher {
        if lone {
            self.lone
        } else {
            self.publisher
        }
    }

    fn producer_mut(&mut self, lone: bool) -> &mut crate::publisher::Publisher {
        if lone {
            &mut *self.lone
        } else {
            &mut *self.publisher
        }
    }

    /// Starts a new session of the producer (the old one is never used again).
    fn replace(&mut self, lone: bool, producer: &str) {
        if let Err(e) = self.producer_mut(lone).replace() {
            tracing::error!(error = %e, producer, "Could not start a new Kafka producer session");
        }
    }

    fn not_held(&self, producer: &str) -> BatchEnd {
        tracing::warn!(
            lease.epoch = self.token.epoch,
            producer,
            "The lease is no longer this relay's: its Kafka producer is not initialised"
        );
        BatchEnd::LeaseLost
    }
}
