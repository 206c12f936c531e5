//! The event envelope: how an outbox row becomes a Kafka message (shared DESIGN.md, "On the
//! broker"). Topic = explicit `topic` or `<prefix><aggregate_type>`, key = `message_key` or
//! `aggregate_id`, value = the JSON `payload`, the `payload_bytes` unchanged, or nothing (a
//! tombstone), headers = the contract headers, `content-type` of a binary payload, the
//! CloudEvents attributes when they are on ([`HeaderOptions`]), then the row's extra headers.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Default topic prefix; matches Debezium's outbox event router.
pub const DEFAULT_TOPIC_PREFIX: &str = "outbox.event.";

/// Header names the relay always sets. Extra headers from the row may not override them.
pub const CONTRACT_HEADERS: [&str; 6] = [
    "id",
    "event_id",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "occurred_at",
];

/// The `content-type` header: of a binary payload always, of a JSON one with CloudEvents on.
pub const CONTENT_TYPE_HEADER: &str = "content-type";
/// Content type of a JSON payload.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// Content type of a binary payload whose row names none.
pub const DEFAULT_BINARY_CONTENT_TYPE: &str = "application/octet-stream";
/// The CloudEvents attributes (Kafka protocol binding, binary mode) the relay sets from the
/// row; a row's extra header of one of these names is dropped while CloudEvents are on. Other
/// `ce_` headers of the row go through: they are the event's extension attributes.
pub const CLOUDEVENTS_HEADERS: [&str; 7] = [
    "ce_specversion",
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_subject",
    "ce_time",
    "ce_datacontenttype",
];

/// The message value of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// JSON text (the `payload` column, as PostgreSQL prints its `jsonb`).
    Json(String),
    /// Bytes published unchanged (`payload_bytes`), and their content type (`content_type`,
    /// [`DEFAULT_BINARY_CONTENT_TYPE`] when the row names none).
    Binary {
        /// The value.
        bytes: Vec<u8>,
        /// Its content type.
        content_type: String,
    },
    /// No value: a Kafka tombstone.
    Tombstone,
}

impl Payload {
    /// The message value; `None` for a tombstone.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Self::Json(text) => Some(text.as_bytes()),
            Self::Binary { bytes, .. } => Some(bytes),
            Self::Tombstone => None,
        }
    }

    /// Bytes of the value (0 for a tombstone).
    pub fn len(&self) -> usize {
        self.bytes().map_or(0, <[u8]>::len)
    }

    /// True for a tombstone or an empty value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value's content type: [`JSON_CONTENT_TYPE`], the binary payload's, none for a
    /// tombstone.
    pub fn content_type(&self) -> Option<&str> {
        match self {
            Self::Json(_) => Some(JSON_CONTENT_TYPE),
            Self::Binary { content_type, .. } => Some(content_type),
            Self::Tombstone => None,
        }
    }
}

/// What the relay adds to the contract headers, beyond the row itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderOptions<'a> {
    /// CloudEvents (Kafka protocol binding, binary mode) on, with this `ce_source`.
    pub cloudevents_source: Option<&'a str>,
    /// The `traceparent` to send instead of the row's (the relay's own span, a child of it).
    pub traceparent: Option<&'a str>,
}

/// One outbox row as the relay reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventEnvelope {
    /// Outbox sequence number: relay order within an aggregate.
    pub id: i64,
    /// The event's identity end to end.
    pub event_id: Uuid,
    /// Routes the topic.
    pub aggregate_type: String,
    /// The aggregate: the unit of ordering, and the Kafka key unless [`Self::key`] is set.
    pub aggregate_id: String,
    /// E.g. `OrderPaid`.
    pub event_type: String,
    /// The message value.
    pub payload: Payload,
    /// The Kafka key when it is not the aggregate id (`message_key`); empty for no key at all
    /// (see [`Self::message_key`]).
    pub key: Option<String>,
    /// Extra headers as a JSON object (values that are not strings are sent as JSON text).
    pub headers: serde_json::Value,
    /// Explicit topic, overriding the routing.
    pub topic: Option<String>,
    /// When the event was written (its transaction's start time).
    pub created_at: DateTime<Utc>,
    /// The relay's own headers go on the message (the `relay_headers` column, true but for
    /// rows copied from a Debezium-shaped table: their message carries the row's `headers`
    /// only, as Debezium's router sends them).
    pub relay_headers: bool,
}

impl EventEnvelope {
    /// The topic this event goes to under the given prefix.
    pub fn topic(&self, prefix: &str) -> String {
        match &self.topic {
            Some(t) if !t.is_empty() => t.clone(),
            _ => format!("{prefix}{}", self.aggregate_type),
        }
    }

    /// The Kafka message key: [`Self::key`], else the aggregate id; none for an empty
    /// [`Self::key`] (only a row without the relay's headers may have one: a row copied from a
    /// Debezium table whose key column was NULL, which Debezium sends without a key).
    pub fn message_key(&self) -> Option<&str> {
        match self.key.as_deref() {
            Some("") => None,
            Some(key) => Some(key),
            None => Some(&self.aggregate_id),
        }
    }

    /// The row's `traceparent` (from its `headers`), if it has one as a string.
    pub fn traceparent(&self) -> Option<&str> {
        self.headers
            .get(outbox_trace::TRACEPARENT)
            .and_then(serde_json::Value::as_str)
    }

    /// The row's `tracestate` (from its `headers`), if it has one as a string.
    pub fn tracestate(&self) -> Option<&str> {
        self.headers
            .get(outbox_trace::TRACESTATE)
            .and_then(serde_json::Value::as_str)
    }

    /// Calls `f` with each message header in contract order (see [`EventEnvelope::kafka_headers`])
    /// without allocating per header: the relay's hot path.
    /// A header without a value (`None`) comes only from a JSON null in the row's `headers`
    /// of a row without the relay's headers (a NULL column Debezium placed as a header).
    pub fn for_each_header(
        &self,
        options: HeaderOptions<'_>,
        mut f: impl FnMut(&str, Option<&[u8]>),
    ) {
        if !self.relay_headers {
            self.for_each_row_header(&mut f);
            return;
        }
        let mut f = |k: &str, v: &[u8]| f(k, Some(v));
        let mut id = Uuid::encode_buffer();
        let id = self.event_id.hyphenated().encode_lower(&mut id).as_bytes();
        f("id", id);
        f("event_id", id);
        f("event_type", self.event_type.as_bytes());
        f("aggregate_type", self.aggregate_type.as_bytes());
        f("aggregate_id", self.aggregate_id.as_bytes());
        let mut at = [0u8; 32];
        let at = rfc3339_micros(&self.created_at, &mut at);
        f("occurred_at", at);
        // The content type of a binary value always; of a JSON value only as a CloudEvent (a
        // JSON event without CloudEvents is what it always was).
        let content_type = match (&self.payload, options.cloudevents_source) {
            (Payload::Binary { content_type, .. }, _) => Some(content_type.as_str()),
            (Payload::Json(_), Some(_)) => Some(JSON_CONTENT_TYPE),
            _ => None,
        };
        if let Some(ct) = content_type {
            f(CONTENT_TYPE_HEADER, ct.as_bytes());
        }
        if let Some(source) = options.cloudevents_source {
            f("ce_specversion", b"1.0");
            f("ce_id", id);
            f("ce_source", source.as_bytes());
            f("ce_type", self.event_type.as_bytes());
            f("ce_subject", self.aggregate_id.as_bytes());
            f("ce_time", at);
        }
        if let serde_json::Value::Object(extra) = &self.headers {
            if extra.is_empty() {
                return;
            }
            let mut keys: Vec<&String> = extra.keys().collect();
            keys.sort();
            for k in keys {
                if CONTRACT_HEADERS.contains(&k.as_str())
                    || (content_type.is_some() && k.eq_ignore_ascii_case(CONTENT_TYPE_HEADER))
                    || (options.cloudevents_source.is_some()
                        && CLOUDEVENTS_HEADERS.contains(&k.as_str()))
                {
                    continue;
                }
                if k == outbox_trace::TRACEPARENT {
                    if let Some(own) = options.traceparent {
                        f(k, own.as_bytes());
                        continue;
                    }
                }
                match &extra[k] {
                    serde_json::Value::String(s) => f(k, s.as_bytes()),
                    other => f(k, other.to_string().as_bytes()),
                }
            }
        }
    }

    /// The row's `headers` alone, `id` first (Debezium's order: the event id, then the placed
    /// columns); a JSON null is a header without a value, other non-strings their JSON text.
    fn for_each_row_header(&self, f: &mut impl FnMut(&str, Option<&[u8]>)) {
        let serde_json::Value::Object(headers) = &self.headers else {
            return;
        };
        let mut keys: Vec<&String> = headers.keys().collect();
        keys.sort_by_key(|k| (k.as_str() != "id", k.as_str()));
        for k in keys {
            match &headers[k] {
                serde_json::Value::Null => f(k, None),
                serde_json::Value::String(s) => f(k, Some(s.as_bytes())),
                other => f(k, Some(other.to_string().as_bytes())),
            }
        }
    }

    /// The message headers in contract order: `id`, `event_id`, `event_type`,
    /// `aggregate_type`, `aggregate_id`, `occurred_at`, `content-type` (of a binary payload;
    /// of every payload with CloudEvents on), the CloudEvents attributes (`ce_specversion`,
    /// `ce_id`, `ce_source`, `ce_type`, `ce_subject`, `ce_time`) when they are on, then each key
    /// of the row's `headers` (sorted by key) that does not collide with a header set before.
    /// A header without a value reads as the empty string.
    pub fn kafka_headers(&self, options: HeaderOptions<'_>) -> Vec<(String, String)> {
        let mut out = Vec::with_capacity(8);
        self.for_each_header(options, |k, v| {
            let v = v.map(String::from_utf8_lossy).unwrap_or_default();
            out.push((k.to_owned(), v.into_owned()));
        });
        out
    }
}

/// Writes `t` as `YYYY-MM-DDTHH:MM:SS.ffffffZ` into `buf` (what
/// `to_rfc3339_opts(SecondsFormat::Micros, true)` gives for years 0-9999).
fn rfc3339_micros<'b>(t: &DateTime<Utc>, buf: &'b mut [u8; 32]) -> &'b [u8] {
    use chrono::{Datelike, Timelike};
    let (y, mo, d) = (t.year().clamp(0, 9999) as u32, t.month(), t.day());
    let (h, mi, s) = (t.hour(), t.minute(), t.second());
    // A leap second shows as nanosecond ≥ 1e9; chrono prints it as second 60.
    let (s, micros) = match t.nanosecond() {
        n if n >= 1_000_000_000 => (s + 1, (n - 1_000_000_000) / 1000),
        n => (s, n / 1000),
    };
    let mut put = |at: usize, v: u32, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            buf[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y, 4);
    put(5, mo, 2);
    put(8, d, 2);
    put(11, h, 2);
    put(14, mi, 2);
    put(17, s, 2);
    put(20, micros, 6);
    buf[4] = b'-';
    buf[7] = b'-';
    buf[10] = b'T';
    buf[13] = b':';
    buf[16] = b':';
    buf[19] = b'.';
    buf[26] = b'Z';
    &buf[..27]
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{SecondsFormat, TimeZone};

    fn sample() -> EventEnvelope {
        EventEnvelope {
            id: 7,
            event_id: Uuid::parse_str("7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90").unwrap(),
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "OrderPaid".into(),
            payload: Payload::Json(r#"{"order_id":"42"}"#.into()),
            key: None,
            headers: serde_json::json!({"traceparent": "00-abc-01", "retries": 3, "id": "evil"}),
            topic: None,
            created_at: Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap(),
            relay_headers: true,
        }
    }

    fn names(h: &[(String, String)]) -> Vec<&str> {
        h.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn value<'h>(h: &'h [(String, String)], name: &str) -> Option<&'h str> {
        h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn routes_by_aggregate_type_with_prefix() {
        let e = sample();
        assert_eq!(e.topic(DEFAULT_TOPIC_PREFIX), "outbox.event.order");
        assert_eq!(e.topic("staging."), "staging.order");
    }

    #[test]
    fn explicit_topic_overrides_routing() {
        let mut e = sample();
        e.topic = Some("payments.audit".into());
        assert_eq!(e.topic(DEFAULT_TOPIC_PREFIX), "payments.audit");
        e.topic = Some(String::new());
        assert_eq!(e.topic(DEFAULT_TOPIC_PREFIX), "outbox.event.order");
    }

    #[test]
    fn the_key_is_the_aggregate_id_unless_the_row_names_one() {
        let mut e = sample();
        assert_eq!(e.message_key(), Some("42"));
        e.key = Some("customer-9".into());
        assert_eq!(e.message_key(), Some("customer-9"));
        let h = e.kafka_headers(HeaderOptions::default());
        assert_eq!(
            value(&h, "aggregate_id"),
            Some("42"),
            "the header stays the aggregate"
        );
        e.key = Some(String::new());
        e.relay_headers = false;
        assert_eq!(
            e.message_key(),
            None,
            "an empty key: a record without a key"
        );
    }

    #[test]
    fn headers_follow_the_contract_then_extras() {
        let h = sample().kafka_headers(HeaderOptions::default());
        assert_eq!(
            names(&h),
            [
                "id",
                "event_id",
                "event_type",
                "aggregate_type",
                "aggregate_id",
                "occurred_at",
                "retries",
                "traceparent"
            ]
        );
        assert_eq!(h[0].1, "7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90");
        assert_eq!(h[0].1, h[1].1, "id and event_id carry the same event id");
        assert_eq!(h[2].1, "OrderPaid");
        assert_eq!(h[3].1, "order");
        assert_eq!(h[4].1, "42");
        assert_eq!(h[5].1, "2026-01-02T03:04:05.000000Z");
        assert_eq!(h[6].1, "3", "non-string values are sent as JSON text");
        assert_eq!(h[7].1, "00-abc-01");
    }

    #[test]
    fn without_the_relays_headers_only_the_rows_go_out_id_first_null_without_value() {
        let mut e = sample();
        e.relay_headers = false;
        e.headers =
            serde_json::json!({"eventType": "OrderPaid", "id": "e-1", "n": 7, "tenant": null});
        let mut seen = Vec::new();
        e.for_each_header(HeaderOptions::default(), |k, v| {
            seen.push((k.to_owned(), v.map(<[u8]>::to_vec)));
        });
        assert_eq!(
            seen,
            [
                ("id".to_owned(), Some(b"e-1".to_vec())),
                ("eventType".to_owned(), Some(b"OrderPaid".to_vec())),
                ("n".to_owned(), Some(b"7".to_vec())),
                ("tenant".to_owned(), None),
            ]
        );
    }

    #[test]
    fn occurred_at_is_rfc3339_with_microseconds() {
        let mut e = sample();
        for nanos in [0, 5_000, 999_999_999, 123_456_789] {
            e.created_at = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 58).unwrap()
                + chrono::Duration::nanoseconds(nanos);
            let h = e.kafka_headers(HeaderOptions::default());
            assert_eq!(
                value(&h, "occurred_at").unwrap(),
                e.created_at.to_rfc3339_opts(SecondsFormat::Micros, true)
            );
        }
    }

    #[test]
    fn extra_headers_cannot_override_contract_headers() {
        let h = sample().kafka_headers(HeaderOptions::default());
        assert!(h.iter().all(|(k, v)| k != "id" || v != "evil"));
        assert_eq!(h.iter().filter(|(k, _)| k == "id").count(), 1);
    }

    #[test]
    fn a_binary_payload_names_its_content_type_and_a_json_one_does_not() {
        let mut e = sample();
        assert_eq!(
            value(
                &e.kafka_headers(HeaderOptions::default()),
                CONTENT_TYPE_HEADER
            ),
            None
        );
        e.payload = Payload::Binary {
            bytes: vec![0, 255, 10],
            content_type: "application/x-protobuf".into(),
        };
        e.headers = serde_json::json!({"content-type": "text/plain", "Content-Type": "x"});
        let h = e.kafka_headers(HeaderOptions::default());
        assert_eq!(
            value(&h, CONTENT_TYPE_HEADER),
            Some("application/x-protobuf")
        );
        assert_eq!(
            h.iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(CONTENT_TYPE_HEADER))
                .count(),
            1,
            "the row cannot name a second content type: {h:?}"
        );
        e.payload = Payload::Tombstone;
        assert_eq!(e.payload.bytes(), None);
        assert_eq!(
            value(&e.kafka_headers(HeaderOptions::default()), "content-type"),
            Some("text/plain"),
            "a tombstone has no content type of its own; the row's extra header goes through"
        );
    }

    #[test]
    fn cloudevents_attributes_come_from_the_row() {
        let mut e = sample();
        e.headers = serde_json::json!({"ce_id": "forged", "ce_tenant": "x", "traceparent": "t"});
        let options = HeaderOptions {
            cloudevents_source: Some("/orders"),
            traceparent: None,
        };
        let h = e.kafka_headers(options);
        assert_eq!(value(&h, "ce_specversion"), Some("1.0"));
        assert_eq!(
            value(&h, "ce_id"),
            Some("7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90")
        );
        assert_eq!(value(&h, "ce_source"), Some("/orders"));
        assert_eq!(value(&h, "ce_type"), Some("OrderPaid"));
        assert_eq!(value(&h, "ce_subject"), Some("42"));
        assert_eq!(value(&h, "ce_time"), Some("2026-01-02T03:04:05.000000Z"));
        assert_eq!(value(&h, CONTENT_TYPE_HEADER), Some(JSON_CONTENT_TYPE));
        assert_eq!(
            value(&h, "ce_tenant"),
            Some("x"),
            "extension attributes go through"
        );
        assert_eq!(h.iter().filter(|(k, _)| k == "ce_id").count(), 1);
        let off = e.kafka_headers(HeaderOptions::default());
        assert!(
            off.iter()
                .all(|(k, _)| k != "ce_specversion" && k != CONTENT_TYPE_HEADER),
            "off: no CloudEvents attribute of the relay's: {off:?}"
        );
    }

    #[test]
    fn the_relay_span_replaces_the_writers_traceparent() {
        let e = sample();
        let h = e.kafka_headers(HeaderOptions {
            cloudevents_source: None,
            traceparent: Some("00-relay-01"),
        });
        assert_eq!(value(&h, "traceparent"), Some("00-relay-01"));
        assert_eq!(h.iter().filter(|(k, _)| k == "traceparent").count(), 1);
        assert_eq!(
            e.traceparent(),
            Some("00-abc-01"),
            "the row keeps the writer's"
        );
    }
}
