//! What every client of the order service's API in the tests builds the same way, whether it
//! calls a router served in-process (order-service's tests) or a child process (the end-to-end
//! tests): bearer headers, signed callback requests, the JSON bodies of the payment and refund
//! providers and of order lines.

use reqwest::header::{HeaderMap, AUTHORIZATION};
use reqwest::RequestBuilder;
use serde_json::{json, Value};

/// `Authorization: Bearer <token>`, as a client's default headers.
///
/// # Panics
/// When the token is not a valid header value.
pub fn bearer_headers(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
    headers
}

/// `req` as a provider's callback: the JSON bytes `raw`, `X-Signature-Timestamp: timestamp`
/// and, when given, `X-Signature: signature` (`CallbackSecret::sign_at(timestamp, raw)` for a
/// correctly signed one).
pub fn callback(
    req: RequestBuilder,
    raw: Vec<u8>,
    timestamp: i64,
    signature: Option<&str>,
) -> RequestBuilder {
    let req = req
        .header("content-type", "application/json")
        .header("X-Signature-Timestamp", timestamp.to_string())
        .body(raw);
    match signature {
        Some(s) => req.header("X-Signature", s),
        None => req,
    }
}

/// The payment provider's notification that `order_id` was paid `amount_cents` in
/// transaction `transaction_id`.
pub fn payment_success(order_id: &str, transaction_id: &str, amount_cents: i64) -> Value {
    json!({
        "order_id": order_id,
        "transaction_id": transaction_id,
        "amount_cents": amount_cents,
        "status": "SUCCESS"
    })
}

/// The refund provider's outcome of refund `refund_no` (`SUCCESS` or `CLOSED`), modified at
/// `modified` (Unix milliseconds).
pub fn refund_notice(refund_no: &str, status: &str, modified: i64) -> Value {
    json!({ "refund_no": refund_no, "status": status, "modified": modified })
}

/// Order (or refund) lines: `(sku, quantity)` as `{"sku_id", "quantity"}` objects.
pub fn lines(items: &[(&str, i64)]) -> Vec<Value> {
    items
        .iter()
        .map(|(sku, quantity)| json!({ "sku_id": sku, "quantity": quantity }))
        .collect()
}
