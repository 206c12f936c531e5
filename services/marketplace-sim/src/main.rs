//! `marketplace-sim`: parse flags, serve the platform's API until SIGTERM.

use anyhow::Context;
use clap::Parser;
use marketplace_sim::config::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = outbox_http::service::init_tracing();
    let config = Config::parse();
    let secret = outbox_http::signature::CallbackSecret::new(&config.secret)
        .context("invalid MARKETPLACE_SECRET")?;
    let listener = outbox_http::service::bind(&config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let shutdown = outbox_http::service::shutdown_on_signal();
    let platform = marketplace_sim::Platform::new(secret, config.faults);
    outbox_http::service::serve(
        listener,
        marketplace_sim::router(platform),
        shutdown,
        std::time::Duration::from_secs(5),
    )
    .await
    .context("serving HTTP")?;
    tracing::info!("Stopped");
    Ok(())
}
