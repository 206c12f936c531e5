//! End-to-end tests: real PostgreSQL, a real Kafka-protocol broker, relay processes, and an
//! independent client (kafka-python) checking what landed on the broker.

mod common;
mod consumers;
mod deploy;
mod failover;
mod faults;
mod lease_lock;
mod observe;
mod order_flow;
mod poison;
mod stream;
