//! The PRODUCER span of a message the relay sends, when spans are exported.

use outbox_trace::{Attribute, ProducerSpan, TraceContext};
use outbox_writer::EventEnvelope;

/// The PRODUCER span of `row` below its writer's `traceparent`, from the row's `created_at` (the
/// time it waited in the outbox is part of the span); `None` without a valid `traceparent`.
pub(super) fn producer_span(row: &EventEnvelope, topic: &str) -> Option<ProducerSpan> {
    let parent = TraceContext::from_headers(row.traceparent(), row.tracestate())?;
    ProducerSpan::start(parent, row.created_at.into(), || {
        (
            format!("send {topic}"),
            // The messaging conventions' identifying attributes only: every attribute is
            // encoded and exported per event (the aggregate and event type are in the
            // writer's span and the message's headers).
            vec![
                Attribute::Static("messaging.system", "kafka"),
                Attribute::Static("messaging.operation.type", "send"),
                Attribute::Str("messaging.destination.name", topic.to_owned()),
                Attribute::Str("messaging.message.id", row.event_id.to_string()),
                Attribute::Int("outbox.id", row.id),
            ],
        )
    })
}
