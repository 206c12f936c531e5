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
        // A TLS connection whose server (or the proxy in front of it) went away while it asked
        // for TLS: sqlx reads the closed socket as a protocol error, not an I/O one (seen while
        // PostgreSQL restarted behind a proxy, every request answered 500 instead of 503).
        sqlx::Error::Protocol(m) => m.starts_with("unexpected response from SSLRequest"),
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

    #[test]
    fn a_tls_handshake_cut_by_an_outage_is_retryable_other_protocol_errors_not() {
        let cut = sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into());
        assert!(is_retryable(&cut));
        let other = sqlx::Error::Protocol("unknown message type: 'x'".into());
        assert!(!is_retryable(&other));
    }
}
