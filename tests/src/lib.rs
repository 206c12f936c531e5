//! Harness for the end-to-end tests: real PostgreSQL, a real Kafka-protocol broker, the relay
//! binary in its own process, and an independent Kafka client (kafka-python) to check what
//! landed on the broker.
//!
//! Shared servers come from `DATABASE_URL` (an admin URL; each test creates its own database)
//! and `KAFKA_BROKERS` (each test uses its own topic prefix). Tests that restart a server start
//! a private one of their own ([`servers`]).

pub mod audit;
pub mod auth;
pub mod channel;
pub mod chaos;
pub mod db;
pub mod debezium;
pub mod fulfilment;
pub mod marketplace;
pub mod observe;
pub mod otlp;
pub mod pgbouncer;
pub mod proc;
pub mod proxy;
pub mod roles;
pub mod secured;
pub mod servers;
pub mod stream;
pub mod verify;

/// The workspace root.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Held by the tests whose verdict depends on having the machine's CPU to themselves more than
/// the others do (the poison-storm drain-rate ratio, the CI-sized chaos run with its recovery
/// deadlines), so that they do not run at the same time as each other: on two cores the chaos
/// run's dozen processes took the ratio from 0.84 to 0.66 within one test.
pub async fn cpu_heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// `KAFKA_BROKERS` of the shared broker.
pub fn kafka_brokers() -> String {
    std::env::var("KAFKA_BROKERS").expect(
        "KAFKA_BROKERS is not set: run the tests with `make test`, or start a broker with \
         `deploy/local/up.sh` and source its env.sh",
    )
}

/// A random topic prefix, so every test has its own topics on a shared broker.
pub fn unique_topic_prefix() -> String {
    format!("t{:08x}.outbox.event.", rand::random::<u32>())
}

pub use test_support::process::free_port;

pub use outbox_process::poll::{poll_until, wait_for};
