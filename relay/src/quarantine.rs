//! Per-aggregate back-off for events that fail while others succeed (a message the broker or
//! librdkafka refuses, e.g. too large): the failing aggregate waits, with a growing delay,
//! while every other aggregate keeps flowing. One poison event must not freeze the relay.
//!
//! Only an aggregate is held, never a table or a partition: its later events stay behind the
//! failed one (order), everyone else's go on. When failures are not specific to a few
//! aggregates (every event of a batch failed), the relay backs off as a whole instead.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Most aggregates held at once; beyond that the failure is treated as global.
pub const MAX_HELD: usize = 1000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    until: Instant,
    failures: u32,
}

/// Aggregates whose events are held back, with their retry times.
#[derive(Debug)]
pub struct Quarantine {
    entries: HashMap<String, Entry>,
    base: Duration,
    max: Duration,
}

impl Default for Quarantine {
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(60))
    }
}

impl Quarantine {
    /// Delays start at `base` and double per consecutive failure up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            base,
            max,
        }
    }

    /// Holds `aggregate` back after a failure; returns the delay and how many consecutive
    /// failures it had. `None` when the quarantine is full (the caller backs off globally).
    pub fn hold(&mut self, aggregate: &str, now: Instant) -> Option<(Duration, u32)> {
        if !self.entries.contains_key(aggregate) && self.entries.len() >= MAX_HELD {
            return None;
        }
        let e = self.entries.entry(aggregate.to_owned()).or_insert(Entry {
            until: now,
            failures: 0,
        });
        e.failures = e.failures.saturating_add(1);
        let delay = self
            .base
            .saturating_mul(2u32.saturating_pow(e.failures.saturating_sub(1).min(16)))
            .min(self.max);
        e.until = now + delay;
        Some((delay, e.failures))
    }

    /// Forgets `aggregate` after one of its events was published.
    pub fn release(&mut self, aggregate: &str) {
        if !self.entries.is_empty() {
            self.entries.remove(aggregate);
        }
    }

    /// Aggregates to leave out of the next claim.
    pub fn held(&self, now: Instant) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| e.until > now)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Number of aggregates tracked (held or waiting for their retry to succeed).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_per_aggregate_and_reset_on_success() {
        let mut q = Quarantine::new(Duration::from_millis(100), Duration::from_millis(350));
        let t0 = Instant::now();
        assert_eq!(q.hold("a", t0), Some((Duration::from_millis(100), 1)));
        assert_eq!(q.hold("a", t0), Some((Duration::from_millis(200), 2)));
        assert_eq!(
            q.hold("a", t0),
            Some((Duration::from_millis(350), 3)),
            "capped"
        );
        assert_eq!(
            q.hold("b", t0),
            Some((Duration::from_millis(100), 1)),
            "independent"
        );
        assert_eq!(q.held(t0).len(), 2);
        assert_eq!(
            q.held(t0 + Duration::from_millis(150)),
            vec!["a".to_owned()]
        );
        q.release("a");
        assert_eq!(
            q.hold("a", t0),
            Some((Duration::from_millis(100), 1)),
            "success resets"
        );
    }

    #[test]
    fn a_full_quarantine_refuses_new_aggregates() {
        let mut q = Quarantine::default();
        let now = Instant::now();
        for i in 0..MAX_HELD {
            assert!(q.hold(&format!("a{i}"), now).is_some());
        }
        assert!(q.hold("one-more", now).is_none());
        assert!(
            q.hold("a1", now).is_some(),
            "known aggregates still count up"
        );
    }
}
