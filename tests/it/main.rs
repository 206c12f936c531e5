//! End-to-end tests: real PostgreSQL, a real Kafka-protocol broker, relay processes, and an
//! independent client (kafka-python) checking what landed on the broker.

mod access;
mod audit;
mod business_metrics;
mod chaos;
mod claim_filter;
mod commit_order;
mod common;
mod consumer_runtime;
mod consumers;
mod deploy;
mod dlq_redrive;
mod exhaustion;
mod failover;
mod faults;
mod http_fuzz;
mod isolation;
mod lease_lock;
mod lone_sends;
mod marketplace;
mod observe;
mod openapi_fuzz;
mod operator_races;
mod order_flow;
mod parking;
mod payment_timeout;
mod pgbouncer;
mod relay_metrics;
mod retention;
mod reverse_flow;
mod roles;
mod secrets;
mod secured;
mod stream;
mod trace;
mod wire_formats;
