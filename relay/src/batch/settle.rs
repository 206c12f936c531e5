//! Settling a bucket from its records ([`crate::records`]) before anything is claimed: when a
//! relay takes the bucket (its previous owner may have committed a transaction it did not get
//! to mark), and after one of its own transactions ended without the relay knowing whether it
//! committed. The rows those transactions published are marked, not sent again.

use std::time::Duration;

use super::{BatchEnd, Batcher};
use crate::records::read_last;
use crate::store::Marked;

/// How long reading a record partition may take: its open transactions (another bucket's on
/// the same partition) must end first.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// Where a bucket's records are, for settling it.
#[derive(Debug, Clone)]
pub struct Settle {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// The user's librdkafka settings (their connection settings apply to the reader).
    pub extra: Vec<(String, String)>,
    /// The records topic.
    pub topic: String,
    /// The bucket's partition of it.
    pub partition: i32,
    /// The record keys of the bucket's producers (main and lone).
    pub keys: Vec<String>,
}

impl Batcher<'_> {
    /// Settles the bucket when it must be (see the module's documentation); nothing without
    /// records.
    pub(super) async fn settle_if_needed(&mut self) -> Result<(), BatchEnd> {
        // Both calls run: each clears its producer's flag.
        let main = self.publisher.take_uncertain();
        let lone = self.lone.take_uncertain();
        if main || lone {
            self.unsettled = true;
        }
        if !self.unsettled {
            return Ok(());
        }
        let Some(settle) = self.records.clone() else {
            self.unsettled = false;
            return Ok(());
        };
        // Every transaction of the bucket's ids is decided once its producers are initialised
        // (under the lease): committed ones have their records, aborted ones none.
        self.initialise(true).await?;
        let after = match self.store.record_offset(self.token).await {
            Ok(o) => o,
            Err(e) => return Err(self.db_failed(&e)),
        };
        let read = tokio::task::spawn_blocking(move || {
            read_last(
                &settle.brokers,
                &settle.extra,
                (&settle.topic, settle.partition),
                after,
                &settle.keys,
                SETTLE_DEADLINE,
            )
        })
        .await;
        let last = match read {
            Ok(Ok(last)) => last,
            Ok(Err(e)) => {
                self.metrics.set_healthy(false);
                self.kafka
                    .failed(&format_args!("reading the bucket's records: {e}"));
                return Err(BatchEnd::Backoff);
            }
            Err(e) => {
                self.kafka
                    .failed(&format_args!("reading the bucket's records: {e}"));
                return Err(BatchEnd::Backoff);
            }
        };
        if last.end > 0 && (after != Some(last.end - 1) || !last.ids.is_empty()) {
            match self
                .store
                .mark_published_clearing(self.token, &last.ids, &last.ids, Some(last.end - 1))
                .await
            {
                Ok(Marked::Deleted(n)) => {
                    if n > 0 {
                        self.metrics.settled.inc_by(n);
                        tracing::info!(
                            events = n,
                            "Marked the events a committed transaction of the bucket published without their rows being marked (from its record): not sent again"
                        );
                    }
                }
                Ok(Marked::LeaseLost) => return Err(BatchEnd::LeaseLost),
                Err(e) => return Err(self.db_failed(&e)),
            }
        }
        self.publisher.marked();
        self.lone.marked();
        self.unsettled = false;
        Ok(())
    }
}
