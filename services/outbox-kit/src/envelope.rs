//! The event envelope: how an outbox row becomes a Kafka message (shared DESIGN.md, "On the
//! broker"). Topic = explicit `topic` or `<prefix><aggregate_type>`, key = `aggregate_id`,
//! value = `payload` as JSON, headers = the contract headers then the row's extra headers.

use chrono::{DateTime, SecondsFormat, Utc};
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

/// One outbox row as the relay reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventEnvelope {
    /// Outbox sequence number: relay order within an aggregate.
    pub id: i64,
    /// The event's identity end to end.
    pub event_id: Uuid,
    /// Routes the topic.
    pub aggregate_type: String,
    /// The Kafka message key.
    pub aggregate_id: String,
    /// E.g. `OrderPaid`.
    pub event_type: String,
    /// The message value: JSON text.
    pub payload: String,
    /// Extra headers as a JSON object (values that are not strings are sent as JSON text).
    pub headers: serde_json::Value,
    /// Explicit topic, overriding the routing.
    pub topic: Option<String>,
    /// When the event was written (its transaction's start time).
    pub created_at: DateTime<Utc>,
}

impl EventEnvelope {
    /// The topic this event goes to under the given prefix.
    pub fn topic(&self, prefix: &str) -> String {
        match &self.topic {
            Some(t) if !t.is_empty() => t.clone(),
            _ => format!("{prefix}{}", self.aggregate_type),
        }
    }

    /// Calls `f` with each message header in contract order (see [`EventEnvelope::kafka_headers`])
    /// without allocating per header: the relay's hot path.
    pub fn for_each_header(&self, mut f: impl FnMut(&str, &[u8])) {
        let mut id = Uuid::encode_buffer();
        let id = self.event_id.hyphenated().encode_lower(&mut id).as_bytes();
        f("id", id);
        f("event_id", id);
        f("event_type", self.event_type.as_bytes());
        f("aggregate_type", self.aggregate_type.as_bytes());
        f("aggregate_id", self.aggregate_id.as_bytes());
        let mut at = [0u8; 32];
        f("occurred_at", rfc3339_micros(&self.created_at, &mut at));
        if let serde_json::Value::Object(extra) = &self.headers {
            if extra.is_empty() {
                return;
            }
            let mut keys: Vec<&String> = extra.keys().collect();
            keys.sort();
            for k in keys {
                if CONTRACT_HEADERS.contains(&k.as_str()) {
                    continue;
                }
                match &extra[k] {
                    serde_json::Value::String(s) => f(k, s.as_bytes()),
                    other => f(k, other.to_string().as_bytes()),
                }
            }
        }
    }

    /// The message headers in contract order: `id`, `event_id`, `event_type`,
    /// `aggregate_type`, `aggregate_id`, `occurred_at`, then each key of the row's `headers`
    /// (sorted by key) that does not collide with a contract header.
    pub fn kafka_headers(&self) -> Vec<(String, String)> {
        let event_id = self.event_id.to_string();
        let mut out = vec![
            ("id".to_owned(), event_id.clone()),
            ("event_id".to_owned(), event_id),
            ("event_type".to_owned(), self.event_type.clone()),
            ("aggregate_type".to_owned(), self.aggregate_type.clone()),
            ("aggregate_id".to_owned(), self.aggregate_id.clone()),
            (
                "occurred_at".to_owned(),
                self.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
            ),
        ];
        if let serde_json::Value::Object(extra) = &self.headers {
            let mut keys: Vec<&String> = extra.keys().collect();
            keys.sort();
            for k in keys {
                if CONTRACT_HEADERS.contains(&k.as_str()) {
                    continue;
                }
                let v = match &extra[k] {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out.push((k.clone(), v));
            }
        }
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
    use chrono::TimeZone;

    fn sample() -> EventEnvelope {
        EventEnvelope {
            id: 7,
            event_id: Uuid::parse_str("7d1f4b8e-2f0a-4c3e-9b1a-0c7e5d6f8a90").unwrap(),
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "OrderPaid".into(),
            payload: r#"{"order_id":"42"}"#.into(),
            headers: serde_json::json!({"traceparent": "00-abc-01", "retries": 3, "id": "evil"}),
            topic: None,
            created_at: Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap(),
        }
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
    fn headers_follow_the_contract_then_extras() {
        let h = sample().kafka_headers();
        let names: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
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
    fn the_allocation_free_headers_equal_the_contract_headers() {
        let mut e = sample();
        for nanos in [0, 5_000, 999_999_999, 123_456_789] {
            e.created_at = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 58).unwrap()
                + chrono::Duration::nanoseconds(nanos);
            let mut got = Vec::new();
            e.for_each_header(|k, v| {
                got.push((k.to_owned(), String::from_utf8(v.to_vec()).unwrap()))
            });
            assert_eq!(got, e.kafka_headers());
        }
    }

    #[test]
    fn extra_headers_cannot_override_contract_headers() {
        let h = sample().kafka_headers();
        assert!(h.iter().all(|(k, v)| k != "id" || v != "evil"));
        assert_eq!(h.iter().filter(|(k, _)| k == "id").count(), 1);
    }
}
