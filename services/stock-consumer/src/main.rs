//! `stock-consumer`: parse configuration, then run the shared consuming-service skeleton (migrate,
//! serve the HTTP API and consume events until SIGTERM; or run `dlq list` / `dlq redrive`).

use anyhow::Context;
use clap::Parser;
use stock_consumer::config::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = outbox_http::service::init_tracing();
    let config = Config::parse();
    stock_consumer::service()
        .run(config.service)
        .await
        .context("stock-consumer stopped")
}
