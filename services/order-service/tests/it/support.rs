//! Test harness: a fresh database per test, the app served on an ephemeral port, helpers to
//! call it and to read what the database holds.

use std::str::FromStr;
use std::time::Duration;

use order_service::{AppState, CallbackSecret, Metrics};
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use tokio_util::sync::CancellationToken;

/// The secret the test app verifies callbacks with.
pub const SECRET: &str = "test-callback-secret";

/// The secret the test app verifies marketplace pushes with.
pub const MARKETPLACE_SECRET: &str = "test-marketplace-secret";

/// A running order service on its own database.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// HTTP client.
    pub client: reqwest::Client,
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

fn admin_url() -> String {
    std::env::var("DATABASE_URL").expect(
        "DATABASE_URL must point at a PostgreSQL server these tests may create databases on \
         (e.g. postgres://postgres@127.0.0.1:5432/postgres)",
    )
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
        let admin =
            PgConnectOptions::from_str(&admin_url()).expect("DATABASE_URL is not a valid URL");
        let name = format!("order_it_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin
            .connect()
            .await
            .expect("cannot connect to DATABASE_URL");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("CREATE DATABASE");
        conn.close().await.ok();
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(admin.database(&name))
            .await
            .expect("connect to the test database");
        order_service::migrate(&pool).await.expect("migrations");
        let secret = CallbackSecret::new(SECRET).unwrap();
        let state = AppState {
            pool: pool.clone(),
            metrics: Metrics::new(),
            secret: secret.clone(),
            marketplace_secret: Some(CallbackSecret::new(MARKETPLACE_SECRET).unwrap()),
            marketplace: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(order_service::serve(
            listener,
            state,
            shutdown.clone(),
            Duration::from_secs(1),
        ));
        Self {
            base,
            client: reqwest::Client::new(),
            pool,
            secret,
            shutdown,
        }
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
            .json(&json!({ "name": format!("Item {sku_id}"), "price_cents": price_cents }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    }

    /// `POST /orders` with an optional key.
    pub async fn post_order(&self, key: Option<&str>, body: &Value) -> Response {
        let mut req = self.client.post(self.url("/orders")).json(body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        req.send().await.unwrap()
    }

    /// Creates an order of `quantity` × `sku_id` for `user`, asserting 201; returns its body.
    pub async fn order(&self, user: &str, sku_id: &str, quantity: i64) -> Value {
        let key = uuid::Uuid::new_v4().to_string();
        let body =
            json!({ "user_id": user, "items": [{ "sku_id": sku_id, "quantity": quantity }] });
        let r = self.post_order(Some(&key), &body).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        r.json().await.unwrap()
    }

    /// POSTs `raw` with `X-Signature: signature` when given.
    pub async fn post_raw(&self, path: &str, raw: &[u8], signature: Option<&str>) -> Response {
        let mut req = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(raw.to_vec());
        if let Some(s) = signature {
            req = req.header("X-Signature", s);
        }
        req.send().await.unwrap()
    }

    /// POSTs `body` to a callback path, correctly signed.
    pub async fn signed(&self, path: &str, body: &Value) -> Response {
        let raw = serde_json::to_vec(body).unwrap();
        let sig = self.secret.sign(&raw);
        self.post_raw(path, &raw, Some(&sig)).await
    }

    /// A signed payment notification.
    pub async fn pay(&self, order_id: &str, transaction_id: &str, amount_cents: i64) -> Response {
        self.signed(
            "/payments/callback",
            &json!({
                "order_id": order_id,
                "transaction_id": transaction_id,
                "amount_cents": amount_cents,
                "status": "SUCCESS"
            }),
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
        self.client
            .post(self.url(&format!("/orders/{order_id}/refunds")))
            .json(&json!({ "refund_no": refund_no, "amount_cents": amount_cents, "reason": "damaged" }))
            .send()
            .await
            .unwrap()
    }

    /// `POST /orders/{id}/refunds` with a kind.
    pub async fn refund_of_kind(
        &self,
        order_id: &str,
        refund_no: &str,
        amount_cents: i64,
        kind: &str,
    ) -> Response {
        self.client
            .post(self.url(&format!("/orders/{order_id}/refunds")))
            .json(&json!({ "refund_no": refund_no, "amount_cents": amount_cents, "reason": "damaged", "kind": kind }))
            .send()
            .await
            .unwrap()
    }

    /// `POST /orders/{id}/{action}` (`cancel`, `deliver`, `complete`).
    pub async fn act(&self, order_id: &str, action: &str) -> Response {
        self.client
            .post(self.url(&format!("/orders/{order_id}/{action}")))
            .send()
            .await
            .unwrap()
    }

    /// A signed refund notification.
    pub async fn refund_notice(&self, refund_no: &str, status: &str, modified: i64) -> Response {
        self.signed(
            "/refunds/callback",
            &json!({ "refund_no": refund_no, "status": status, "modified": modified }),
        )
        .await
    }

    /// `GET /orders/{id}` body, asserting 200.
    pub async fn get_order(&self, order_id: &str) -> Value {
        let r = self
            .client
            .get(self.url(&format!("/orders/{order_id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// `POST /orders/{id}/cancel`.
    pub async fn cancel(&self, order_id: &str) -> Response {
        self.client
            .post(self.url(&format!("/orders/{order_id}/cancel")))
            .send()
            .await
            .unwrap()
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
