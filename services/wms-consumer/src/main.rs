//! `wms-consumer`: parse configuration, migrate, then serve the HTTP API and consume events
//! until SIGTERM; or run an operator command (`dlq list`, `dlq redrive`) and exit.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use wms_consumer::config::Config;
use wms_consumer::{AppState, WmsHandler};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    outbox_kit::service::init_tracing();
    let config = Config::parse();
    if let Some(command) = &config.command {
        return outbox_kit::consumer::dlq_cli::run(
            command,
            &config.runtime_config(),
            &mut std::io::stdout().lock(),
        )
        .await
        .context("dlq command failed");
    }
    let pool =
        outbox_kit::service::connect_lazy(&config.database_url, config.database_max_connections)
            .context("invalid DATABASE_URL")?;
    wms_consumer::server::migrate(&pool)
        .await
        .context("applying the outbox, inbox and WMS migrations")?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let shutdown = outbox_kit::service::shutdown_on_signal();
    let metrics = wms_consumer::metrics::new_metrics();
    let state = AppState {
        pool: pool.clone(),
        metrics: metrics.clone(),
    };
    let http = tokio::spawn(outbox_kit::service::serve(
        listener,
        wms_consumer::router(state),
        shutdown.clone(),
        config.shutdown_timeout(),
    ));
    let consumed = outbox_kit::consumer::run(
        config.runtime_config(),
        pool.clone(),
        Arc::new(WmsHandler),
        metrics.consumer.clone(),
        shutdown.clone(),
    )
    .await;
    // The consumer only returns early on a fatal error: stop serving too.
    shutdown.cancel();
    let served = http.await.context("HTTP server task")?;
    pool.close().await;
    consumed.context("running the consumer")?;
    served.context("serving HTTP")?;
    tracing::info!("Stopped");
    Ok(())
}
