//! Order and refund statuses. Which order moves are legal is one table, in
//! [`super::lifecycle`]; the SQL enforces them with conditional updates
//! (`... WHERE status = $expected`), these types name the states.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A status text from the database that this version does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown status `{0}`")]
pub struct UnknownStatus(String);

/// Where an order is in its life; the moves between them are [`super::lifecycle::TRANSITIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    /// Created, waiting for the payment provider's notification.
    PendingPayment,
    /// Paid exactly once.
    Paid,
    /// The warehouse handed it to the carrier.
    Shipped,
    /// The carrier delivered it (the buyer signed).
    Delivered,
    /// The buyer confirmed receipt. A return may still come back.
    Completed,
    /// Cancelled before payment, or after it for lack of stock; final.
    Cancelled,
    /// Paid, then refunded in full before it shipped: the outbound is cancelled and the stock
    /// released; final.
    Refunded,
    /// Shipped, then returned: the warehouse received the goods back and restocked them; final.
    Returned,
}

impl OrderStatus {
    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingPayment => "PENDING_PAYMENT",
            Self::Paid => "PAID",
            Self::Shipped => "SHIPPED",
            Self::Delivered => "DELIVERED",
            Self::Completed => "COMPLETED",
            Self::Cancelled => "CANCELLED",
            Self::Refunded => "REFUNDED",
            Self::Returned => "RETURNED",
        }
    }

    /// Every status.
    pub const ALL: [Self; 8] = [
        Self::PendingPayment,
        Self::Paid,
        Self::Shipped,
        Self::Delivered,
        Self::Completed,
        Self::Cancelled,
        Self::Refunded,
        Self::Returned,
    ];

    /// Whether money was taken for the order and kept so far, so refunds may be asked for.
    pub fn is_paid(self) -> bool {
        matches!(
            self,
            Self::Paid | Self::Shipped | Self::Delivered | Self::Completed | Self::Returned
        )
    }

    /// Whether the goods left the warehouse.
    pub fn is_shipped(self) -> bool {
        matches!(
            self,
            Self::Shipped | Self::Delivered | Self::Completed | Self::Returned
        )
    }

    /// Whether nothing can move the order any more.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Cancelled | Self::Refunded | Self::Returned)
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
            "DELIVERED" => Self::Delivered,
            "COMPLETED" => Self::Completed,
            "CANCELLED" => Self::Cancelled,
            "REFUNDED" => Self::Refunded,
            "RETURNED" => Self::Returned,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
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

/// What a refund gives back: money only, or money against the goods coming back.
///
/// Before shipping both mean the same (nothing left the warehouse): a refund of everything
/// paid cancels the outbound, a partial one lets it ship. After shipping, `ReturnAndRefund`
/// recalls the parcel (a return is expected) and `RefundOnly` (a price adjustment, or the
/// buyer keeps the goods) changes nothing in fulfilment. Requests without a kind are
/// `ReturnAndRefund`, which is what every refund did before kinds existed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefundKind {
    /// Money back, the goods stay with the buyer (or never left).
    RefundOnly,
    /// Money back once the goods come back.
    #[default]
    ReturnAndRefund,
}

impl RefundKind {
    /// As stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RefundOnly => "REFUND_ONLY",
            Self::ReturnAndRefund => "RETURN_AND_REFUND",
        }
    }
}

impl TryFrom<String> for RefundKind {
    type Error = UnknownStatus;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Ok(match s.as_str() {
            "REFUND_ONLY" => Self::RefundOnly,
            "RETURN_AND_REFUND" => Self::ReturnAndRefund,
            _ => return Err(UnknownStatus(s)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_text() {
        for s in OrderStatus::ALL {
            assert_eq!(s.as_str().parse::<OrderStatus>().unwrap(), s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert!("REFUNDING".parse::<OrderStatus>().is_err());
        for s in [
            RefundStatus::Requested,
            RefundStatus::Succeeded,
            RefundStatus::Closed,
        ] {
            assert_eq!(RefundStatus::try_from(s.as_str().to_owned()).unwrap(), s);
        }
        for k in [RefundKind::RefundOnly, RefundKind::ReturnAndRefund] {
            assert_eq!(RefundKind::try_from(k.as_str().to_owned()).unwrap(), k);
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }
}
