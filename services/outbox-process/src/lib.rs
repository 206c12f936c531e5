#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! - [`init_logging`] / [`init_tracing`]: logs (and, in services, OTLP span export);
//!   [`shutdown_on_signal`]: the token SIGTERM and SIGINT cancel.
//! - [`pg`]: the PostgreSQL connection options every binary builds (TLS from the URL, the
//!   password from `DATABASE_PASSWORD_FILE`); [`secret_file`]: secrets read from files.
//! - [`secrets`]: the start-up refusal of weak or published secrets and its development switch
//!   `--allow-weak-secrets`.
//! - [`retention`]: the bounded-batch purge of rows past a retention window.
//! - [`poll`]: waiting on a condition with a deadline.
//! - [`metrics`]: Prometheus metrics created and registered in one call, and a registry's text
//!   exposition.

pub mod metrics;
pub mod pg;
pub mod poll;
pub mod retention;
pub mod secret_file;
pub mod secrets;

use tokio_util::sync::CancellationToken;

/// Logs to stderr through `tracing`: `RUST_LOG` filters (default `info`, quieter for sqlx and
/// librdkafka), `LOG_FORMAT=json` switches to one JSON object per line.
///
/// # Panics
/// When a global subscriber is set already.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,rdkafka=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Logs to stderr through `tracing` ([`init_logging`]), then sets up the
/// optional OTLP span export ([`outbox_trace::otlp`]; only when `OTEL_EXPORTER_OTLP_ENDPOINT` is
/// set), with the executable's name as `service.name`.
///
/// Hold the returned [`Telemetry`](outbox_trace::otlp::Telemetry) until the end of `main`:
/// dropping it flushes the last spans. A configuration the exporter refuses is logged as an
/// error and the service runs without export.
pub fn init_tracing() -> outbox_trace::otlp::Telemetry {
    init_logging();
    let name = std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "outbox-service".to_owned());
    outbox_trace::otlp::init_or_run_without(&name)
}

/// A token cancelled on the first SIGTERM or SIGINT.
///
/// # Panics
/// When the signal handlers cannot be installed (outside a Tokio runtime).
pub fn shutdown_on_signal() -> CancellationToken {
    use tokio::signal::unix::{signal, SignalKind};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; shutting down"),
        }
        t.cancel();
    });
    token
}
