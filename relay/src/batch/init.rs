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
    /// under the lease; nothing to do without transactions.
    ///
    /// # Errors
    /// [`BatchEnd::LeaseLost`] when the lease is no longer this relay's; [`BatchEnd::Backoff`]
    /// when the database or the broker failed (the next batch tries again).
    pub(crate) async fn initialise(&mut self) -> Result<(), BatchEnd> {
        for lone in [false, true] {
            let publisher = if lone { &*self.lone } else { &*self.publisher };
            let Some(timeout) = publisher.init_timeout() else {
                continue;
            };
            let mut hold = match self
                .store
                .hold_lease(self.token, self.guard.ttl(), timeout + HOLD_SLACK)
                .await
            {
                Ok(Some(hold)) => hold,
                Ok(None) => {
                    tracing::warn!(
                        lease.epoch = self.token.epoch,
                        "The lease is no longer this relay's: its Kafka producer is not initialised"
                    );
                    return Err(BatchEnd::LeaseLost);
                }
                Err(e) => return Err(self.db_failed(&e)),
            };
            if let Err(e) = publisher.fence().await {
                drop(hold);
                self.metrics.set_healthy(false);
                self.kafka.failed(&format_args!(
                    "initialising the transactional producer: {e}"
                ));
                return Err(BatchEnd::Backoff);
            }
            // The initialisation may have outlasted the lease's local trust: renew it once more
            // under the lock, and trust it from then on once the hold committed.
            let renewing = tokio::time::Instant::now();
            let confirmed = match self
                .store
                .renew_in_hold(&mut hold, self.token, self.guard.ttl())
                .await
            {
                Ok(true) => hold.finish().await,
                Ok(false) => Err(sqlx::Error::RowNotFound),
                Err(e) => Err(e),
            };
            if confirmed.is_ok() {
                self.guard.renewed(renewing);
            }
            if let Err(e) = confirmed {
                // Whether the initialisation came before a takeover cannot be known: the
                // session is never used.
                tracing::warn!(error = %e, "Could not confirm the lease after initialising the Kafka producer; starting a new session instead");
                let publisher = if lone {
                    &mut *self.lone
                } else {
                    &mut *self.publisher
                };
                if let Err(e) = publisher.replace() {
                    tracing::error!(error = %e, "Could not start a new Kafka producer session");
                }
                return Err(self.db_failed(&e));
            }
        }
        Ok(())
    }
}
