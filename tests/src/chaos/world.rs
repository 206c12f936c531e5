//! Everything the chaos run starts: a private PostgreSQL and a private Apache Kafka broker,
//! a proxy in front of each (the broker advertises its proxy's address), the marketplace
//! simulator, the three services with the producer-side ledgers installed, and four relays
//! (one per database, plus a standby for the orders database) that faults kill and restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::PgPool;

use crate::fulfilment::{Service, System};
use crate::proc::{RelayArgs, RelayProcess};
use crate::proxy::Proxy;
use crate::servers::{Kafka, PgCluster};

/// The marketplace simulator's shared secret.
pub const MARKETPLACE_SECRET: &str = "chaos-marketplace-secret";

/// A relay the faults may kill and restart.
#[derive(Debug)]
pub struct RelaySlot {
    /// Its instance id (also its lease holder name).
    pub name: String,
    /// How it is started.
    pub args: RelayArgs,
    /// The process, while it runs.
    pub process: Option<RelayProcess>,
}

/// The running world.
#[derive(Debug)]
pub struct World {
    /// PostgreSQL (restarted by faults).
    pub pg: PgCluster,
    /// The proxy every client of PostgreSQL goes through.
    pub pg_proxy: Proxy,
    /// The broker (restarted by faults).
    pub kafka: Mutex<Kafka>,
    /// The proxy every Kafka client goes through (the broker advertises it).
    pub kafka_proxy: Proxy,
    /// The services, their databases and HTTP clients (its `relays` are in [`World::relays`]).
    pub sys: Arc<System>,
    /// The marketplace simulator.
    pub sim: Service,
    /// The relays: `relay-order`, `relay-order-standby`, `relay-wms`, `relay-stock`.
    pub relays: Mutex<Vec<RelaySlot>>,
    /// Pools on the three databases straight to PostgreSQL (not through the proxy), for
    /// sampling the lag while the proxy is faulty: order, wms, stock.
    pub direct: [PgPool; 3],
    /// HTTP client for the simulator.
    pub http: reqwest::Client,
}

/// SKUs of the load: `(sku, price_cents, stock)`. `rare` runs out, so some paid orders are
/// rejected for lack of stock.
pub const SKUS: [(&str, i64, i64); 4] = [
    ("lamp", 2_500, 1_000_000),
    ("chair", 8_900, 1_000_000),
    ("rare", 9_999, 25),
    ("MK", 1_000, 1_000_000),
];

impl World {
    /// Starts everything and waits until it serves.
    pub async fn start() -> Self {
        let pg = PgCluster::start();
        let pg_proxy = Proxy::start(0, pg.port).await;
        let kafka_port = crate::free_port();
        let kafka = tokio::task::spawn_blocking(move || Kafka::start_behind(kafka_port))
            .await
            .unwrap();
        let kafka_proxy = Proxy::start(kafka_port, kafka.port).await;
        let brokers = format!("127.0.0.1:{}", kafka_proxy.port);
        let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", pg_proxy.port);

        let sim = Service::start_marketplace_simulator(MARKETPLACE_SECRET).await;
        let mut sys = System::start_on_servers(
            &admin,
            &brokers,
            vec![
                ("MARKETPLACE_SECRET".into(), MARKETPLACE_SECRET.into()),
                ("MARKETPLACE_URL".into(), sim.url("")),
                ("MARKETPLACE_COMPENSATION_INTERVAL_MS".into(), "5000".into()),
            ],
            vec![],
        )
        .await;
        crate::audit::install_ledgers(&sys).await;
        let mut started = std::mem::take(&mut sys.relays).into_iter();
        let dbs = [&sys.order_db, &sys.order_db, &sys.wms_db, &sys.stock_db];
        let names = [
            "relay-order",
            "relay-order-standby",
            "relay-wms",
            "relay-stock",
        ];
        let relays = dbs
            .iter()
            .zip(names)
            .map(|(db, name)| {
                let args = RelayArgs::new(&db.url, &brokers, &sys.prefix, name);
                // The three the system started keep running; the standby starts here.
                let process = if name == "relay-order-standby" {
                    RelayProcess::start(&args)
                } else {
                    started.next().expect("a relay per database")
                };
                RelaySlot {
                    name: name.to_owned(),
                    args,
                    process: Some(process),
                }
            })
            .collect();
        let direct_url = |db: &crate::db::TestDb| {
            db.url.replace(
                &format!("127.0.0.1:{}/", pg_proxy.port),
                &format!("127.0.0.1:{}/", pg.port),
            )
        };
        let direct = [
            PgPool::connect_lazy(&direct_url(&sys.order_db)).unwrap(),
            PgPool::connect_lazy(&direct_url(&sys.wms_db)).unwrap(),
            PgPool::connect_lazy(&direct_url(&sys.stock_db)).unwrap(),
        ];
        let me = Self {
            pg,
            pg_proxy,
            kafka: Mutex::new(kafka),
            kafka_proxy,
            sys: Arc::new(sys),
            sim,
            relays: Mutex::new(relays),
            direct,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        for (sku, price, stock) in SKUS {
            me.sys.sku(sku, price).await;
            me.sys.set_stock(sku, stock).await;
        }
        me.point_pushes().await;
        me
    }

    /// Points the simulator's pushes at the order service's current address (it changes when
    /// the service restarts), with duplicate copies, new msg_ids and dropped pushes.
    pub async fn point_pushes(&self) {
        let faults = json!({
            "push_url": self.sys.order.url("/channels/marketplace/push"),
            "push_copies": 2,
            "new_msg_id_ratio": 0.1,
            "drop_ratio": 0.05,
        });
        crate::wait_for(
            "the simulator to take its push settings",
            Duration::from_secs(30),
            || async {
                let r = self
                    .http
                    .put(self.sim.url("/admin/faults"))
                    .json(&faults)
                    .send()
                    .await
                    .ok()?;
                r.status().is_success().then_some(())
            },
        )
        .await;
    }

    /// Places (and pays) a trade on the marketplace; `false` when the simulator refused.
    pub async fn trade(&self, tid: &str) -> bool {
        let body: Value = json!({"tid": tid, "buyer_id": format!("buyer-{tid}"),
            "items": [{"sku_id": "MK", "quantity": 1}], "paid_cents": 1_000, "pay": true});
        matches!(
            self.http.post(self.sim.url("/trades")).json(&body).send().await,
            Ok(r) if r.status().is_success()
        )
    }

    /// Sends one of the reverse sequences through the simulator's refund API (`refund` is its
    /// body: statuses, amounts, `same_modified`); `false` when the simulator refused (the
    /// trade not placed yet, or closed).
    pub async fn refund_trade(&self, tid: &str, refund: &Value) -> bool {
        matches!(
            self.http
                .post(self.sim.url(&format!("/trades/{tid}/refunds")))
                .json(refund)
                .send()
                .await,
            Ok(r) if r.status().is_success()
        )
    }

    /// The Kafka bootstrap address (the proxy).
    pub fn brokers(&self) -> String {
        self.sys.brokers.clone()
    }

    /// The current holder of the orders database's lease.
    pub async fn order_leader(&self) -> Option<String> {
        sqlx::query_scalar(
            "SELECT holder FROM outbox_relay_lease WHERE name = 'default' AND expires_at > now()",
        )
        .fetch_optional(&self.direct[0])
        .await
        .ok()
        .flatten()
    }

    /// Unpublished events in the three outboxes, `None` when a database does not answer.
    pub async fn backlog(&self) -> Option<i64> {
        let mut total = 0;
        for pool in &self.direct {
            total += crate::db::backlog(pool).await.ok()?;
        }
        Some(total)
    }

    /// Duplicates the three inboxes absorbed so far, `None` when a database does not answer.
    pub async fn inbox_duplicates(&self) -> Option<i64> {
        let mut total = 0;
        for pool in &self.direct {
            let n: i64 =
                sqlx::query_scalar("SELECT COALESCE(sum(duplicates), 0)::bigint FROM inbox")
                    .fetch_one(pool)
                    .await
                    .ok()?;
            total += n;
        }
        Some(total)
    }

    /// Orders on their way through the pipeline: paid without a reservation decision yet, plus
    /// reserved (not rejected) without an outbound yet; `None` when a database does not answer.
    /// Counted from the business tables (cheap counts), so it is the lag a user sees.
    pub async fn orders_in_flight(&self) -> Option<i64> {
        let count = |pool: &PgPool, sql: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(&pool)
                    .await
                    .ok()
            }
        };
        let paid = count(
            &self.direct[0],
            "SELECT count(*) FROM orders WHERE paid_cents > 0",
        )
        .await?;
        let decided = count(&self.direct[2], "SELECT count(*) FROM reservations").await?;
        let to_ship = count(
            &self.direct[2],
            "SELECT count(*) FROM reservations WHERE status <> 'REJECTED'",
        )
        .await?;
        let outbounds = count(&self.direct[1], "SELECT count(*) FROM outbounds").await?;
        Some((paid - decided).max(0) + (to_ship - outbounds).max(0))
    }
}
