//! The flags every service with an HTTP API and its own database takes. Flatten
//! [`ServiceArgs`] into the service's `clap::Parser` and give `listen` its default there:
//! `#[command(mut_arg("listen", |a| a.default_value("127.0.0.1:8081").required(false)))]`.
//! It also carries the HTTP server's limits ([`super::HttpLimitArgs`]) and the weak-secret
//! check's development switch ([`outbox_process::secrets::SecretArgs`]).

use std::time::Duration;

/// When a service applies its migrations ([`ServiceArgs::migrations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Migrations {
    /// Apply them at start-up, then serve.
    #[default]
    Apply,
    /// Serve without applying them (they were applied by the migrator role).
    Skip,
    /// Apply them and exit.
    Only,
}

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

    /// When the service applies its migrations (the outbox's, the inbox's and its own):
    /// `apply` at start-up, then serve (the database role must own the schema); `skip`: serve
    /// without touching the schema (a least-privilege role, docs/src/security.md, "Least-privilege database
    /// roles"); `only`: apply them and exit (run as the migrator role, e.g. an init container).
    #[arg(long, env = "DATABASE_MIGRATIONS", value_enum, default_value_t = Migrations::Apply)]
    pub migrations: Migrations,

    /// How often the business state gauges (refunds and holds left open, money flagged for
    /// refund, ...) are read from the database, in milliseconds.
    #[arg(long, env = "STATE_METRICS_INTERVAL_MS", default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub state_metrics_interval_ms: u64,

    /// Timeouts, body limits and concurrency bounds of the HTTP server.
    #[command(flatten)]
    pub http: super::HttpLimitArgs,

    /// The development switch of the weak-secret check.
    #[command(flatten)]
    pub secrets: outbox_process::secrets::SecretArgs,
}

impl ServiceArgs {
    /// Refuses to start with a weak or published secret: the password in `DATABASE_URL` and
    /// `others` (the service's signing keys), unless `--allow-weak-secrets`
    /// ([`outbox_process::secrets`]).
    ///
    /// # Errors
    /// [`outbox_process::secrets::WeakSecrets`] naming each weak setting.
    pub fn check_secrets(
        &self,
        others: &[outbox_process::secrets::Secret<'_>],
    ) -> Result<(), outbox_process::secrets::WeakSecrets> {
        let mut all = vec![outbox_process::secrets::Secret::database_url(
            "DATABASE_URL (--database-url)",
            &self.database_url,
        )];
        all.extend(others.iter().cloned());
        self.secrets.check(&all)
    }

    /// The HTTP drain deadline on SIGTERM.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }
}
