//! One traced hop: a `tracing` span whose fields carry the trace, plus (with OTLP export on)
//! the OpenTelemetry span with the same ids.

use std::future::Future;

use tracing::Instrument;

use super::{SpanId, TraceContext};

/// What kind of hop a span is (OpenTelemetry's span kinds that occur here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Handling an incoming HTTP request.
    Server,
    /// Handling a consumed Kafka message.
    Consumer,
    /// Publishing a message (the relay: from the row's commit to the broker's ack).
    Producer,
}

/// An attribute of an exported span (OpenTelemetry semantic-convention names).
#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    /// A text value.
    Str(&'static str, String),
    /// A text value known at compile time (no allocation).
    Static(&'static str, &'static str),
    /// A number.
    Int(&'static str, i64),
}

/// One hop of a trace: the work for one HTTP request or one consumed message.
///
/// Its [`TracedSpan::context`] is a child of the remote parent (or a new trace): the id that
/// log lines show and that events written inside [`TracedSpan::run`] carry as their parent.
#[derive(Debug)]
pub struct TracedSpan {
    context: TraceContext,
    parent: Option<SpanId>,
    span: tracing::Span,
    #[cfg(feature = "otlp")]
    exported: Option<opentelemetry_sdk::trace::Span>,
}

impl TracedSpan {
    /// Starts a hop below `remote_parent` (a received `traceparent`), or as the root of a new
    /// trace when there is none. `describe` gives the exported span's name and attributes; it is
    /// called only when spans are exported, so the hot path builds neither otherwise.
    pub fn start(
        kind: SpanKind,
        remote_parent: Option<TraceContext>,
        describe: impl FnOnce() -> (String, Vec<Attribute>),
    ) -> Self {
        let parent = remote_parent.as_ref().map(|p| p.span_id);
        let context = match &remote_parent {
            Some(p) => p.child(),
            None => TraceContext::new_root(),
        };
        let span = match kind {
            SpanKind::Server => tracing::info_span!(
                "http",
                trace_id = %context.trace_id,
                span_id = %context.span_id
            ),
            SpanKind::Consumer => tracing::info_span!(
                "consume",
                trace_id = %context.trace_id,
                span_id = %context.span_id
            ),
            SpanKind::Producer => tracing::info_span!(
                "publish",
                trace_id = %context.trace_id,
                span_id = %context.span_id
            ),
        };
        #[cfg(feature = "otlp")]
        let exported = super::otlp::start_span(kind, &context, remote_parent, None, describe);
        // With export on, the sampler decides a new trace's sampling; pass its decision on.
        #[cfg(feature = "otlp")]
        let mut context = context;
        #[cfg(feature = "otlp")]
        if let Some(s) = &exported {
            context.flags = if super::otlp::is_sampled(s) {
                super::SAMPLED
            } else {
                0
            };
        }
        #[cfg(not(feature = "otlp"))]
        let _ = describe;
        Self {
            context,
            parent,
            span,
            #[cfg(feature = "otlp")]
            exported,
        }
    }

    /// This hop's trace context: what events written inside it carry as `traceparent`.
    pub fn context(&self) -> &TraceContext {
        &self.context
    }

    /// The span id of the remote parent, if the hop continued a trace.
    pub fn parent(&self) -> Option<SpanId> {
        self.parent
    }

    /// The `tracing` span, e.g. to enter it for a log line written after [`TracedSpan::run`].
    pub fn tracing_span(&self) -> &tracing::Span {
        &self.span
    }

    /// Runs `f` inside the hop: its log lines carry the trace, and events it writes to the
    /// outbox carry this hop as their parent ([`super::scope`]).
    pub async fn run<F: Future>(&self, f: F) -> F::Output {
        super::scope(self.context.clone(), f.instrument(self.span.clone())).await
    }

    /// Adds an attribute to the exported span (no-op without export).
    pub fn set_attribute(&mut self, attribute: Attribute) {
        #[cfg(feature = "otlp")]
        if let Some(span) = &mut self.exported {
            super::otlp::set_attribute(span, attribute);
        }
        #[cfg(not(feature = "otlp"))]
        let _ = attribute;
    }

    /// Ends the hop; `error` marks the exported span as failed with that description.
    pub fn end(self, error: Option<String>) {
        #[cfg(feature = "otlp")]
        if let Some(span) = self.exported {
            super::otlp::end_span(span, error);
        }
        #[cfg(not(feature = "otlp"))]
        let _ = error;
    }
}

/// One published message's PRODUCER span (the relay), exported only: no `tracing` span, and
/// none at all unless spans are exported ([`super::exporting`]). It starts when the event was
/// written (the outbox row's `created_at`) and ends at the broker's ack, so a trace shows how long
/// the event waited in the outbox; the message carries [`ProducerSpan::context`] as its
/// `traceparent`, so the consumer's span is its child.
#[derive(Debug)]
pub struct ProducerSpan {
    context: TraceContext,
    #[cfg(feature = "otlp")]
    exported: opentelemetry_sdk::trace::Span,
}

impl ProducerSpan {
    /// Starts the span below the writer's `parent` at `started_at`; `None` when spans are not
    /// exported (then nothing is built, and `describe` is not called).
    pub fn start(
        parent: TraceContext,
        started_at: std::time::SystemTime,
        describe: impl FnOnce() -> (String, Vec<Attribute>),
    ) -> Option<Self> {
        #[cfg(feature = "otlp")]
        {
            let mut context = parent.child();
            let exported = super::otlp::start_span(
                SpanKind::Producer,
                &context,
                Some(parent),
                Some(started_at),
                describe,
            )?;
            context.flags = if super::otlp::is_sampled(&exported) {
                super::SAMPLED
            } else {
                0
            };
            Some(Self { context, exported })
        }
        #[cfg(not(feature = "otlp"))]
        {
            let _ = (parent, started_at, describe);
            None
        }
    }

    /// The span's context: what the published message carries as `traceparent`.
    pub fn context(&self) -> &TraceContext {
        &self.context
    }

    /// Ends the span at `at` (the broker's ack); `error` marks it failed with that description.
    pub fn end(self, at: std::time::SystemTime, error: Option<String>) {
        #[cfg(feature = "otlp")]
        super::otlp::end_span_at(self.exported, at, error);
        #[cfg(not(feature = "otlp"))]
        let _ = (at, error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hop_continues_its_parent_and_is_current_inside_run() {
        let parent =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let hop = TracedSpan::start(SpanKind::Consumer, Some(parent.clone()), || {
            ("t process".to_owned(), vec![])
        });
        assert_eq!(hop.context().trace_id, parent.trace_id);
        assert_ne!(hop.context().span_id, parent.span_id);
        assert_eq!(hop.parent(), Some(parent.span_id));
        let inside = hop.run(async { super::super::current() }).await;
        assert_eq!(inside.as_ref(), Some(hop.context()));
        hop.end(None);
        let root = TracedSpan::start(SpanKind::Server, None, || ("GET /".to_owned(), vec![]));
        assert_eq!(root.parent(), None);
        assert_ne!(root.context().trace_id, parent.trace_id);
        root.end(None);
    }

    #[test]
    fn no_producer_span_is_built_while_spans_are_not_exported() {
        let parent =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let span = ProducerSpan::start(parent, std::time::SystemTime::now(), || {
            panic!("the span's description must not be built when export is off")
        });
        assert!(span.is_none());
    }
}
