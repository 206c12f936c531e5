//! From a Kafka message to an [`Event`] a handler can apply, or to the [`Rejection`] that sends
//! it to the dead-letter topic.
//!
//! Decoding runs in two steps so that a consumer never dead-letters an event it does not care
//! about: [`RawMessage::envelope`] reads only the contract headers (shared DESIGN.md, "On the
//! broker") every consumer needs to route and dedupe; [`Envelope::into_event`] checks the event
//! version and parses the payload, and runs only for event types the handler applies.
//!
//! Files: `envelope` (the consumed message and its contract headers), `decode` (the event
//! version and the value), `rejection` (why a message goes to the dead-letter topic). The
//! tests below drive both steps together, as the worker does.

mod decode;
mod envelope;
mod rejection;

pub use decode::{Event, MessageValue};
pub use envelope::{Envelope, RawMessage, EVENT_VERSION_HEADER};
pub use rejection::Rejection;

#[cfg(test)]
mod tests {
    use uuid::Uuid;

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

    use outbox_writer::EventEnvelope;
    use uuid::Uuid;

    use super::*;

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
                        relay_headers: true,
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
            row.for_each_header(options, |k, v| headers.push((k.to_owned(), v.map(<[u8]>::to_vec))));
            let msg = RawMessage {
                topic: row.topic("p."),
                partition: 0,
                offset: 0,
                key: row.message_key().map(|k| k.as_bytes().to_vec()),
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
