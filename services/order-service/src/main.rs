//! `order-service`: parse configuration, migrate, serve until SIGTERM.

use anyhow::Context;
use clap::Parser;
use order_service::config::Config;
use order_service::{AppState, CallbackSecret, Metrics};
use tokio_util::sync::CancellationToken;

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let config = Config::parse();
    let secret = CallbackSecret::new(&config.payment_callback_secret)
        .context("invalid PAYMENT_CALLBACK_SECRET")?;
    let pool = order_service::connect_lazy(&config.database_url, config.database_max_connections)
        .context("invalid DATABASE_URL")?;
    order_service::migrate(&pool)
        .await
        .context("applying the outbox and order migrations")?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let shutdown = CancellationToken::new();
    tokio::spawn(wait_for_signal(shutdown.clone()));
    let state = AppState {
        pool: pool.clone(),
        metrics: Metrics::new(),
        secret,
    };
    order_service::serve(listener, state, shutdown, config.shutdown_timeout())
        .await
        .context("serving HTTP")?;
    pool.close().await;
    tracing::info!("Stopped");
    Ok(())
}

async fn wait_for_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; draining requests"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; draining requests"),
    }
    shutdown.cancel();
}
