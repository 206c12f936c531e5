//! From a Kafka message to an [`Event`] a handler can apply, or to the [`Rejection`] that sends
//! it to the dead-letter topic.
//!
//! Decoding runs in two steps so that a consumer never dead-letters an event it does not care
//! about: [`RawMessage::envelope`] reads only the contract headers (shared DESIGN.md, "On the
//! broker") every consumer needs to route and dedupe; [`Envelope::into_event`] checks the event
//! version and parses the payload, and runs only for event types the handler applies.

use uuid::Uuid;

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

/// Why a message can never be applied. It goes to the dead-letter topic with this text in its
/// `dlq.error` header and [`Rejection::reason`] in `dlq.reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// A contract header is missing (`event_id`, `event_type`).
    #[error("missing header `{0}`")]
    MissingHeader(&'static str),
    /// A contract header is present but unusable (not UTF-8, not a UUID, not a number).
    #[error("invalid header `{name}`: {problem}")]
    InvalidHeader {
        /// The header.
        name: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The consumer applies this event type, but not in this version.
    #[error(
        "unknown version {version} of {event_type} (this consumer applies versions {supported:?})"
    )]
    UnknownVersion {
        /// The event type.
        event_type: String,
        /// The version the message carries.
        version: u32,
        /// The versions the consumer applies.
        supported: Vec<u32>,
    },
    /// The value is missing or not JSON.
    #[error("undecodable payload: {0}")]
    Undecodable(String),
    /// The handler refused the event for good (payload of the wrong shape, or an effect the
    /// database's constraints forbid).
    #[error("rejected by the handler: {0}")]
    Unapplicable(String),
    /// Every attempt failed with an error that comes back the same each time (a row not
    /// found, a value that does not decode), up to the bounded number of attempts.
    #[error("failed {attempts} attempts: {error}")]
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        error: String,
    },
    /// The handler panicked on every attempt, up to the bounded number of attempts.
    #[error("handler panicked on {attempts} attempts: {message}")]
    HandlerPanic {
        /// Attempts made.
        attempts: u32,
        /// The last panic's message.
        message: String,
    },
}

impl Rejection {
    /// Short machine-readable reason, used as a metric label and in the `dlq.reason` header.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingHeader(_) => "missing_header",
            Self::InvalidHeader { .. } => "invalid_header",
            Self::UnknownVersion { .. } => "unknown_version",
            Self::Undecodable(_) => "undecodable",
            Self::Unapplicable(_) => "unapplicable",
            Self::RetriesExhausted { .. } => "retries_exhausted",
            Self::HandlerPanic { .. } => "handler_panic",
        }
    }

    /// Every value of [`Rejection::reason`], to show the metric series from the start.
    pub const REASONS: [&'static str; 7] = [
        "missing_header",
        "invalid_header",
        "unknown_version",
        "undecodable",
        "unapplicable",
        "retries_exhausted",
        "handler_panic",
    ];
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

/// An event ready to be applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Routing and identity.
    pub envelope: Envelope,
    /// The message value, parsed.
    pub payload: serde_json::Value,
    /// Where it was read from: topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

impl Event {
    /// The event id.
    pub fn event_id(&self) -> Uuid {
        self.envelope.event_id
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        &self.envelope.event_type
    }

    /// The payload as `T`.
    ///
    /// # Errors
    /// [`crate::consumer::HandlerError::Payload`] when it does not have that shape: the event
    /// goes to the dead-letter topic.
    pub fn payload_as<T: serde::de::DeserializeOwned>(
        &self,
    ) -> Result<T, crate::consumer::HandlerError> {
        T::deserialize(&self.payload).map_err(crate::consumer::HandlerError::Payload)
    }
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
    pub fn trace_context(&self) -> Option<crate::trace::TraceContext> {
        let text = |name| {
            self.header(name)
                .flatten()
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        crate::trace::TraceContext::from_headers(
            text(crate::trace::TRACEPARENT),
            text(crate::trace::TRACESTATE),
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

impl Envelope {
    /// Completes the event: checks the version against the ones the handler applies and parses
    /// the payload.
    ///
    /// # Errors
    /// [`Rejection::UnknownVersion`], or [`Rejection::Undecodable`] when the value is missing
    /// or not JSON.
    pub fn into_event(self, msg: &RawMessage, supported: &[u32]) -> Result<Event, Rejection> {
        if !supported.contains(&self.version) {
            return Err(Rejection::UnknownVersion {
                event_type: self.event_type,
                version: self.version,
                supported: supported.to_vec(),
            });
        }
        let bytes = msg
            .payload
            .as_deref()
            .ok_or_else(|| Rejection::Undecodable("the message has no value".to_owned()))?;
        let payload = serde_json::from_slice(bytes)
            .map_err(|e| Rejection::Undecodable(format!("not JSON: {e}")))?;
        Ok(Event {
            envelope: self,
            payload,
            topic: msg.topic.clone(),
            partition: msg.partition,
            offset: msg.offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90";

    fn msg(headers: &[(&str, &str)], payload: Option<&str>) -> RawMessage {
        RawMessage {
            topic: "outbox.event.order".into(),
            partition: 2,
            offset: 41,
            key: Some(b"order-1".to_vec()),
            payload: payload.map(|p| p.as_bytes().to_vec()),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
                .collect(),
        }
    }

    #[test]
    fn reads_the_relay_headers() {
        let m = msg(
            &[
                ("id", ID),
                ("event_id", ID),
                ("event_type", "OrderPaid"),
                ("aggregate_type", "order"),
                ("aggregate_id", "o-1"),
                ("occurred_at", "2026-01-02T03:04:05.000000Z"),
                ("traceparent", "00-x"),
            ],
            Some(r#"{"order_id":"o-1"}"#),
        );
        let env = m.envelope().unwrap();
        assert_eq!(env.event_id, Uuid::parse_str(ID).unwrap());
        assert_eq!(env.event_type, "OrderPaid");
        assert_eq!(env.version, 1, "no version header means version 1");
        assert_eq!(env.aggregate_id.as_deref(), Some("o-1"));
        assert_eq!(env.aggregate_type.as_deref(), Some("order"));
        let ev = env.into_event(&m, &[1]).unwrap();
        assert_eq!(ev.payload["order_id"], "o-1");
        assert_eq!((ev.partition, ev.offset), (2, 41));
    }

    #[test]
    fn debezium_id_header_is_enough_and_the_key_is_the_aggregate() {
        let m = msg(&[("id", ID), ("event_type", "OrderPaid")], Some("{}"));
        let env = m.envelope().unwrap();
        assert_eq!(env.event_id.to_string(), ID);
        assert_eq!(env.aggregate_id.as_deref(), Some("order-1"));
    }

    #[test]
    fn missing_or_broken_contract_headers_are_rejected() {
        let cases: Vec<(RawMessage, &str)> = vec![
            (
                msg(&[("event_type", "OrderPaid")], Some("{}")),
                "missing_header",
            ),
            (msg(&[("event_id", ID)], Some("{}")), "missing_header"),
            (
                msg(
                    &[("event_id", "not-a-uuid"), ("event_type", "X")],
                    Some("{}"),
                ),
                "invalid_header",
            ),
            (
                msg(&[("event_id", ID), ("event_type", " ")], Some("{}")),
                "invalid_header",
            ),
            (
                msg(
                    &[
                        ("event_id", ID),
                        ("event_type", "X"),
                        ("event_version", "0"),
                    ],
                    None,
                ),
                "invalid_header",
            ),
            (
                msg(
                    &[
                        ("event_id", ID),
                        ("event_type", "X"),
                        ("event_version", "two"),
                    ],
                    None,
                ),
                "invalid_header",
            ),
        ];
        for (m, reason) in cases {
            let err = m.envelope().unwrap_err();
            assert_eq!(err.reason(), reason, "{err}");
        }
        let mut m = msg(&[("event_type", "X")], None);
        m.headers.push(("event_id".into(), Some(vec![0xff, 0xfe])));
        assert_eq!(m.envelope().unwrap_err().reason(), "invalid_header");
    }

    #[test]
    fn unknown_versions_and_bad_payloads_are_rejected_only_when_handled() {
        let m = msg(
            &[
                ("event_id", ID),
                ("event_type", "OrderPaid"),
                ("event_version", "3"),
            ],
            Some("not json"),
        );
        // Reading the envelope succeeds: a consumer that ignores OrderPaid moves on.
        let env = m.envelope().unwrap();
        assert_eq!(env.version, 3);
        let err = env.clone().into_event(&m, &[1, 2]).unwrap_err();
        assert_eq!(err.reason(), "unknown_version");
        assert!(
            err.to_string().contains("unknown version 3 of OrderPaid"),
            "{err}"
        );
        let err = env.into_event(&m, &[3]).unwrap_err();
        assert_eq!(err.reason(), "undecodable");
        let empty = msg(&[("event_id", ID), ("event_type", "OrderPaid")], None);
        let err = empty
            .envelope()
            .unwrap()
            .into_event(&empty, &[1])
            .unwrap_err();
        assert_eq!(err.reason(), "undecodable");
    }

    #[test]
    fn extra_headers_cannot_override_contract_headers() {
        let other = "00000000-0000-4000-8000-000000000000";
        let m = msg(
            &[
                ("event_id", ID),
                ("event_type", "OrderPaid"),
                ("event_id", other),
            ],
            Some("{}"),
        );
        assert_eq!(m.envelope().unwrap().event_id.to_string(), ID);
    }
}
