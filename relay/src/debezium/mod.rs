//! A Debezium-shaped outbox table, published as Debezium's Outbox Event Router publishes it
//! (`outbox-relay debezium-install`; docs: "Coming from Debezium").
//!
//! Teams coming from Debezium keep their table, their writers and their consumers. The relay is
//! configured by the properties Kafka Connect runs Debezium with (the worker's file and the
//! connector's, [`ConnectProperties`]): [`RouterConfig::from_connect`] reads what decides the
//! messages (the table, the router's `transforms.<name>.*` options, the key and value
//! converters, layered as Connect layers them) and refuses every
//! option it cannot reproduce, naming it. [`install_sql`] then turns that configuration and
//! the table's columns into one trigger on the table: each inserted row is copied, in the
//! writer's transaction, into the relay's `outbox` with the message already encoded as
//! Debezium's converters encode it (key and value bytes, the topic of `route.topic.replacement`,
//! the `id` header and the placed headers), and a row flag (`relay_headers = false`) that keeps
//! the relay's own headers off the message.
//!
//! So the relay's guarantees hold as they are (the copy goes through the outbox's insert lock:
//! per-aggregate order is commit order), and a writer that deletes its row right after
//! inserting it (Debezium's advice, Quarkus' `remove-after-insert`) loses nothing: the copy is
//! in the outbox already, in the same transaction.
//!
//! The command is `install`; the properties are read in `properties`, into the router's
//! configuration (`router`); `columns` maps the table's column types and `sql` generates the
//! trigger from both.

mod columns;
mod install;
mod properties;
mod router;
mod sql;

pub use columns::{table_columns, Column, ColumnKind};
pub use install::install;
pub use properties::{parse_properties, ConnectProperties};
pub use router::{Converter, HeaderPlacement, RouterConfig, EVENT_ROUTER};
pub use sql::{install_sql, trigger_name};
