//! The marketplace channel through the simulator: the `marketplace-sim` process as the
//! platform (trades, refunds, ship API, push faults) and the whole [`System`] with the order
//! service's channel pointed at it. The tests in `tests/it/services/marketplace.rs` and
//! `ship_backs.rs` drive it.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fulfilment::{Service, System};

/// The key the simulator signs its pushes with and the order service verifies them with.
pub const MARKETPLACE_SECRET: &str = "e2e-marketplace-secret";
/// The SKU every trade buys (one unit).
pub const SKU: &str = "MK";
/// Its price: what a trade pays.
pub const PRICE: i64 = 1_000;

/// The marketplace simulator and the whole shop, the order service's channel pointed at the
/// simulator and the simulator's pushes at the order service.
pub struct Market {
    /// The simulator.
    pub sim: Service,
    /// The shop.
    pub sys: System,
    /// An HTTP client for both.
    pub http: reqwest::Client,
}

impl Market {
    /// The simulator, then the system with the order service pointed at it, then the
    /// simulator's pushes pointed at the order service with `faults`.
    pub async fn start(faults: Value) -> Self {
        Self::start_on(&crate::kafka_brokers(), faults).await
    }

    /// [`Market::start`] on the broker at `brokers`.
    pub async fn start_on(brokers: &str, mut faults: Value) -> Self {
        let sim = Service::start_marketplace_simulator(MARKETPLACE_SECRET).await;
        let sys = System::start_with(
            brokers,
            vec![
                ("MARKETPLACE_SECRET".into(), MARKETPLACE_SECRET.into()),
                ("MARKETPLACE_URL".into(), sim.url("")),
                // Only explicit passes in these tests.
                (
                    "MARKETPLACE_COMPENSATION_INTERVAL_MS".into(),
                    "3600000".into(),
                ),
            ],
        )
        .await;
        faults["push_url"] = Value::from(sys.order.url("/channels/marketplace/push"));
        let http = reqwest::Client::new();
        let r = http
            .put(sim.url("/admin/faults"))
            .json(&faults)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        sys.sku(SKU, PRICE).await;
        Self { sim, sys, http }
    }

    /// A short id of this test's run (its topic prefix's first part), for unique tids.
    pub fn run_id(&self) -> &str {
        self.sys.prefix.split('.').next().unwrap_or("run")
    }

    /// POSTs `body` to the simulator's `path`, asserting success; its answer.
    pub async fn sim_post(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(self.sim.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    /// GETs the simulator's `path`.
    pub async fn sim_get(&self, path: &str) -> Value {
        self.http
            .get(self.sim.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A paid trade `tid` of one unit of [`SKU`] on the platform.
    pub async fn trade(&self, tid: &str) {
        self.sim_post(
            "/trades",
            json!({"tid": tid, "buyer_id": format!("buyer-{tid}"),
                   "items": [{"sku_id": SKU, "quantity": 1}], "paid_cents": PRICE, "pay": true}),
        )
        .await;
    }

    /// A refund of `cents` of `kind` on trade `tid`, requested and then succeeded.
    pub async fn refund(&self, tid: &str, cents: i64, kind: &str) {
        self.sim_post(
            &format!("/trades/{tid}/refunds"),
            json!({"refund_id": format!("R-{tid}"), "refund_cents": cents, "kind": kind,
                   "statuses": ["WAIT_SELLER_AGREE", "SUCCESS"]}),
        )
        .await;
    }

    /// One compensation pass of the order service (as an operator); its report.
    pub async fn compensate(&self) -> Value {
        let r = self
            .http
            .post(self.sys.order.url("/channels/marketplace/compensate"))
            .bearer_auth(crate::auth::operator())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// tid -> (our order id, our status).
    pub async fn our_orders(&self) -> HashMap<String, (String, String)> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT c.external_order_id, o.order_id::text, o.status FROM channel_orders c \
             JOIN orders o USING (order_id)",
        )
        .fetch_all(&self.sys.order_db.pool)
        .await
        .unwrap();
        rows.into_iter().map(|(t, id, s)| (t, (id, s))).collect()
    }

    /// order id -> (outbound_no, status) in the WMS.
    pub async fn outbounds(&self) -> HashMap<String, (String, String)> {
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT order_id::text, outbound_no, status FROM outbounds")
                .fetch_all(&self.sys.wms_db.pool)
                .await
                .unwrap();
        rows.into_iter().map(|(o, n, s)| (o, (n, s))).collect()
    }

    /// Ship calls per tid by result.
    pub async fn ship_calls(&self) -> HashMap<String, Vec<String>> {
        let calls = self.sim_get("/calls").await;
        let mut by_tid: HashMap<String, Vec<String>> = HashMap::new();
        for c in calls["ship"].as_array().unwrap() {
            by_tid
                .entry(c["tid"].as_str().unwrap().to_owned())
                .or_default()
                .push(c["result"].as_str().unwrap().to_owned());
        }
        by_tid
    }

    /// Waits for the WMS to have a `CREATED` outbound for each of `orders`, ships them all and
    /// waits until the platform shows each trade shipped (the ship-back arrived).
    pub async fn ship_all(&self, orders: &[(String, String)]) {
        self.ship_outbounds(orders).await;
        self.wait_platform_shipped(orders.len(), Duration::from_secs(120))
            .await;
    }

    /// Waits for the WMS to have a `CREATED` outbound for each of `orders` and ships them all
    /// (tracking number `SF{index:06}`), without waiting for the ship-backs.
    pub async fn ship_outbounds(&self, orders: &[(String, String)]) {
        let ids: Vec<String> = orders.iter().map(|(_, id)| id.clone()).collect();
        let outbounds = crate::wait_for(
            "an outbound CREATED for every shippable order",
            Duration::from_secs(120),
            || async {
                let ob = self.outbounds().await;
                ids.iter()
                    .all(|id| ob.get(id).is_some_and(|(_, s)| s == "CREATED"))
                    .then_some(ob)
            },
        )
        .await;
        futures::stream::iter(orders.iter().enumerate())
            .for_each_concurrent(8, |(i, (_, id))| {
                let no = outbounds[id].0.clone();
                async move {
                    let (s, body, _) = self.sys.ship(&no, "SF", &format!("SF{i:06}")).await;
                    assert_eq!(s, StatusCode::OK, "{body}");
                }
            })
            .await;
    }

    /// Waits until the platform shows `n` trades shipped (their ship-backs arrived).
    pub async fn wait_platform_shipped(&self, n: usize, timeout: Duration) {
        crate::wait_for(
            "the platform to show every shippable trade shipped",
            timeout,
            || async {
                let trades = self.sim_get("/trades").await;
                let shipped = trades
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|t| t["status"] == "WAIT_BUYER_CONFIRM")
                    .count();
                (shipped == n).then_some(())
            },
        )
        .await;
    }
}
