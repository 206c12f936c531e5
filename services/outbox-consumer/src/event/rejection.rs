//! Why a message can never be applied ([`Rejection`]): the text and the short reason it goes to
//! the dead-letter topic with.

/// Why a message can never be applied. It goes to the dead-letter topic with this text in its
/// `dlq.error` header and [`Rejection::reason`] in `dlq.reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// A contract header is missing (`event_id`, `event_type`).
    #[error("missing header `{0}`")]
    MissingHeader(&'static str),
    /// A contract header is present but unusable (not UTF-8, not a UUID, not a number).
    #[error("invalid header `{name}`: {problem}")]
    InvalidHeader {
        /// The header.
        name: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The consumer applies this event type, but not in this version.
    #[error(
        "unknown version {version} of {event_type} (this consumer applies versions {supported:?})"
    )]
    UnknownVersion {
        /// The event type.
        event_type: String,
        /// The version the message carries.
        version: u32,
        /// The versions the consumer applies.
        supported: Vec<u32>,
    },
    /// The value is missing or not JSON.
    #[error("undecodable payload: {0}")]
    Undecodable(String),
    /// The handler refused the event for good (payload of the wrong shape, or an effect the
    /// database's constraints forbid).
    #[error("rejected by the handler: {0}")]
    Unapplicable(String),
    /// Every attempt failed with an error that comes back the same each time (a row not
    /// found, a value that does not decode), up to the bounded number of attempts.
    #[error("failed {attempts} attempts: {error}")]
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        error: String,
    },
    /// The handler panicked on every attempt, up to the bounded number of attempts.
    #[error("handler panicked on {attempts} attempts: {message}")]
    HandlerPanic {
        /// Attempts made.
        attempts: u32,
        /// The last panic's message.
        message: String,
    },
}

impl Rejection {
    /// Short machine-readable reason, used as a metric label and in the `dlq.reason` header.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingHeader(_) => "missing_header",
            Self::InvalidHeader { .. } => "invalid_header",
            Self::UnknownVersion { .. } => "unknown_version",
            Self::Undecodable(_) => "undecodable",
            Self::Unapplicable(_) => "unapplicable",
            Self::RetriesExhausted { .. } => "retries_exhausted",
            Self::HandlerPanic { .. } => "handler_panic",
        }
    }

    /// Every value of [`Rejection::reason`], to show the metric series from the start.
    pub const REASONS: [&'static str; 7] = [
        "missing_header",
        "invalid_header",
        "unknown_version",
        "undecodable",
        "unapplicable",
        "retries_exhausted",
        "handler_panic",
    ];
}
