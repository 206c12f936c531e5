//! Debezium in the harness: [`test_support::debezium`], shared with `relay-bench`.

pub use test_support::debezium::*;
