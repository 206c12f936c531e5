//! What a service plugs into the runtime: a [`Handler`] that applies one event inside the
//! runtime's transaction, and the [`HandlerError`]s it may fail with, each sorted into "retry
//! without moving the offset", "retry a few times, then dead-letter" or "dead-letter and move
//! on" ([`HandlerError::disposition`]).

use std::future::Future;

use sqlx::{PgConnection, PgPool};

use super::event::Event;

/// What applying an event did. Both commit the inbox row; the difference is only counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Business rows changed.
    Changed,
    /// Nothing to change: a business key or state check found the intent already applied (the
    /// same business event under a new event id), or the event does not apply to the current
    /// state.
    Unchanged,
}

/// A service's event handling.
pub trait Handler: Send + Sync + 'static {
    /// The versions of `event_type` this handler applies, or `None` for event types it does
    /// not care about (their offsets move on without an inbox row or a transaction). An event
    /// of a handled type in another version goes to the dead-letter topic.
    fn versions(&self, event_type: &str) -> Option<&'static [u32]>;

    /// Runs before the transaction of [`Handler::handle`], for an effect outside the database
    /// (a call to another system) that must not hold a pooled connection inside a transaction
    /// while it waits: record the intent, make the call, record the answer, each in its own
    /// short statement on `pool`; `handle` then reads the answer in the transaction. It runs
    /// again on every attempt and for redelivered events (before the inbox is consulted), so
    /// it must be idempotent: look for a recorded answer first, and call only a system that
    /// absorbs a repeated call. Its errors are handled as those of `handle`. Does nothing by
    /// default.
    ///
    /// # Errors
    /// A [`HandlerError`]; its [`HandlerError::disposition`] decides what happens next.
    fn prepare<'a>(
        &'a self,
        pool: &'a PgPool,
        event: &'a Event,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a {
        let _ = (pool, event);
        std::future::ready(Ok(()))
    }

    /// Applies one event. Runs inside the transaction that already inserted the event's inbox
    /// row; the runtime commits both together when this returns `Ok`, and rolls both back
    /// otherwise. Write business rows and outbox events through `conn` only.
    ///
    /// # Errors
    /// A [`HandlerError`]; its [`HandlerError::disposition`] decides what happens next.
    fn handle<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        event: &'a Event,
    ) -> impl Future<Output = Result<Effect, HandlerError>> + Send + 'a;

    /// Called after the transaction of [`Handler::handle`] committed, with what it returned:
    /// the place to count outcomes, which must not be counted for a transaction that rolled
    /// back. Not called for duplicates.
    fn committed(&self, event: &Event, effect: Effect) {
        let _ = (event, effect);
    }
}

/// Why a handler could not apply an event.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The payload does not have the shape of its event type and version: dead-lettered.
    #[error("payload does not match the event type")]
    Payload(#[source] serde_json::Error),
    /// The event contradicts the consumer's state in a way no retry can fix: dead-lettered.
    #[error("cannot apply the event: {0}")]
    Unapplicable(String),
    /// A database statement failed: retried, unless the database refused the effect itself
    /// (integrity or data exception), which no retry can fix.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// Writing an outbox event failed.
    #[error("outbox write failed")]
    Outbox(#[from] outbox_writer::OutboxError),
    /// Something else that may work later (a dependency is down): retried.
    #[error("transient failure: {0}")]
    Transient(String),
    /// The consumer's own rows are in a state this code cannot read (an unknown enum value, a
    /// row that should exist and does not): retried a few times in case it is a race, then
    /// dead-lettered.
    #[error("inconsistent state: {0}")]
    Inconsistent(String),
}

/// What the runtime does after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// An infrastructure problem (connection lost, pool timeout, deadlock, serialization
    /// failure): roll back, wait (backoff), try the same message again, for as long as it
    /// takes; the offset stays.
    Retry,
    /// A problem that almost certainly comes back on every attempt but might be a race (a row
    /// not found, a value that does not decode, a handler panic): roll back and retry with
    /// backoff up to the configured number of attempts (`--max-attempts-deterministic`), then
    /// dead-letter and move on.
    RetryThenDeadLetter,
    /// The message itself can never be applied: roll back, send it to the dead-letter topic,
    /// move on.
    DeadLetter,
}

/// SQLSTATE classes after which the same transaction can never succeed for this event:
/// `22` data exception (e.g. a value out of range), `23` integrity constraint violation (a
/// CHECK, unique or foreign key refused the effect).
const DETERMINISTIC_SQLSTATE_CLASSES: [&str; 2] = ["22", "23"];

impl HandlerError {
    /// Retry, retry a few times then dead-letter, or dead-letter at once.
    ///
    /// Database errors dead-letter at once only for the SQLSTATE classes the event itself
    /// causes. Errors of reading results (a row not found, a column or value that does not
    /// decode, an unknown type) are the same on every attempt, so they are retried a bounded
    /// number of times and then dead-lettered instead of holding the partition forever.
    /// Anything else (connection loss, pool timeout, serialization failure, deadlock,
    /// shutdown, even a missing table) is retried for as long as it takes, so a database
    /// problem stops the partition instead of discarding its events.
    pub fn disposition(&self) -> Disposition {
        let db = match self {
            Self::Payload(_) | Self::Unapplicable(_) => return Disposition::DeadLetter,
            Self::Outbox(outbox_writer::OutboxError::Invalid(_)) => return Disposition::DeadLetter,
            Self::Transient(_) => return Disposition::Retry,
            Self::Inconsistent(_) => return Disposition::RetryThenDeadLetter,
            Self::Database(e) | Self::Outbox(outbox_writer::OutboxError::Database(e)) => e,
        };
        match db {
            sqlx::Error::Database(e) => {
                let deterministic = e.code().is_some_and(|c| {
                    DETERMINISTIC_SQLSTATE_CLASSES
                        .iter()
                        .any(|class| c.starts_with(class))
                });
                if deterministic {
                    Disposition::DeadLetter
                } else {
                    Disposition::Retry
                }
            }
            sqlx::Error::RowNotFound
            | sqlx::Error::TypeNotFound { .. }
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::ColumnIndexOutOfBounds { .. }
            | sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::Decode(_)
            | sqlx::Error::Encode(_) => Disposition::RetryThenDeadLetter,
            _ => Disposition::Retry,
        }
    }

    /// The error with its sources, for logs and the `dlq.error` header.
    pub fn describe(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let part = s.to_string();
            // Some errors repeat their source's text (sqlx's database errors do).
            if !text.contains(&part) {
                text.push_str(": ");
                text.push_str(&part);
            }
            source = s.source();
        }
        if let Self::Database(sqlx::Error::Database(e))
        | Self::Outbox(outbox_writer::OutboxError::Database(sqlx::Error::Database(e))) = self
        {
            if let Some(code) = e.code() {
                text.push_str(&format!(" (SQLSTATE {code}"));
                if let Some(c) = e.constraint() {
                    text.push_str(&format!(", constraint {c}"));
                }
                text.push(')');
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_problems_dead_letter_and_infrastructure_problems_retry() {
        let bad_json = serde_json::from_str::<u32>("x").unwrap_err();
        assert_eq!(
            HandlerError::Payload(bad_json).disposition(),
            Disposition::DeadLetter
        );
        assert_eq!(
            HandlerError::Unapplicable("shipped after release".into()).disposition(),
            Disposition::DeadLetter
        );
        assert_eq!(
            HandlerError::Outbox(outbox_writer::OutboxError::Invalid("aggregate_id is empty"))
                .disposition(),
            Disposition::DeadLetter
        );
        assert_eq!(
            HandlerError::Transient("warehouse API down".into()).disposition(),
            Disposition::Retry
        );
        for e in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::Io(std::io::Error::other("reset")),
        ] {
            assert_eq!(HandlerError::Database(e).disposition(), Disposition::Retry);
        }
    }

    /// Changed on purpose: `RowNotFound` used to be retried forever, which held its partition
    /// for good; it now dead-letters after the bounded attempts, like every error of reading
    /// results that comes back the same on each attempt.
    #[test]
    fn errors_that_come_back_on_every_attempt_dead_letter_after_bounded_retries() {
        let decode =
            || -> Box<dyn std::error::Error + Send + Sync> { "unknown status `LOST`".into() };
        for e in [
            sqlx::Error::RowNotFound,
            sqlx::Error::Decode(decode()),
            sqlx::Error::ColumnDecode {
                index: "status".into(),
                source: decode(),
            },
            sqlx::Error::TypeNotFound {
                type_name: "mood".into(),
            },
            sqlx::Error::ColumnNotFound("status".into()),
        ] {
            let shown = format!("{e:?}");
            assert_eq!(
                HandlerError::Database(e).disposition(),
                Disposition::RetryThenDeadLetter,
                "{shown}"
            );
        }
        assert_eq!(
            HandlerError::Inconsistent("reservation without lines".into()).disposition(),
            Disposition::RetryThenDeadLetter
        );
    }

    #[test]
    fn describe_keeps_the_sources() {
        let e = HandlerError::Payload(serde_json::from_str::<u32>("x").unwrap_err());
        let text = e.describe();
        assert!(
            text.starts_with("payload does not match the event type: "),
            "{text}"
        );
        assert!(text.contains("expected value"), "{text}");
    }
}
