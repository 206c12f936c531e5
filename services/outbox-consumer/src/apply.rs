//! One attempt at applying an event ([`apply`]: inbox row and business effect in one
//! transaction) and the backoff between attempts ([`RetryPolicy`]).

use std::time::Duration;

use sqlx::PgPool;

use super::event::Event;
use super::handler::{Effect, Handler, HandlerError};
use crate::inbox::{self, Claim};

/// What a successful attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The inbox row and the handler's effect committed together.
    Effect(Effect),
    /// The inbox already had the event: nothing was applied, the duplicate was counted.
    Duplicate,
}

impl Applied {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Effect(Effect::Changed) => "applied",
            Self::Effect(Effect::Unchanged) => "unchanged",
            Self::Duplicate => "duplicate",
        }
    }
}

/// Applies `event` once: inserts its inbox row for `consumer_name` and runs the handler in the
/// same transaction, then commits; or, when the inbox has the event already, commits the
/// duplicate count and skips the handler. Any error rolls everything back. The handler's
/// [`Handler::prepare`] runs first, outside the transaction.
///
/// Only once this returned `Ok` may the message's offset be stored: the effect is durable.
/// A commit whose outcome is unknown (connection lost during `COMMIT`) is an error; the retry
/// then finds the inbox row if the commit did happen.
///
/// # Errors
/// The handler's error, or a [`HandlerError::Database`] for the inbox and transaction
/// statements.
pub async fn apply<H: Handler>(
    pool: &PgPool,
    consumer_name: &str,
    handler: &H,
    event: &Event,
) -> Result<Applied, HandlerError> {
    handler.prepare(pool, event).await?;
    let mut tx = pool.begin().await?;
    match inbox::claim(&mut tx, consumer_name, event.event_id()).await? {
        Claim::Duplicate => {
            tx.commit().await?;
            Ok(Applied::Duplicate)
        }
        Claim::New => {
            let effect = handler.handle(&mut tx, event).await?;
            tx.commit().await?;
            Ok(Applied::Effect(effect))
        }
    }
}

/// Exponential backoff with jitter between attempts at one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Wait after the first failure (before jitter).
    pub initial: Duration,
    /// Longest wait.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The nominal wait after `failures` consecutive failures (1 = the first): `initial`
    /// doubled each time, capped at `max`.
    pub fn nominal(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial
            .saturating_mul(1u32 << doublings)
            .min(self.max)
            .max(Duration::from_millis(1))
    }

    /// The wait after `failures` failures: between half and all of [`RetryPolicy::nominal`],
    /// so partitions failing together do not retry in lockstep. `unit` is a random number in
    /// `[0, 1)`.
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        let nominal = self.nominal(failures);
        nominal.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let waits: Vec<u128> = (1..=7).map(|n| p.nominal(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(p.nominal(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn jitter_stays_between_half_and_the_nominal_wait() {
        let p = RetryPolicy::default();
        for failures in 1..10 {
            let nominal = p.nominal(failures);
            assert_eq!(p.delay(failures, 0.0), nominal / 2);
            assert!(p.delay(failures, 0.999) <= nominal);
            assert!(p.delay(failures, 0.5) >= nominal / 2);
        }
    }
}
