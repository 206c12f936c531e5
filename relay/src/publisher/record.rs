//! A transactional publisher's bucket record ([`crate::records`]): the ids its transactions
//! committed since the bucket's rows were last marked, written as the last message of each
//! transaction, and whether a transaction ended without the relay knowing how.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::records::{Ids, RecordSink};

use super::session::Publisher;

/// The record state of one publisher (kept across its producer sessions).
#[derive(Debug)]
pub(super) struct Records {
    pub(super) sink: RecordSink,
    /// Ids committed since the bucket was last marked, and the last committed record's offset.
    committed: Mutex<(Vec<i64>, Option<i64>)>,
    /// A commit failed and the abort too: the transaction may have committed.
    uncertain: AtomicBool,
}

impl Records {
    pub(super) fn new(sink: RecordSink) -> Self {
        Self {
            sink,
            committed: Mutex::new((Vec::new(), None)),
            uncertain: AtomicBool::new(false),
        }
    }

    /// The value of the record of a transaction publishing `ids`: those and every id committed
    /// since the last mark (a relay settling from this record alone marks them all).
    pub(super) fn value(&self, ids: &[i64]) -> Vec<u8> {
        let committed = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        Ids::of(&[committed.0.as_slice(), ids].concat()).encode()
    }

    /// The transaction publishing `ids`, with its record at `offset`, committed.
    pub(super) fn committed(&self, ids: &[i64], offset: Option<i64>) {
        let mut committed = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        committed.0.extend_from_slice(ids);
        committed.1 = offset.or(committed.1);
    }

    /// The transaction may or may not have committed.
    pub(super) fn uncertain(&self) {
        self.uncertain.store(true, Ordering::Relaxed);
    }
}

impl Publisher {
    /// Writes a bucket record to `sink` at the end of each transaction (with transactions on;
    /// see [`crate::records`]).
    #[must_use]
    pub fn with_records(mut self, sink: RecordSink) -> Self {
        self.records = Some(Records::new(sink));
        self
    }

    /// The ids this publisher committed since [`Publisher::marked`], and the offset of its
    /// last committed record (`None`: nothing committed since).
    pub fn unmarked(&self) -> (Vec<i64>, Option<i64>) {
        match &self.records {
            Some(r) => r
                .committed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            None => (Vec::new(), None),
        }
    }

    /// Every committed id is marked (or settled): later records start afresh.
    pub fn marked(&self) {
        if let Some(r) = &self.records {
            *r.committed.lock().unwrap_or_else(|p| p.into_inner()) = (Vec::new(), None);
        }
    }

    /// True (once) after a transaction ended without the relay knowing whether it committed:
    /// the bucket must be settled from its records before anything is claimed again.
    pub fn take_uncertain(&self) -> bool {
        self.records
            .as_ref()
            .is_some_and(|r| r.uncertain.swap(false, Ordering::Relaxed))
    }
}
