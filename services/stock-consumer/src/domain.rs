//! Where an order's reservation is, and the kinds of stock movements.
//!
//! ```text
//! (OrderPaid) ──all lines available──> RESERVED ──shipped──> DEDUCTED ──returned──> RESTOCKED
//!      │                                  └──cancelled / refunded before shipping──> RELEASED
//!      └──some line short──> REJECTED
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
    /// Every line is reserved.
    Reserved,
    /// Some line lacked stock; nothing was reserved. Final.
    Rejected,
    /// Given back before shipping. Final.
    Released,
    /// Shipped: the goods left the warehouse.
    Deducted,
    /// Returned goods were put back on hand. Final.
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

/// A stock change of one order line; at most one of each kind per line (a unique key).
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

    /// The reservation move this kind of movement makes: `(from, to)`.
    pub fn transition(self) -> (ReservationStatus, ReservationStatus) {
        use ReservationStatus::*;
        match self {
            Self::Reserve => (Reserved, Reserved),
            Self::Release => (Reserved, Released),
            Self::Deduct => (Reserved, Deducted),
            Self::Restock => (Deducted, Restocked),
        }
    }
}

pub use outbox_kit::validate::ValidationError;
use outbox_kit::validate::{Chars, IntRange, TextRule};

outbox_kit::text_newtype!(
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
            assert_eq!(k.transition().0, ReservationStatus::Reserved);
        }
        assert_eq!(
            Restock.transition(),
            (ReservationStatus::Deducted, ReservationStatus::Restocked)
        );
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
