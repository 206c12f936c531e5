//! The flags every service with an HTTP API and its own database takes. Flatten
//! [`ServiceArgs`] into the service's `clap::Parser` and give `listen` its default there:
//! `#[command(mut_arg("listen", |a| a.default_value("127.0.0.1:8081").required(false)))]`.

use std::time::Duration;

/// Listen address, database and HTTP drain deadline.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// Address of the HTTP API (`host:port`).
    #[arg(long, env = "LISTEN_ADDR")]
    pub listen: String,

    /// PostgreSQL connection URL of the service's database (its tables, inbox and outbox).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Most database connections (HTTP requests, and one per partition being applied by a
    /// consumer).
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub database_max_connections: u32,

    /// How long SIGTERM waits for HTTP requests in flight, in milliseconds.
    #[arg(long, env = "SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,
}

impl ServiceArgs {
    /// The HTTP drain deadline on SIGTERM.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }
}
