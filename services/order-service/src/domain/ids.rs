//! Identifiers and short texts, each validated once when parsed.

use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use outbox_http::text_newtype;
use outbox_http::validate::{Chars, TextRule};

text_newtype!(
    /// The buyer, as the caller identifies them. Idempotency keys are scoped to it.
    UserId,
    TextRule::new(128, Chars::VisibleAscii)
);
text_newtype!(
    /// A catalog entry's identifier (`[A-Za-z0-9._:-]`).
    SkuId,
    TextRule::new(64, Chars::Token)
);
text_newtype!(
    /// A catalog entry's display name.
    SkuName,
    TextRule::new(200, Chars::Text)
);
text_newtype!(
    /// The client's `Idempotency-Key`: 1 to 128 printable ASCII characters.
    IdempotencyKey,
    TextRule::new(128, Chars::PrintableAscii)
);
text_newtype!(
    /// The payment provider's transaction id; unique across all payments.
    TransactionId,
    TextRule::new(128, Chars::VisibleAscii)
);
text_newtype!(
    /// The merchant's refund number; unique across all refunds.
    RefundNo,
    TextRule::new(64, Chars::VisibleAscii)
);
text_newtype!(
    /// Why a refund is asked for, shown to operators and downstream systems.
    RefundReason,
    TextRule::new(500, Chars::Text)
);

/// An order's identifier (a UUID assigned by the database).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct OrderId(Uuid);

impl OrderId {
    /// Parses an id from a path segment or a callback body. `None` when it is not a UUID: no
    /// order has such an id, so callers answer "not found".
    pub fn parse(value: &str) -> Option<Self> {
        Uuid::parse_str(value).ok().map(Self)
    }

    /// The UUID.
    pub fn uuid(self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for OrderId {
    fn from(id: Uuid) -> Self {
        Self(id)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_key_is_1_to_128_printable_chars() {
        assert!(IdempotencyKey::parse("k", "a".into()).is_ok());
        assert!(IdempotencyKey::parse("k", "order 2026-05-17 #1".into()).is_ok());
        assert!(IdempotencyKey::parse("k", "x".repeat(128)).is_ok());
        assert!(IdempotencyKey::parse("k", String::new()).is_err());
        assert!(IdempotencyKey::parse("k", "x".repeat(129)).is_err());
        assert!(IdempotencyKey::parse("k", "tab\there".into()).is_err());
        assert!(IdempotencyKey::parse("k", "naïve".into()).is_err());
    }

    #[test]
    fn sku_ids_are_tokens() {
        assert!(SkuId::parse("sku", "SKU-1.a_b:2".into()).is_ok());
        let err = SkuId::parse("sku_id", "has space".into()).unwrap_err();
        assert_eq!(err.field, "sku_id");
        assert!(SkuId::parse("sku", "x".repeat(65)).is_err());
    }

    #[test]
    fn names_allow_unicode_but_not_control_characters() {
        assert!(SkuName::parse("name", "咖啡杯 350ml".into()).is_ok());
        assert!(SkuName::parse("name", "bad\u{0}".into()).is_err());
        assert!(RefundReason::parse("reason", "破损".into()).is_ok());
    }

    #[test]
    fn order_ids_are_uuids() {
        assert!(OrderId::parse("6f1c2b0e-0d7a-4a53-9f5e-2b8d3c4e5f60").is_some());
        assert!(OrderId::parse("42").is_none());
    }
}
