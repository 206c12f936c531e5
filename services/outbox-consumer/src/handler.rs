//! What a service plugs into the runtime: a [`Handler`] that applies one event inside the
//! runtime's transaction, and the [`HandlerError`]s it may fail with, each sorted into "retry
//! without moving the offset", "retry a few times, then dead-letter" or "dead-letter and move
//! on" ([`HandlerError::disposition`]).
//!
//! The errors and their dispositions live in `handler_error`, a leaf that the decoded event
//! ([`Event::payload_as`]) can name without importing this module.

use std::future::Future;

use sqlx::{PgConnection, PgPool};

use super::event::Event;

pub use super::handler_error::{Disposition, HandlerError};

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
