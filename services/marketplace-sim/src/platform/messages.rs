//! The messages the platform sends, pushed or answered by the query API: `TradeSync` and
//! `RefundSync`, each the latest snapshot of a trade or a refund under a `msg_id`.

use serde_json::{json, Value};

use super::model::{Refund, Trade};

pub(super) fn trade_message(msg_id: &str, t: &Trade) -> Value {
    let mut m = json!({
        "msg_id": msg_id, "type": "TradeSync", "modified": t.modified,
        "trade": {"tid": t.tid, "status": t.status, "buyer_id": t.buyer_id, "items": t.items}
    });
    if t.paid {
        m["trade"]["paid_cents"] = Value::from(t.paid_cents);
    }
    m
}

pub(super) fn refund_message(msg_id: &str, tid: &str, r: &Refund) -> Value {
    let mut m = json!({
        "msg_id": msg_id, "type": "RefundSync", "modified": r.modified,
        "refund": {"tid": tid, "refund_id": r.refund_id, "status": r.status,
                   "refund_cents": r.refund_cents, "kind": r.kind}
    });
    if !r.items.is_empty() {
        m["refund"]["items"] = json!(r.items);
    }
    m
}
