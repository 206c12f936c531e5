//! Integration tests of the order service against a real PostgreSQL: the axum app runs
//! in-process on 127.0.0.1:0 and is driven over HTTP. Each test gets a fresh database, created
//! through the admin URL in `DATABASE_URL`.

mod auth;
mod callbacks;
mod channel;
mod compensation;
mod lifecycle;
mod migrations;
mod ops;
mod orders;
mod refund_kinds;
mod refund_lines;
mod refunds;
mod support;
mod validation;
