//! Private servers for tests that stop and restart them: a PostgreSQL cluster (initdb/pg_ctl
//! in a temporary directory, run as `postgres` when we are root, `wal_level=logical`) and an Apache Kafka broker
//! (single-node KRaft, started by `deploy/local/kafka-broker.sh`, storage kept across
//! restarts).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::proc::run_ok;

/// Whether this process runs as root (then the servers run as `postgres`).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// The directory of the PostgreSQL binaries (`PG_BIN_DIR`, else the newest under
/// `/usr/lib/postgresql`).
pub fn pg_bin_dir() -> PathBuf {
    if let Ok(d) = std::env::var("PG_BIN_DIR") {
        return d.into();
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.pop()
        .expect("no PostgreSQL binaries: set PG_BIN_DIR or install postgresql")
}

fn as_pg_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// A throwaway PostgreSQL cluster.
#[derive(Debug)]
pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    /// Its port.
    pub port: u16,
}

impl PgCluster {
    /// initdb + start on a free port.
    pub fn start() -> Self {
        Self::start_with(&["-A", "trust"], |_| {})
    }

    /// initdb with `initdb_args` (besides `-U postgres --no-sync -D <dir>`), then `configure`
    /// with the data directory (write `postgresql.conf` additions, `pg_hba.conf`, key files:
    /// the cluster's directory is chowned to `postgres` after it), then start on a free port.
    pub fn start_with(initdb_args: &[&str], configure: impl FnOnce(&Path)) -> Self {
        let bin = pg_bin_dir();
        let dir = std::env::temp_dir().join(format!("outbox-pg-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        // The cluster's files belong to `postgres` when we are root, also those `configure`
        // wrote.
        let chown = || {
            if is_root() {
                run_ok(
                    "chown",
                    Command::new("chown")
                        .args(["-R", "postgres:postgres"])
                        .arg(&dir),
                );
            }
        };
        chown();
        let mut init = as_pg_user(&bin.join("initdb"));
        init.args(initdb_args)
            .args(["-U", "postgres", "--no-sync", "-D"])
            .arg(dir.join("data"));
        run_ok("initdb", &mut init);
        configure(&dir.join("data"));
        chown();
        let me = Self {
            dir,
            bin,
            port: crate::free_port(),
        };
        me.pg_ctl_start();
        me
    }

    fn pg_ctl_start(&self) {
        let mut c = as_pg_user(&self.bin.join("pg_ctl"));
        c.arg("-D")
            .arg(self.dir.join("data"))
            .arg("-o")
            // wal_level=logical: Debezium ([`crate::debezium`]) can stream from any of them.
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c wal_level=logical",
                self.port,
                self.dir.display()
            ))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "start"]);
        run_ok("pg_ctl start", &mut c);
    }

    /// Admin URL (database `postgres`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server abruptly (`-m immediate`: like a crash; recovery runs on start).
    pub fn stop_immediate(&self) {
        let mut c = as_pg_user(&self.bin.join("pg_ctl"));
        c.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"]);
        run_ok("pg_ctl stop", &mut c);
    }

    /// Starts it again on the same port.
    pub fn start_again(&self) {
        self.pg_ctl_start();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let mut c = as_pg_user(&self.bin.join("pg_ctl"));
        c.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"]);
        let _ = c.stdout(Stdio::null()).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `deploy/local/kafka-broker.sh`: the one starter of Apache Kafka the scripts use too.
pub fn kafka_broker_script() -> PathBuf {
    crate::workspace_root().join("deploy/local/kafka-broker.sh")
}

/// How a private broker listens, besides its PLAINTEXT listener on `127.0.0.1`.
#[derive(Debug, Clone, Default)]
pub struct KafkaOptions {
    /// The PLAINTEXT port (0: a free one).
    pub port: u16,
    /// What the PLAINTEXT listener advertises, `host:port` (default: `127.0.0.1:<port>`): a
    /// proxy's address when clients reach the broker through one.
    pub advertise: Option<String>,
    /// Further listeners (`SASL_SSL://localhost:9094`), advertised as given, or as
    /// `NAME://HOST:PORT=AHOST:APORT` listening on one address and advertising another.
    pub listeners: Vec<String>,
    /// Properties appended to the broker's configuration (security settings, limits).
    pub config: String,
    /// Extra arguments of the storage format on the first start, e.g. `--add-scram` and
    /// `SCRAM-SHA-512=[name=u,password=p]` (written to a file, never a command line).
    pub format_args: Vec<String>,
    /// A broker-only node with this id joining the cluster whose first node keeps its state in
    /// this directory (see [`Kafka::start_joining`]).
    pub join: Option<(PathBuf, i32)>,
}

/// A private Apache Kafka broker (single-node KRaft, `deploy/local/kafka-broker.sh`) whose
/// storage survives [`Kafka::stop`] and [`Kafka::start_again`]: for tests that kill, stall or
/// restart the broker, or need listeners or limits of their own.
#[derive(Debug)]
pub struct Kafka {
    dir: PathBuf,
    child: Option<Child>,
    options: KafkaOptions,
    /// Its PLAINTEXT port.
    pub port: u16,
}

impl Kafka {
    /// Starts a broker on a free port; returns once it answers a metadata request.
    pub fn start() -> Self {
        Self::start_with(KafkaOptions::default())
    }

    /// A broker behind a proxy listening on `advertised_port`: clients connect to the address
    /// metadata gives them, so the broker must advertise the proxy's.
    pub fn start_behind(advertised_port: u16) -> Self {
        Self::start_on_behind(crate::free_port(), advertised_port, "127.0.0.1")
    }

    /// [`Kafka::start_behind`] listening on `port` (a proxy started first forwards there) and
    /// advertising `host:advertised_port`.
    pub fn start_on_behind(port: u16, advertised_port: u16, host: &str) -> Self {
        Self::start_with(KafkaOptions {
            port,
            advertise: Some(format!("{host}:{advertised_port}")),
            ..KafkaOptions::default()
        })
    }

    /// A second broker (node id 2, broker only) in `first`'s cluster, on a free port; returns
    /// once `first`'s metadata lists it. For the tests of a partition whose only broker is
    /// gone while the others serve.
    pub fn start_joining(first: &Kafka) -> Self {
        let second = Self::start_with(KafkaOptions {
            join: Some((first.dir.clone(), 2)),
            ..KafkaOptions::default()
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !first.broker_ids().contains(&2) {
            assert!(
                std::time::Instant::now() < deadline,
                "the second broker did not register within 120 s; see {}",
                second.log_path().display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        second
    }

    /// The ids of the brokers `self`'s metadata lists (the live, registered ones).
    pub fn broker_ids(&self) -> Vec<i32> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.brokers())
            .set("log_level", "0")
            .create()
            .expect("a metadata client");
        consumer
            .fetch_metadata(None, Duration::from_secs(5))
            .map(|m| m.brokers().iter().map(|b| b.id()).collect())
            .unwrap_or_default()
    }

    /// Starts a broker with `options`.
    pub fn start_with(mut options: KafkaOptions) -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-kafka-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        if options.port == 0 {
            options.port = crate::free_port();
        }
        if !options.format_args.is_empty() {
            std::fs::write(
                dir.join("format.args"),
                options.format_args.join("\n") + "\n",
            )
            .unwrap();
        }
        std::fs::write(dir.join("extra.properties"), &options.config).unwrap();
        let mut me = Self {
            dir,
            child: None,
            port: options.port,
            options,
        };
        me.start_again();
        me
    }

    /// The broker process id (the JVM's: for SIGKILL, SIGSTOP / SIGCONT).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("kafka is running").id() as i32
    }

    /// Bootstrap address of the PLAINTEXT listener.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kafka.log")
    }

    /// (Re)starts the process on the same ports and storage; returns once it answers a
    /// metadata request on its PLAINTEXT listener.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut c = Command::new("bash");
        c.arg(kafka_broker_script())
            .arg("--dir")
            .arg(&self.dir)
            .args(["--port", &self.port.to_string()])
            .arg("--config-file")
            .arg(self.dir.join("extra.properties"));
        if let Some(a) = &self.options.advertise {
            c.args(["--advertise", a]);
        }
        for l in &self.options.listeners {
            c.args(["--listener", l]);
        }
        if let Some((first, id)) = &self.options.join {
            c.arg("--join")
                .arg(first)
                .args(["--node-id", &id.to_string()]);
        }
        let child = c
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start deploy/local/kafka-broker.sh");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits until a metadata request on the PLAINTEXT listener answers. Generous: three
    /// tests starting JVMs at once on two cores make a start take many seconds.
    fn wait_ready(&mut self) {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.brokers())
            .set("log_level", "0")
            .create()
            .expect("a metadata client");
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                // The directory goes with the panic's drop: the log's end says why here.
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                panic!(
                    "kafka exited ({status}) before it served metadata; the end of its log:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            if consumer
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok_and(|m| !m.brokers().is_empty())
            {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "kafka did not serve metadata within 120 s; see {}",
                self.log_path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// From the next start on, `config` replaces the appended properties (e.g. another
    /// certificate); the broker is restarted now.
    pub fn restart_with_config(&mut self, config: &str) {
        self.stop();
        config.clone_into(&mut self.options.config);
        std::fs::write(self.dir.join("extra.properties"), config).unwrap();
        self.start_again();
    }

    /// Kills the broker process (SIGKILL: a crash; the log is recovered on the next start).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        self.stop();
        if std::env::var_os("KEEP_KAFKA_DIR").is_some() {
            eprintln!("kafka's storage and log kept in {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
