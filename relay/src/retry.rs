//! Waiting between attempts: the backoff the relay uses while a dependency is down, and a
//! sleep that a shutdown cuts short. A leaf module, so the relay's loop (`relay`) and the batch
//! (`batch`) share it without importing each other.

use std::time::Duration;

use backoff::ExponentialBackoff;
use tokio_util::sync::CancellationToken;

/// The relay's backoff between attempts when a dependency is down.
pub fn new_backoff() -> ExponentialBackoff {
    ExponentialBackoff {
        initial_interval: Duration::from_millis(100),
        max_interval: Duration::from_secs(10),
        multiplier: 2.0,
        randomization_factor: 0.2,
        max_elapsed_time: None,
        ..ExponentialBackoff::default()
    }
}

/// Sleeps unless `token` fires first; false when it fired.
pub async fn sleep_unless(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = token.cancelled() => false,
    }
}
