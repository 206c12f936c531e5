//! Identifiers and short texts, each validated once when parsed.

use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use super::ValidationError;

/// Checks length (in characters) and that every character is allowed.
fn check_text(
    field: &str,
    value: &str,
    max_chars: usize,
    allowed: fn(char) -> bool,
    allowed_desc: &str,
) -> Result<(), ValidationError> {
    let len = value.chars().count();
    if len == 0 {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if len > max_chars {
        return Err(ValidationError::new(
            field,
            format!("must be at most {max_chars} characters"),
        ));
    }
    if !value.chars().all(allowed) {
        return Err(ValidationError::new(
            field,
            format!("may only contain {allowed_desc}"),
        ));
    }
    Ok(())
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

fn is_printable_ascii(c: char) -> bool {
    c == ' ' || c.is_ascii_graphic()
}

fn is_visible_ascii(c: char) -> bool {
    c.is_ascii_graphic()
}

fn is_text_char(c: char) -> bool {
    !c.is_control()
}

macro_rules! text_newtype {
    ($(#[$doc:meta])* $name:ident, max = $max:expr, allowed = $allowed:expr, desc = $desc:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Most characters allowed.
            pub const MAX_CHARS: usize = $max;

            /// Validates `value`; `field` names it in the error.
            ///
            /// # Errors
            /// When it is empty, too long or has a character that is not allowed.
            pub fn parse(field: &str, value: String) -> Result<Self, ValidationError> {
                check_text(field, &value, $max, $allowed, $desc)?;
                Ok(Self(value))
            }

            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

text_newtype!(
    /// The buyer, as the caller identifies them. Idempotency keys are scoped to it.
    UserId, max = 128, allowed = is_visible_ascii, desc = "printable ASCII characters without spaces"
);
text_newtype!(
    /// A catalog entry's identifier (`[A-Za-z0-9._:-]`).
    SkuId, max = 64, allowed = is_token_char, desc = "letters, digits, '-', '_', '.' and ':'"
);
text_newtype!(
    /// A catalog entry's display name.
    SkuName, max = 200, allowed = is_text_char, desc = "non-control characters"
);
text_newtype!(
    /// The client's `Idempotency-Key`: 1 to 128 printable ASCII characters.
    IdempotencyKey, max = 128, allowed = is_printable_ascii, desc = "printable ASCII characters"
);
text_newtype!(
    /// The payment provider's transaction id; unique across all payments.
    TransactionId, max = 128, allowed = is_visible_ascii, desc = "printable ASCII characters without spaces"
);
text_newtype!(
    /// The merchant's refund number; unique across all refunds.
    RefundNo, max = 64, allowed = is_visible_ascii, desc = "printable ASCII characters without spaces"
);
text_newtype!(
    /// Why a refund is asked for, shown to operators and downstream systems.
    RefundReason, max = 500, allowed = is_text_char, desc = "non-control characters"
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
