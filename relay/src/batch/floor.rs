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
//!    the candidate must all be published (its batch marked every one of them), and what it
//!    left out was held back by a failure row of its own snapshot, one of the row's aggregate
//!    with a smaller `id` (the insert lock orders an aggregate's ids as its commits): the
//!    failure rows at or below the candidate become the new floor's set.
//!
//! Each candidate takes a transaction id, so one is noted at most every [`CANDIDATE_EVERY`]:
//! the floor trails the head by a second or two. A transaction that stays open (one that
//! wrote, so it has a transaction id) keeps `xmin` back and with it the floor: claims then read
//! from the last floor, as they did from the head before; they never skip a row they should
//! send. Each floored claim also checks the premises (the trigger, enabled; the sequence's
//! cache of 1): without them it reads from the head and the floor is forgotten.

use std::time::{Duration, Instant};

use crate::store::{FloorQuery, FloorSeen};

/// Shortest time between two candidates: each takes a transaction id (and writes a commit
/// record), so not one per claim; the floor then trails the head by about this much.
pub const CANDIDATE_EVERY: Duration = Duration::from_secs(1);

/// A leadership term's claim floor (see the module's documentation).
#[derive(Debug, Default)]
pub struct ClaimFloor {
    /// In effect while every failure row of `held` exists.
    current: Option<Floor>,
    /// An `id` that may become the floor once `xid` is older than every running transaction.
    candidate: Option<Candidate>,
    /// Becomes the floor once the batch that found it marked every row it claimed up to it.
    pending: Option<Floor>,
    /// When the last candidate was noted.
    noted_at: Option<Instant>,
    /// [`CANDIDATE_EVERY`] (zero in the unit tests).
    candidate_every: Duration,
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
    /// No floor yet; candidates at most every `candidate_every`.
    pub fn new(candidate_every: Duration) -> Self {
        Self {
            candidate_every,
            ..Self::default()
        }
    }

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

    /// Forgets the floor and its candidates (the claim is not floored: no failure rows, too
    /// many, or the floor's premises do not hold).
    pub fn reset(&mut self) {
        self.current = None;
        self.candidate = None;
        self.pending = None;
    }

    /// After a floored claim that saw `seen` and returned rows up to `last` (`None`: no rows);
    /// `full` when it stopped at its row or byte bound (rows past `last` were not read).
    /// Returns the `id` to note as a candidate, if one is wanted: the caller takes a new
    /// transaction id and passes both to [`ClaimFloor::noted`].
    pub fn claimed(&mut self, seen: &FloorSeen, last: Option<i64>, full: bool) -> Option<i64> {
        if !seen.sound {
            self.reset();
            return None;
        }
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
                    // What this claim left out at or below the candidate was held back by a
                    // failure of its aggregate with a smaller id (the insert lock orders an
                    // aggregate's ids as its commits): the floor holds while those exist.
                    self.pending = Some(Floor {
                        id: c.upto,
                        held: seen
                            .failed
                            .iter()
                            .copied()
                            .filter(|&f| f <= c.upto)
                            .collect(),
                    });
                }
            }
        }
        let due = self
            .noted_at
            .is_none_or(|t| t.elapsed() >= self.candidate_every);
        if self.candidate.is_some() || !due {
            return None;
        }
        // A candidate must be a row this claim saw committed.
        let upto = if full { last } else { seen.top }?;
        (upto > self.pending.as_ref().map_or(floor, |p| p.id)).then_some(upto)
    }

    /// Notes a candidate: `upto`, seen by the last claim, and a transaction id taken after it.
    pub fn noted(&mut self, upto: i64, xid: i64) {
        self.candidate = Some(Candidate { upto, xid });
        self.noted_at = Some(Instant::now());
    }

    /// After the batch, given the lowest claimed `id` it did not mark published (`None`: it
    /// marked every row): a pending floor takes effect if every claimed row at or below it was
    /// marked (a row left unsent, or failed now with a failure row the floor's set does not
    /// have, would be below it).
    pub fn batch_ended(&mut self, lowest_unmarked: Option<i64>) {
        match self.pending.take() {
            Some(p) if lowest_unmarked.is_none_or(|u| u > p.id) => self.current = Some(p),
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
            sound: true,
        }
    }

    #[test]
    fn a_candidate_becomes_the_floor_once_older_transactions_ended_and_the_batch_is_marked() {
        let mut f = ClaimFloor::new(Duration::ZERO);
        // First claim: no floor; rows up to 900, more left (full).
        assert_eq!(
            f.claimed(&seen(true, Some(2_000), &[5], 100), Some(900), true),
            Some(900)
        );
        f.noted(900, 120);
        f.batch_ended(None);
        assert_eq!(f.id(), None, "a candidate is not a floor");
        // Second claim: a transaction older than 120 still runs: not yet.
        assert_eq!(
            f.claimed(&seen(true, Some(2_000), &[5], 110), Some(1_500), true),
            None
        );
        f.batch_ended(None);
        assert_eq!(f.id(), None);
        // Third: every older transaction ended and the claim read past 900; a row failed.
        assert_eq!(
            f.claimed(&seen(true, Some(2_500), &[5, 7], 130), Some(1_800), true),
            Some(1_800)
        );
        f.batch_ended(Some(850));
        assert_eq!(f.id(), None, "a row below the candidate was not marked");
        // The candidate was used up; the new one (1 800) takes its place.
        f.noted(1_800, 140);
        assert_eq!(
            f.claimed(&seen(true, Some(2_500), &[5, 7], 141), None, false),
            Some(2_500)
        );
        f.noted(2_500, 150);
        // A row above the new floor failed: no matter.
        f.batch_ended(Some(1_900));
        assert_eq!(f.id(), Some(1_800));
        assert_eq!(
            f.query().held,
            &[5, 7],
            "the set of the claim that found it"
        );
    }

    #[test]
    fn a_claim_that_stopped_short_of_the_candidate_does_not_raise_the_floor() {
        let mut f = ClaimFloor::new(Duration::ZERO);
        f.claimed(&seen(true, Some(5_000), &[1], 10), Some(3_000), true);
        f.noted(3_000, 20);
        // Read only up to 2 000 (the byte bound): rows up to 3 000 were not all seen.
        assert_eq!(
            f.claimed(&seen(true, Some(5_000), &[1], 30), Some(2_000), true),
            None
        );
        f.batch_ended(None);
        assert_eq!(f.id(), None);
    }

    #[test]
    fn a_floor_whose_failure_row_went_is_dropped() {
        let mut f = ClaimFloor::new(Duration::ZERO);
        f.claimed(&seen(true, Some(100), &[1], 10), None, false);
        f.noted(100, 20);
        f.claimed(&seen(true, Some(100), &[1], 30), None, false);
        f.batch_ended(None);
        assert_eq!(f.id(), Some(100));
        // The claim found a failure row of the set gone (it read from the head).
        f.claimed(&seen(false, Some(100), &[], 40), None, false);
        assert_eq!(f.id(), None);
        assert!(f.query().id.is_none());
    }

    #[test]
    fn the_floors_set_is_the_failures_at_or_below_it() {
        let mut f = ClaimFloor::new(Duration::ZERO);
        f.claimed(&seen(true, Some(100), &[3], 10), None, false);
        f.noted(100, 20);
        f.claimed(&seen(true, Some(300), &[3, 150, 200], 30), None, false);
        f.batch_ended(None);
        assert_eq!(f.id(), Some(100));
        assert_eq!(
            f.query().held,
            &[3],
            "failures above the floor hold nothing below it"
        );
    }

    #[test]
    fn without_its_premises_there_is_no_floor() {
        let mut f = ClaimFloor::new(Duration::ZERO);
        f.claimed(&seen(true, Some(100), &[1], 10), None, false);
        f.noted(100, 20);
        f.claimed(&seen(true, Some(100), &[1], 30), None, false);
        f.batch_ended(None);
        assert_eq!(f.id(), Some(100));
        let unsound = FloorSeen {
            sound: false,
            ..seen(false, Some(100), &[1], 40)
        };
        assert_eq!(f.claimed(&unsound, None, false), None);
        assert_eq!(f.id(), None);
        f.batch_ended(None);
        assert_eq!(f.id(), None);
    }

    #[test]
    fn candidates_come_at_most_every_interval() {
        let mut f = ClaimFloor::new(Duration::from_secs(3_600));
        assert_eq!(
            f.claimed(&seen(true, Some(100), &[1], 10), None, false),
            Some(100)
        );
        f.noted(100, 20);
        // Adopted, and a new candidate would be wanted, but not within the hour.
        assert_eq!(
            f.claimed(&seen(true, Some(200), &[1], 30), None, false),
            None
        );
        f.batch_ended(None);
        assert_eq!(f.id(), Some(100));
    }

    #[test]
    fn an_empty_outbox_gives_no_candidate() {
        let mut f = ClaimFloor::new(Duration::ZERO);
        assert_eq!(f.claimed(&seen(true, None, &[], 10), None, false), None);
    }
}
