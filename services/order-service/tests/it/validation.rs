//! Every bad input gets its status and error code and changes nothing: all row counts, the
//! state of every row and the outbox are the same before and after.

use reqwest::header::HeaderValue;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};

use crate::support::{expect_error, Snapshot, TestApp, SECRET};

const BAD: StatusCode = StatusCode::BAD_REQUEST;
const UNPROCESSABLE: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;
const UNAUTHORIZED: StatusCode = StatusCode::UNAUTHORIZED;
const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
const CONFLICT: StatusCode = StatusCode::CONFLICT;

/// An app with one order of each kind and the state they leave.
struct Fixture {
    app: TestApp,
    /// Created with key `setup-key`, waiting for payment (amount 1000).
    pending: String,
    /// Paid (1000), with refund `R-1` of 300 requested.
    paid: String,
    /// A UUID no order has.
    unknown: String,
    before: Snapshot,
}

impl Fixture {
    async fn new() -> Self {
        let app = TestApp::spawn().await;
        app.sku("MUG", 1_000).await;
        let r = app.post_order(Some("setup-key"), &good_order()).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let pending = r.json::<Value>().await.unwrap()["order_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (paid, _) = app.paid_order("u1", "MUG", 1).await;
        let r = app.refund(&paid, "R-1", 300).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let before = app.snapshot().await;
        Self {
            app,
            pending,
            paid,
            unknown: uuid::Uuid::new_v4().to_string(),
            before,
        }
    }

    /// Asserts status, error code and shape, and that nothing changed.
    async fn expect(&self, case: &str, r: Response, status: StatusCode, code: &str) {
        assert_eq!(r.status(), status, "case `{case}`");
        expect_error(r, status, code).await;
        assert_eq!(
            self.app.snapshot().await,
            self.before,
            "case `{case}` changed the database"
        );
    }

    async fn post_order_raw(&self, body: &'static str) -> Response {
        self.app
            .client
            .post(self.app.url("/orders"))
            .header("Idempotency-Key", "fresh-key")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }
}

fn good_order() -> Value {
    json!({ "user_id": "u1", "items": [{ "sku_id": "MUG", "quantity": 1 }] })
}

#[tokio::test]
async fn bad_order_requests() {
    let f = Fixture::new().await;
    let app = &f.app;
    let key = "invalid_idempotency_key";
    f.expect(
        "no key",
        app.post_order(None, &good_order()).await,
        BAD,
        key,
    )
    .await;
    let r = app.post_order(Some(""), &good_order()).await;
    f.expect("empty key", r, BAD, key).await;
    let r = app.post_order(Some(&"k".repeat(129)), &good_order()).await;
    f.expect("129-char key", r, BAD, key).await;
    let r = app
        .client
        .post(app.url("/orders"))
        .header(
            "Idempotency-Key",
            HeaderValue::from_bytes("ключ".as_bytes()).unwrap(),
        )
        .json(&good_order())
        .send()
        .await
        .unwrap();
    f.expect("non-ASCII key", r, BAD, key).await;

    let malformed = "malformed_json";
    for (case, body) in [
        ("truncated JSON", r#"{"user_id": "#),
        ("not JSON", "user_id=u1"),
        (
            "quantity of the wrong type",
            r#"{"user_id":"u1","items":[{"sku_id":"MUG","quantity":"two"}]}"#,
        ),
        (
            "fractional quantity",
            r#"{"user_id":"u1","items":[{"sku_id":"MUG","quantity":1.5}]}"#,
        ),
        ("no items field", r#"{"user_id":"u1"}"#),
    ] {
        f.expect(case, f.post_order_raw(body).await, BAD, malformed)
            .await;
    }

    let invalid = "validation_failed";
    for (case, user, items) in [
        ("empty items", "u1", json!([])),
        (
            "quantity 0",
            "u1",
            json!([{ "sku_id": "MUG", "quantity": 0 }]),
        ),
        (
            "negative quantity",
            "u1",
            json!([{ "sku_id": "MUG", "quantity": -3 }]),
        ),
        (
            "huge quantity",
            "u1",
            json!([{ "sku_id": "MUG", "quantity": 10_001 }]),
        ),
        (
            "repeated sku",
            "u1",
            json!([{ "sku_id": "MUG", "quantity": 1 }, { "sku_id": "MUG", "quantity": 1 }]),
        ),
        (
            "bad sku id",
            "u1",
            json!([{ "sku_id": "M U G", "quantity": 1 }]),
        ),
    ] {
        let body = json!({ "user_id": user, "items": items });
        let r = app.post_order(Some("fresh-key"), &body).await;
        f.expect(case, r, UNPROCESSABLE, invalid).await;
    }

    let body = json!({ "user_id": "u1", "items": [{ "sku_id": "NOPE", "quantity": 1 }] });
    let r = app.post_order(Some("fresh-key"), &body).await;
    f.expect("unknown sku", r, UNPROCESSABLE, "unknown_sku")
        .await;

    let body = json!({ "user_id": "u1", "items": [{ "sku_id": "MUG", "quantity": 2 }] });
    let r = app.post_order(Some("setup-key"), &body).await;
    f.expect(
        "key reused with another body",
        r,
        UNPROCESSABLE,
        "idempotency_key_reused",
    )
    .await;
}

#[tokio::test]
async fn bad_catalog_requests() {
    let f = Fixture::new().await;
    let put = |id: &str, body: Value| {
        f.app
            .client
            .put(f.app.url(&format!("/skus/{id}")))
            .bearer_auth(f.app.operator_token())
            .json(&body)
            .send()
    };
    for (case, id, body) in [
        ("zero price", "X", json!({ "name": "x", "price_cents": 0 })),
        (
            "negative price",
            "X",
            json!({ "name": "x", "price_cents": -1 }),
        ),
        ("empty name", "X", json!({ "name": "", "price_cents": 1 })),
        (
            "bad sku id",
            "a%20b",
            json!({ "name": "x", "price_cents": 1 }),
        ),
    ] {
        let r = put(id, body).await.unwrap();
        f.expect(case, r, UNPROCESSABLE, "validation_failed").await;
    }
    let r = put("X", json!({ "name": "x", "price_cents": 1.5 }))
        .await
        .unwrap();
    f.expect("fractional price", r, BAD, "malformed_json").await;
}

#[tokio::test]
async fn bad_payment_callbacks() {
    let f = Fixture::new().await;
    let app = &f.app;
    let payment = json!({
        "order_id": f.pending, "transaction_id": "tx-bad", "amount_cents": 1_000, "status": "SUCCESS"
    });
    let raw = serde_json::to_vec(&payment).unwrap();
    let path = "/payments/callback";
    let sig = "invalid_signature";
    let r = app.post_raw(path, &raw, None).await;
    f.expect("no signature", r, UNAUTHORIZED, sig).await;
    let r = app.post_raw(path, &raw, Some(&"0".repeat(64))).await;
    f.expect("wrong signature", r, UNAUTHORIZED, sig).await;
    let r = app.post_raw(path, &raw, Some("not-hex")).await;
    f.expect("garbage signature", r, UNAUTHORIZED, sig).await;
    let signed_other = order_service::CallbackSecret::new(SECRET)
        .unwrap()
        .sign(b"{}");
    let r = app.post_raw(path, &raw, Some(&signed_other)).await;
    f.expect("signature of another body", r, UNAUTHORIZED, sig)
        .await;
    let r = app.post_raw(path, b"{not json", None).await;
    f.expect(
        "unsigned garbage is refused before parsing",
        r,
        UNAUTHORIZED,
        sig,
    )
    .await;

    let r = app.pay(&f.unknown, "tx-bad", 1_000).await;
    f.expect("unknown order", r, NOT_FOUND, "order_not_found")
        .await;
    let r = app.pay("not-a-uuid", "tx-bad", 1_000).await;
    f.expect("malformed order id", r, NOT_FOUND, "order_not_found")
        .await;
    let r = app.pay(&f.pending, "tx-bad", 999).await;
    let err = expect_error(r, BAD, "amount_mismatch").await;
    assert_eq!(
        (
            err["expected_cents"].as_i64(),
            err["received_cents"].as_i64()
        ),
        (Some(1_000), Some(999))
    );
    assert_eq!(app.snapshot().await, f.before);
    let r = app.pay(&f.paid, &format!("tx-{}", f.paid), 1).await;
    f.expect("duplicate with another amount", r, BAD, "amount_mismatch")
        .await;

    let invalid = "validation_failed";
    for (case, status, amount) in [
        ("status FAILED", "FAILED", 1_000),
        ("amount 0", "SUCCESS", 0),
    ] {
        let body = json!({
            "order_id": f.pending, "transaction_id": "tx-bad", "amount_cents": amount, "status": status
        });
        f.expect(case, app.signed(path, &body).await, UNPROCESSABLE, invalid)
            .await;
    }
    let r = app.signed(path, &json!({ "order_id": f.pending })).await;
    f.expect("missing fields", r, BAD, "malformed_json").await;
}

#[tokio::test]
async fn bad_cancel_and_refund_requests() {
    let f = Fixture::new().await;
    let app = &f.app;
    let r = app.cancel(&f.unknown).await;
    f.expect("cancel unknown order", r, NOT_FOUND, "order_not_found")
        .await;
    let r = app.cancel(&f.paid).await;
    f.expect("cancel paid order", r, CONFLICT, "illegal_transition")
        .await;

    let r = app.refund(&f.pending, "R-2", 100).await;
    f.expect("refund a pending order", r, CONFLICT, "illegal_transition")
        .await;
    let r = app.refund(&f.paid, "R-2", 701).await;
    f.expect(
        "refund above refundable",
        r,
        UNPROCESSABLE,
        "refund_exceeds_paid",
    )
    .await;
    let r = app.refund(&f.paid, "R-2", 0).await;
    f.expect("refund of 0", r, UNPROCESSABLE, "validation_failed")
        .await;
    let r = app.refund(&f.unknown, "R-2", 100).await;
    f.expect("refund unknown order", r, NOT_FOUND, "order_not_found")
        .await;
    let r = app.refund(&f.paid, "R-1", 200).await;
    f.expect("refund_no reused", r, UNPROCESSABLE, "refund_no_reused")
        .await;
    let url = app.url(&format!("/orders/{}/refunds", f.paid));
    let r = app
        .client
        .post(&url)
        .json(&json!({ "refund_no": "R-2", "amount_cents": 100, "reason": "" }))
        .send()
        .await
        .unwrap();
    f.expect(
        "refund without reason",
        r,
        UNPROCESSABLE,
        "validation_failed",
    )
    .await;
    let r = app.client.post(&url).body("{").send().await.unwrap();
    f.expect("refund malformed", r, BAD, "malformed_json").await;
}

#[tokio::test]
async fn bad_refund_callbacks() {
    let f = Fixture::new().await;
    let app = &f.app;
    let path = "/refunds/callback";
    let raw =
        serde_json::to_vec(&json!({ "refund_no": "R-1", "status": "SUCCESS", "modified": 1 }))
            .unwrap();
    let sig = "invalid_signature";
    let r = app.post_raw(path, &raw, None).await;
    f.expect("no signature", r, UNAUTHORIZED, sig).await;
    let r = app.post_raw(path, &raw, Some(&"ab".repeat(32))).await;
    f.expect("wrong signature", r, UNAUTHORIZED, sig).await;
    let r = app.refund_notice("R-404", "SUCCESS", 1).await;
    f.expect("unknown refund", r, NOT_FOUND, "refund_not_found")
        .await;
    let r = app.refund_notice("R-1", "PENDING", 1).await;
    f.expect("unknown status", r, UNPROCESSABLE, "validation_failed")
        .await;
    let r = app.refund_notice("R-1", "SUCCESS", -1).await;
    f.expect("negative modified", r, UNPROCESSABLE, "validation_failed")
        .await;
    let r = app
        .signed(path, &json!({ "refund_no": "R-1", "status": "SUCCESS" }))
        .await;
    f.expect("no modified", r, BAD, "malformed_json").await;
}

#[tokio::test]
async fn bad_reads_and_routes() {
    let f = Fixture::new().await;
    let app = &f.app;
    let r = app
        .client
        .get(app.url(&format!("/orders/{}", f.unknown)))
        .send()
        .await
        .unwrap();
    f.expect("unknown order", r, NOT_FOUND, "order_not_found")
        .await;
    let r = app.client.get(app.url("/orders/42")).send().await.unwrap();
    f.expect("malformed order id", r, NOT_FOUND, "order_not_found")
        .await;
    let r = app.client.get(app.url("/nope")).send().await.unwrap();
    f.expect("unknown route", r, NOT_FOUND, "not_found").await;
    let r = app.client.delete(app.url("/orders")).send().await.unwrap();
    let status = StatusCode::METHOD_NOT_ALLOWED;
    f.expect("wrong method", r, status, "method_not_allowed")
        .await;
}
