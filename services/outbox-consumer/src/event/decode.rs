//! The second decoding step, for event types the handler applies: the event version is checked
//! and the value read as JSON, bytes of another content type, or a tombstone
//! ([`Envelope::into_event`] gives the [`Event`]).

use uuid::Uuid;

use super::envelope::{Envelope, RawMessage};
use super::rejection::Rejection;
use crate::handler_error::HandlerError;

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
    /// [`HandlerError::Payload`] when it does not have that shape: the event
    /// goes to the dead-letter topic.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, HandlerError> {
        use serde::de::Error as _;
        match &self.value {
            MessageValue::Json => T::deserialize(&self.payload).map_err(HandlerError::Payload),
            MessageValue::Tombstone => Err(HandlerError::Payload(serde_json::Error::custom(
                "the event is a tombstone: it has no value",
            ))),
            MessageValue::Binary { content_type, .. } => Err(HandlerError::Payload(
                serde_json::Error::custom(format!("the value is {content_type}, not JSON")),
            )),
        }
    }

    /// True for a tombstone (the message has no value).
    pub fn is_tombstone(&self) -> bool {
        self.value == MessageValue::Tombstone
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
