//! The whole shop as child processes: the order service, the WMS consumer and the stock
//! consumer, each on a fresh database with its own relay, on a test's own topics and consumer
//! groups. HTTP helpers drive them; SQL helpers look into their databases.

use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::Mutex;
use std::time::Duration;

use order_service::CallbackSecret;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;
use test_support::order_api;

use crate::db::TestDb;
use crate::proc::{log_file, workspace_binary, RelayArgs, RelayProcess, ServiceProcess};

/// The secret the order service verifies payment and refund callbacks with.
pub const SECRET: &str = "e2e-callback-secret";

/// Partitions of every topic the tests create.
pub const PARTITIONS: i32 = 3;

/// One service binary as a child process ([`ServiceProcess`]); killed when dropped. It can be
/// killed and started again while other tasks use it (interior mutability).
#[derive(Debug)]
pub struct Service {
    /// Name for logs and messages.
    pub name: String,
    bin: String,
    envs: Vec<(String, String)>,
    child: Mutex<Option<ServiceProcess>>,
    /// Where this run's log starts, and the address it found there.
    addr: Mutex<(u64, Option<String>)>,
    /// Its log file (all its runs append to it).
    pub log: PathBuf,
}

impl Service {
    /// Starts workspace binary `bin` with environment `envs` (and `LISTEN_ADDR=127.0.0.1:0`).
    pub fn spawn(name: &str, bin: &str, envs: Vec<(String, String)>) -> Self {
        let log = log_file(name);
        let me = Self {
            name: name.to_owned(),
            bin: bin.to_owned(),
            envs,
            child: Mutex::new(None),
            addr: Mutex::new((0, None)),
            log,
        };
        me.start_again();
        me
    }

    /// Starts the marketplace simulator (`marketplace-sim`, signing its pushes with `secret`)
    /// and waits until it serves.
    pub async fn start_marketplace_simulator(secret: &str) -> Self {
        let sim = Self::spawn(
            "marketplace-sim",
            "marketplace-sim",
            vec![("MARKETPLACE_SECRET".into(), secret.into())],
        );
        crate::wait_for(
            "the simulator to serve",
            Duration::from_secs(30),
            || async { crate::proc::http_get(&sim.addr(), "/healthz").await },
        )
        .await;
        sim
    }

    /// Starts the process (again). It listens on a port the system picks (`127.0.0.1:0`, so
    /// no other process can take it in between); [`Service::addr`] reads it from the log.
    pub fn start_again(&self) {
        let mut slot = self.child.lock().unwrap();
        assert!(slot.is_none(), "{} is running", self.name);
        let log_start = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let child = ServiceProcess::spawn(
            Command::new(workspace_binary(&self.bin))
                .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .env("LISTEN_ADDR", "127.0.0.1:0"),
            self.log.clone(),
        );
        *slot = Some(child);
        *self.addr.lock().unwrap() = (log_start, None);
    }

    /// SIGKILL, then reap.
    pub fn kill(&self) {
        // Also after a panic while it was held (e.g. a failed start): this runs in `Drop`, and
        // a panic there would abort and leave the other children running.
        let mut slot = self
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(mut c) = slot.take() {
            c.kill();
        }
    }

    /// SIGTERM; waits up to `timeout` for the exit (killing it after that).
    pub fn terminate(&self, timeout: Duration) -> Option<(Duration, ExitStatus)> {
        let mut child = self.child.lock().unwrap().take()?;
        child.terminate(timeout)
    }

    /// `host:port` it listens on now, as its log says once it is serving (`127.0.0.1:0`, which
    /// nothing answers, until then).
    pub fn addr(&self) -> String {
        let mut slot = self.addr.lock().unwrap();
        if let (start, None) = *slot {
            let log = std::fs::read(&self.log).unwrap_or_default();
            let text = String::from_utf8_lossy(log.get(start as usize..).unwrap_or_default());
            let found = text
                .lines()
                .filter(|l| l.contains("Serving"))
                .find_map(|l| l.split("addr=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned);
            slot.1 = found;
        }
        slot.1.clone().unwrap_or_else(|| "127.0.0.1:0".to_owned())
    }

    /// `http://addr/path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/metrics` text (empty when unreachable).
    pub async fn metrics(&self) -> String {
        crate::proc::http_get(&self.addr(), "/metrics")
            .await
            .unwrap_or_default()
    }

    /// Starts a consumer again after a crash (SIGKILL) and waits until the group hands it
    /// partitions: the group rebalances once the dead member's session has run out
    /// ([`Service::session_timeout`]), so within that plus a minute. Returns how long it took.
    pub async fn start_again_until_assigned(&self) -> Duration {
        self.try_start_again_until_assigned()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Self::start_again_until_assigned`]; the error says how it ended (the process is left
    /// running).
    pub async fn try_start_again_until_assigned(&self) -> Result<Duration, String> {
        let started = std::time::Instant::now();
        self.start_again();
        let deadline = self.session_timeout() + Duration::from_secs(60);
        let assigned = crate::poll_until(deadline, || async {
            let m = self.metrics().await;
            (metric(&m, "consumer_assigned_partitions", &[]) >= 1.0).then_some(())
        })
        .await;
        match assigned {
            Some(()) => Ok(started.elapsed()),
            None => Err(format!(
                "{} got no partitions within {} s of its start; log {}",
                self.name,
                deadline.as_secs(),
                self.log.display()
            )),
        }
    }

    /// Its consumer's `session.timeout.ms`, from the last `KAFKA_CONSUMER_CONFIG` of its
    /// environment ([`SESSION_TIMEOUT`] when none sets it).
    pub fn session_timeout(&self) -> Duration {
        self.envs
            .iter()
            .rev()
            .filter(|(k, _)| k == "KAFKA_CONSUMER_CONFIG")
            .find_map(|(_, v)| {
                v.split(',')
                    .find_map(|kv| kv.trim().strip_prefix("session.timeout.ms="))
                    .and_then(|ms| ms.parse().ok())
            })
            .map_or(SESSION_TIMEOUT, Duration::from_millis)
    }

    /// Waits until `/healthz` answers 200 (database reachable, consumer running) and the
    /// consumer has partitions assigned.
    pub async fn wait_ready(&self, timeout: Duration) {
        let what = format!("{} to be ready (log {})", self.name, self.log.display());
        crate::wait_for(&what, timeout, || async {
            crate::proc::http_get(&self.addr(), "/healthz").await?;
            let m = self.metrics().await;
            (metric(&m, "consumer_assigned_partitions", &[]) >= 1.0).then_some(())
        })
        .await;
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

pub use crate::proc::metric;

/// The three services and their relays.
#[derive(Debug)]
pub struct System {
    /// Bootstrap servers.
    pub brokers: String,
    /// This system's topic prefix.
    pub prefix: String,
    /// The order service's database.
    pub order_db: TestDb,
    /// The WMS's database.
    pub wms_db: TestDb,
    /// The stock consumer's database.
    pub stock_db: TestDb,
    /// `order-service` (HTTP + fulfilment consumer).
    pub order: Service,
    /// `wms-consumer`.
    pub wms: Service,
    /// `stock-consumer`.
    pub stock: Service,
    /// One relay per database.
    pub relays: Vec<RelayProcess>,
    /// HTTP client; sends an operator token unless a request sets its own.
    pub http: reqwest::Client,
    secret: CallbackSecret,
}

/// `Authorization: Bearer <operator token>`.
pub fn operator_headers() -> reqwest::header::HeaderMap {
    order_api::bearer_headers(&crate::auth::operator())
}

/// The consumers' `session.timeout.ms` in these tests: a SIGKILLed member holds its
/// partitions this long.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);

/// The environment of a consuming service on `db`, topics under `prefix`, group `prefix + group`.
pub fn consumer_env(
    db: &TestDb,
    brokers: &str,
    prefix: &str,
    group: &str,
) -> Vec<(String, String)> {
    consumer_env_at(&db.url, brokers, prefix, group)
}

/// [`consumer_env`] with `database_url` as its `DATABASE_URL`.
fn consumer_env_at(
    database_url: &str,
    brokers: &str,
    prefix: &str,
    group: &str,
) -> Vec<(String, String)> {
    [
        ("DATABASE_URL", database_url),
        ("KAFKA_BROKERS", brokers),
        ("OUTBOX_TOPIC_PREFIX", prefix),
        ("KAFKA_GROUP_ID", &format!("{prefix}{group}")),
        ("CONSUMER_CREATE_MISSING_TOPICS", "true"),
        ("CONSUMER_TOPIC_PARTITIONS", &PARTITIONS.to_string()),
        (
            "KAFKA_CONSUMER_CONFIG",
            &format!("session.timeout.ms={}", SESSION_TIMEOUT.as_millis()),
        ),
        ("CONSUMER_SHUTDOWN_TIMEOUT_MS", "5000"),
        ("CONSUMER_RETRY_MAX_BACKOFF_MS", "1000"),
        ("DATABASE_MAX_CONNECTIONS", "10"),
        (
            "RUST_LOG",
            "info,outbox_consumer=debug,sqlx=warn,rdkafka=warn",
        ),
    ]
    .iter()
    .chain(crate::auth::ENV.iter())
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

/// How a process of a [`System`] logs in to its database when not with the database's own
/// URL: as a least-privilege role over TLS, say.
#[derive(Debug, Clone)]
pub struct DbLogin {
    /// Its `DATABASE_URL` (no password in it: that comes with `env`, if any).
    pub url: String,
    /// Environment that goes with it (`DATABASE_PASSWORD_FILE`, `DATABASE_MIGRATIONS=skip`).
    pub env: Vec<(String, String)>,
}

impl DbLogin {
    /// With `db`'s own URL and nothing else, as [`System::start_on_servers`] starts them.
    pub fn of(db: &TestDb) -> Self {
        Self {
            url: db.url.clone(),
            env: Vec::new(),
        }
    }
}

/// One database of a [`System`], made and migrated beforehand, with how its service and its
/// relay log in to it ([`System::start_on_databases`]).
#[derive(Debug, Clone)]
pub struct SystemDb {
    /// The database: its URL is what `outbox-audit` reads it with ([`crate::audit`]), its pool
    /// is the harness's.
    pub db: TestDb,
    /// How the service logs in.
    pub service: DbLogin,
    /// How the relay logs in.
    pub relay: DbLogin,
}

/// How a [`System`] starts its relay `name` on `login`, topics under `prefix`: the services'
/// Kafka security settings and OpenTelemetry export (of `services_env`) reach the relays too,
/// then the login's environment.
pub fn relay_args(
    login: &DbLogin,
    brokers: &str,
    prefix: &str,
    name: &str,
    services_env: &[(String, String)],
) -> RelayArgs {
    let mut args = RelayArgs::new(&login.url, brokers, prefix, name);
    args.env = services_env
        .iter()
        .filter(|(k, _)| {
            ["KAFKA_SECURITY_", "KAFKA_SASL_", "KAFKA_SSL_", "OTEL_"]
                .iter()
                .any(|p| k.starts_with(p))
        })
        .chain(&login.env)
        .cloned()
        .collect();
    args
}

impl System {
    /// Starts everything on the shared broker (`KAFKA_BROKERS`).
    pub async fn start() -> Self {
        Self::start_on(&crate::kafka_brokers()).await
    }

    /// Starts everything on `brokers`, waiting until every service is ready.
    pub async fn start_on(brokers: &str) -> Self {
        Self::start_with(brokers, Vec::new()).await
    }

    /// Starts everything on `brokers` with extra environment for the order service.
    pub async fn start_with(brokers: &str, order_extra_env: Vec<(String, String)>) -> Self {
        Self::start_with_env(brokers, order_extra_env, Vec::new()).await
    }

    /// Starts everything on `brokers` with extra environment for the order service and extra
    /// environment for all three services (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub async fn start_with_env(
        brokers: &str,
        order_extra_env: Vec<(String, String)>,
        services_env: Vec<(String, String)>,
    ) -> Self {
        let admin = test_support::db::admin_url();
        Self::start_on_servers(&admin, brokers, order_extra_env, services_env).await
    }

    /// Starts everything with its three databases on the PostgreSQL server of `admin_url`
    /// (e.g. a private one, or a proxy in front of it) and on `brokers`, with extra
    /// environment for the order service and for all three services.
    pub async fn start_on_servers(
        admin_url: &str,
        brokers: &str,
        order_extra_env: Vec<(String, String)>,
        services_env: Vec<(String, String)>,
    ) -> Self {
        let (order_db, wms_db, stock_db) = tokio::join!(
            crate::db::fresh_database_on(admin_url),
            crate::db::fresh_database_on(admin_url),
            crate::db::fresh_database_on(admin_url)
        );
        let dbs = [order_db, wms_db, stock_db].map(|db| SystemDb {
            service: DbLogin::of(&db),
            relay: DbLogin::of(&db),
            db,
        });
        Self::start_on_databases(dbs, brokers, order_extra_env, services_env).await
    }

    /// Starts everything on `dbs` (order, wms, stock: made and migrated beforehand, each
    /// process logging in as its [`SystemDb`] says) and on `brokers`, with extra environment
    /// for the order service and for all three services (and, for their Kafka security
    /// settings, the relays: [`relay_args`]).
    pub async fn start_on_databases(
        dbs: [SystemDb; 3],
        brokers: &str,
        order_extra_env: Vec<(String, String)>,
        services_env: Vec<(String, String)>,
    ) -> Self {
        let prefix = crate::unique_topic_prefix();
        let env = |db: &SystemDb, group: &str| {
            let mut env = consumer_env_at(&db.service.url, brokers, &prefix, group);
            env.extend(services_env.iter().cloned());
            env.extend(db.service.env.iter().cloned());
            env
        };
        let [order_db, wms_db, stock_db] = dbs;
        let mut order_env = env(&order_db, "order");
        order_env.push(("PAYMENT_CALLBACK_SECRET".to_owned(), SECRET.to_owned()));
        order_env.extend(order_extra_env);
        let order = Service::spawn("order-service", "order-service", order_env);
        let wms = Service::spawn("wms-consumer", "wms-consumer", env(&wms_db, "wms"));
        let stock = Service::spawn("stock-consumer", "stock-consumer", env(&stock_db, "stock"));
        let relays = [
            (&order_db, "relay-order"),
            (&wms_db, "relay-wms"),
            (&stock_db, "relay-stock"),
        ]
        .into_iter()
        .map(|(db, name)| {
            RelayProcess::start(&relay_args(
                &db.relay,
                brokers,
                &prefix,
                name,
                &services_env,
            ))
        })
        .collect();
        let (order_db, wms_db, stock_db) = (order_db.db, wms_db.db, stock_db.db);
        let me = Self {
            brokers: brokers.to_owned(),
            prefix,
            order_db,
            wms_db,
            stock_db,
            order,
            wms,
            stock,
            relays,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .default_headers(operator_headers())
                .build()
                .unwrap(),
            secret: CallbackSecret::new(SECRET).unwrap(),
        };
        let ready = Duration::from_secs(90);
        tokio::join!(
            me.order.wait_ready(ready),
            me.wms.wait_ready(ready),
            me.stock.wait_ready(ready)
        );
        me
    }

    /// The topic of `aggregate_type`.
    pub fn topic(&self, aggregate_type: &str) -> String {
        format!("{}{aggregate_type}", self.prefix)
    }

    /// Sends `req`; a `503` (with `Retry-After`: the services' "send the same request again")
    /// is sent again every 250 ms until another answer comes, for up to 30 s, as a client of
    /// these APIs should; the last answer is returned.
    async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let (status, _, body) = self.send_with_headers(req).await;
        (status, body)
    }

    /// [`System::send`], with the last answer's headers too (e.g. `Idempotent-Replayed`).
    async fn send_with_headers(
        &self,
        req: reqwest::RequestBuilder,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let next = std::sync::Mutex::new(Some(req));
        let last = std::sync::Mutex::new(None);
        outbox_process::poll::poll_every(
            Duration::from_millis(250),
            Duration::from_secs(30),
            || async {
                let req = next.lock().unwrap().take()?;
                let again = req.try_clone();
                let r = req.send().await.expect("HTTP request");
                let unavailable = r.status() == StatusCode::SERVICE_UNAVAILABLE;
                *last.lock().unwrap() = Some(r);
                match again {
                    Some(again) if unavailable => {
                        *next.lock().unwrap() = Some(again);
                        None
                    }
                    _ => Some(()),
                }
            },
        )
        .await;
        let r = last.into_inner().unwrap().expect("a request was sent");
        let status = r.status();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap_or_default();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `PUT /skus/{sku}` on the order service.
    pub async fn sku(&self, sku: &str, price_cents: i64) {
        let (s, body) = self
            .send(
                self.http
                    .put(self.order.url(&format!("/skus/{sku}")))
                    .json(&json!({ "name": sku, "price_cents": price_cents })),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }

    /// `PUT /stock/{sku}` on the stock consumer.
    pub async fn set_stock(&self, sku: &str, on_hand: i64) {
        let (s, body) = self
            .send(
                self.http
                    .put(self.stock.url(&format!("/stock/{sku}")))
                    .json(&json!({ "on_hand": on_hand })),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }

    /// A SKU's `(on_hand, reserved)`.
    pub async fn stock_of(&self, sku: &str) -> (i64, i64) {
        let (s, body) = self
            .send(self.http.get(self.stock.url(&format!("/stock/{sku}"))))
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        (
            body["on_hand"].as_i64().unwrap(),
            body["reserved"].as_i64().unwrap(),
        )
    }

    /// Waits until a SKU's stock is `(on_hand, reserved)`.
    pub async fn wait_stock(&self, sku: &str, expected: (i64, i64)) {
        crate::wait_for(
            &format!("stock of {sku} to be {expected:?}"),
            Duration::from_secs(60),
            || async { (self.stock_of(sku).await == expected).then_some(()) },
        )
        .await;
    }

    /// Creates an order of `items` (`(sku, quantity)`) as customer `user`; returns
    /// `(order_id, amount_cents)`.
    pub async fn create_order(&self, user: &str, items: &[(&str, i64)]) -> (String, i64) {
        self.create_order_keyed(user, items, &uuid::Uuid::new_v4().to_string(), None)
            .await
    }

    /// [`System::create_order`] with a `traceparent` header (any text: malformed ones too).
    pub async fn create_order_traced(
        &self,
        user: &str,
        items: &[(&str, i64)],
        traceparent: Option<&str>,
    ) -> (String, i64) {
        self.create_order_keyed(user, items, &uuid::Uuid::new_v4().to_string(), traceparent)
            .await
    }

    /// [`System::create_order`] under the idempotency key `key` (the same key again, a
    /// duplicate request or a retry, answers with the same order), with an optional
    /// `traceparent` header.
    pub async fn create_order_keyed(
        &self,
        user: &str,
        items: &[(&str, i64)],
        key: &str,
        traceparent: Option<&str>,
    ) -> (String, i64) {
        let items = order_api::lines(items);
        let (s, body) = self
            .send(with_traceparent(
                self.http
                    .post(self.order.url("/orders"))
                    .header("Idempotency-Key", key)
                    .bearer_auth(crate::auth::customer(user))
                    .json(&json!({ "items": items })),
                traceparent,
            ))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        (
            body["order_id"].as_str().unwrap().to_owned(),
            body["amount_cents"].as_i64().unwrap(),
        )
    }

    async fn signed(
        &self,
        path: &str,
        body: &Value,
        traceparent: Option<&str>,
    ) -> (StatusCode, Value) {
        let raw = serde_json::to_vec(body).unwrap();
        let now = chrono::Utc::now().timestamp();
        let sig = self.secret.sign_at(now, &raw);
        let req = self.http.post(self.order.url(path));
        self.send(with_traceparent(
            order_api::callback(req, raw, now, Some(&sig)),
            traceparent,
        ))
        .await
    }

    /// The payment provider's notification that `order_id` was paid.
    pub async fn pay(&self, order_id: &str, amount_cents: i64) {
        self.pay_traced(order_id, amount_cents, None).await
    }

    /// [`System::pay`] with a `traceparent` header.
    pub async fn pay_traced(&self, order_id: &str, amount_cents: i64, traceparent: Option<&str>) {
        let (s, body) = self
            .signed(
                "/payments/callback",
                &order_api::payment_success(order_id, &format!("tx-{order_id}"), amount_cents),
                traceparent,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }

    /// Creates and pays an order; returns its id.
    pub async fn paid_order(&self, user: &str, items: &[(&str, i64)]) -> String {
        let (id, amount) = self.create_order(user, items).await;
        self.pay(&id, amount).await;
        id
    }

    /// `POST /orders/{id}/refunds` of the whole amount as the order's owner, asserting 201.
    pub async fn request_refund(&self, order_id: &str, refund_no: &str) {
        self.request_line_refund(order_id, refund_no, &[]).await;
    }

    /// `POST /orders/{id}/refunds` of `lines` (`(sku, units)`, priced from the order's lines;
    /// none: the whole order and its amount) as the order's owner, asserting 201 (a replay
    /// included).
    pub async fn request_line_refund(
        &self,
        order_id: &str,
        refund_no: &str,
        lines: &[(&str, i64)],
    ) {
        let order = self.order_of(order_id).await;
        let owner = order["user_id"].as_str().unwrap();
        let amount = if lines.is_empty() {
            order["amount_cents"].as_i64().unwrap()
        } else {
            lines
                .iter()
                .map(|(sku, units)| {
                    let item = order["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|i| i["sku_id"] == *sku)
                        .unwrap_or_else(|| panic!("order {order_id} has no line {sku}"));
                    item["unit_price_cents"].as_i64().unwrap() * units
                })
                .sum()
        };
        let mut body =
            json!({ "refund_no": refund_no, "amount_cents": amount, "reason": "changed mind" });
        if !lines.is_empty() {
            body["lines"] = order_api::lines(lines).into();
        }
        let (s, body) = self
            .send(
                self.http
                    .post(self.order.url(&format!("/orders/{order_id}/refunds")))
                    .bearer_auth(crate::auth::customer(owner))
                    .json(&body),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
    }

    /// The provider's refund outcome (`SUCCESS` or `CLOSED`).
    pub async fn refund_outcome(&self, refund_no: &str, status: &str) {
        let modified = chrono::Utc::now().timestamp_millis();
        let (s, body) = self
            .signed(
                "/refunds/callback",
                &order_api::refund_notice(refund_no, status, modified),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }

    /// `GET /orders/{id}` (as an operator).
    pub async fn order_of(&self, order_id: &str) -> Value {
        let (s, body) = self
            .send(
                self.http
                    .get(self.order.url(&format!("/orders/{order_id}"))),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        body
    }

    /// Waits until the order's status is `status`.
    pub async fn wait_order(&self, order_id: &str, status: &str) -> Value {
        crate::wait_for(
            &format!("order {order_id} to be {status}"),
            Duration::from_secs(60),
            || async {
                let o = self.order_of(order_id).await;
                (o["status"] == status).then_some(o)
            },
        )
        .await
    }

    /// The order's outbounds (`GET /outbounds?order_id=`).
    pub async fn outbounds_of(&self, order_id: &str) -> Vec<Value> {
        let (s, body) = self
            .send(
                self.http
                    .get(self.wms.url(&format!("/outbounds?order_id={order_id}"))),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        body["outbounds"].as_array().unwrap().clone()
    }

    /// Waits until the order's outbound is in `status`; returns it.
    pub async fn wait_outbound(&self, order_id: &str, status: &str) -> Value {
        crate::wait_for(
            &format!("the outbound of {order_id} to be {status}"),
            Duration::from_secs(60),
            || async {
                self.outbounds_of(order_id)
                    .await
                    .into_iter()
                    .find(|o| o["status"] == status)
            },
        )
        .await
    }

    /// `POST /outbounds/{no}/ship`, a 503 sent again like every request of this client
    /// ([`System::send`]): shipping again with the same carrier and tracking number is a
    /// replay, so a resend after a commit whose answer was lost answers 200 (replayed).
    pub async fn ship(
        &self,
        outbound_no: &str,
        carrier: &str,
        tracking_no: &str,
    ) -> (StatusCode, Value, bool) {
        let (status, headers, body) = self
            .send_with_headers(
                self.http
                    .post(self.wms.url(&format!("/outbounds/{outbound_no}/ship")))
                    .json(&json!({ "carrier": carrier, "tracking_no": tracking_no })),
            )
            .await;
        (status, body, headers.contains_key("idempotent-replayed"))
    }

    /// `POST /outbounds/{no}/return-received`.
    pub async fn return_received(&self, outbound_no: &str) -> (StatusCode, Value) {
        self.send(
            self.http.post(
                self.wms
                    .url(&format!("/outbounds/{outbound_no}/return-received")),
            ),
        )
        .await
    }

    /// Waits until every relay's outbox is empty (everything committed is on the broker).
    pub async fn wait_outboxes_drained(&self) {
        for db in [&self.order_db, &self.wms_db, &self.stock_db] {
            crate::wait_for("an outbox to drain", Duration::from_secs(60), || async {
                matches!(crate::db::backlog(&db.pool).await, Ok(0)).then_some(())
            })
            .await;
        }
    }
}

/// `req` with a `traceparent` header when one is given.
fn with_traceparent(
    req: reqwest::RequestBuilder,
    traceparent: Option<&str>,
) -> reqwest::RequestBuilder {
    match traceparent {
        Some(t) => req.header("traceparent", t),
        None => req,
    }
}

/// Every message on the topics of `aggregate_types` of the system, read with kafka-python.
pub async fn dump_topics(sys: &System, aggregate_types: &[&str]) -> Vec<crate::verify::Record> {
    let brokers = sys.brokers.clone();
    let topics: Vec<String> = aggregate_types.iter().map(|a| sys.topic(a)).collect();
    tokio::task::spawn_blocking(move || crate::verify::dump(&brokers, &topics))
        .await
        .unwrap()
}

/// `SELECT count(*) ...` as i64.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Inbox duplicates counted by the database, summed over a consumer's rows.
pub async fn inbox_duplicates(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT COALESCE(sum(duplicates), 0)::bigint FROM inbox",
    )
    .await
}

/// Whether `event_id` is in the database's inbox.
pub async fn in_inbox(pool: &PgPool, event_id: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM inbox WHERE event_id = $1::uuid)")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap_or(false)
}

/// Produces one message with the independent client (kafka-python).
pub fn produce(
    brokers: &str,
    topic: &str,
    key: &str,
    value: &str,
    headers: &[(String, String)],
    partition: Option<i32>,
) {
    let mut argv: Vec<String> = [
        "produce",
        "--brokers",
        brokers,
        "--topic",
        topic,
        "--key",
        key,
        "--value",
        value,
    ]
    .map(str::to_owned)
    .into();
    for (k, v) in headers {
        argv.extend(["--header".to_owned(), format!("{k}={v}")]);
    }
    if let Some(p) = partition {
        argv.extend(["--partition".to_owned(), p.to_string()]);
    }
    crate::verify::run_python(&crate::verify::kafka_tool(), argv);
}

/// A message to produce: `(topic, key, value, headers, partition)`; no partition means the
/// producer's partitioner picks it by key.
pub type Produce = (String, String, String, Vec<(String, String)>, Option<i32>);

/// Produces many messages with the independent client, a few processes at a time.
pub async fn produce_all(brokers: &str, messages: Vec<Produce>) {
    let mut pending = messages;
    while !pending.is_empty() {
        let batch: Vec<_> = pending.drain(..pending.len().min(6)).collect();
        let tasks: Vec<_> = batch
            .into_iter()
            .map(|(t, k, v, h, p)| {
                let brokers = brokers.to_owned();
                tokio::task::spawn_blocking(move || produce(&brokers, &t, &k, &v, &h, p))
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
}
