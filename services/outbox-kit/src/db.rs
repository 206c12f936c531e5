//! Which database errors are worth sending again unchanged. One list for every service, so an
//! HTTP API's 503 and a consumer's retry agree on what "transient" means.

/// SQLSTATEs after which the same statement may simply be sent again.
pub const RETRYABLE_SQLSTATES: [&str; 3] = [
    "40001", // serialization_failure
    "40P01", // deadlock_detected
    "55P03", // lock_not_available
];

/// Whether `error` is transient: the database was unreachable or busy, or chose this
/// transaction as a serialization or deadlock victim. The same request may then succeed.
pub fn is_retryable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|c| RETRYABLE_SQLSTATES.contains(&c.as_ref())),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_and_io_failures_are_retryable_others_not() {
        assert!(is_retryable(&sqlx::Error::PoolTimedOut));
        assert!(is_retryable(&sqlx::Error::PoolClosed));
        assert!(!is_retryable(&sqlx::Error::RowNotFound));
    }
}
