//! Everything the chaos run starts, on the secured stack a deployment runs on: a private
//! PostgreSQL ([`SecuredPg`]: TLS and SCRAM passwords only) and a private Apache Kafka broker
//! ([`SecuredKafka`]: a SASL_SSL listener with SCRAM-SHA-512), a proxy in front of each (the
//! broker's SASL_SSL listener advertises its proxy's address, so every Kafka connection goes
//! through it), the marketplace simulator, the three services with the producer-side ledgers
//! installed, and several active relays per database that faults kill, pause and restart: each
//! outbox is split into buckets ([`RELAYS`]), shared by its relays, every one publishing with
//! Kafka transactions (the default), so the audit's `read_committed` read of the topics must
//! find every event exactly once.
//!
//! Every process logs in as a deployment does. PostgreSQL: `sslmode=verify-full` against the
//! test CA, host `localhost` and the proxy's port, each process as its least-privilege role of
//! `deploy/postgres/roles.sql` with its password from `DATABASE_PASSWORD_FILE`; the migrations
//! ran before as the migrator (`outbox-relay migrate`, then each service with
//! `DATABASE_MIGRATIONS=only`), the services serve with `DATABASE_MIGRATIONS=skip`. Kafka:
//! SASL_SSL + SCRAM-SHA-512 with the password from `KAFKA_SASL_PASSWORD_FILE`, trusting the
//! test CA. The audit reads the databases as the migrator (it owns every table; the audit's
//! sessions are read-only), its password from `PGPASSFILE`. No password is in a process's
//! URL or command line; the harness's own connections (making the databases, the ledgers, the
//! lag samples) log in as the admin.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::PgPool;

use crate::db::TestDb;
use crate::fulfilment::{relay_args, DbLogin, Service, System, SystemDb};
use crate::proc::{RelayArgs, RelayProcess};
use crate::proxy::Proxy;
use crate::roles::{MIGRATOR, RELAY};
use crate::secured::{
    write_secret_file, Advertised, Pki, SecuredKafka, SecuredPg, KAFKA_PASSWORD, PG_ADMIN_PASSWORD,
};

/// The marketplace simulator's shared secret.
pub const MARKETPLACE_SECRET: &str = "chaos-marketplace-secret";

/// How every process of the run logs in (the summary says it).
pub const SECURITY: &str = "SASL_SSL SCRAM-SHA-512, PostgreSQL verify-full, least-privilege roles";

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
    pub pg: SecuredPg,
    /// The proxy every client of PostgreSQL goes through.
    pub pg_proxy: Proxy,
    /// The broker (its JVM killed and started again by faults: [`SecuredKafka::broker`]).
    pub kafka: Mutex<SecuredKafka>,
    /// The proxy every Kafka client goes through (the SASL_SSL listener advertises it).
    pub kafka_proxy: Proxy,
    /// The services, their databases and HTTP clients (its `relays` are in [`World::relays`]).
    /// The databases' URLs are the migrator's, what the audit reads them with; their pools
    /// the admin's, straight to PostgreSQL.
    pub sys: Arc<System>,
    /// The marketplace simulator.
    pub sim: Service,
    /// The relays ([`RELAYS`]), the orders database's first.
    pub relays: Mutex<Vec<RelaySlot>>,
    /// Pools on the three databases straight to PostgreSQL (not through the proxy), as the
    /// admin, for sampling the lag while the proxy is faulty: order, wms, stock.
    pub direct: [PgPool; 3],
    /// The audit's Kafka login flags (SASL_SSL, SCRAM-SHA-512, the password file, the CA).
    pub audit_flags: Vec<String>,
    /// HTTP client for the simulator.
    pub http: reqwest::Client,
    /// The test CA, the certificates and the password files (removed when dropped, last).
    pub pki: Pki,
}

/// The relays of each database (order, wms, stock) and its outbox's bucket count: every relay
/// of a database publishes its share of the buckets at once.
pub const RELAYS: [(&[&str], u8); 3] = [
    (&["relay-order", "relay-order-2", "relay-order-3"], 4),
    (&["relay-wms", "relay-wms-2"], 2),
    (&["relay-stock", "relay-stock-2"], 2),
];

/// SKUs of the load: `(sku, price_cents, stock)`. `rare` runs out, so some paid orders are
/// rejected for lack of stock.
pub const SKUS: [(&str, i64, i64); 4] = [
    ("lamp", 2_500, 1_000_000),
    ("chair", 8_900, 1_000_000),
    ("rare", 9_999, 25),
    ("MK", 1_000, 1_000_000),
];

/// The services: binary, database role (`-v service_role=` of `roles.sql`).
const SERVICES: [(&str, &str); 3] = [
    ("order-service", "order_service"),
    ("wms-consumer", "wms_service"),
    ("stock-consumer", "stock_service"),
];

/// A `verify-full` URL of database `db` as `user` at `localhost:port`, trusting `ca`, with
/// `password` in it only for the harness's admin connections.
fn pg_url(user: &str, password: Option<&str>, port: u16, db: &str, ca: &str) -> String {
    let password = password.map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "postgres://{user}{password}@localhost:{port}/{db}?sslmode=verify-full&sslrootcert={ca}"
    )
}

/// A password for `role`, new each run.
fn new_password(role: &str) -> String {
    format!("chaos-{role}-{:016x}", rand::random::<u64>())
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

impl World {
    /// Starts everything and waits until it serves.
    pub async fn start() -> Self {
        let pki = Pki::new();
        let ca = pki.path("ca.pem");
        let secrets = pki.dir.join("secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        let pg = blocking(|| SecuredPg::start(&pki));
        let pg_proxy = Proxy::start(0, pg.cluster.port).await;
        let kafka_proxy_port = crate::free_port();
        let kafka = blocking(|| {
            SecuredKafka::start_with(
                &pki,
                &[],
                &Advertised {
                    sasl_ssl_port: Some(kafka_proxy_port),
                    ..Advertised::default()
                },
            )
        });
        let kafka_proxy = Proxy::start(kafka_proxy_port, kafka.port).await;
        let brokers = format!("localhost:{}", kafka_proxy.port);
        let kafka_password = write_secret_file(&secrets, "kafka", KAFKA_PASSWORD);
        let services_env = SecuredKafka::client_env_with_password_file(&kafka_password, &ca);

        let dbs = Self::databases(&pg, &pg_proxy, &ca, &secrets).await;
        let direct = [0, 1, 2].map(|i| dbs[i].db.pool.clone());
        let sim = Service::start_marketplace_simulator(MARKETPLACE_SECRET).await;
        let mut sys = System::start_on_databases(
            dbs.clone(),
            &brokers,
            vec![
                ("MARKETPLACE_SECRET".into(), MARKETPLACE_SECRET.into()),
                ("MARKETPLACE_URL".into(), sim.url("")),
                ("MARKETPLACE_COMPENSATION_INTERVAL_MS".into(), "5000".into()),
            ],
            services_env.clone(),
        )
        .await;
        // The system started one relay per database (the first of each in `RELAYS`); the
        // others start here.
        let mut started = std::mem::take(&mut sys.relays).into_iter();
        let mut relays = Vec::new();
        for (db, (names, _)) in dbs.iter().zip(RELAYS) {
            let mut first = started.next();
            for name in names {
                let args = relay_args(&db.relay, &brokers, &sys.prefix, name, &services_env);
                let process = first.take().unwrap_or_else(|| RelayProcess::start(&args));
                relays.push(RelaySlot {
                    name: (*name).to_owned(),
                    args,
                    process: Some(process),
                });
            }
        }
        let me = Self {
            pg,
            pg_proxy,
            kafka: Mutex::new(kafka),
            kafka_proxy,
            sys: Arc::new(sys),
            sim,
            relays: Mutex::new(relays),
            direct,
            audit_flags: SecuredKafka::client_flags(&kafka_password, &ca),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            pki,
        };
        for (sku, price, stock) in SKUS {
            me.sys.sku(sku, price).await;
            me.sys.set_stock(sku, stock).await;
        }
        me.point_pushes().await;
        me
    }

    /// The three databases (order, wms, stock), set up as a deployment's: made by the admin,
    /// `roles.sql` applied and the roles given passwords (SCRAM, each in a file of
    /// `secrets`), the migrations applied as the migrator, the ledger installed by the admin
    /// before any event, `roles.sql` again (the ledger is the migrator's, the service may write
    /// it from the outbox trigger). The audit's password goes to a `PGPASSFILE`, set for this
    /// process so that `outbox-audit` inherits it.
    async fn databases(pg: &SecuredPg, proxy: &Proxy, ca: &str, secrets: &Path) -> [SystemDb; 3] {
        let admin = |port: u16, db: &str| pg_url("postgres", Some(PG_ADMIN_PASSWORD), port, db, ca);
        let mut passwords: BTreeMap<&str, String> = BTreeMap::new();
        let mut dbs = Vec::new();
        for (bin, service_role) in SERVICES {
            // Straight to PostgreSQL: the harness's pool (the ledger, the lag samples).
            let made = crate::db::empty_database_on(&admin(pg.cluster.port, "postgres")).await;
            let name = url::Url::parse(&made.url).unwrap().path()[1..].to_owned();
            // Through the proxy, so the roles' URLs are the ones the processes use.
            let admin_url = admin(proxy.port, &name);
            let (urls, files) = blocking(|| {
                crate::roles::apply(&admin_url, service_role);
                let mut files = BTreeMap::new();
                for role in [MIGRATOR, RELAY, service_role] {
                    let password = passwords
                        .entry(role)
                        .or_insert_with(|| new_password(role))
                        .clone();
                    crate::roles::set_password(&admin_url, role, &password);
                    files.insert(role, write_secret_file(secrets, role, &password));
                }
                let urls = crate::roles::migrate_as_migrator_with(
                    bin,
                    &admin_url,
                    service_role,
                    &[("DATABASE_PASSWORD_FILE", &files[MIGRATOR])],
                );
                // The outbox split into buckets before any relay starts, as the operator
                // does it: `outbox-relay buckets --set` as the migrator.
                let buckets = RELAYS[dbs.len()].1.to_string();
                crate::proc::run_ok(
                    &format!("outbox-relay buckets --set {buckets} as {MIGRATOR}"),
                    std::process::Command::new(crate::proc::relay_binary())
                        .args(["buckets", "--set", &buckets, "--database-url"])
                        .arg(&urls.migrator)
                        .env("DATABASE_PASSWORD_FILE", &files[MIGRATOR]),
                );
                (urls, files)
            });
            outbox_writer::schema::migrate_ledger(&made.pool)
                .await
                .expect("install the outbox ledger");
            blocking(|| crate::roles::apply(&admin_url, service_role));
            let login = |url: &str, role: &str, extra: &[(&str, &str)]| DbLogin {
                url: url.to_owned(),
                env: [("DATABASE_PASSWORD_FILE", files[role].as_str())]
                    .iter()
                    .chain(extra)
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            };
            dbs.push(SystemDb {
                db: TestDb {
                    url: urls.migrator.clone(),
                    pool: made.pool,
                },
                service: login(
                    &urls.service,
                    service_role,
                    &[("DATABASE_MIGRATIONS", "skip")],
                ),
                relay: login(&urls.relay, RELAY, &[]),
            });
        }
        let pgpass = write_secret_file(
            secrets,
            "pgpass",
            &format!(
                "localhost:{}:*:{MIGRATOR}:{}",
                proxy.port, passwords[MIGRATOR]
            ),
        );
        // For `outbox-audit`, which takes its passwords from its URLs or from here (it has three
        // databases, so no one `DATABASE_PASSWORD_FILE`). Set before any audit runs; the one
        // line matches only the migrator at the proxy.
        std::env::set_var("PGPASSFILE", pgpass);
        dbs.try_into().expect("three databases")
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

    /// The client sessions on the three databases now, by role: `(role, sessions, of them
    /// over TLS)`; `None` when PostgreSQL does not answer.
    pub async fn sessions(&self) -> Option<Vec<(String, i64, i64)>> {
        sqlx::query_as(
            "SELECT a.usename::text, count(*), count(*) FILTER (WHERE s.ssl) \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.backend_type = 'client backend' \
               AND a.datname IN (SELECT current_database() UNION ALL SELECT unnest($1::text[])) \
             GROUP BY 1 ORDER BY 1",
        )
        .bind(
            self.direct[1..]
                .iter()
                .map(|p| {
                    p.connect_options()
                        .get_database()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect::<Vec<_>>(),
        )
        .fetch_all(&self.direct[0])
        .await
        .ok()
    }

    /// The live bucket leases of the orders database: `(bucket lease, holder)`.
    pub async fn order_buckets(&self) -> Option<Vec<(String, String)>> {
        sqlx::query_as(
            "SELECT name, holder FROM outbox_relay_lease \
             WHERE name LIKE 'default/l%' AND expires_at > now() ORDER BY name",
        )
        .fetch_all(&self.direct[0])
        .await
        .ok()
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
