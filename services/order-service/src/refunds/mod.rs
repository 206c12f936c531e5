//! Refunds: requests against paid orders (`POST /orders/{id}/refunds`) and the provider's
//! outcome notifications (`POST /refunds/callback`).
//!
//! A refund number is the refund's identity: repeating it returns the same refund. The amount
//! is reserved on the order row under a conditional update (`refund_reserved_cents + amount <=
//! paid_cents`, also a CHECK), and released when the provider closes the refund.
//!
//! An order cancelled after payment (for lack of stock, or a marketplace trade first seen
//! closed) has everything reserved, and its flagged payment owes the rest to the buyer
//! (`refund_due_cents`). It still takes refunds (the platform refunds such trades itself): a
//! refund draws its amount from that flag, and gives it back to the flag if it closes without
//! paying out, so money owed is owed to exactly one place (`reserve.rs`).
//!
//! A requested refund's amount and kind follow the platform's newest snapshot ([`amend_in`]):
//! the reservation moves by the difference and `RefundRequested` is emitted again with the new
//! terms.
//!
//! Provider notifications are snapshots stamped with `modified` (epoch ms): a snapshot only
//! applies if it is newer than the one applied before, and a refund reaches `SUCCEEDED` or
//! `CLOSED` once. Money that went back cannot come back, so a final state is never left: a
//! newer snapshot that contradicts it is logged and counted for operators, not applied.
//!
//! `request.rs` holds the requests and their amendments, `notice.rs` the provider's outcomes;
//! both move money through the one function in `reserve.rs`.

mod notice;
mod request;
mod reserve;

pub use notice::{
    apply_notice, apply_notice_in, epoch_ms_schema, RefundCallbackBody, RefundNotice,
    RefundNoticeOutcome, EPOCH_MS,
};
pub use request::{
    amend_in, parse_lines, request, request_in, RefundBody, RefundCreated, RefundRequest,
};
