//! Waiting on a condition with a deadline: polls a check until it answers, never a sleep that
//! hopes. The tests of every crate wait with these ([`wait_for`] fails the test with what it
//! waited for); [`poll_until`] leaves the timeout to the caller.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How long [`poll_until`] waits between two checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Polls `check` until it returns `Some`; `None` once `timeout` has passed without.
pub async fn poll_until<T, F, Fut>(timeout: Duration, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_every(POLL_INTERVAL, timeout, check).await
}

/// [`poll_until`] checking every `interval` (a check that is costly, or a condition that needs
/// a quick answer).
pub async fn poll_every<T, F, Fut>(interval: Duration, timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Polls `check` until it returns `Some`, panicking with `what` after `timeout` (for tests).
///
/// # Panics
/// When `timeout` passes first.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_when_the_check_does_and_gives_up_at_the_deadline() {
        let mut n = 0;
        let got = poll_until(Duration::from_secs(1), || {
            n += 1;
            let v = (n == 3).then_some(n);
            async move { v }
        })
        .await;
        assert_eq!(got, Some(3));
        let never = poll_until(Duration::from_millis(120), || async { None::<()> }).await;
        assert_eq!(never, None);
    }
}
