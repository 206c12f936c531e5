//! The claim floor: what keeps a parked aggregate's backlog from slowing every claim.
//!
//! While an event is parked or waits for a retry, the events of its aggregate behind it stay
//! in the outbox (in `id` order, for when it is sent) and, once everything around them is
//! published, they are the outbox's head. A claim walks the outbox in `id` order: without a
//! floor, every claim would read all of them before the first row it can send.
//!
//! So the relay keeps, per leadership term, a **floor**: an `id` at or below which every row
//! that exists or ever will is held back by a failure row it knows (the floor's `held` set),
//! or is gone. Claims start above it ([`crate::store::Store::claim_above`]); the failed events
//! at or below it that are due for a retry come from the failure table. The floor holds while
//! every failure row of its set exists: when one goes (a published retry, `redrive`,
//! `discard`), the rows it held may flow again and the next claim starts at the head, once.
//!
//! Raising the floor past an `id` needs two facts:
//! 1. **No row at or below it can still commit.** A transaction takes its transaction id before
//!    an outbox id (the insert trigger, migration `20260101000007`), and ids are handed out one
//!    at a time in time order (the id sequence's cache is 1, enforced). So once every
//!    transaction older than a transaction id taken *after* the `id` was seen committed has
//!    ended, nothing at or below it is left to commit. A claim notes such a **candidate** (the
//!    `id`, a new transaction id); a later claim whose snapshot's `xmin` is past that
//!    transaction id has seen every row at or below the candidate.
//! 2. **That later claim read up to the candidate and left nothing behind.** Its rows up to
//!    the candidate must all be published (its batch marked every row), and what it left out
//!    was held back by the failure rows of its own snapshot: those become the new floor's set.
//!
//! The floor trails the head by about one claim. A transaction that stays open (one that
//! wrote, so it has a transaction id) keeps `xmin` back and with it the floor: claims then read
//! from the last floor, as they did from the head before; they never skip a row they should
//! send.

use crate::store::{FloorQuery, FloorSeen};

/// A leadership term's claim floor (see the module's documentation).
#[derive(Debug, Default)]
pub struct ClaimFloor {
    /// In effect while every failure row of `held` exists.
    current: Option<Floor>,
    /// An `id` that may become the floor once `xid` is older than every running transaction.
    candidate: Option<Candidate>,
    /// Becomes the floor once the batch that found it marked every row it claimed.
    pending: Option<Floor>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Floor {
    id: i64,
    held: Vec<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    upto: i64,
    xid: i64,
}

impl ClaimFloor {
    /// Where the next claim starts.
    pub fn query(&self) -> FloorQuery<'_> {
        match &self.current {
            Some(f) => FloorQuery {
                id: Some(f.id),
                held: &f.held,
            },
            None => FloorQuery::default(),
        }
    }

    /// The floor in effect, if any.
    pub fn id(&self) -> Option<i64> {
        self.current.as_ref().map(|f| f.id)
    }

    /// Forgets everything (the claim is not floored: no failure rows, or too many).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// After a floored claim that saw `seen` and returned rows up to `last` (`None`: no rows);
    /// `full` when it stopped at its row or byte bound (rows past `last` were not read).
    /// Returns the `id` to note as a candidate, if one is wanted: the caller takes a new
    /// transaction id and passes both to [`ClaimFloor::noted`].
    pub fn claimed(&mut self, seen: &FloorSeen, last: Option<i64>, full: bool) -> Option<i64> {
        if !seen.applied {
            self.current = None;
        }
        self.pending = None;
        // How far this claim read: up to its last row when bounded, else everything.
        let read_upto = if full { last } else { Some(i64::MAX) };
        let floor = self.id().unwrap_or(i64::MIN);
        if let (Some(c), Some(read)) = (self.candidate, read_upto) {
            if seen.xmin > c.xid && read >= c.upto {
                self.candidate = None;
                if c.upto > floor {
                    self.pending = Some(Floor {
                        id: c.upto,
                        held: seen.failed.clone(),
                    });
                }
            }
        }
        if self.candidate.is_some() {
            return None;
        }
        // A candidate must be a row this claim saw committed.
        let upto = if full { last } else { seen.top }?;
        (upto > self.pending.as_ref().map_or(floor, |p| p.id)).then_some(upto)
    }

    /// Notes a candidate: `upto`, seen by the last claim, and a transaction id taken after it.
    pub fn noted(&mut self, upto: i64, xid: i64) {
        self.candidate = Some(Candidate { upto, xid });
    }

    /// After the batch: a pending floor takes effect if every claimed row was marked
    /// published (a row left unsent, or failed now with a failure row the floor's set does not
    /// have, would be below it).
    pub fn batch_ended(&mut self, every_row_marked: bool) {
        match self.pending.take() {
            Some(p) if every_row_marked => self.current = Some(p),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(applied: bool, top: Option<i64>, failed: &[i64], xmin: i64) -> FloorSeen {
        FloorSeen {
            applied,
            top,
            failed: failed.to_vec(),
            xmin,
        }
    }

    #[test]
    fn a_candidate_becomes_the_floor_once_older_transactions_ended_and_the_batch_is_marked() {
        let mut f = ClaimFloor::default();
        // First claim: no floor; rows up to 900, more left (full).
        assert_eq!(
            f.claimed(&seen(true, Some(2_000), &[5], 100), Some(900), true),
            Some(900)
        );
        f.noted(900, 120);
        f.batch_ended(true);
        assert_eq!(f.id(), None, "a candidate is not a floor");
        // Second claim: a transaction older than 120 still runs: not yet.
        assert_eq!(
            f.claimed(&seen(true, Some(2_000), &[5], 110), Some(1_500), true),
            None
        );
        f.batch_ended(true);
        assert_eq!(f.id(), None);
        // Third: every older transaction ended and the claim read past 900; a row failed.
        assert_eq!(
            f.claimed(&seen(true, Some(2_500), &[5, 7], 130), Some(1_800), true),
            Some(1_800)
        );
        f.batch_ended(false);
        assert_eq!(f.id(), None, "not every row was marked");
        // The candidate was used up; the new one (1 800) takes its place.
        f.noted(1_800, 140);
        assert_eq!(
            f.claimed(&seen(true, Some(2_500), &[5, 7], 141), None, false),
            Some(2_500)
        );
        f.noted(2_500, 150);
        f.batch_ended(true);
        assert_eq!(f.id(), Some(1_800));
        assert_eq!(
            f.query().held,
            &[5, 7],
            "the set of the claim that found it"
        );
    }

    #[test]
    fn a_claim_that_stopped_short_of_the_candidate_does_not_raise_the_floor() {
        let mut f = ClaimFloor::default();
        f.claimed(&seen(true, Some(5_000), &[1], 10), Some(3_000), true);
        f.noted(3_000, 20);
        // Read only up to 2 000 (the byte bound): rows up to 3 000 were not all seen.
        assert_eq!(
            f.claimed(&seen(true, Some(5_000), &[1], 30), Some(2_000), true),
            None
        );
        f.batch_ended(true);
        assert_eq!(f.id(), None);
    }

    #[test]
    fn a_floor_whose_failure_row_went_is_dropped() {
        let mut f = ClaimFloor::default();
        f.claimed(&seen(true, Some(100), &[1], 10), None, false);
        f.noted(100, 20);
        f.claimed(&seen(true, Some(100), &[1], 30), None, false);
        f.batch_ended(true);
        assert_eq!(f.id(), Some(100));
        // The claim found a failure row of the set gone (it read from the head).
        f.claimed(&seen(false, Some(100), &[], 40), None, false);
        assert_eq!(f.id(), None);
        assert!(f.query().id.is_none());
    }

    #[test]
    fn an_empty_outbox_gives_no_candidate() {
        let mut f = ClaimFloor::default();
        assert_eq!(f.claimed(&seen(true, None, &[], 10), None, false), None);
    }
}
