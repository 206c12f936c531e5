//! The order and refund state machines. Transitions only move forward; the SQL enforces them
//! with conditional updates (`... WHERE status = $expected`), these types name them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A status text from the database that this version does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown status `{0}`")]
pub struct UnknownStatus(String);

/// Where an order is in its life.
///
/// ```text
/// PENDING_PAYMENT ──pay──> PAID ──ship──> SHIPPED ──complete──> COMPLETED
///        └──cancel──> CANCELLED <──stock rejected──┘ (from PAID)
/// ```
/// `PAID -> SHIPPED` (the WMS shipped it) and `PAID -> CANCELLED` (its stock could not be
/// reserved; the payment is flagged for refund) are driven by consumed events
/// ([`crate::fulfilment`]); every move goes through [`crate::store::orders::transition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    /// Created, waiting for the payment provider's notification.
    PendingPayment,
    /// Paid exactly once.
    Paid,
    /// Handed to the warehouse.
    Shipped,
    /// Delivered; final.
    Completed,
    /// Cancelled before payment, or after it for lack of stock; final.
    Cancelled,
}

impl OrderStatus {
    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingPayment => "PENDING_PAYMENT",
            Self::Paid => "PAID",
            Self::Shipped => "SHIPPED",
            Self::Completed => "COMPLETED",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// Whether `self -> to` is a legal (forward) transition.
    pub fn can_become(self, to: Self) -> bool {
        matches!(
            (self, to),
            (Self::PendingPayment, Self::Paid)
                | (Self::PendingPayment, Self::Cancelled)
                | (Self::Paid, Self::Shipped)
                | (Self::Paid, Self::Cancelled)
                | (Self::Shipped, Self::Completed)
        )
    }

    /// Whether money was taken for the order, so refunds may be asked for.
    pub fn is_paid(self) -> bool {
        matches!(self, Self::Paid | Self::Shipped | Self::Completed)
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OrderStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "PENDING_PAYMENT" => Self::PendingPayment,
            "PAID" => Self::Paid,
            "SHIPPED" => Self::Shipped,
            "COMPLETED" => Self::Completed,
            "CANCELLED" => Self::Cancelled,
            other => return Err(UnknownStatus(other.to_owned())),
        })
    }
}

impl TryFrom<String> for OrderStatus {
    type Error = UnknownStatus;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Where a refund is: `REQUESTED -> SUCCEEDED` or `REQUESTED -> CLOSED`, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefundStatus {
    /// Asked for; the provider has not answered yet. Its amount is reserved.
    Requested,
    /// The money went back to the buyer; final.
    Succeeded,
    /// The provider closed the refund without paying; final, and its amount is free again.
    Closed,
}

impl RefundStatus {
    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "REQUESTED",
            Self::Succeeded => "SUCCEEDED",
            Self::Closed => "CLOSED",
        }
    }

    /// Whether the refund reached its final state.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Requested)
    }
}

impl fmt::Display for RefundStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for RefundStatus {
    type Error = UnknownStatus;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Ok(match s.as_str() {
            "REQUESTED" => Self::Requested,
            "SUCCEEDED" => Self::Succeeded,
            "CLOSED" => Self::Closed,
            _ => return Err(UnknownStatus(s)),
        })
    }
}

/// A refund outcome as the provider reports it (`SUCCESS` or `CLOSED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefundOutcome {
    /// The refund was paid out.
    Success,
    /// The refund was closed without paying out.
    Closed,
}

impl RefundOutcome {
    /// The refund status this outcome leads to.
    pub fn status(self) -> RefundStatus {
        match self {
            Self::Success => RefundStatus::Succeeded,
            Self::Closed => RefundStatus::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [OrderStatus; 5] = [
        OrderStatus::PendingPayment,
        OrderStatus::Paid,
        OrderStatus::Shipped,
        OrderStatus::Completed,
        OrderStatus::Cancelled,
    ];

    #[test]
    fn only_forward_transitions_are_legal() {
        let legal: Vec<(OrderStatus, OrderStatus)> = ALL
            .iter()
            .flat_map(|a| ALL.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| a.can_become(*b))
            .collect();
        assert_eq!(
            legal,
            [
                (OrderStatus::PendingPayment, OrderStatus::Paid),
                (OrderStatus::PendingPayment, OrderStatus::Cancelled),
                (OrderStatus::Paid, OrderStatus::Shipped),
                (OrderStatus::Paid, OrderStatus::Cancelled),
                (OrderStatus::Shipped, OrderStatus::Completed),
            ]
        );
    }

    #[test]
    fn statuses_round_trip_through_text() {
        for s in ALL {
            assert_eq!(s.as_str().parse::<OrderStatus>().unwrap(), s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert!("REFUNDED".parse::<OrderStatus>().is_err());
        for s in [
            RefundStatus::Requested,
            RefundStatus::Succeeded,
            RefundStatus::Closed,
        ] {
            assert_eq!(RefundStatus::try_from(s.as_str().to_owned()).unwrap(), s);
        }
    }
}
