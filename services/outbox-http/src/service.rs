//! What every service binary needs besides its own logic: structured logs, a cancellation
//! token fired by SIGTERM / SIGINT, an HTTP server that drains with a deadline, the
//! `/healthz` and `/metrics` answers and the JSON error envelope ([`ApiError`]). The skeleton
//! of a consuming service, built on this, is the `outbox-consumer-service` crate.

mod api_error;
mod args;
pub mod extract;
mod openapi;
pub mod operations;
pub mod server;
mod state_gauges;

pub use api_error::ApiError;
pub use args::{Migrations, ServiceArgs};
pub use openapi::{
    error_answers, error_response, error_responses, serve_openapi, ErrorBody, ErrorDetail, Health,
    JsonBodyRefused, OperatorOnly, BEARER_SCHEME,
};
pub use operations::Operations;
/// Logging and SIGTERM, from the process plumbing every binary shares (the relay too).
pub use outbox_process::{init_tracing, shutdown_on_signal};
pub use server::{bind, serve, serve_with_limits, HttpLimitArgs, HttpLimits};
pub use state_gauges::StateGauges;

use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use prometheus::{Encoder, IntCounterVec, Registry, TextEncoder};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// A lazily connecting pool: the process starts while the database is still coming up;
/// requests and events wait or fail (and are retried) until it is reachable.
///
/// # Errors
/// When the URL is invalid.
pub fn connect_lazy(database_url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(outbox_process::pg::connect_options(database_url)?))
}

/// What [`track_requests`] records each request into: a request counter, or a service's own
/// metrics that also keep a latency histogram.
pub trait ObserveHttp: Clone + Send + Sync + 'static {
    /// Records one request under its route template.
    fn observe_http(&self, method: &str, route: &str, status: u16, elapsed: Duration);
}

/// Counts requests by `method`, `route` and `status`.
impl ObserveHttp for IntCounterVec {
    fn observe_http(&self, method: &str, route: &str, status: u16, _elapsed: Duration) {
        self.with_label_values(&[method, route, &status.to_string()])
            .inc();
    }
}

/// Middleware recording every request in `metrics` under its route template, never the raw
/// path with ids, and logging it (probes and scrapes at debug level). Install with
/// `axum::middleware::from_fn_with_state(metrics, track_requests::<M>)`.
///
/// It also runs each request (except `/healthz` and `/metrics`) as a traced hop
/// ([`outbox_trace::TracedSpan`]): continuing the trace of a valid W3C `traceparent` header (with
/// its `tracestate`), else starting a new one. A missing or malformed header is never an error.
/// The hop's [`TraceContext`](outbox_trace::TraceContext) is a request extension, its log lines
/// carry `trace_id` / `span_id`, and events written to the outbox while handling the request
/// carry its `traceparent`.
pub async fn track_requests<M: ObserveHttp>(
    State(metrics): State<M>,
    mut req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    // Never the raw method: every made-up one would be a new time series, kept forever.
    let method = method_label(req.method());
    // Probes and scrapes arrive every few seconds; keep them out of the info log and traces.
    let probe = matches!(route.as_str(), "/healthz" | "/metrics");
    let started = std::time::Instant::now();
    let (response, hop) = if probe {
        (next.run(req).await, None)
    } else {
        let hop = outbox_trace::TracedSpan::start(
            outbox_trace::SpanKind::Server,
            remote_trace(req.headers()),
            || {
                let attributes = vec![
                    outbox_trace::Attribute::Str("http.request.method", method.to_owned()),
                    outbox_trace::Attribute::Str("http.route", route.clone()),
                ];
                (format!("{method} {route}"), attributes)
            },
        );
        req.extensions_mut().insert(hop.context().clone());
        (hop.run(next.run(req)).await, Some(hop))
    };
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    metrics.observe_http(method, &route, status, elapsed);
    let duration_ms = elapsed.as_secs_f64() * 1000.0;
    match hop {
        None => {
            tracing::debug!(http.method = %method, http.route = %route, http.status = status, duration_ms, "Handled HTTP request");
        }
        Some(mut hop) => {
            hop.tracing_span().in_scope(|| {
                tracing::info!(http.method = %method, http.route = %route, http.status = status, duration_ms, "Handled HTTP request");
            });
            hop.set_attribute(outbox_trace::Attribute::Int(
                "http.response.status_code",
                i64::from(status),
            ));
            hop.end((status >= 500).then(|| format!("HTTP {status}")));
        }
    }
    response
}

/// The `method` label of a request: one of the methods of RFC 9110 and `PATCH`, else `other`,
/// so that clients cannot add label values (each a time series kept for the process's life).
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// The trace context of a request's `traceparent` / `tracestate` headers: `None` (start a new
/// trace) without a valid one, or with several `traceparent` headers (W3C: then none is valid).
fn remote_trace(headers: &axum::http::HeaderMap) -> Option<outbox_trace::TraceContext> {
    let mut parents = headers.get_all(outbox_trace::TRACEPARENT).iter();
    let parent = parents.next()?.to_str().ok();
    if parents.next().is_some() {
        return None;
    }
    // Several `tracestate` headers are one list, joined with commas.
    let states: Vec<&str> = headers
        .get_all(outbox_trace::TRACESTATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let state = (!states.is_empty()).then(|| states.join(","));
    outbox_trace::TraceContext::from_headers(parent, state.as_deref())
}

/// How long the health check waits for the database.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// The `/healthz` answer: 200 when the database answers and `consumer_up` (if the service
/// consumes) is true, else 503.
pub async fn healthz(pool: &PgPool, consumer_up: Option<bool>) -> Response {
    let ping = sqlx::query("SELECT 1").execute(pool);
    let database = match tokio::time::timeout(HEALTH_TIMEOUT, ping).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "Health check failed: database unreachable");
            false
        }
        Err(_) => {
            tracing::warn!("Health check failed: database did not answer in time");
            false
        }
    };
    let ok = database && consumer_up != Some(false);
    let mut body = serde_json::json!({
        "status": if ok { "ok" } else { "unavailable" },
        "database": if database { "ok" } else { "unreachable" },
    });
    if let Some(up) = consumer_up {
        body["consumer"] = serde_json::json!(if up { "running" } else { "stopped" });
    }
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The `/metrics` answer: the registry in Prometheus text format.
pub fn metrics_response(registry: &Registry) -> Response {
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buf) {
        tracing::error!(error = %e, "Could not encode metrics");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], buf).into_response()
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::method_label;

    #[test]
    fn the_method_label_takes_a_fixed_set_of_values() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        for made_up in ["M000001", "get", "PROPFIND", "X"] {
            let m = Method::from_bytes(made_up.as_bytes()).unwrap();
            assert_eq!(method_label(&m), "other", "{made_up}");
        }
    }
}
