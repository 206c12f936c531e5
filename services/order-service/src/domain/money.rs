//! Money and quantities. Money is integer cents, never floats, and bounded so that sums of
//! bounded values cannot overflow an `i64`.

use serde::Serialize;

use outbox_http::validate::IntRange;

use super::ValidationError;

/// A positive amount of money in cents, at most [`Cents::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Cents(i64);

impl Cents {
    /// The largest amount accepted anywhere: 100 billion units of currency.
    pub const MAX: i64 = 10_000_000_000_000;

    /// What a valid amount is: 1 to [`Cents::MAX`] (the check and the OpenAPI schema).
    pub const RANGE: IntRange = IntRange::new(1, Self::MAX);

    /// Validates an amount; `field` names it in the error.
    ///
    /// # Errors
    /// When it is not positive or above [`Cents::MAX`].
    pub fn parse(field: &str, value: i64) -> Result<Self, ValidationError> {
        Self::RANGE.check(field, value)?;
        Ok(Self(value))
    }

    /// [`Cents::RANGE`] as an inline JSON Schema, for wire fields.
    pub fn schema_object() -> utoipa::openapi::schema::Object {
        Self::RANGE.schema()
    }

    /// The amount in cents.
    pub fn get(self) -> i64 {
        self.0
    }

    /// `self × quantity`, `None` above [`Cents::MAX`].
    pub fn times(self, quantity: Quantity) -> Option<Self> {
        self.0
            .checked_mul(i64::from(quantity.get()))
            .filter(|v| *v <= Self::MAX)
            .map(Self)
    }

    /// `self + other`, `None` above [`Cents::MAX`].
    pub fn plus(self, other: Self) -> Option<Self> {
        self.0
            .checked_add(other.0)
            .filter(|v| *v <= Self::MAX)
            .map(Self)
    }
}

/// How many units of a SKU an order line asks for: 1 to [`Quantity::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Quantity(i32);

impl Quantity {
    /// The largest quantity of one line.
    pub const MAX: i64 = 10_000;

    /// What a valid quantity is: 1 to [`Quantity::MAX`] (the check and the OpenAPI schema).
    pub const RANGE: IntRange = IntRange::new(1, Self::MAX);

    /// Validates a quantity; `field` names it in the error.
    ///
    /// # Errors
    /// When it is not between 1 and [`Quantity::MAX`].
    pub fn parse(field: &str, value: i64) -> Result<Self, ValidationError> {
        Self::RANGE.check(field, value)?;
        // In range by the check above.
        Ok(Self(value as i32))
    }

    /// [`Quantity::RANGE`] as an inline JSON Schema, for wire fields.
    pub fn schema_object() -> utoipa::openapi::schema::Object {
        Self::RANGE.schema()
    }

    /// The quantity.
    pub fn get(self) -> i32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cents_are_positive_and_bounded() {
        assert_eq!(Cents::parse("a", 1).unwrap().get(), 1);
        assert!(Cents::parse("a", 0).is_err());
        assert!(Cents::parse("a", -5).is_err());
        assert!(Cents::parse("a", Cents::MAX + 1).is_err());
    }

    #[test]
    fn arithmetic_stays_in_bounds() {
        let price = Cents::parse("p", 1_999).unwrap();
        let q = Quantity::parse("q", 3).unwrap();
        assert_eq!(price.times(q).unwrap().get(), 5_997);
        assert_eq!(price.plus(price).unwrap().get(), 3_998);
        let big = Cents::parse("p", Cents::MAX).unwrap();
        assert!(big.times(q).is_none());
        assert!(big.plus(price).is_none());
    }

    #[test]
    fn quantities_are_between_1_and_max() {
        assert!(Quantity::parse("q", 0).is_err());
        assert!(Quantity::parse("q", -1).is_err());
        assert!(Quantity::parse("q", Quantity::MAX + 1).is_err());
        assert_eq!(Quantity::parse("q", Quantity::MAX).unwrap().get(), 10_000);
    }
}
