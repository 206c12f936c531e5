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

/// What a message's value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageValue {
    /// JSON (no `content-type` header, or a JSON one): parsed into [`Event::payload`].
    Json,
    /// Bytes of another content type (the `content-type` header), e.g. Protobuf or Avro, as
    /// the writer stored them in `payload_bytes`. [`Event::payload`] is `null`.
    Binary {
        /// The `content-type` header.
        content_type: String,
        /// The value.
        bytes: Vec<u8>,
    },
    /// No value: a tombstone (a deletion on a compacted topic). [`Event::payload`] is `null`.
    Tombstone,
}

/// An event ready to be applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Routing and identity.
    pub envelope: Envelope,
    /// The message value parsed as JSON; `null` for a tombstone or a binary value (see
    /// [`Event::value`]).
    pub payload: serde_json::Value,
    /// Whether the value is JSON, bytes of another content type, or absent (a tombstone).
    pub value: MessageValue,
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
    /// [`crate::HandlerError::Payload`] when it does not have that shape: the event
    /// goes to the dead-letter topic.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::HandlerError> {
        use serde::de::Error as _;
        match &self.value {
            MessageValue::Json => {
                T::deserialize(&self.payload).map_err(crate::HandlerError::Payload)
            }
            MessageValue::Tombstone => Err(crate::HandlerError::Payload(
                serde_json::Error::custom("the event is a tombstone: it has no value"),
            )),
            MessageValue::Binary { content_type, .. } => Err(crate::HandlerError::Payload(
                serde_json::Error::custom(format!("the value is {content_type}, not JSON")),
            )),
        }
    }

    /// True for a tombstone (the message has no value).
    pub fn is_tombstone(&self) -> bool {
        self.value == MessageValue::Tombstone
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
        let content_type = match msg.header(outbox_writer::envelope::CONTENT_TYPE_HEADER) {
            Some(Some(v)) => {
                Some(
                    std::str::from_utf8(v).map_err(|_| Rejection::InvalidHeader {
                        name: outbox_writer::envelope::CONTENT_TYPE_HEADER,
                        problem: "not UTF-8".to_owned(),
                    })?,
                )
            }
            _ => None,
        };
        let (payload, value) = match (msg.payload.as_deref(), content_type) {
            (None, _) => (serde_json::Value::Null, MessageValue::Tombstone),
            (Some(bytes), Some(ct)) if !is_json(ct) => (
                serde_json::Value::Null,
                MessageValue::Binary {
                    content_type: ct.to_owned(),
                    bytes: bytes.to_vec(),
                },
            ),
            (Some(bytes), _) => (
                serde_json::from_slice(bytes)
                    .map_err(|e| Rejection::Undecodable(format!("not JSON: {e}")))?,
                MessageValue::Json,
            ),
        };
        Ok(Event {
            envelope: self,
            payload,
            value,
            topic: msg.topic.clone(),
            partition: msg.partition,
            offset: msg.offset,
        })
    }
}

/// Whether a `content-type` names JSON: `application/json` or a `+json` type, parameters and
/// case aside.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == outbox_writer::envelope::JSON_CONTENT_TYPE || essence.ends_with("+json")
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
    }

    #[test]
    fn a_message_without_a_value_is_a_tombstone() {
        let empty = msg(&[("event_id", ID), ("event_type", "OrderDeleted")], None);
        let event = empty.envelope().unwrap().into_event(&empty, &[1]).unwrap();
        assert!(event.is_tombstone());
        assert_eq!(event.payload, serde_json::Value::Null);
        let err = event.payload_as::<serde_json::Value>().unwrap_err();
        assert!(format!("{err:?}").contains("tombstone"), "{err:?}");
    }

    #[test]
    fn the_content_type_decides_between_json_and_bytes() {
        let headers =
            |ct: &'static str| [("event_id", ID), ("event_type", "T"), ("content-type", ct)];
        for ct in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/cloudevents+json",
        ] {
            let m = msg(&headers(ct), Some(r#"{"a":1}"#));
            let event = m.envelope().unwrap().into_event(&m, &[1]).unwrap();
            assert_eq!(event.value, MessageValue::Json, "{ct}");
            assert_eq!(event.payload["a"], 1);
        }
        let mut m = msg(&headers("application/x-protobuf"), None);
        m.payload = Some(vec![0x08, 0x96, 0x01, 0xff, 0x00]);
        let event = m.envelope().unwrap().into_event(&m, &[1]).unwrap();
        assert_eq!(
            event.value,
            MessageValue::Binary {
                content_type: "application/x-protobuf".into(),
                bytes: vec![0x08, 0x96, 0x01, 0xff, 0x00]
            }
        );
        assert!(event.payload_as::<serde_json::Value>().is_err());
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

#[cfg(test)]
mod properties {
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;

    use super::*;
    use outbox_writer::EventEnvelope;

    /// Header names a consumer looks for, mixed with others.
    fn header_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("id".to_owned()),
            Just("event_id".to_owned()),
            Just("event_type".to_owned()),
            Just(EVENT_VERSION_HEADER.to_owned()),
            Just("aggregate_id".to_owned()),
            Just("aggregate_type".to_owned()),
            Just("occurred_at".to_owned()),
            ".{0,12}",
        ]
    }

    /// Header values: valid ids and versions, near-misses, arbitrary bytes (not UTF-8 too).
    fn header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90".to_vec()),
            "[0-9 ]{0,4}".prop_map(String::into_bytes),
            ".{0,40}".prop_map(String::into_bytes),
            vec(any::<u8>(), 0..40),
        ]
    }

    fn raw_message() -> impl Strategy<Value = RawMessage> {
        (
            option::of(vec(any::<u8>(), 0..16)),
            option::of(prop_oneof![
                vec(any::<u8>(), 0..64),
                Just(b"{\"order_id\": 1}".to_vec())
            ]),
            vec((header_name(), option::of(header_value())), 0..10),
        )
            .prop_map(|(key, payload, headers)| RawMessage {
                topic: "t".into(),
                partition: 0,
                offset: 0,
                key,
                payload,
                headers,
            })
    }

    fn payload() -> impl Strategy<Value = outbox_writer::Payload> {
        prop_oneof![
            Just(outbox_writer::Payload::Json("{}".into())),
            (
                vec(any::<u8>(), 0..64),
                prop_oneof![
                    Just("application/x-protobuf"),
                    Just("avro/binary"),
                    Just("application/octet-stream")
                ]
            )
                .prop_map(|(bytes, ct)| outbox_writer::Payload::Binary {
                    bytes,
                    content_type: ct.to_owned()
                }),
            Just(outbox_writer::Payload::Tombstone),
        ]
    }

    fn row() -> impl Strategy<Value = EventEnvelope> {
        (
            any::<u128>(),
            ".{1,20}",
            ".{0,20}",
            ".{0,20}",
            vec(("[a-z_-]{1,14}", ".{0,10}"), 0..4),
            payload(),
            option::of("[a-z0-9]{1,8}"),
        )
            .prop_map(
                |(id, event_type, aggregate_id, aggregate_type, extra, payload, key)| {
                    EventEnvelope {
                        id: 1,
                        event_id: Uuid::from_u128(id),
                        aggregate_type,
                        aggregate_id,
                        event_type,
                        payload,
                        key,
                        headers: serde_json::Value::Object(
                            extra
                                .into_iter()
                                .map(|(k, v)| (k, serde_json::Value::String(v)))
                                .collect(),
                        ),
                        topic: None,
                        created_at: chrono::DateTime::from_timestamp(1_700_000_000, 123_456_000)
                            .unwrap(),
                    }
                },
            )
    }

    proptest! {
        /// Whatever a message carries, decoding answers an envelope or a rejection (for the
        /// dead-letter topic), never a panic; a decoded envelope has a usable type and version.
        #[test]
        fn any_message_decodes_or_is_rejected(msg in raw_message()) {
            if let Ok(envelope) = msg.envelope() {
                prop_assert!(!envelope.event_type.is_empty());
                prop_assert!(envelope.version >= 1);
                let _ = envelope.into_event(&msg, &[1, 2]);
            }
        }

        /// What the relay writes the consumer reads back: event id, type (trimmed), aggregate
        /// id and type, and the value as JSON, bytes of its content type, or a tombstone;
        /// with CloudEvents on or off.
        #[test]
        fn relay_headers_decode_to_the_same_event(row in row(), cloudevents in any::<bool>()) {
            let mut headers = Vec::new();
            let options = outbox_writer::HeaderOptions {
                cloudevents_source: cloudevents.then_some("/orders"),
                traceparent: None,
            };
            row.for_each_header(options, |k, v| headers.push((k.to_owned(), Some(v.to_vec()))));
            let msg = RawMessage {
                topic: row.topic("p."),
                partition: 0,
                offset: 0,
                key: Some(row.message_key().as_bytes().to_vec()),
                payload: row.payload.bytes().map(<[u8]>::to_vec),
                headers,
            };
            match msg.envelope() {
                Ok(e) => {
                    prop_assert_eq!(e.event_id, row.event_id);
                    prop_assert_eq!(e.event_type.as_str(), row.event_type.trim());
                    prop_assert_eq!(e.aggregate_id.as_deref(), Some(row.aggregate_id.as_str()));
                    prop_assert_eq!(
                        e.aggregate_type.as_deref(),
                        Some(row.aggregate_type.as_str())
                    );
                    let event = e.into_event(&msg, &[1]);
                    prop_assert!(event.is_ok(), "{:?}", event);
                    let event = event.unwrap();
                    match &row.payload {
                        outbox_writer::Payload::Json(text) => {
                            prop_assert_eq!(&event.value, &MessageValue::Json);
                            prop_assert_eq!(
                                event.payload,
                                serde_json::from_str::<serde_json::Value>(text).unwrap()
                            );
                        }
                        outbox_writer::Payload::Binary { bytes, content_type } => prop_assert_eq!(
                            event.value,
                            MessageValue::Binary {
                                content_type: content_type.clone(),
                                bytes: bytes.clone()
                            }
                        ),
                        outbox_writer::Payload::Tombstone => prop_assert!(event.is_tombstone()),
                    }
                }
                Err(r) => prop_assert!(
                    row.event_type.trim().is_empty(),
                    "rejected {:?}: {}", row, r
                ),
            }
        }
    }
}
