//! Where an order's reservation is, and the kinds of stock movements.
//!
//! The status summarises the reservation's lines ([`crate::lines`] keeps their amounts):
//!
//! ```text
//! (OrderPaid) ──some line short──> REJECTED
//!      │
//!      └──all lines available──> RESERVED ↺ lines refunded before shipping: units released
//!                                 ├──cancelled, or every unit refunded──> RELEASED
//!                                 └──shipped, rest released──> DEDUCTED ↺ units back: restocked
//!                                                               └──all units back──> RESTOCKED
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A status text from the database that this version does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown reservation status `{0}`")]
pub struct UnknownStatus(String);

/// An order's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReservationStatus {
    /// Every line is reserved; some units may be released already (refunded before shipping).
    Reserved,
    /// Some line lacked stock; nothing was reserved. Final.
    Rejected,
    /// Every unit given back before shipping. Final.
    Released,
    /// Shipped: the goods left the warehouse (what did not ship was released); some units may
    /// be back on hand already (a partial return).
    Deducted,
    /// Every deducted unit was returned and put back on hand. Final.
    Restocked,
}

impl ReservationStatus {
    /// The status as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "RESERVED",
            Self::Rejected => "REJECTED",
            Self::Released => "RELEASED",
            Self::Deducted => "DEDUCTED",
            Self::Restocked => "RESTOCKED",
        }
    }
}

impl fmt::Display for ReservationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReservationStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "RESERVED" => Self::Reserved,
            "REJECTED" => Self::Rejected,
            "RELEASED" => Self::Released,
            "DEDUCTED" => Self::Deducted,
            "RESTOCKED" => Self::Restocked,
            other => return Err(UnknownStatus(other.to_owned())),
        })
    }
}

impl TryFrom<String> for ReservationStatus {
    type Error = UnknownStatus;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// A stock change of one order line. A line is reserved once and deducted once (a unique key);
/// it may be released and restocked in several steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MovementKind {
    /// `reserved += q`.
    Reserve,
    /// `reserved -= q`.
    Release,
    /// `on_hand -= q, reserved -= q`.
    Deduct,
    /// `on_hand += q`.
    Restock,
}

impl MovementKind {
    /// The kind as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserve => "RESERVE",
            Self::Release => "RELEASE",
            Self::Deduct => "DEDUCT",
            Self::Restock => "RESTOCK",
        }
    }

    /// How a movement of `quantity` changes `(on_hand, reserved)`.
    pub fn deltas(self, quantity: i64) -> (i64, i64) {
        match self {
            Self::Reserve => (0, quantity),
            Self::Release => (0, -quantity),
            Self::Deduct => (-quantity, -quantity),
            Self::Restock => (quantity, 0),
        }
    }

    /// The reservation status this kind of movement applies in: releases and deductions while
    /// goods are held, restocks once they shipped (and not all came back yet).
    pub fn applies_in(self) -> ReservationStatus {
        match self {
            Self::Reserve | Self::Release | Self::Deduct => ReservationStatus::Reserved,
            Self::Restock => ReservationStatus::Deducted,
        }
    }
}

pub use outbox_http::validate::ValidationError;
use outbox_http::validate::{Chars, IntRange, TextRule};

outbox_http::text_newtype!(
    /// A SKU id: 1-64 letters, digits and `-_.:`, like the order service's.
    SkuId,
    TextRule::new(64, Chars::Token)
);

/// Units on hand, as set by `PUT /stock/{sku_id}`: zero to [`OnHand::RANGE`]'s maximum (a
/// billion units, far beyond any warehouse, and exact in every JSON reader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnHand(i64);

impl OnHand {
    /// What a valid count is.
    pub const RANGE: IntRange = IntRange::new(0, 1_000_000_000);

    /// Validates a count of units.
    ///
    /// # Errors
    /// When it is negative or above the maximum.
    pub fn parse(value: i64) -> Result<Self, ValidationError> {
        Self::RANGE.check("on_hand", value)?;
        Ok(Self(value))
    }

    /// The count.
    pub fn get(self) -> i64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn movements_keep_what_is_available_consistent() {
        // Reserve then deduct takes the goods out once; reserve then release is a no-op;
        // a restock after a deduction puts them back.
        let sum = |kinds: &[MovementKind]| {
            kinds.iter().fold((0, 0), |(h, r), k| {
                let (dh, dr) = k.deltas(3);
                (h + dh, r + dr)
            })
        };
        use MovementKind::*;
        assert_eq!(sum(&[Reserve, Deduct]), (-3, 0));
        assert_eq!(sum(&[Reserve, Release]), (0, 0));
        assert_eq!(sum(&[Reserve, Deduct, Restock]), (0, 0));
        for k in [Release, Deduct] {
            assert_eq!(k.applies_in(), ReservationStatus::Reserved);
        }
        assert_eq!(Restock.applies_in(), ReservationStatus::Deducted);
    }

    #[test]
    fn inputs_are_validated() {
        assert!(SkuId::parse("sku_id", "SKU-1".into()).is_ok());
        assert!(SkuId::parse("sku_id", "a b".into()).is_err());
        assert!(SkuId::parse("sku_id", "\0abc".into()).is_err());
        assert!(OnHand::parse(OnHand::RANGE.max + 1).is_err());
        assert!(OnHand::parse(-1).is_err());
        assert_eq!(OnHand::parse(0).unwrap().get(), 0);
        for s in ["RESERVED", "REJECTED", "RELEASED", "DEDUCTED", "RESTOCKED"] {
            assert_eq!(s.parse::<ReservationStatus>().unwrap().as_str(), s);
        }
    }
}
