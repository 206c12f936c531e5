#![doc = include_str!("../README.md")]

pub mod db;
pub mod debezium;
pub mod metrics;
#[cfg(feature = "order-api")]
pub mod order_api;
pub mod process;
pub mod relay;
