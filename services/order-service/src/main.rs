//! `order-service`: parse configuration, migrate, serve until SIGTERM; with `--kafka-brokers`,
//! also consume the fulfilment events that move orders. `dlq list` / `dlq redrive` run an
//! operator command on the fulfilment consumer's dead letters instead.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use order_service::channel::PlatformClient;
use order_service::config::Config;
use order_service::{AppState, CallbackSecret, FulfilmentHandler, Metrics};
use outbox_consumer_service::ServiceError;

/// A failed migration, named as every consuming service names it.
fn migration_failed(source: sqlx::migrate::MigrateError) -> ServiceError {
    ServiceError::Migrate {
        service: "order",
        source,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = outbox_http::service::init_tracing();
    let config = Config::parse();
    if let Some(command) = &config.command {
        let runtime = config
            .runtime_config()
            .map_err(ServiceError::KafkaSecurity)?
            .context("the dlq commands need --kafka-brokers / KAFKA_BROKERS")?;
        let database_url = &config.service.database_url;
        return Ok(
            outbox_consumer_service::run_dlq_command(command, &runtime, database_url).await?,
        );
    }
    if config.service.migrations == outbox_http::service::Migrations::Only {
        config.service.check_secrets(&[])?;
        let pool = outbox_http::service::connect_lazy(&config.service.database_url, 1)
            .map_err(ServiceError::DatabaseUrl)?;
        order_service::migrate(&pool)
            .await
            .map_err(migration_failed)?;
        tracing::info!("Migrations applied (DATABASE_MIGRATIONS=only)");
        return Ok(());
    }
    config.check_secrets()?;
    let auth = config.auth.authenticator().map_err(ServiceError::Auth)?;
    let secret = CallbackSecret::new(
        config
            .payment_callback_secret
            .as_deref()
            .context("PAYMENT_CALLBACK_SECRET (--payment-callback-secret) must be set to serve")?,
    )
    .context("invalid PAYMENT_CALLBACK_SECRET")?;
    let marketplace_secret = config
        .marketplace_secret
        .as_deref()
        .map(CallbackSecret::new)
        .transpose()
        .context("invalid MARKETPLACE_SECRET")?;
    let pool = outbox_http::service::connect_lazy(
        &config.service.database_url,
        config.service.database_max_connections,
    )
    .map_err(ServiceError::DatabaseUrl)?;
    if config.service.migrations == outbox_http::service::Migrations::Apply {
        order_service::migrate(&pool)
            .await
            .map_err(migration_failed)?;
    }
    let listener = outbox_http::service::bind(&config.service.listen)
        .await
        .map_err(|source| ServiceError::Bind {
            addr: config.service.listen.clone(),
            source,
        })?;
    let shutdown = outbox_http::service::shutdown_on_signal();
    let metrics = Metrics::new();
    let marketplace = config.marketplace_url.as_deref().map(PlatformClient::new);
    let compensation = marketplace.clone().map(|client| {
        metrics.enable_compensation();
        tokio::spawn(order_service::channel::compensation::run(
            pool.clone(),
            client,
            metrics.clone(),
            Duration::from_millis(config.marketplace_compensation_interval_ms),
            shutdown.clone(),
        ))
    });
    let payment_timeout = (config.payment_timeout_secs > 0).then(|| {
        tokio::spawn(order_service::payment_timeout::run(
            pool.clone(),
            Duration::from_secs(config.payment_timeout_secs),
            Duration::from_millis(config.payment_timeout_interval_ms),
            metrics.clone(),
            shutdown.clone(),
        ))
    });
    let state_gauges = tokio::spawn(metrics.state_gauges().run(
        pool.clone(),
        Duration::from_millis(config.service.state_metrics_interval_ms),
        shutdown.clone(),
    ));
    let retention = tokio::spawn(outbox_process::retention::run(
        pool.clone(),
        vec![config.idempotency_retention()],
        config.consumer.purge.settings(),
        metrics.consumer.retention.clone(),
        || true,
        shutdown.clone(),
    ));
    let consumer = match config
        .runtime_config()
        .map_err(ServiceError::KafkaSecurity)?
    {
        Some(runtime) => {
            let consumed = outbox_consumer::run(
                runtime,
                pool.clone(),
                Arc::new(
                    FulfilmentHandler::new(metrics.clone()).with_platform(marketplace.clone()),
                ),
                metrics.consumer.clone(),
                shutdown.clone(),
            );
            let stop = shutdown.clone();
            Some(tokio::spawn(async move {
                let result = consumed.await;
                // The consumer returns early only on a fatal error: stop serving too.
                stop.cancel();
                result
            }))
        }
        None => {
            tracing::warn!("KAFKA_BROKERS is not set: not consuming fulfilment events (orders will not move to SHIPPED)");
            None
        }
    };
    let state = AppState {
        pool: pool.clone(),
        metrics,
        secret,
        replay_window: Duration::from_secs(config.callback_replay_window_secs),
        marketplace_secret,
        marketplace,
        auth,
    };
    let limits = config
        .service
        .http
        .limits(order_service::http::UNAUTHENTICATED_ROUTES);
    let served = order_service::serve_with_limits(
        listener,
        state,
        shutdown.clone(),
        config.service.shutdown_timeout(),
        &limits,
    )
    .await
    .map_err(ServiceError::Serve);
    shutdown.cancel();
    let _ = retention.await;
    let _ = state_gauges.await;
    if let Some(consumer) = consumer {
        consumer
            .await
            .context("consumer task")?
            .map_err(ServiceError::Consumer)?;
    }
    if let Some(compensation) = compensation {
        compensation.await.context("compensation task")?;
    }
    if let Some(payment_timeout) = payment_timeout {
        payment_timeout.await.context("payment timeout task")?;
    }
    pool.close().await;
    served?;
    tracing::info!("Stopped");
    Ok(())
}
