//! The marketplace channel driven directly: the whole [`System`] with the channel on, and
//! signed `TradeSync` / `RefundSync` pushes whose `modified`, amounts and kinds the test
//! chooses (the simulator stamps every change with a new `modified` and keeps one amount per
//! refund call, so sequences such as "the same `modified`, a later status" or "the amount
//! lowered" are written here as the platform would send them).

use std::time::Duration;

use order_service::CallbackSecret;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::audit::AuditRun;
use crate::fulfilment::System;

/// The channel's HMAC key in these tests.
pub const SECRET: &str = "e2e-channel-secret";

/// The SKU every trade here buys (one unit).
pub const SKU: &str = "RV";

/// Its price: what a trade pays.
pub const PRICE: i64 = 1_000;

/// The system with the marketplace channel on (no compensation poller, no ship-back URL) and
/// ledgers installed, so the audit can run.
pub struct Channel {
    /// The shop.
    pub sys: System,
    secret: CallbackSecret,
}

impl Channel {
    /// Starts the system, the catalog entry and `stock` units of [`SKU`].
    pub async fn start(stock: i64) -> Self {
        Self::start_with(stock, Vec::new()).await
    }

    /// [`Channel::start`] with extra environment for the order service.
    pub async fn start_with(stock: i64, order_env: Vec<(String, String)>) -> Self {
        Self::start_with_env(stock, order_env, Vec::new()).await
    }

    /// [`Channel::start`] with extra environment for the order service and for all three
    /// services.
    pub async fn start_with_env(
        stock: i64,
        mut order_env: Vec<(String, String)>,
        services_env: Vec<(String, String)>,
    ) -> Self {
        order_env.push(("MARKETPLACE_SECRET".into(), SECRET.into()));
        let sys = System::start_with_env(&crate::kafka_brokers(), order_env, services_env).await;
        crate::audit::install_ledgers(&sys).await;
        sys.sku(SKU, PRICE).await;
        sys.set_stock(SKU, stock).await;
        Self {
            sys,
            secret: CallbackSecret::new(SECRET).unwrap(),
        }
    }

    /// A trade id unique to this run.
    pub fn tid(&self, name: &str) -> String {
        format!(
            "{name}-{}",
            self.sys.prefix.split('.').next().unwrap_or("run")
        )
    }

    /// Pushes `body` signed; the answer.
    pub async fn push(&self, body: &Value) -> (StatusCode, Value) {
        let raw = serde_json::to_vec(body).unwrap();
        let r = self
            .sys
            .http
            .post(self.sys.order.url("/channels/marketplace/push"))
            .header("content-type", "application/json")
            .header("X-Signature", self.secret.sign(&raw))
            .body(raw)
            .send()
            .await
            .expect("push");
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Pushes `body` and asserts `200 success`; returns the outcome.
    pub async fn pushed(&self, body: &Value) -> String {
        let (s, answer) = self.push(body).await;
        assert_eq!(s, StatusCode::OK, "{body} -> {answer}");
        answer["outcome"].as_str().unwrap_or_default().to_owned()
    }

    /// A `TradeSync` of `tid` (one unit of [`SKU`]) at `modified`; `paid_cents` as given.
    pub fn trade(tid: &str, status: &str, modified: i64, paid_cents: Option<i64>) -> Value {
        let mut m = json!({
            "msg_id": format!("t-{tid}-{status}-{modified}"), "type": "TradeSync",
            "modified": modified,
            "trade": {"tid": tid, "status": status, "buyer_id": format!("b-{tid}"),
                      "items": [{"sku_id": SKU, "quantity": 1}]}
        });
        if let Some(c) = paid_cents {
            m["trade"]["paid_cents"] = Value::from(c);
        }
        m
    }

    /// A `RefundSync` of refund `R-<tid>` at `modified`.
    pub fn refund(tid: &str, status: &str, modified: i64, cents: i64, kind: &str) -> Value {
        json!({
            "msg_id": format!("r-{tid}-{status}-{modified}-{cents}-{kind}"), "type": "RefundSync",
            "modified": modified,
            "refund": {"tid": tid, "refund_id": format!("R-{tid}"), "status": status,
                       "refund_cents": cents, "kind": kind}
        })
    }

    /// Creates and pays `tid` at `modified` and waits for its outbound (`CREATED`); returns
    /// our order id.
    pub async fn paid_trade(&self, tid: &str, modified: i64) -> String {
        self.pushed(&Self::trade(
            tid,
            "WAIT_SELLER_SEND_GOODS",
            modified,
            Some(PRICE),
        ))
        .await;
        let id = self.order_id(tid).await;
        self.sys.wait_outbound(&id, "CREATED").await;
        id
    }

    /// Our order id of `tid`.
    pub async fn order_id(&self, tid: &str) -> String {
        sqlx::query_scalar("SELECT order_id::text FROM channel_orders WHERE external_order_id = $1")
            .bind(tid)
            .fetch_one(&self.sys.order_db.pool)
            .await
            .unwrap()
    }

    /// `(amount_cents, kind, status)` of refund `marketplace:R-<tid>`.
    pub async fn our_refund(&self, tid: &str) -> (i64, String, String) {
        sqlx::query_as("SELECT amount_cents, kind, status FROM refunds WHERE refund_no = $1")
            .bind(format!("marketplace:R-{tid}"))
            .fetch_one(&self.sys.order_db.pool)
            .await
            .unwrap()
    }

    /// `(disposition, refund_due_cents)` of each payment of `order_id`.
    pub async fn payments(&self, order_id: &str) -> Vec<(String, Option<i64>)> {
        sqlx::query_as(
            "SELECT disposition, refund_due_cents FROM payments WHERE order_id = $1::uuid \
             ORDER BY received_at",
        )
        .bind(order_id)
        .fetch_all(&self.sys.order_db.pool)
        .await
        .unwrap()
    }

    /// Waits until the consumer on `consumer` applied every `event_type` of `aggregate_id`
    /// that `producer` wrote (its outbox ledger against the consumer's inbox).
    pub async fn wait_applied(
        &self,
        producer: &crate::db::TestDb,
        consumer: &crate::db::TestDb,
        event_type: &str,
        aggregate_id: &str,
    ) {
        crate::wait_for(
            &format!("{event_type} of {aggregate_id} to be applied"),
            Duration::from_secs(60),
            || async {
                let ids: Vec<String> = sqlx::query_scalar(
                    "SELECT event_id::text FROM outbox_ledger \
                     WHERE event_type = $1 AND aggregate_id = $2",
                )
                .bind(event_type)
                .bind(aggregate_id)
                .fetch_all(&producer.pool)
                .await
                .ok()?;
                let mut all = !ids.is_empty();
                for id in &ids {
                    all &= crate::fulfilment::in_inbox(&consumer.pool, id).await;
                }
                all.then_some(())
            },
        )
        .await;
    }

    /// Waits for `order_id`'s outbound to be `CREATED` and ships it (tracking `SF-<order_id>`);
    /// returns its number.
    pub async fn ship(&self, order_id: &str) -> String {
        let ob = self.sys.wait_outbound(order_id, "CREATED").await;
        let no = ob["outbound_no"].as_str().unwrap().to_owned();
        let (s, body, _) = self.sys.ship(&no, "SF", &format!("SF-{order_id}")).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        self.sys.wait_order(order_id, "SHIPPED").await;
        no
    }

    /// Waits until everything is published and consumed, then runs the audit on the settled
    /// system.
    pub async fn settled_audit(&self) -> AuditRun {
        self.sys.wait_outboxes_drained().await;
        crate::audit::run_caught_up(
            &self.sys,
            &["--settle-s", "0", "--max-unpublished-age-s", "600"],
            Duration::from_secs(60),
        )
        .await
    }
}
