//! Phase `debezium` (opt-in): Debezium's Outbox Event Router (its PostgreSQL connector on a
//! Kafka Connect standalone worker, [`test_support::debezium`]) and the relay publishing the
//! same Debezium table, on the same database, broker and backlog, one after the other, with the
//! same message bytes (the relay installed by `outbox-relay debezium-install` from Debezium's own
//! properties; JsonConverter with schemas, Connect's default).
//!
//! 1. The worker starts (its slot exists), then is stopped (SIGSTOP); the backlog is inserted
//!    into the Debezium table; the relay's trigger copies each row into the outbox.
//! 2. Debezium drains: SIGCONT, until its topic holds the backlog. CPU: the worker's JVM, and
//!    the PostgreSQL server (its WAL sender decoding the WAL).
//! 3. The relay drains the copies (Debezium stopped again): from its start until its topic holds
//!    the backlog. CPU: the relay, and the PostgreSQL server.
//! 4. Latency at the offered load, the relay first (Debezium stopped), then Debezium (the relay
//!    stopped; Debezium first publishes what the relay's run wrote, then the measured events),
//!    each after a `VACUUM ANALYZE` of both tables and a checkpoint (a steady state):
//!    writers commit one row per transaction into the Debezium table on a fixed schedule, a
//!    consumer notes when each event id (the `id` header) arrives; commit → seen. CPU per event
//!    over the load as above.
//!
//! Peak RSS: `VmHWM` of the JVM and of the relay (the relay's from a fresh process per run).
//!
//! `phase` runs the steps, `load` the latency runs under the offered load and the CPU of each
//! publisher's own PostgreSQL backends; `figures` is what the phase is given and reports.

mod figures;
mod load;
mod phase;

pub use figures::{DebeziumFigures, DebeziumSpec, Side};
pub use phase::run;
