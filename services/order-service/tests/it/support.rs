//! Test harness: a fresh database per test, the app served on an ephemeral port, helpers to
//! call it and to read what the database holds.
//!
//! Authentication: the app verifies HS256 tokens under [`JWT_SECRET`]; [`TestApp::minter`]
//! mints them. The helpers send the token the real caller would: an operator's for the
//! catalog and `deliver`, the order owner's (looked up in the database) for the customer
//! endpoints, and for `POST /orders` a token for the body's `user_id` (a test shorthand: the
//! field is removed from the body sent, the server takes the user from the token only).
//! `client` sends a customer token of [`DEFAULT_USER`] unless a request sets its own.

use std::time::Duration;

use order_service::{AppState, CallbackSecret, Metrics};
use outbox_http::auth::{Authenticator, Minter};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use test_support::order_api;
use tokio_util::sync::CancellationToken;

/// The secret the test app verifies callbacks with.
pub const SECRET: &str = "test-callback-secret";

/// The secret the test app verifies marketplace pushes with.
pub const MARKETPLACE_SECRET: &str = "test-marketplace-secret";

/// The HS256 secret of the test app's bearer tokens.
pub const JWT_SECRET: &str = "test-jwt-secret-of-at-least-32-bytes";
/// The issuer and audience the test app requires.
pub const JWT_ISSUER: &str = "test-issuer";
/// See [`JWT_ISSUER`].
pub const JWT_AUDIENCE: &str = "order-service";

/// The user `client`'s default token belongs to, and of orders whose body names none.
pub const DEFAULT_USER: &str = "u1";

/// A running order service on its own database.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// HTTP client; sends a customer token of [`DEFAULT_USER`] by default.
    pub client: reqwest::Client,
    /// Mints tokens the app accepts.
    pub minter: Minter,
    /// Pool on the test database, for assertions.
    pub pool: PgPool,
    secret: CallbackSecret,
    shutdown: CancellationToken,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Row counts and a fingerprint of every mutable column: equal before and after a request
/// means the request changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Snapshot {
    pub skus: i64,
    pub orders: i64,
    pub order_items: i64,
    pub idempotency_keys: i64,
    pub payments: i64,
    pub refunds: i64,
    pub outbox: i64,
    pub state: String,
}

impl TestApp {
    /// Creates a database, migrates it and serves the app on it.
    pub async fn spawn() -> Self {
        Self::spawn_with_window(outbox_http::signature::DEFAULT_REPLAY_WINDOW).await
    }

    /// As [`Self::spawn`], with a callback replay window of `replay_window`.
    pub async fn spawn_with_window(replay_window: Duration) -> Self {
        let pool = fresh_pool().await;
        order_service::migrate(&pool).await.expect("migrations");
        Self::serve_on(pool, replay_window).await
    }
}

/// A pool on a new, empty database.
pub async fn fresh_pool() -> PgPool {
    let name = test_support::db::unique_name("order_it_");
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(30));
    test_support::db::create(&test_support::db::admin_url(), &name, pool)
        .await
        .unwrap_or_else(|e| panic!("creating the test database {name}: {e}"))
        .pool
}

impl TestApp {
    /// Serves the app on a migrated `pool` with the given callback replay window.
    async fn serve_on(pool: PgPool, replay_window: Duration) -> Self {
        let secret = CallbackSecret::new(SECRET).unwrap();
        let state = AppState {
            pool: pool.clone(),
            metrics: Metrics::new(),
            secret: secret.clone(),
            replay_window,
            marketplace_secret: Some(CallbackSecret::new(MARKETPLACE_SECRET).unwrap()),
            marketplace: None,
            auth: Authenticator::hs256(JWT_SECRET.as_bytes(), JWT_ISSUER, JWT_AUDIENCE),
        };
        let minter = Minter::hs256(JWT_SECRET.as_bytes(), JWT_ISSUER, JWT_AUDIENCE);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(order_service::serve(
            listener,
            state,
            shutdown.clone(),
            Duration::from_secs(1),
        ));
        let headers = order_api::bearer_headers(&minter.customer(DEFAULT_USER));
        Self {
            base,
            client: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap(),
            minter,
            pool,
            secret,
            shutdown,
        }
    }

    /// A customer token of `user`.
    pub fn customer_token(&self, user: &str) -> String {
        self.minter.customer(user)
    }

    /// An operator token.
    pub fn operator_token(&self) -> String {
        self.minter.operator("ops")
    }

    /// The owner of an order ([`DEFAULT_USER`] when there is no such order).
    pub async fn owner_of(&self, order_id: &str) -> String {
        let owner: Option<String> =
            sqlx::query_scalar("SELECT user_id FROM orders WHERE order_id::text = $1")
                .bind(order_id)
                .fetch_optional(&self.pool)
                .await
                .unwrap();
        owner.unwrap_or_else(|| DEFAULT_USER.to_owned())
    }

    /// `req` with the order owner's token (an operator's for a marketplace buyer's order: no
    /// customer token is in the channel's namespace).
    async fn as_owner(&self, req: RequestBuilder, order_id: &str) -> RequestBuilder {
        let owner = self.owner_of(order_id).await;
        if order_service::channel::in_namespace(&owner) {
            return req.bearer_auth(self.operator_token());
        }
        req.bearer_auth(self.customer_token(&owner))
    }

    /// Starts a graceful shutdown of the server (as SIGTERM does).
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `PUT /skus/{id}`, asserting success.
    pub async fn sku(&self, sku_id: &str, price_cents: i64) {
        let r = self
            .client
            .put(self.url(&format!("/skus/{sku_id}")))
            .bearer_auth(self.operator_token())
            .json(&json!({ "name": format!("Item {sku_id}"), "price_cents": price_cents }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    }

    /// `POST /orders` with an optional key, as the body's `user_id` (removed from the body
    /// sent; [`DEFAULT_USER`] without one).
    pub async fn post_order(&self, key: Option<&str>, body: &Value) -> Response {
        let mut body = body.clone();
        let user = body
            .as_object_mut()
            .and_then(|o| o.remove("user_id"))
            .and_then(|u| u.as_str().map(str::to_owned))
            .unwrap_or_else(|| DEFAULT_USER.to_owned());
        let mut req = self
            .client
            .post(self.url("/orders"))
            .bearer_auth(self.customer_token(&user))
            .json(&body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        req.send().await.unwrap()
    }

    /// Creates an order of `quantity` × `sku_id` for `user`, asserting 201; returns its body.
    pub async fn order(&self, user: &str, sku_id: &str, quantity: i64) -> Value {
        let key = uuid::Uuid::new_v4().to_string();
        let body = json!({ "user_id": user, "items": order_api::lines(&[(sku_id, quantity)]) });
        let r = self.post_order(Some(&key), &body).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        r.json().await.unwrap()
    }

    /// POSTs `raw` with `X-Signature: signature` when given, and the current time as
    /// `X-Signature-Timestamp`.
    pub async fn post_raw(&self, path: &str, raw: &[u8], signature: Option<&str>) -> Response {
        self.post_raw_at(path, raw, chrono::Utc::now().timestamp(), signature)
            .await
    }

    /// POSTs `raw` with `X-Signature-Timestamp: timestamp` and `X-Signature: signature` when
    /// given.
    pub async fn post_raw_at(
        &self,
        path: &str,
        raw: &[u8],
        timestamp: i64,
        signature: Option<&str>,
    ) -> Response {
        order_api::callback(
            self.client.post(self.url(path)),
            raw.to_vec(),
            timestamp,
            signature,
        )
        .send()
        .await
        .unwrap()
    }

    /// POSTs `body` to a callback path, correctly signed now.
    pub async fn signed(&self, path: &str, body: &Value) -> Response {
        self.signed_at(path, body, chrono::Utc::now().timestamp())
            .await
    }

    /// POSTs `body` to a callback path, correctly signed at `timestamp` (Unix seconds).
    pub async fn signed_at(&self, path: &str, body: &Value, timestamp: i64) -> Response {
        let raw = serde_json::to_vec(body).unwrap();
        let sig = self.secret.sign_at(timestamp, &raw);
        self.post_raw_at(path, &raw, timestamp, Some(&sig)).await
    }

    /// A signed payment notification.
    pub async fn pay(&self, order_id: &str, transaction_id: &str, amount_cents: i64) -> Response {
        self.signed(
            "/payments/callback",
            &order_api::payment_success(order_id, transaction_id, amount_cents),
        )
        .await
    }

    /// Creates and pays an order; returns its id.
    pub async fn paid_order(&self, user: &str, sku_id: &str, quantity: i64) -> (String, i64) {
        let o = self.order(user, sku_id, quantity).await;
        let id = o["order_id"].as_str().unwrap().to_owned();
        let amount = o["amount_cents"].as_i64().unwrap();
        let r = self.pay(&id, &format!("tx-{id}"), amount).await;
        assert_eq!(r.status(), StatusCode::OK);
        (id, amount)
    }

    /// `POST /orders/{id}/refunds`.
    pub async fn refund(&self, order_id: &str, refund_no: &str, amount_cents: i64) -> Response {
        self.refund_body(
            order_id,
            &json!({ "refund_no": refund_no, "amount_cents": amount_cents, "reason": "damaged" }),
        )
        .await
    }

    /// `POST /orders/{id}/refunds` with a kind.
    pub async fn refund_of_kind(
        &self,
        order_id: &str,
        refund_no: &str,
        amount_cents: i64,
        kind: &str,
    ) -> Response {
        self.refund_body(
            order_id,
            &json!({ "refund_no": refund_no, "amount_cents": amount_cents, "reason": "damaged", "kind": kind }),
        )
        .await
    }

    /// `POST /orders/{id}/refunds` with `body`, as the order's owner.
    pub async fn refund_body(&self, order_id: &str, body: &Value) -> Response {
        let req = self
            .client
            .post(self.url(&format!("/orders/{order_id}/refunds")));
        self.as_owner(req, order_id)
            .await
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// `POST /orders/{id}/{action}` (`cancel`, `deliver`, `complete`): as an operator for
    /// `deliver`, else as the order's owner.
    pub async fn act(&self, order_id: &str, action: &str) -> Response {
        let req = self
            .client
            .post(self.url(&format!("/orders/{order_id}/{action}")));
        let req = if action == "deliver" {
            req.bearer_auth(self.operator_token())
        } else {
            self.as_owner(req, order_id).await
        };
        req.send().await.unwrap()
    }

    /// A signed refund notification.
    pub async fn refund_notice(&self, refund_no: &str, status: &str, modified: i64) -> Response {
        self.signed(
            "/refunds/callback",
            &order_api::refund_notice(refund_no, status, modified),
        )
        .await
    }

    /// `GET /orders/{id}` body, asserting 200.
    pub async fn get_order(&self, order_id: &str) -> Value {
        let req = self.client.get(self.url(&format!("/orders/{order_id}")));
        let r = self.as_owner(req, order_id).await.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// `POST /orders/{id}/cancel`.
    pub async fn cancel(&self, order_id: &str) -> Response {
        let req = self
            .client
            .post(self.url(&format!("/orders/{order_id}/cancel")));
        self.as_owner(req, order_id).await.send().await.unwrap()
    }

    /// `GET /metrics` text.
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The outbox events of one order in outbox id order: `(event_type, payload)`.
    pub async fn events(&self, order_id: &str) -> Vec<(String, Value)> {
        sqlx::query_as(
            "SELECT event_type, payload FROM outbox \
             WHERE aggregate_type = 'order' AND aggregate_id = $1 ORDER BY id",
        )
        .bind(order_id)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// Event types of one order, in outbox order.
    pub async fn event_types(&self, order_id: &str) -> Vec<String> {
        self.events(order_id)
            .await
            .into_iter()
            .map(|(t, _)| t)
            .collect()
    }

    /// Row counts and a fingerprint of all mutable state.
    pub async fn snapshot(&self) -> Snapshot {
        sqlx::query_as(
            "SELECT \
               (SELECT count(*) FROM skus) AS skus, \
               (SELECT count(*) FROM orders) AS orders, \
               (SELECT count(*) FROM order_items) AS order_items, \
               (SELECT count(*) FROM idempotency_keys) AS idempotency_keys, \
               (SELECT count(*) FROM payments) AS payments, \
               (SELECT count(*) FROM refunds) AS refunds, \
               (SELECT count(*) FROM outbox) AS outbox, \
               concat_ws('|', \
                 (SELECT string_agg(concat_ws(',', order_id, status, paid_cents, refund_reserved_cents, updated_at), ';' ORDER BY order_id) FROM orders), \
                 (SELECT string_agg(concat_ws(',', refund_no, status, provider_modified_ms, updated_at), ';' ORDER BY refund_no) FROM refunds), \
                 (SELECT string_agg(concat_ws(',', sku_id, name, price_cents, updated_at), ';' ORDER BY sku_id) FROM skus), \
                 (SELECT string_agg(concat_ws(',', transaction_id, disposition), ';' ORDER BY transaction_id) FROM payments) \
               ) AS state",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

/// Asserts the `{"error": {"code", "message"}}` shape and code; returns the error object.
pub async fn expect_error(r: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(r.status(), status, "unexpected status for expected {code}");
    let body: Value = r.json().await.expect("error bodies are JSON");
    let err = body["error"].clone();
    assert_eq!(err["code"], code, "body: {body}");
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error without message: {body}"
    );
    err
}
