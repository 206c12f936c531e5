#![doc = include_str!("../README.md")]
//!
//! The skeleton of a consuming service (`wms-consumer`, `stock-consumer`): the flags they all
//! take ([`ConsumerServiceArgs`]) and one builder ([`ConsumerService`]) that migrates, serves
//! the HTTP API and consumes events until SIGTERM, or runs a `dlq` operator command and
//! returns. Each service names itself ([`ServiceIdentity`]) and hands over its migrations,
//! router (on [`ServiceState`]) and handler.
//!
//! A service that consumes beside a life of its own (`order-service`) takes the pieces instead:
//! its [`ServiceIdentity`] (runtime configuration, metrics), [`migrate`], [`run_dlq_command`]
//! and the [`ServiceError`]s they return.

use axum::extract::FromRef;
use axum::Router;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

use outbox_consumer::dlq_cli::ConsumerCommand;
use outbox_consumer::redrive::DlqError;
use outbox_consumer::{ConsumerArgs, ConsumerError, Handler, RuntimeConfig};
use outbox_http::service::{Operations, ServiceArgs};
use outbox_kafka::KafkaSecurityError;
use prometheus::{IntCounterVec, Registry};

/// The flags and environment variables every consuming service takes: [`ServiceArgs`], the
/// brokers, the consumer's settings and the `dlq` subcommand. Flatten it into the service's
/// `clap::Parser` and give `listen` its default there (see [`ServiceArgs`]).
#[derive(Debug, Clone, clap::Args)]
pub struct ConsumerServiceArgs {
    /// Listen address, database and drain deadline.
    #[command(flatten)]
    pub service: ServiceArgs,

    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub kafka_brokers: String,

    /// Bearer-token verification of the HTTP API (operator endpoints need
    /// `roles: ["operator"]`). A key is required to serve; `dlq` commands don't need one.
    #[command(flatten)]
    pub auth: outbox_http::auth::AuthArgs,

    /// Consumer settings.
    #[command(flatten)]
    pub consumer: ConsumerArgs,

    /// An operator command (`dlq list`, `dlq redrive`); without one, the service runs.
    #[command(subcommand)]
    pub command: Option<ConsumerCommand>,
}

/// Why a consuming service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// `DATABASE_URL` is not a valid PostgreSQL URL.
    #[error("invalid DATABASE_URL")]
    DatabaseUrl(#[source] sqlx::Error),
    /// The outbox, inbox or service migrations could not be applied.
    #[error("applying the outbox, inbox and {service} migrations")]
    Migrate {
        /// The service's name.
        service: &'static str,
        /// What failed.
        #[source]
        source: MigrateError,
    },
    /// The Kafka security settings are incomplete or contradict each other.
    #[error("Kafka security settings")]
    KafkaSecurity(#[from] KafkaSecurityError),
    /// A secret is weak or published (a placeholder) and `--allow-weak-secrets` is not set.
    #[error(transparent)]
    WeakSecrets(#[from] outbox_process::secrets::WeakSecrets),
    /// The bearer-token settings cannot verify tokens (no key, no issuer, ...).
    #[error("bearer-token configuration")]
    Auth(#[from] outbox_http::auth::AuthConfigError),
    /// The HTTP listener could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// The `--listen` address.
        addr: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A `dlq` operator command failed.
    #[error("dlq command failed")]
    Dlq(#[from] DlqError),
    /// The consumer runtime stopped on a fatal error.
    #[error("running the consumer")]
    Consumer(#[from] ConsumerError),
    /// Serving HTTP failed.
    #[error("serving HTTP")]
    Serve(#[source] std::io::Error),
    /// The HTTP server task panicked or was cancelled.
    #[error("HTTP server task")]
    Join(#[from] tokio::task::JoinError),
}

/// Who a consuming service is: what names its consumer group, metrics, inbox rows and topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceIdentity {
    /// The service's name (`wms-consumer`), also its consumer group unless `--group-id`.
    pub name: &'static str,
    /// The prefix of its metrics (`wms` gives `wms_http_requests_total`).
    pub metrics_prefix: &'static str,
    /// Its consumer's name (its inbox rows, its redrive topics, `dlq.consumer`).
    pub consumer_name: &'static str,
    /// The aggregate types whose topics (`<prefix><aggregate type>`) it consumes.
    pub aggregate_types: &'static [&'static str],
}

impl ServiceIdentity {
    /// The consumer runtime's configuration: the consumer flags `consumer`, reading from
    /// `brokers`.
    ///
    /// # Errors
    /// Incomplete or contradicting Kafka security settings.
    pub fn runtime_config(
        &self,
        consumer: &ConsumerArgs,
        brokers: &str,
    ) -> Result<RuntimeConfig, KafkaSecurityError> {
        consumer.runtime_config(self.consumer_name, brokers, self.name, self.aggregate_types)
    }

    /// The metrics every consuming service exposes ([`ConsumerServiceMetrics`]), in a
    /// registry of their own.
    ///
    /// # Panics
    /// When the names make an invalid metric name (a programming error: they are constants).
    pub fn metrics(&self) -> ConsumerServiceMetrics {
        ConsumerServiceMetrics::new(self.metrics_prefix, self.consumer_name)
    }
}

/// Applies the outbox and inbox migrations, then the service's own (`service`; set
/// `ignore_missing` on it: they share sqlx's bookkeeping table).
///
/// # Errors
/// When the database is unreachable or a migration fails.
pub async fn migrate(pool: &PgPool, service: Option<&Migrator>) -> Result<(), MigrateError> {
    outbox_writer::schema::migrate(pool).await?;
    outbox_writer::schema::migrate_inbox(pool).await?;
    match service {
        Some(m) => m.run(pool).await,
        None => Ok(()),
    }
}

/// Runs the `dlq` operator `command` on the dead letters of the consumer `runtime` describes,
/// writing to stdout; `dlq redrive` records what it sent in the service's database at
/// `database_url` (one connection).
///
/// # Errors
/// [`ServiceError::DatabaseUrl`] when the URL is invalid, [`ServiceError::Dlq`] when the
/// command fails.
pub async fn run_dlq_command(
    command: &ConsumerCommand,
    runtime: &RuntimeConfig,
    database_url: &str,
) -> Result<(), ServiceError> {
    let pool =
        outbox_http::service::connect_lazy(database_url, 1).map_err(ServiceError::DatabaseUrl)?;
    let ran =
        outbox_consumer::dlq_cli::run(command, runtime, &pool, &mut std::io::stdout().lock()).await;
    pool.close().await;
    Ok(ran?)
}

/// Builds the HTTP API from the pool and the process's metrics.
type RouterFn = Box<dyn FnOnce(PgPool, ConsumerServiceMetrics) -> Router + Send>;

/// Registers the state gauges in the process's registry.
type StateGaugesFn =
    Box<dyn FnOnce(&prometheus::Registry) -> outbox_http::service::StateGauges + Send>;

/// One consuming service: its name, consumer, migrations, HTTP API and event handler.
pub struct ConsumerService<H> {
    identity: ServiceIdentity,
    migrator: Option<Migrator>,
    router: Option<RouterFn>,
    state_gauges: Option<StateGaugesFn>,
    handler: Arc<H>,
}

impl<H> std::fmt::Debug for ConsumerService<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerService")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl<H: Handler> ConsumerService<H> {
    /// Service `name` (also the default consumer group), whose metrics start with
    /// `metrics_prefix` (`wms` gives `wms_http_requests_total`), running `handler` as consumer
    /// `consumer_name` on the topics of `aggregate_types` (its [`ServiceIdentity`]). Without
    /// [`Self::migrator`] only the outbox and inbox migrations run; without [`Self::router`]
    /// the API is empty.
    pub fn new(
        name: &'static str,
        metrics_prefix: &'static str,
        consumer_name: &'static str,
        aggregate_types: &'static [&'static str],
        handler: H,
    ) -> Self {
        Self {
            identity: ServiceIdentity {
                name,
                metrics_prefix,
                consumer_name,
                aggregate_types,
            },
            migrator: None,
            router: None,
            state_gauges: None,
            handler: Arc::new(handler),
        }
    }

    /// The service's own migrations, applied after the outbox's and the inbox's (set
    /// `ignore_missing`: they share sqlx's bookkeeping table).
    #[must_use]
    pub fn migrator(mut self, migrator: Migrator) -> Self {
        self.migrator = Some(migrator);
        self
    }

    /// The HTTP API, built from the pool and the process's metrics once both exist.
    #[must_use]
    pub fn router(
        mut self,
        router: impl FnOnce(PgPool, ConsumerServiceMetrics) -> Router + Send + 'static,
    ) -> Self {
        self.router = Some(Box::new(router));
        self
    }

    /// Gauges of the service's business state, registered in the process's registry and read
    /// every `--state-metrics-interval-ms` ([`outbox_http::service::StateGauges`]).
    #[must_use]
    pub fn state_gauges(
        mut self,
        gauges: impl FnOnce(&prometheus::Registry) -> outbox_http::service::StateGauges + Send + 'static,
    ) -> Self {
        self.state_gauges = Some(Box::new(gauges));
        self
    }

    /// The consumer runtime's configuration (default group: the service's name).
    ///
    /// # Errors
    /// Incomplete or contradicting Kafka security settings.
    pub fn runtime_config(
        &self,
        args: &ConsumerServiceArgs,
    ) -> Result<RuntimeConfig, KafkaSecurityError> {
        self.identity
            .runtime_config(&args.consumer, &args.kafka_brokers)
    }

    /// Runs the `dlq` command of `args` if there is one; otherwise migrates, then serves the
    /// HTTP API and consumes events until SIGTERM (or a fatal consumer error, which stops the
    /// HTTP server too).
    ///
    /// # Errors
    /// See [`ServiceError`]: invalid URL, failed migration, unbindable address, failed `dlq`
    /// command, fatal consumer or HTTP error.
    pub async fn run(self, args: ConsumerServiceArgs) -> Result<(), ServiceError> {
        let runtime = self.runtime_config(&args)?;
        let settings = &args.service;
        if let Some(command) = &args.command {
            return run_dlq_command(command, &runtime, &settings.database_url).await;
        }
        let only = settings.migrations == outbox_http::service::Migrations::Only;
        let mut secrets = vec![runtime.client_config.password_secret()];
        if !only {
            secrets.extend(args.auth.secrets());
        }
        settings.check_secrets(&secrets)?;
        let auth = if only {
            None
        } else {
            Some(args.auth.authenticator()?)
        };
        let pool = outbox_http::service::connect_lazy(
            &settings.database_url,
            settings.database_max_connections,
        )
        .map_err(ServiceError::DatabaseUrl)?;
        if settings.migrations != outbox_http::service::Migrations::Skip {
            migrate(&pool, self.migrator.as_ref())
                .await
                .map_err(|source| ServiceError::Migrate {
                    service: self.identity.name,
                    source,
                })?;
        }
        let Some(auth) = auth else {
            tracing::info!(
                service = self.identity.name,
                "Migrations applied (DATABASE_MIGRATIONS=only)"
            );
            pool.close().await;
            return Ok(());
        };
        let listener = outbox_http::service::bind(&settings.listen)
            .await
            .map_err(|source| ServiceError::Bind {
                addr: settings.listen.clone(),
                source,
            })?;
        let shutdown = outbox_http::service::shutdown_on_signal();
        let metrics = self.identity.metrics();
        let gauges = self.state_gauges.map(|g| {
            tokio::spawn(g(&metrics.registry).run(
                pool.clone(),
                Duration::from_millis(settings.state_metrics_interval_ms),
                shutdown.clone(),
            ))
        });
        let router = match self.router {
            Some(router) => router(pool.clone(), metrics.clone()),
            None => Router::new(),
        }
        .layer(axum::Extension(auth));
        let limits = settings.http.limits(&[]);
        let drain = settings.shutdown_timeout();
        let stop_http = shutdown.clone();
        let http = tokio::spawn(async move {
            outbox_http::service::serve_with_limits(listener, router, stop_http, drain, &limits)
                .await
        });
        let consumed = outbox_consumer::run(
            runtime,
            pool.clone(),
            self.handler,
            metrics.consumer.clone(),
            shutdown.clone(),
        )
        .await;
        // The consumer only returns early on a fatal error: stop serving too.
        shutdown.cancel();
        let served = http.await?;
        if let Some(gauges) = gauges {
            let _ = gauges.await;
        }
        pool.close().await;
        consumed?;
        served.map_err(ServiceError::Serve)?;
        tracing::info!("Stopped");
        Ok(())
    }
}

/// What every handler of a consuming service's HTTP API shares: its database and the process's
/// metrics, from which `/healthz` and `/metrics` answer too ([`Operations`]).
#[derive(Debug, Clone)]
pub struct ServiceState {
    /// The service's database.
    pub pool: PgPool,
    /// The process's metrics.
    pub metrics: ConsumerServiceMetrics,
}

impl ServiceState {
    /// The service's `api` (its routes and the operations ones) on this state, every request
    /// counted in `<service>_http_requests_total`.
    pub fn into_router(self, api: Router<Self>) -> Router {
        api.layer(axum::middleware::from_fn_with_state(
            self.metrics.http_requests.clone(),
            outbox_http::service::track_requests::<IntCounterVec>,
        ))
        .with_state(self)
    }
}

impl FromRef<ServiceState> for Operations {
    fn from_ref(state: &ServiceState) -> Self {
        Operations::new(state.pool.clone(), state.metrics.registry.clone())
            .consuming(state.metrics.consumer.up.clone())
    }
}

/// The metrics every consuming service exposes: HTTP requests by method, matched route and
/// status (`<service>_http_requests_total`) and the consumer runtime's metrics (including inbox
/// duplicates), in one registry that `/metrics` renders.
#[derive(Debug, Clone)]
pub struct ConsumerServiceMetrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// HTTP requests by method, matched route and status.
    pub http_requests: IntCounterVec,
    /// The consumer runtime's metrics.
    pub consumer: outbox_consumer::ConsumerMetrics,
}

impl ConsumerServiceMetrics {
    /// Creates and registers every metric; `service` prefixes the HTTP metric (`wms`, `stock`).
    ///
    /// # Panics
    /// When `service` or `consumer_name` make an invalid or duplicate metric name (a
    /// programming error: both are constants of the calling service).
    pub fn new(service: &str, consumer_name: &str) -> Self {
        let registry = Registry::new();
        let http_requests = outbox_process::metrics::Registrar::new(&registry)
            .metric_vec(
                &format!("{service}_http_requests_total"),
                "HTTP requests by method, route and status",
                &["method", "route", "status"],
            )
            .expect("valid, unique metric");
        let consumer = outbox_consumer::ConsumerMetrics::register(&registry, consumer_name)
            .expect("unique consumer metrics");
        Self {
            registry,
            http_requests,
            consumer,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    #[command(name = "svc", mut_arg("listen", |a| a.default_value("127.0.0.1:9999").required(false)))]
    struct Config {
        #[command(flatten)]
        service: ConsumerServiceArgs,
    }

    /// The required flags, then `more`.
    fn parse(more: &[&str]) -> Config {
        let required = [
            "svc",
            "--database-url",
            "postgres://x/svc",
            "--kafka-brokers",
            "k:9092",
        ];
        Config::try_parse_from(required.iter().chain(more)).unwrap()
    }

    #[test]
    fn flags_parse_with_the_service_default_listen_and_a_dlq_subcommand() {
        let c = parse(&[]);
        assert_eq!(c.service.service.listen, "127.0.0.1:9999");
        assert_eq!(c.service.service.database_max_connections, 20);
        assert_eq!(
            c.service.service.shutdown_timeout(),
            Duration::from_secs(10)
        );
        assert_eq!(c.service.command, None, "no subcommand: run the service");
        let dlq = parse(&["dlq", "list", "--json"]);
        assert_eq!(
            dlq.service.command,
            Some(ConsumerCommand::Dlq(
                outbox_consumer::dlq_cli::DlqCommand::List { json: true }
            ))
        );
    }

    #[test]
    fn the_identity_names_the_consumer_its_group_topics_and_metrics() {
        let identity = ServiceIdentity {
            name: "svc",
            metrics_prefix: "svc",
            consumer_name: "probe",
            aggregate_types: &["order", "stock"],
        };
        let c = parse(&["--topic-prefix", "p."]);
        let runtime = identity
            .runtime_config(&c.service.consumer, &c.service.kafka_brokers)
            .unwrap();
        assert_eq!(runtime.consumer_name, "probe");
        assert_eq!(runtime.brokers, "k:9092");
        assert_eq!(runtime.group_id, "svc");
        assert_eq!(runtime.topics, ["p.order", "p.stock"]);
        let metrics = identity.metrics();
        metrics
            .http_requests
            .with_label_values(&["GET", "/x", "200"])
            .inc();
        let text = outbox_process::metrics::render(&metrics.registry);
        for line in [
            "svc_http_requests_total{method=\"GET\",route=\"/x\",status=\"200\"} 1",
            "consumer_up{consumer=\"probe\"} 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[tokio::test]
    async fn the_state_serves_the_operations_and_counts_every_request() {
        use axum::body::Body;
        use axum::http::Request;
        use tower::ServiceExt;

        let identity = ServiceIdentity {
            name: "svc",
            metrics_prefix: "svc",
            consumer_name: "probe",
            aggregate_types: &["order"],
        };
        let state = ServiceState {
            // Never connects: `/metrics` reads the registry only.
            pool: outbox_http::service::connect_lazy("postgres://x/svc", 1).unwrap(),
            metrics: identity.metrics(),
        };
        let (api, _) = outbox_http::service::operations::routes().split_for_parts();
        let router = state.into_router(api);
        let get = || Request::get("/metrics").body(Body::empty()).unwrap();
        let first = router.clone().oneshot(get()).await.unwrap();
        assert_eq!(first.status(), 200);
        let second = router.oneshot(get()).await.unwrap();
        let body = axum::body::to_bytes(second.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        for line in [
            "svc_http_requests_total{method=\"GET\",route=\"/metrics\",status=\"200\"} 1",
            "consumer_up{consumer=\"probe\"} 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
