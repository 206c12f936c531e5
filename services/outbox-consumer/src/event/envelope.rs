//! The first decoding step: a consumed message ([`RawMessage`]) and its contract headers (shared
//! DESIGN.md, "On the broker"), read into the routing part every consumer needs to route and
//! dedupe ([`Envelope`]), whether or not it applies the event type.

use uuid::Uuid;

use super::rejection::Rejection;

/// Optional header carrying the payload's schema version of its event type. Absent means 1.
/// Producers set it through the outbox `headers` column, e.g. `{"event_version": "2"}`.
pub const EVENT_VERSION_HEADER: &str = "event_version";

/// A consumed message, copied out of librdkafka's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawMessage {
    /// Topic it was read from.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub payload: Option<Vec<u8>>,
    /// Headers in message order; a header may have no value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// The routing part of a message: what every consumer reads before deciding whether the
/// event concerns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The event's identity end to end: the inbox key.
    pub event_id: Uuid,
    /// E.g. `OrderPaid`.
    pub event_type: String,
    /// Payload schema version of the event type ([`EVENT_VERSION_HEADER`], default 1).
    pub version: u32,
    /// The `aggregate_type` header, when present.
    pub aggregate_type: Option<String>,
    /// The `aggregate_id` header, else the message key.
    pub aggregate_id: Option<String>,
    /// The `occurred_at` header (RFC 3339), when present.
    pub occurred_at: Option<String>,
}

impl RawMessage {
    /// The first value of header `name`, if the header is present (its value may be null).
    pub fn header(&self, name: &str) -> Option<Option<&[u8]>> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref())
    }

    /// The trace this message continues: its `traceparent` (and `tracestate`) header, or `None`
    /// when it has none or a malformed one (the consumer then starts a new trace).
    pub fn trace_context(&self) -> Option<outbox_trace::TraceContext> {
        let text = |name| {
            self.header(name)
                .flatten()
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        outbox_trace::TraceContext::from_headers(
            text(outbox_trace::TRACEPARENT),
            text(outbox_trace::TRACESTATE),
        )
    }

    /// The first value of header `name` (the relay's contract headers come first, and extra
    /// headers never override them).
    fn contract_header(&self, name: &'static str) -> Result<Option<&str>, Rejection> {
        let Some((_, value)) = self.headers.iter().find(|(k, _)| k == name) else {
            return Ok(None);
        };
        let Some(bytes) = value else {
            return Ok(None);
        };
        std::str::from_utf8(bytes)
            .map(Some)
            .map_err(|_| Rejection::InvalidHeader {
                name,
                problem: "not UTF-8".to_owned(),
            })
    }

    /// Reads the contract headers.
    ///
    /// # Errors
    /// [`Rejection::MissingHeader`] / [`Rejection::InvalidHeader`] when `event_id` (or its
    /// Debezium name `id`) or `event_type` is missing or unusable, or the version is not a
    /// positive integer.
    pub fn envelope(&self) -> Result<Envelope, Rejection> {
        let (id_name, id_text) = match self.contract_header("event_id")? {
            Some(v) => ("event_id", v),
            None => match self.contract_header("id")? {
                Some(v) => ("id", v),
                None => return Err(Rejection::MissingHeader("event_id")),
            },
        };
        let event_id = Uuid::parse_str(id_text.trim()).map_err(|e| Rejection::InvalidHeader {
            name: id_name,
            problem: e.to_string(),
        })?;
        let event_type = match self.contract_header("event_type")? {
            Some(t) if !t.trim().is_empty() => t.trim().to_owned(),
            Some(_) => {
                return Err(Rejection::InvalidHeader {
                    name: "event_type",
                    problem: "empty".to_owned(),
                })
            }
            None => return Err(Rejection::MissingHeader("event_type")),
        };
        let version = match self.contract_header(EVENT_VERSION_HEADER)? {
            None => 1,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(Rejection::InvalidHeader {
                        name: EVENT_VERSION_HEADER,
                        problem: format!("`{v}` is not a positive integer"),
                    })
                }
            },
        };
        let aggregate_id = match self.contract_header("aggregate_id")? {
            Some(v) => Some(v.to_owned()),
            None => self
                .key
                .as_deref()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
        };
        Ok(Envelope {
            event_id,
            event_type,
            version,
            aggregate_type: self.contract_header("aggregate_type")?.map(str::to_owned),
            aggregate_id,
            occurred_at: self.contract_header("occurred_at")?.map(str::to_owned),
        })
    }
}
