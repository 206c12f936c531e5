//! Debezium in the harness: its PostgreSQL connector with the Outbox Event Router, run by a Kafka
//! Connect standalone worker (`deploy/local/debezium-connect.sh`, the jars `install-deps.sh`
//! put in the cache) on the test's database and the shared broker. What teams coming from
//! Debezium have on their topics, to hold the relay's output against.
//!
//! [`Debezium::start`] gives the connector what it needs on the database (a replication role
//! that may read the outbox table, a publication for it), starts the worker and returns once
//! Connect's REST API says the connector and its task are RUNNING and the replication slot is
//! active (Debezium streams: a row committed from then on reaches the broker). Dropping it stops
//! the worker, then drops the slot (once PostgreSQL sees it inactive), the publication and the
//! role: a slot left behind would hold the shared cluster's WAL forever.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sqlx::{ConnectOptions, PgConnection, PgPool};

use crate::process::ChildProcess;

/// Debezium's default outbox columns (its documented shape), in table `qualified_table`
/// (`schema.table`; the schema is created when missing).
///
/// # Panics
/// When the statements fail.
pub async fn create_outbox_table(pool: &PgPool, qualified_table: &str) {
    let (schema, _) = qualified_table
        .split_once('.')
        .expect("the table as schema.table");
    for sql in [
        format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
        format!(
            "CREATE TABLE {qualified_table} (\
                 id uuid PRIMARY KEY, \
                 aggregatetype varchar(255) NOT NULL, \
                 aggregateid varchar(255) NOT NULL, \
                 type varchar(255) NOT NULL, \
                 payload jsonb)"
        ),
    ] {
        sqlx::query(&sql)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// How the worker converts keys and values to bytes (`key.converter`, `value.converter`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Converter {
    /// `StringConverter`: the key is the aggregate id, the value the payload's JSON text.
    #[default]
    String,
    /// `JsonConverter` with `schemas.enable=true` (a schema-and-payload envelope).
    Json,
    /// `JsonConverter` with `schemas.enable=false`.
    JsonSchemaless,
}

impl Converter {
    fn arg(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Json => "json",
            Self::JsonSchemaless => "json-schemaless",
        }
    }
}

/// What the connector is told besides the database and the broker.
#[derive(Debug, Clone)]
pub struct DebeziumOptions {
    /// The outbox table, `schema.table`, in Debezium's shape ([`create_outbox_table`]).
    pub table: String,
    /// Key and value converter.
    pub converter: Converter,
    /// The Outbox Event Router's options (`transforms.outbox.<key>`), e.g.
    /// `("route.topic.replacement", "<prefix>${routedByValue}")`.
    pub router: Vec<(String, String)>,
    /// More connector options (`KEY=VALUE` of the connector's properties, e.g.
    /// `poll.interval.ms`), after the script's own.
    pub connector: Vec<(String, String)>,
    /// Partitions of the topics the worker creates.
    pub topic_partitions: u32,
    /// The worker's log file.
    pub log: PathBuf,
}

impl DebeziumOptions {
    /// Table `table`, strings on the wire, the router's topics `<topic_prefix><aggregatetype>`
    /// with 3 partitions (the broker creates no topic by itself).
    pub fn new(table: &str, topic_prefix: &str) -> Self {
        Self {
            table: table.to_owned(),
            converter: Converter::String,
            router: vec![(
                "route.topic.replacement".to_owned(),
                format!("{topic_prefix}${{routedByValue}}"),
            )],
            topic_partitions: 3,
            connector: Vec::new(),
            log: workspace_root().join("target/e2e-logs").join(format!(
                "debezium-{:06x}.log",
                rand::random::<u32>() & 0xff_ffff
            )),
        }
    }
}

/// A running Debezium connector on one test database; stopped and cleaned up when dropped.
#[derive(Debug)]
pub struct Debezium {
    /// One Debezium at a time in this test process: each is a JVM on two shared cores.
    _turn: tokio::sync::OwnedMutexGuard<()>,
    worker: Option<ChildProcess>,
    dir: PathBuf,
    database_url: String,
    /// The replication slot it streams from.
    pub slot: String,
    /// The publication of the outbox table.
    pub publication: String,
    /// The replication role it logs in as.
    pub role: String,
    /// The connector's name in the REST API.
    pub name: String,
    /// Connect's REST API on 127.0.0.1.
    pub rest_port: u16,
}

/// How long the worker may take to run the connector: a JVM start on two shared cores.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

impl Debezium {
    /// `deploy/local/debezium-connect.sh`.
    pub fn script() -> PathBuf {
        workspace_root().join("deploy/local/debezium-connect.sh")
    }

    /// Starts Debezium on the database of `database_url` (a superuser's URL, as
    /// [`crate::db::fresh_database`] gives) and broker `brokers`; returns once the connector
    /// and its task are RUNNING and its slot is active.
    ///
    /// # Panics
    /// When the server's `wal_level` is not `logical`, the set-up statements fail, or the
    /// connector is not streaming within 180 s (with the worker's log).
    pub async fn start(database_url: &str, brokers: &str, options: &DebeziumOptions) -> Self {
        static TURN: std::sync::OnceLock<std::sync::Arc<tokio::sync::Mutex<()>>> =
            std::sync::OnceLock::new();
        let turn = TURN
            .get_or_init(Default::default)
            .clone()
            .lock_owned()
            .await;
        let id = format!("{:08x}", rand::random::<u32>());
        let url = url::Url::parse(database_url).expect("a PostgreSQL URL");
        let dbname = url.path().trim_start_matches('/').to_owned();
        let mut me = Self {
            _turn: turn,
            worker: None,
            dir: std::env::temp_dir().join(format!("outbox-debezium-{id}")),
            database_url: database_url.to_owned(),
            slot: format!("dbz_{id}"),
            publication: format!("dbz_{id}"),
            role: format!("dbz_{id}"),
            name: format!("outbox-{id}"),
            rest_port: crate::process::free_port(),
        };
        std::fs::create_dir_all(&me.dir).unwrap();
        let password = format!("{:032x}", rand::random::<u128>());
        me.prepare_database(&dbname, &options.table, &password)
            .await;
        let password_file = me.dir.join("password");
        write_private(&password_file, &password);

        let mut cmd = Command::new("bash");
        cmd.arg(Self::script())
            .arg("--dir")
            .arg(me.dir.join("connect"))
            .args(["--brokers", brokers])
            .args(["--table", &options.table])
            .args(["--slot", &me.slot])
            .args(["--publication", &me.publication])
            .args(["--rest-port", &me.rest_port.to_string()])
            .args(["--name", &me.name])
            .args(["--topic-prefix", &me.slot])
            .args(["--topic-partitions", &options.topic_partitions.to_string()])
            .args(["--converter", options.converter.arg()])
            .args(["--pg-host", url.host_str().unwrap_or("127.0.0.1")])
            .args(["--pg-port", &url.port().unwrap_or(5432).to_string()])
            .args(["--pg-user", &me.role])
            .args(["--pg-dbname", &dbname])
            .arg("--pg-password-file")
            .arg(&password_file)
            // The worker's own environment: none of the test's database settings.
            .env_remove("DATABASE_PASSWORD_FILE");
        if let Some((_, mode)) = url.query_pairs().find(|(k, _)| k == "sslmode") {
            cmd.args(["--pg-sslmode", &mode]);
        }
        for (k, v) in &options.router {
            cmd.arg("--router").arg(format!("{k}={v}"));
        }
        if !options.connector.is_empty() {
            let extra = me.dir.join("connector-extra.properties");
            let text: String = options
                .connector
                .iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect();
            std::fs::write(&extra, text).unwrap();
            cmd.arg("--connector-config").arg(extra);
        }
        if let Some(dir) = options.log.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        me.worker = Some(
            ChildProcess::spawn(&mut cmd, options.log.clone()).unwrap_or_else(|e| {
                panic!(
                    "start {} (log {}): {e}",
                    Self::script().display(),
                    options.log.display()
                )
            }),
        );
        me.wait_streaming().await;
        me
    }

    /// The replication role, the publication; refuses a server that cannot decode logically.
    async fn prepare_database(&self, dbname: &str, table: &str, password: &str) {
        let mut conn = connect(&self.database_url).await;
        let wal_level: String = sqlx::query_scalar("SHOW wal_level")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            wal_level, "logical",
            "Debezium needs wal_level=logical on the server of DATABASE_URL (deploy/local/up.sh \
             and servers::PgCluster start theirs so; restart a cluster started before)"
        );
        let (schema, _) = table.split_once('.').expect("the table as schema.table");
        let role = &self.role;
        for sql in [
            format!("CREATE ROLE {role} REPLICATION LOGIN PASSWORD '{password}'"),
            format!("GRANT CONNECT ON DATABASE {dbname} TO {role}"),
            format!("GRANT USAGE ON SCHEMA {schema} TO {role}"),
            format!("GRANT SELECT ON {table} TO {role}"),
            format!("CREATE PUBLICATION {} FOR TABLE {table}", self.publication),
        ] {
            sqlx::query(&sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", sql.replace(password, "***")));
        }
    }

    /// Waits until the REST API says RUNNING for the connector and its task and the slot is
    /// active; fails at once when the worker exits or the task FAILED.
    async fn wait_streaming(&mut self) {
        let addr = &format!("127.0.0.1:{}", self.rest_port);
        let path = &format!("/connectors/{}/status", self.name);
        let started = std::time::Instant::now();
        let conn = &tokio::sync::Mutex::new(connect(&self.database_url).await);
        let worker_cell = std::sync::Mutex::new(self.worker.take());
        let worker = &worker_cell;
        let last = &std::sync::Mutex::new(None::<serde_json::Value>);
        let this = &*self;
        // Some(Err) ends the wait at once: the worker exited or the task failed.
        let ready = outbox_process::poll::poll_until(READY_TIMEOUT, || async move {
            let exited = worker
                .lock()
                .unwrap()
                .as_mut()
                .and_then(ChildProcess::try_wait);
            if let Some(status) = exited {
                return Some(Err(format!(
                    "the Kafka Connect worker exited ({status}) before Debezium ran"
                )));
            }
            let state = crate::process::http_get(addr, path)
                .await
                .and_then(|body| serde_json::from_str::<serde_json::Value>(&body).ok());
            last.lock().unwrap().clone_from(&state);
            let s = state?;
            let task = &s["tasks"][0];
            if task["state"] == "FAILED" {
                return Some(Err(format!("Debezium's task failed: {}", task["trace"])));
            }
            let running = s["connector"]["state"] == "RUNNING" && task["state"] == "RUNNING";
            (running && this.slot_active(&mut *conn.lock().await).await == Some(true))
                .then_some(Ok(()))
        })
        .await;
        let last = last.lock().unwrap().take();
        self.worker = worker_cell.into_inner().unwrap();
        match ready {
            Some(Ok(())) => eprintln!(
                "debezium: connector {} streaming from slot {} after {} ms",
                self.name,
                self.slot,
                started.elapsed().as_millis()
            ),
            Some(Err(why)) => panic!("{why}:\n{}", self.log_tail()),
            None => panic!(
                "Debezium was not streaming within {} s (status {last:?}):\n{}",
                READY_TIMEOUT.as_secs(),
                self.log_tail()
            ),
        }
    }

    /// Whether the slot is active (a WAL sender streams from it); `None` while it does not exist.
    async fn slot_active(&self, conn: &mut PgConnection) -> Option<bool> {
        sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
            .bind(&self.slot)
            .fetch_optional(conn)
            .await
            .unwrap()
    }

    /// Whether the slot became inactive (or is gone) within `timeout`.
    async fn wait_slot_inactive(&self, conn: &mut PgConnection, timeout: Duration) -> bool {
        let conn = &tokio::sync::Mutex::new(conn);
        outbox_process::poll::poll_until(timeout, || async move {
            let mut conn = conn.lock().await;
            (self.slot_active(&mut conn).await != Some(true)).then_some(())
        })
        .await
        .is_some()
    }

    /// The Kafka Connect properties the worker runs with: the worker's file (its converters)
    /// and the connector's, in the order `outbox-relay debezium-install --config` takes them.
    pub fn properties_files(&self) -> [PathBuf; 2] {
        let connect = self.dir.join("connect");
        [
            connect.join("worker.properties"),
            connect.join("connector.properties"),
        ]
    }

    /// The worker's pid (the JVM: the script execs it).
    pub fn worker_pid(&self) -> u32 {
        self.worker.as_ref().expect("running").id()
    }

    /// The worker's log file.
    pub fn log_path(&self) -> PathBuf {
        self.worker.as_ref().expect("running").log.clone()
    }

    fn log_tail(&self) -> String {
        format!(
            "----- last lines of {} -----\n{}",
            self.log_path().display(),
            self.worker
                .as_ref()
                .map(|w| w.log_tail(60))
                .unwrap_or_default()
        )
    }

    /// Stops the worker (SIGTERM, SIGKILL after 30 s), waits until PostgreSQL sees the slot
    /// inactive (ends its WAL sender after 30 s more), then drops the slot, the publication and
    /// the role.
    async fn clean_up(&mut self) -> Result<(), String> {
        if let Some(mut w) = self.worker.take() {
            if w.terminate(Duration::from_secs(30)).is_none() {
                eprintln!("debezium: the worker did not stop within 30 s, killed it");
            }
        }
        let mut conn = connect(&self.database_url).await;
        if !self
            .wait_slot_inactive(&mut conn, Duration::from_secs(30))
            .await
        {
            sqlx::query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
            )
            .bind(&self.slot)
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
            if !self
                .wait_slot_inactive(&mut conn, Duration::from_secs(10))
                .await
            {
                return Err("the slot stayed active after its WAL sender was terminated".into());
            }
        }
        let role_exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)")
                .bind(&self.role)
                .fetch_one(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        let role = &self.role;
        let mut statements = vec![
            format!(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = '{}'",
                self.slot
            ),
            format!("DROP PUBLICATION IF EXISTS {}", self.publication),
        ];
        if role_exists {
            statements.push(format!("DROP OWNED BY {role}"));
            statements.push(format!("DROP ROLE {role}"));
        }
        for sql in statements {
            sqlx::query(&sql)
                .execute(&mut conn)
                .await
                .map_err(|e| format!("{sql}: {e}"))?;
        }
        Ok(())
    }
}

impl Drop for Debezium {
    fn drop(&mut self) {
        // Async clean-up on a runtime of its own, on a thread of its own: Drop may run inside
        // the test's runtime, which cannot be blocked on.
        let result = std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(self.clean_up())
            })
            .join()
        });
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!(
                "debezium: cleaning up slot {} on {} failed: {e}",
                self.slot, self.database_url
            ),
            Err(_) => eprintln!("debezium: cleaning up slot {} panicked", self.slot),
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A connection on `url` as the relay and the services make one (TLS from the URL,
/// `DATABASE_PASSWORD_FILE`).
async fn connect(url: &str) -> PgConnection {
    outbox_process::pg::connect_options(url)
        .expect("valid database settings")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to the test database: {e}"))
}

/// Writes `text` to a new file only its owner may read.
fn write_private(path: &std::path::Path, text: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// The workspace's root (this crate is `tests/support`).
fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
