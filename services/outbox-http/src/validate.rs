//! The one validator of client text and numbers, used at every service's edge (path
//! identifiers, body strings, integer fields) and, with feature `service`, the source of the
//! matching OpenAPI schemas: a [`TextRule`] or [`IntRange`] is both the check the server runs
//! and the `minLength` / `maxLength` / `pattern` / `minimum` / `maximum` the document shows, so
//! the two cannot drift.
//!
//! Every rule rejects NUL and other control characters (PostgreSQL refuses NUL in `text`, and
//! a raw segment reaching SQL used to be a 500) and bounds the length, so no client string
//! reaches SQL unvalidated.

use std::fmt;

/// A request field that failed validation: which one (a JSON path such as `items[2].quantity`,
/// or a path / query parameter's name) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// Where the problem is.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ValidationError {
    /// A validation error for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Which characters a text may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chars {
    /// Letters, digits and `-_.:` (identifiers: SKU ids, outbound numbers).
    Token,
    /// Tokens without `:` (tracking numbers).
    TokenNoColon,
    /// Printable ASCII without space (`!`..`~`: user ids, transaction ids, refund numbers).
    VisibleAscii,
    /// Printable ASCII with space (idempotency keys).
    PrintableAscii,
    /// Any character except control characters (`U+0000`-`U+001F`, `U+007F`-`U+009F`): names,
    /// reasons, carriers.
    Text,
}

impl Chars {
    /// Whether `c` is allowed.
    pub fn allows(self, c: char) -> bool {
        match self {
            Self::Token => c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'),
            Self::TokenNoColon => c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'),
            Self::VisibleAscii => c.is_ascii_graphic(),
            Self::PrintableAscii => c == ' ' || c.is_ascii_graphic(),
            Self::Text => !c.is_control(),
        }
    }

    /// The same set as a regular-expression character class (ECMA 262 and Python `re` alike).
    pub fn class(self) -> &'static str {
        match self {
            Self::Token => "[A-Za-z0-9._:-]",
            Self::TokenNoColon => "[A-Za-z0-9._-]",
            Self::VisibleAscii => "[!-~]",
            Self::PrintableAscii => "[ -~]",
            Self::Text => "[^\\x00-\\x1f\\x7f-\\x9f]",
        }
    }

    /// The set in words, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Token => "letters, digits, '-', '_', '.' and ':'",
            Self::TokenNoColon => "letters, digits, '-', '_' and '.'",
            Self::VisibleAscii => "printable ASCII characters without spaces",
            Self::PrintableAscii => "printable ASCII characters",
            Self::Text => "non-control characters",
        }
    }
}

/// A text field's rule: 1 to `max_chars` characters (Unicode scalar values, as JSON Schema
/// counts them), each allowed by `chars`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextRule {
    /// Most characters.
    pub max_chars: usize,
    /// Allowed characters.
    pub chars: Chars,
}

impl TextRule {
    /// A rule of 1 to `max_chars` characters of `chars`.
    pub const fn new(max_chars: usize, chars: Chars) -> Self {
        Self { max_chars, chars }
    }

    /// Checks `value`; `field` names it in the error.
    ///
    /// # Errors
    /// When it is empty, too long or has a character that is not allowed.
    pub fn check(&self, field: &str, value: &str) -> Result<(), ValidationError> {
        if value.is_empty() {
            return Err(ValidationError::new(field, "must not be empty"));
        }
        // Counting stops early: an over-long input costs no more than the limit.
        if value.chars().nth(self.max_chars).is_some() {
            return Err(ValidationError::new(
                field,
                format!("must be at most {} characters", self.max_chars),
            ));
        }
        if !value.chars().all(|c| self.chars.allows(c)) {
            return Err(ValidationError::new(
                field,
                format!("may only contain {}", self.chars.describe()),
            ));
        }
        Ok(())
    }

    /// The rule as a regular expression anchored at both ends.
    pub fn pattern(&self) -> String {
        format!("^{}{{1,{}}}$", self.chars.class(), self.max_chars)
    }
}

/// An integer field's rule: `min..=max`. Both bounds are at most 2^53 in magnitude, so a JSON
/// number written with a fraction of zero (`159509.0`, an integer to JSON Schema) is read
/// exactly; see [`integer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRange {
    /// Smallest allowed.
    pub min: i64,
    /// Largest allowed.
    pub max: i64,
}

/// The largest integer every JSON reader holds exactly (2^53).
pub const MAX_EXACT_INTEGER: i64 = 1 << 53;

impl IntRange {
    /// `min..=max`.
    ///
    /// # Panics
    /// At compile time (the rules are constants) when a bound is beyond ±2^53 or `min > max`.
    pub const fn new(min: i64, max: i64) -> Self {
        assert!(min <= max);
        assert!(min >= -MAX_EXACT_INTEGER && max <= MAX_EXACT_INTEGER);
        Self { min, max }
    }

    /// Checks `value`; `field` names it in the error.
    ///
    /// # Errors
    /// When it is out of range.
    pub fn check(&self, field: &str, value: i64) -> Result<(), ValidationError> {
        if value < self.min || value > self.max {
            return Err(ValidationError::new(
                field,
                format!("must be between {} and {}", self.min, self.max),
            ));
        }
        Ok(())
    }
}

/// An integer read from any JSON number with no fractional part: `7`, `7.0` and `7e0` are
/// the same integer to JSON Schema (`"type": "integer"`), so the server takes all three. A
/// value with a fraction, or beyond ±2^53 written as a float (where it is not exact), is
/// refused. Use as `#[serde(deserialize_with = "outbox_http::validate::integer")]`.
///
/// # Errors
/// When the value is not a number, has a fraction, or does not fit.
pub fn integer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = i64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an integer")
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| E::custom("integer out of range"))
        }

        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<i64, E> {
            // Exactly representable and integral: the cast is lossless.
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            if v.fract() == 0.0 && v.abs() <= MAX_EXACT_INTEGER as f64 {
                Ok(v as i64)
            } else if v.fract() == 0.0 {
                Err(E::custom("integer out of range"))
            } else {
                Err(E::invalid_type(serde::de::Unexpected::Float(v), &self))
            }
        }
    }
    deserializer.deserialize_any(Visitor)
}

/// `Some(integer)` for an optional integer field; see [`integer`].
///
/// # Errors
/// As [`integer`].
pub fn optional_integer<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    #[derive(serde::Deserialize)]
    struct Wrap(#[serde(deserialize_with = "integer")] i64);
    let v: Option<Wrap> = serde::Deserialize::deserialize(deserializer)?;
    Ok(v.map(|w| w.0))
}

mod openapi {
    use utoipa::openapi::schema::{Object, ObjectBuilder, SchemaFormat, SchemaType, Type};
    use utoipa::openapi::KnownFormat;

    use super::{IntRange, TextRule};

    impl TextRule {
        /// The rule as a JSON Schema string: `minLength: 1`, `maxLength`, `pattern`.
        pub fn schema(&self) -> Object {
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .min_length(Some(1))
                .max_length(Some(self.max_chars))
                .pattern(Some(self.pattern()))
                .build()
        }
    }

    impl IntRange {
        /// The rule as a JSON Schema integer: `minimum`, `maximum`, `format: int64`.
        pub fn schema(&self) -> Object {
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::Integer))
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                .minimum(Some(self.min))
                .maximum(Some(self.max))
                .build()
        }
    }
}

/// Declares a validated text newtype checked by a [`TextRule`]: `parse(field, value)`,
/// `as_str`, `Display`, `Serialize` (as the text) and, for the OpenAPI document, a schema
/// built from the same rule.
///
/// ```ignore
/// outbox_http::text_newtype!(
///     /// A catalog entry's identifier.
///     SkuId, TextRule::new(64, Chars::Token)
/// );
/// ```
#[macro_export]
macro_rules! text_newtype {
    ($(#[$doc:meta])* $name:ident, $rule:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// What a valid value is.
            pub const RULE: $crate::validate::TextRule = $rule;

            /// Validates `value`; `field` names it in the error.
            ///
            /// # Errors
            /// When it is empty, too long or has a character that is not allowed.
            pub fn parse(
                field: &str,
                value: String,
            ) -> Result<Self, $crate::validate::ValidationError> {
                Self::RULE.check(field, &value)?;
                Ok(Self(value))
            }

            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The rule as an inline JSON Schema, for a wire field kept as a `String`:
            /// `#[schema(schema_with = Name::schema_object)]`.
            pub fn schema_object() -> $crate::__utoipa::openapi::schema::Object {
                Self::RULE.schema()
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl $crate::__utoipa::PartialSchema for $name {
            fn schema(
            ) -> $crate::__utoipa::openapi::RefOr<$crate::__utoipa::openapi::schema::Schema> {
                $crate::__utoipa::openapi::schema::Schema::Object(Self::RULE.schema()).into()
            }
        }

        impl $crate::__utoipa::ToSchema for $name {}
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: TextRule = TextRule::new(4, Chars::Token);

    #[test]
    fn text_rules_bound_length_and_characters() {
        assert!(TOKEN.check("f", "ab:1").is_ok());
        assert_eq!(
            TOKEN.check("f", "").unwrap_err().message,
            "must not be empty"
        );
        assert!(TOKEN.check("f", "abcde").is_err());
        assert_eq!(TOKEN.check("f", "a\0").unwrap_err().field, "f");
        assert!(TextRule::new(9, Chars::Text).check("f", "咖啡杯").is_ok());
        assert!(TextRule::new(9, Chars::Text).check("f", "a\u{85}").is_err());
        assert!(TextRule::new(9, Chars::PrintableAscii)
            .check("f", "a b")
            .is_ok());
        assert!(TextRule::new(9, Chars::VisibleAscii)
            .check("f", "a b")
            .is_err());
        assert_eq!(TOKEN.pattern(), "^[A-Za-z0-9._:-]{1,4}$");
    }

    #[test]
    fn integers_accept_integral_floats_only() {
        #[derive(serde::Deserialize)]
        struct B {
            #[serde(deserialize_with = "integer")]
            n: i64,
        }
        let n = |s: &str| serde_json::from_str::<B>(s).map(|b| b.n);
        assert_eq!(n(r#"{"n": 159509}"#).unwrap(), 159_509);
        assert_eq!(n(r#"{"n": 159509.0}"#).unwrap(), 159_509);
        assert_eq!(n(r#"{"n": 1.59509e5}"#).unwrap(), 159_509);
        assert_eq!(n(r#"{"n": -3.0}"#).unwrap(), -3);
        assert!(n(r#"{"n": 1.5}"#).is_err());
        assert!(n(r#"{"n": 1e300}"#).is_err());
        assert!(n(r#"{"n": 18446744073709551615}"#).is_err());
        assert!(n(r#"{"n": "1"}"#).is_err());
        assert!(n(r#"{"n": null}"#).is_err());
        let r = IntRange::new(1, 10);
        assert!(r.check("q", 0).is_err());
        assert!(r.check("q", 10).is_ok());
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    const RULES: [TextRule; 5] = [
        TextRule::new(8, Chars::Token),
        TextRule::new(8, Chars::TokenNoColon),
        TextRule::new(8, Chars::VisibleAscii),
        TextRule::new(8, Chars::PrintableAscii),
        TextRule::new(8, Chars::Text),
    ];

    /// Strings near the rules' edges: empty, at and past the limit, control characters, NUL,
    /// non-ASCII, `:` and spaces.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,12}",
            "[a-z:. \\x00\\x1f\\x7f\\u{85}é咖-]{0,10}",
            any::<String>(),
        ]
    }

    proptest! {
        /// The server's check and the document's pattern accept exactly the same strings.
        #[test]
        fn check_accepts_exactly_what_the_pattern_matches(s in text()) {
            for rule in RULES {
                let pattern = regex::Regex::new(&rule.pattern()).unwrap();
                prop_assert_eq!(
                    rule.check("f", &s).is_ok(),
                    pattern.is_match(&s),
                    "{:?} on {:?}", rule, s
                );
            }
        }

        /// Any JSON number: read as an integer exactly when it is integral and exact, and then
        /// the value is the number.
        #[test]
        fn integers_read_any_number_without_panicking(f in any::<f64>(), i in any::<i64>()) {
            #[derive(serde::Deserialize)]
            struct B {
                #[serde(deserialize_with = "integer")]
                n: i64,
            }
            let read = |json: String| serde_json::from_str::<B>(&json).map(|b| b.n);
            prop_assert_eq!(read(format!("{{\"n\": {i}}}")).unwrap(), i);
            if f.is_finite() {
                // What the JSON text reads as: serde_json's float parsing may land one unit in
                // the last place away from `f` (e.g. -4081030588428618.0 read as ...617.5), and
                // the rule is about the number read.
                let text = format!("{f:?}");
                let f: f64 = serde_json::from_str(&text).unwrap();
                let got = read(format!("{{\"n\": {text}}}"));
                #[allow(clippy::cast_precision_loss)]
                let exact = f.fract() == 0.0 && f.abs() <= MAX_EXACT_INTEGER as f64;
                prop_assert_eq!(got.is_ok(), exact, "{}", f);
                #[allow(clippy::cast_precision_loss)]
                if let Ok(n) = got {
                    prop_assert_eq!(n as f64, f);
                }
            }
        }
    }
}
