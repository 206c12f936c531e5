#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! W3C trace context (<https://www.w3.org/TR/trace-context/>) carried end to end: from an HTTP
//! request's `traceparent` header, into the outbox row's `headers`, onto the Kafka message (the
//! relay publishes the row's headers as they are), into every consumer that handles it, and onto
//! the events that consumer emits.
//!
//! - [`TraceContext`]: a parsed `traceparent` (+ `tracestate`); [`TraceContext::parse`] follows
//!   the W3C rules, and a malformed header is never an error for the request: the callers start
//!   a new trace instead ([`TraceContext::from_headers`] gives `None`).
//! - [`scope`] / [`current`]: the context of the span the current task works for. The HTTP
//!   middleware and the consumer runtime run each request / message inside one ([`TracedSpan`]),
//!   and `outbox_writer::enqueue` adds the current `traceparent` to every event written inside it, so
//!   handlers need no extra argument.
//! - [`TracedSpan`]: one hop (an HTTP request, a consumed message): a `tracing` span carrying
//!   `trace_id` and `span_id` (so every log line of that work shows them) and, when OTLP export is
//!   on (`otlp` feature, [`otlp::init`]), an OpenTelemetry span with exactly the same ids.

mod context;
#[cfg(feature = "otlp")]
pub mod otlp;
mod span;

pub use context::{SpanId, TraceContext, TraceId, TraceparentError, SAMPLED};
pub use span::{Attribute, ProducerSpan, SpanKind, TracedSpan};

use std::future::Future;

/// Header (HTTP and Kafka) and outbox `headers` key of the W3C trace parent.
pub const TRACEPARENT: &str = "traceparent";
/// Header (HTTP and Kafka) and outbox `headers` key of the W3C vendor trace state.
pub const TRACESTATE: &str = "tracestate";

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// Runs `f` with `ctx` as the current trace context ([`current`]) of the task.
pub async fn scope<F: Future>(ctx: TraceContext, f: F) -> F::Output {
    CURRENT.scope(ctx, f).await
}

/// Whether spans are exported in this process (OTLP set up by [`otlp::init`]). Callers with a
/// per-event cost of their own (the relay) skip it while this is false.
#[cfg(feature = "otlp")]
pub fn exporting() -> bool {
    otlp::is_set_up()
}

/// Whether spans are exported in this process: never, without the `otlp` feature.
#[cfg(not(feature = "otlp"))]
pub fn exporting() -> bool {
    false
}

/// The trace context of the span the current task works for, if it runs inside [`scope`].
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(Clone::clone).ok()
}

/// Outbox `headers` with the current trace context added: `None` when there is nothing to add
/// (no current context, or `headers` carry a `traceparent` of their own, which wins), else the
/// headers (or a new object) with `traceparent` and, if present, `tracestate`. Headers that are
/// not a JSON object are left alone (the outbox write refuses them).
pub fn headers_with_current(headers: Option<&serde_json::Value>) -> Option<serde_json::Value> {
    let ctx = current()?;
    let mut map = match headers {
        None => serde_json::Map::new(),
        Some(serde_json::Value::Object(m)) if m.contains_key(TRACEPARENT) => return None,
        Some(serde_json::Value::Object(m)) => m.clone(),
        Some(_) => return None,
    };
    ctx.insert_into(&mut map);
    Some(serde_json::Value::Object(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn events_written_inside_a_scope_get_its_traceparent() {
        assert_eq!(headers_with_current(None), None, "no scope: nothing added");
        let ctx = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .unwrap()
            .with_tracestate(Some("vendor=x"));
        scope(ctx, async {
            let added = headers_with_current(None).unwrap();
            assert_eq!(
                added,
                json!({
                    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                    "tracestate": "vendor=x"
                })
            );
            let merged = headers_with_current(Some(&json!({"event_version": "2"}))).unwrap();
            assert_eq!(merged["event_version"], "2");
            assert_eq!(merged[TRACEPARENT], added[TRACEPARENT]);
            let own =
                json!({"traceparent": "00-11111111111111111111111111111111-2222222222222222-00"});
            assert_eq!(
                headers_with_current(Some(&own)),
                None,
                "an explicit traceparent wins"
            );
            assert_eq!(headers_with_current(Some(&json!([1]))), None);
        })
        .await;
        assert_eq!(current(), None, "the scope ends with its future");
    }
}
