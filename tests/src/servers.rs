//! Private servers for tests that stop and restart them: a PostgreSQL cluster (initdb/pg_ctl
//! in a temporary directory, run as `postgres` when we are root) and a tansu broker with
//! sqlite storage (so its data survives a restart).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn is_root() -> bool {
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

fn run_ok(mut c: Command, what: &str) {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
        if is_root() {
            run_ok(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:postgres"]).arg(&dir);
                    c
                },
                "chown",
            );
        }
        let mut init = as_pg_user(&bin.join("initdb"));
        init.args(initdb_args)
            .args(["-U", "postgres", "--no-sync", "-D"])
            .arg(dir.join("data"));
        run_ok(init, "initdb");
        configure(&dir.join("data"));
        if is_root() {
            run_ok(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:postgres"]).arg(&dir);
                    c
                },
                "chown",
            );
        }
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
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1",
                self.port,
                self.dir.display()
            ))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "start"]);
        run_ok(c, "pg_ctl start");
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
        run_ok(c, "pg_ctl stop");
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

/// Path of the tansu binary (`TANSU_BIN`, else the cache location of deploy/local).
pub fn tansu_binary() -> PathBuf {
    if let Ok(p) = std::env::var("TANSU_BIN") {
        return p.into();
    }
    let cache = std::env::var("OUTBOX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/outbox-relay")
        });
    let p = cache.join("tansu-0.6.0/bin/tansu");
    assert!(
        p.exists(),
        "{} is missing: run deploy/local/install-deps.sh or set TANSU_BIN",
        p.display()
    );
    p
}

/// A private tansu broker with sqlite storage.
#[derive(Debug)]
pub struct Tansu {
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
    /// Its port.
    pub port: u16,
    /// The port it advertises in metadata (its own, or a proxy's in front of it).
    advertised_port: u16,
    /// The host it advertises (`127.0.0.1`, or the name in a TLS terminator's certificate).
    advertised_host: String,
}

impl Tansu {
    /// A broker behind a proxy listening on `advertised_port`: clients connect to the address
    /// metadata gives them, so the broker must advertise the proxy's.
    pub fn start_behind(advertised_port: u16) -> Self {
        Self::start_on_behind(crate::free_port(), advertised_port, "127.0.0.1")
    }

    /// [`Tansu::start_behind`] listening on `port` (a proxy started first forwards there) and
    /// advertising `host` (the name in a TLS terminator's certificate, or `127.0.0.1`).
    pub fn start_on_behind(port: u16, advertised_port: u16, host: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-tansu-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut me = Self {
            dir,
            child: None,
            extra: Vec::new(),
            port,
            advertised_port,
            advertised_host: host.to_owned(),
        };
        me.start_again();
        me
    }

    /// Starts a broker on a free port and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A broker with a JSON-schema registry: `schemas` are `(topic, schema)` pairs; the broker
    /// refuses (INVALID_RECORD, for the whole record batch) records of such a topic that do
    /// not match — a real asynchronous, broker-side refusal.
    pub fn start_with_schemas(schemas: &[(String, serde_json::Value)]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("outbox-schemas-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        for (topic, schema) in schemas {
            std::fs::write(dir.join(format!("{topic}.json")), schema.to_string()).unwrap();
        }
        // tansu resolves the registry URL against its working directory (a sibling of `dir`).
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        Self::start_with(&["--schema-registry".to_owned(), format!("file://../{name}/")])
    }

    /// Starts a broker with extra command-line arguments.
    pub fn start_with(extra: &[String]) -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-tansu-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = crate::free_port();
        let mut me = Self {
            dir,
            child: None,
            extra: extra.to_vec(),
            port,
            advertised_port: port,
            advertised_host: "127.0.0.1".to_owned(),
        };
        me.start_again();
        me
    }

    /// The broker process id (for SIGSTOP / SIGCONT).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("tansu is running").id() as i32
    }

    /// Bootstrap address.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// (Re)starts the process on the same port and storage.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "already running");
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://{}:{}", self.advertised_host, self.advertised_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("tansu.log"))
            .unwrap();
        let child = Command::new(tansu_binary())
            .current_dir(&self.dir)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .args([
                "--storage-engine",
                "sqlite://tansu.db",
                "--cluster-id",
                "outbox-e2e",
            ])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start tansu");
        self.child = Some(child);
        // Generous: three sessions compiling on two cores make a start take many seconds.
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "tansu did not start; see {}",
                self.dir.join("tansu.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        add_missing_index(&self.dir.join("tansu.db"));
    }

    /// From the next [`Tansu::start_again`] on: also `args` (e.g. `--authentication`), and
    /// `host` as the advertised host (the name a TLS terminator's certificate holds).
    pub fn restart_with(&mut self, args: &[&str], host: &str) {
        self.stop();
        self.extra.extend(args.iter().map(|a| (*a).to_owned()));
        host.clone_into(&mut self.advertised_host);
        self.start_again();
    }

    /// Runs tansu's own command line against this broker (`tansu <args> --broker tcp://..`),
    /// e.g. `user create NAME PASSWORD` or `topic create NAME`; it cannot authenticate, so only
    /// while the broker runs without `--authentication`.
    ///
    /// # Panics
    /// When the command fails.
    pub fn cli(&self, args: &[&str]) {
        let mut c = Command::new(tansu_binary());
        c.current_dir(&self.dir)
            .args(args)
            .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)]);
        run_ok(c, &format!("tansu {}", args.join(" ")));
    }

    /// Kills the broker process.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Adds the index tansu 0.6.0's sqlite storage lacks (`deploy/local/tansu-sqlite-index.py`):
/// without it every record served scans the whole header table, and a long run's topics can no
/// longer be read back from the beginning within librdkafka's request timeout.
fn add_missing_index(db: &std::path::Path) {
    let script = crate::workspace_root().join("deploy/local/tansu-sqlite-index.py");
    crate::verify::run_python(&script, [db]);
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.stop();
        if std::env::var_os("KEEP_TANSU_DIR").is_some() {
            eprintln!("tansu's storage and log kept in {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
