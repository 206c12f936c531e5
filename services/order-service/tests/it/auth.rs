//! Access control: every protected endpoint refuses a missing, expired, forged or foreign
//! bearer token (401), a customer on an operator endpoint (403) and another customer's order
//! (404, as if it did not exist), and none of these changes anything. Callbacks outside the
//! replay window are refused (401) and change nothing; a fresh duplicate is still answered 200
//! and has no second effect.

use std::time::Duration;

use outbox_http::auth::Minter;
use reqwest::{Method, Response, StatusCode};
use serde_json::{json, Value};

use crate::support::{expect_error, Snapshot, TestApp, JWT_AUDIENCE, JWT_ISSUER, JWT_SECRET};

/// Who may call an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// The order's owner (or an operator).
    Customer,
    /// Operators only.
    Operator,
}

/// An app with a catalog, one pending and one paid order of `u1`.
struct Fixture {
    app: TestApp,
    pending: String,
    paid: String,
    before: Snapshot,
}

impl Fixture {
    async fn new() -> Self {
        let app = TestApp::spawn().await;
        app.sku("MUG", 1_000).await;
        let pending = app.order("u1", "MUG", 1).await["order_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (paid, _) = app.paid_order("u1", "MUG", 1).await;
        let before = app.snapshot().await;
        Self {
            app,
            pending,
            paid,
            before,
        }
    }

    /// Every protected endpoint: who may call it, method, path, body. The order endpoints
    /// name `u1`'s orders.
    fn endpoints(&self) -> Vec<(Access, Method, String, Option<Value>)> {
        let (p, q) = (&self.pending, &self.paid);
        let order = json!({ "items": [{ "sku_id": "MUG", "quantity": 1 }] });
        let refund = json!({ "refund_no": "R-auth", "amount_cents": 100, "reason": "damaged" });
        vec![
            (
                Access::Customer,
                Method::POST,
                "/orders".into(),
                Some(order),
            ),
            (Access::Customer, Method::GET, format!("/orders/{p}"), None),
            (
                Access::Customer,
                Method::POST,
                format!("/orders/{p}/cancel"),
                None,
            ),
            (
                Access::Customer,
                Method::POST,
                format!("/orders/{q}/complete"),
                None,
            ),
            (
                Access::Customer,
                Method::POST,
                format!("/orders/{q}/refunds"),
                Some(refund),
            ),
            (
                Access::Operator,
                Method::PUT,
                "/skus/MUG".into(),
                Some(json!({ "name": "Cheap mug", "price_cents": 1 })),
            ),
            (
                Access::Operator,
                Method::POST,
                format!("/orders/{q}/deliver"),
                None,
            ),
            (
                Access::Operator,
                Method::POST,
                "/channels/marketplace/compensate".into(),
                None,
            ),
        ]
    }

    /// Sends one endpoint's request with `token` (none: no `Authorization` header), from a
    /// client without a default token.
    async fn call(
        &self,
        method: &Method,
        path: &str,
        body: Option<&Value>,
        token: Option<&str>,
    ) -> Response {
        let mut req = reqwest::Client::new()
            .request(method.clone(), self.app.url(path))
            .header("Idempotency-Key", "auth-key");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        req.send().await.unwrap()
    }

    /// Asserts the error status and code, and that the database did not change.
    async fn refused(&self, case: &str, r: Response, status: StatusCode, code: &str) -> Response {
        let challenge = r.headers().get("www-authenticate").cloned();
        if status == StatusCode::UNAUTHORIZED {
            let c = challenge.unwrap_or_else(|| panic!("`{case}`: 401 without WWW-Authenticate"));
            assert!(
                c.to_str().unwrap().starts_with("Bearer "),
                "`{case}`: {c:?}"
            );
        }
        assert_eq!(r.status(), status, "case `{case}`");
        expect_error(r, status, code).await;
        assert_eq!(
            self.app.snapshot().await,
            self.before,
            "case `{case}` changed the database"
        );
        let r = self.call(&Method::GET, "/healthz", None, None).await;
        assert_eq!(r.status(), StatusCode::OK);
        r
    }
}

#[tokio::test]
async fn bad_tokens_are_refused_on_every_protected_endpoint_and_change_nothing() {
    let f = Fixture::new().await;
    let m = &f.app.minter;
    let expired = m.token("u1", &["operator"], -120);
    let forged = Minter::hs256(
        b"not-the-secret-not-the-secret-xx",
        JWT_ISSUER,
        JWT_AUDIENCE,
    )
    .token("u1", &["operator"], 3_600);
    let foreign = m.for_audience("wms").token("u1", &["operator"], 3_600);
    let other_issuer = Minter::hs256(JWT_SECRET.as_bytes(), "someone-else", JWT_AUDIENCE).token(
        "u1",
        &["operator"],
        3_600,
    );
    let bad_tokens = [
        ("expired", expired.as_str()),
        ("wrong signature", forged.as_str()),
        ("wrong audience", foreign.as_str()),
        ("wrong issuer", other_issuer.as_str()),
        ("not a JWT", "abc.def.ghi"),
    ];
    for (_, method, path, body) in f.endpoints() {
        let r = f.call(&method, &path, body.as_ref(), None).await;
        f.refused(
            &format!("{method} {path} without a token"),
            r,
            StatusCode::UNAUTHORIZED,
            "missing_token",
        )
        .await;
        for (why, token) in bad_tokens {
            let r = f.call(&method, &path, body.as_ref(), Some(token)).await;
            f.refused(
                &format!("{method} {path} with an {why} token"),
                r,
                StatusCode::UNAUTHORIZED,
                "invalid_token",
            )
            .await;
        }
    }
    // A scheme other than Bearer.
    let r = reqwest::Client::new()
        .get(f.app.url(&format!("/orders/{}", f.pending)))
        .basic_auth("u1", Some("pw"))
        .send()
        .await
        .unwrap();
    f.refused("basic auth", r, StatusCode::UNAUTHORIZED, "invalid_token")
        .await;
    // A subject that is not a valid user id cannot create orders.
    let r = f
        .call(
            &Method::POST,
            "/orders",
            Some(&json!({ "items": [{ "sku_id": "MUG", "quantity": 1 }] })),
            Some(&m.customer("has spaces")),
        )
        .await;
    f.refused(
        "subject with spaces",
        r,
        StatusCode::UNAUTHORIZED,
        "invalid_token",
    )
    .await;
}

#[tokio::test]
async fn customers_get_403_on_operator_endpoints_and_404_on_other_customers_orders() {
    let f = Fixture::new().await;
    let owner = f.app.customer_token("u1");
    let stranger = f.app.customer_token("u2");
    for (access, method, path, body) in f.endpoints() {
        match access {
            Access::Operator => {
                for (who, token) in [("owner", &owner), ("stranger", &stranger)] {
                    let r = f.call(&method, &path, body.as_ref(), Some(token)).await;
                    let case = format!("{method} {path} as a customer ({who})");
                    f.refused(&case, r, StatusCode::FORBIDDEN, "forbidden")
                        .await;
                }
            }
            Access::Customer if path != "/orders" => {
                let r = f.call(&method, &path, body.as_ref(), Some(&stranger)).await;
                let case = format!("{method} {path} on another customer's order");
                f.refused(&case, r, StatusCode::NOT_FOUND, "order_not_found")
                    .await;
            }
            Access::Customer => {}
        }
    }
    // The stranger's answer is the one for an order that does not exist.
    let missing = uuid::Uuid::new_v4();
    let r = f
        .call(
            &Method::GET,
            &format!("/orders/{missing}"),
            None,
            Some(&stranger),
        )
        .await;
    f.refused("missing order", r, StatusCode::NOT_FOUND, "order_not_found")
        .await;
}

#[tokio::test]
async fn orders_belong_to_the_token_subject_and_operators_see_every_order() {
    let f = Fixture::new().await;
    let app = &f.app;
    // A `user_id` in the body cannot choose the buyer: the body refuses it (unknown property,
    // nothing written), and the token decides.
    let r = f
        .call(
            &Method::POST,
            "/orders",
            Some(&json!({ "user_id": "u1", "items": [{ "sku_id": "MUG", "quantity": 2 }] })),
            Some(&app.customer_token("u2")),
        )
        .await;
    f.refused(
        "user_id in the body",
        r,
        StatusCode::BAD_REQUEST,
        "malformed_json",
    )
    .await;
    let r = f
        .call(
            &Method::POST,
            "/orders",
            Some(&json!({ "items": [{ "sku_id": "MUG", "quantity": 2 }] })),
            Some(&app.customer_token("u2")),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let created: Value = r.json().await.unwrap();
    assert_eq!(created["user_id"], "u2");
    let id = created["order_id"].as_str().unwrap();
    assert_eq!(app.owner_of(id).await, "u2");
    // u2 reads it; u1 cannot; an operator can.
    let path = format!("/orders/{id}");
    let r = f
        .call(&Method::GET, &path, None, Some(&app.customer_token("u2")))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = f
        .call(&Method::GET, &path, None, Some(&app.customer_token("u1")))
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = f
        .call(&Method::GET, &path, None, Some(&app.operator_token()))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    // An operator cancels a customer's order (support on the customer's behalf).
    let r = f
        .call(
            &Method::POST,
            &format!("{path}/cancel"),
            None,
            Some(&app.operator_token()),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "CANCELLED");
    // Operations endpoints stay open.
    for open in ["/healthz", "/metrics", "/openapi.json"] {
        let r = f.call(&Method::GET, open, None, None).await;
        assert_eq!(r.status(), StatusCode::OK, "{open}");
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Sends `body` signed now, then the very same signed request again (a duplicate inside the
/// window): both answer 200, the first changes the database, the second nothing.
async fn applies_once_even_when_sent_twice(app: &TestApp, path: &str, body: &Value) {
    let before = app.snapshot().await;
    let ts = now();
    let r = app.signed_at(path, body, ts).await;
    assert_eq!(r.status(), StatusCode::OK, "{path}");
    let applied = app.snapshot().await;
    assert_ne!(applied, before, "{path} had no effect");
    let r = app.signed_at(path, body, ts).await;
    assert_eq!(r.status(), StatusCode::OK, "{path} duplicate");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({ "result": "success" })
    );
    assert_eq!(
        app.snapshot().await,
        applied,
        "the duplicate on {path} had an effect"
    );
}

#[tokio::test]
async fn callbacks_outside_the_replay_window_are_refused_and_change_nothing() {
    let app = TestApp::spawn().await;
    app.sku("MUG", 1_000).await;
    let id = app.order("u1", "MUG", 1).await["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let payment = json!({
        "order_id": id, "transaction_id": "tx-replay", "amount_cents": 1_000, "status": "SUCCESS"
    });
    let before = app.snapshot().await;
    for (case, ts) in [
        ("6 minutes old", now() - 360),
        ("6 minutes ahead", now() + 360),
    ] {
        let r = app.signed_at("/payments/callback", &payment, ts).await;
        let err = expect_error(r, StatusCode::UNAUTHORIZED, "stale_signature").await;
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("300 s replay window"),
            "{case}: {err}"
        );
        assert_eq!(app.snapshot().await, before, "{case} changed the database");
    }
    // No timestamp header: the signature alone (the old scheme) is not enough.
    let raw = serde_json::to_vec(&payment).unwrap();
    let r = reqwest::Client::new()
        .post(app.url("/payments/callback"))
        .header(
            "X-Signature",
            order_service::CallbackSecret::new(crate::support::SECRET)
                .unwrap()
                .sign(&raw),
        )
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::UNAUTHORIZED, "invalid_signature_timestamp").await;
    assert_eq!(app.snapshot().await, before);

    // A fresh callback pays; the same signed request again inside the window is answered 200
    // and changes nothing more.
    applies_once_even_when_sent_twice(&app, "/payments/callback", &payment).await;
    assert_eq!(app.event_types(&id).await, ["OrderCreated", "OrderPaid"]);

    // Refund callbacks: the same rules.
    let r = app.refund(&id, "R-replay", 400).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let requested = app.snapshot().await;
    let notice = json!({ "refund_no": "R-replay", "status": "SUCCESS", "modified": 1 });
    let r = app
        .signed_at("/refunds/callback", &notice, now() - 301)
        .await;
    expect_error(r, StatusCode::UNAUTHORIZED, "stale_signature").await;
    assert_eq!(app.snapshot().await, requested);
    applies_once_even_when_sent_twice(&app, "/refunds/callback", &notice).await;
}

#[tokio::test]
async fn the_replay_window_is_configurable() {
    let app = TestApp::spawn_with_window(Duration::from_secs(60)).await;
    app.sku("MUG", 1_000).await;
    let id = app.order("u1", "MUG", 1).await["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let payment = json!({
        "order_id": id, "transaction_id": "tx-w", "amount_cents": 1_000, "status": "SUCCESS"
    });
    let before = app.snapshot().await;
    // Inside the default 5 minutes, outside this app's 60 s.
    let r = app
        .signed_at("/payments/callback", &payment, now() - 120)
        .await;
    let err = expect_error(r, StatusCode::UNAUTHORIZED, "stale_signature").await;
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("60 s replay window"),
        "{err}"
    );
    assert_eq!(app.snapshot().await, before);
    let r = app
        .signed_at("/payments/callback", &payment, now() - 30)
        .await;
    assert_eq!(r.status(), StatusCode::OK);
}
