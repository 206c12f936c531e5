//! The SQL, in small functions that take `&mut PgConnection` so the caller decides the
//! transaction. Rows come back as plain structs; the service modules own the transactions and
//! the rules. All queries are checked at run time (no database at build time).

pub mod idempotency;
pub mod orders;
pub mod payments;
pub mod refunds;
pub mod skus;
