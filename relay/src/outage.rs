//! Logging a failing dependency once per outage instead of once per retry.

use std::fmt::Display;
use std::time::Instant;

/// Tracks one dependency (database, broker) between a failure and the next success.
#[derive(Debug)]
pub struct Outage {
    what: &'static str,
    since: Option<Instant>,
    attempts: u64,
}

impl Outage {
    /// A tracker for the named dependency.
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            since: None,
            attempts: 0,
        }
    }

    /// Records a failure; logs only the first one of an outage.
    pub fn failed(&mut self, error: &dyn Display) {
        self.attempts += 1;
        if self.since.is_none() {
            self.since = Some(Instant::now());
            tracing::warn!(component = self.what, error = %error, "Operation failed; retrying with backoff until it recovers");
        }
    }

    /// Records a success; logs the end of an outage.
    pub fn recovered(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                component = self.what,
                outage_ms = since.elapsed().as_millis() as u64,
                failed_attempts = self.attempts,
                "Recovered"
            );
            self.attempts = 0;
        }
    }

    /// True during an outage.
    pub fn is_failing(&self) -> bool {
        self.since.is_some()
    }
}
