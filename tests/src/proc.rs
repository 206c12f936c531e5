//! Child processes: the workspace's binaries (the relay among them) with their output in a log
//! file, signals, and reading what they expose (`/metrics`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of the `outbox-relay` binary (`OUTBOX_RELAY_BIN`, else the workspace's debug build).
pub fn relay_binary() -> PathBuf {
    if let Ok(p) = std::env::var("OUTBOX_RELAY_BIN") {
        return p.into();
    }
    workspace_binary("outbox-relay")
}

/// Path of a binary of this workspace's debug build (`E2E_PROFILE=release`: its release build).
pub fn workspace_binary(name: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| crate::workspace_root().join("target"));
    // `make chaos` runs the release builds (what users run; half the CPU of the debug ones).
    let profile = std::env::var("E2E_PROFILE").unwrap_or_else(|_| "debug".to_owned());
    let p = target.join(&profile).join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins{}` first (make test does)",
        p.display(),
        if profile == "release" {
            " --release"
        } else {
            ""
        }
    );
    p
}

/// A child process with its output in a log file; killed when dropped. The one wrapper the
/// harness's processes share: any workspace binary ([`ServiceProcess::start`]), the relay
/// ([`RelayProcess`]), a restartable service ([`crate::fulfilment::Service`]), Prometheus.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Child,
    /// Its log file.
    pub log: PathBuf,
}

impl ServiceProcess {
    /// Starts workspace binary `bin` with `args`, the test JWT settings ([`crate::auth::ENV`])
    /// and extra environment `envs` (which may override them).
    pub fn start(bin: &str, name: &str, args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::spawn(
            Command::new(workspace_binary(bin))
                .args(args)
                .envs(crate::auth::ENV)
                .envs(envs.iter().copied()),
            log_file(name),
        )
    }

    /// Spawns `cmd` with no input, its output appended to `log`.
    pub fn spawn(cmd: &mut Command, log: PathBuf) -> Self {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", cmd.get_program().to_string_lossy()));
        Self { child, log }
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait up to `timeout` for the exit; returns how long it took, or `None`
    /// when it had not exited by then (it is then killed).
    pub fn terminate(&mut self, timeout: Duration) -> Option<(Duration, std::process::ExitStatus)> {
        signal(self.pid(), "TERM");
        let start = Instant::now();
        let exited = wait_exit(&mut self.child, timeout).map(|status| (start.elapsed(), status));
        if exited.is_none() {
            self.kill();
        }
        exited
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A new log file for process `name` in [`log_dir`]: `<name>-<random>.log`.
pub fn log_file(name: &str) -> PathBuf {
    log_dir().join(format!(
        "{name}-{:06x}.log",
        rand::random::<u32>() & 0xff_ffff
    ))
}

/// Directory for process logs of the tests.
pub fn log_dir() -> PathBuf {
    let d = crate::workspace_root().join("target/e2e-logs");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs an `outbox-relay` operator command (`status`, `blocked`, `redrive`, ...) to the end.
pub fn relay_cli(args: &[&str]) -> std::process::Output {
    relay_cli_with_env(args, &[])
}

/// [`relay_cli`] with extra environment `envs` (e.g. `DATABASE_PASSWORD_FILE`).
pub fn relay_cli_with_env(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    Command::new(relay_binary())
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run outbox-relay")
}

/// A running relay process ([`ServiceProcess`], which it derefs to, plus its metrics
/// address); killed when dropped.
#[derive(Debug)]
pub struct RelayProcess {
    process: ServiceProcess,
    /// Its metrics address.
    pub metrics_addr: String,
}

impl std::ops::Deref for RelayProcess {
    type Target = ServiceProcess;

    fn deref(&self) -> &ServiceProcess {
        &self.process
    }
}

impl std::ops::DerefMut for RelayProcess {
    fn deref_mut(&mut self) -> &mut ServiceProcess {
        &mut self.process
    }
}

/// How to start a relay.
#[derive(Debug, Clone)]
pub struct RelayArgs {
    /// Database URL.
    pub database_url: String,
    /// Brokers.
    pub brokers: String,
    /// Topic prefix.
    pub topic_prefix: String,
    /// Extra flags.
    pub extra: Vec<String>,
    /// Name used for the log file and instance id.
    pub name: String,
    /// Extra environment (e.g. the `KAFKA_SECURITY_*` settings).
    pub env: Vec<(String, String)>,
}

impl RelayArgs {
    /// Defaults for tests: create topics with 3 partitions, short lease.
    pub fn new(database_url: &str, brokers: &str, topic_prefix: &str, name: &str) -> Self {
        Self {
            database_url: database_url.to_owned(),
            brokers: brokers.to_owned(),
            topic_prefix: topic_prefix.to_owned(),
            extra: vec![],
            name: name.to_owned(),
            env: vec![],
        }
    }
}

impl RelayProcess {
    /// Starts `outbox-relay run` with the given arguments.
    pub fn start(args: &RelayArgs) -> Self {
        let metrics_addr = format!("127.0.0.1:{}", crate::free_port());
        let process = ServiceProcess::spawn(
            Command::new(relay_binary())
                .arg("run")
                .args(["--database-url", &args.database_url])
                .args(["--kafka-brokers", &args.brokers])
                .args(["--topic-prefix", &args.topic_prefix])
                .args(["--metrics-addr", &metrics_addr])
                .args(["--instance-id", &args.name])
                .args(["--create-missing-topics", "--topic-partitions", "3"])
                .args(&args.extra)
                .env("RUST_LOG", "info,outbox_relay=debug")
                .envs(args.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            log_file(&args.name),
        );
        Self {
            process,
            metrics_addr,
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Fetches `/metrics`.
    pub async fn metrics(&self) -> Option<String> {
        http_get(&self.metrics_addr, "/metrics").await
    }
}

/// Runs `cmd` to the end with no input; panics naming `what`, with its output, unless it
/// succeeded. Returns its stdout and stderr.
pub fn run_ok(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

/// Waits up to `timeout` for `child` to exit; its status, or `None` if it still runs.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a signal (`TERM`, `KILL`, `STOP`, `CONT`) to a process with kill(1).
pub fn signal(pid: i32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success());
    assert!(matches!(ok, Ok(true)), "kill -{sig} {pid} failed");
}

/// A minimal HTTP/1.0 GET returning the body on 200.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}

/// Reads a Prometheus sample value (first line starting with `name`).
/// The value of one series, written exactly as exposed: `name{label="value",...}`.
pub fn metric_series(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

/// The value of the first sample of metric `name` (any labels).
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    metric_sample(text, name, &[])
}

/// The value of the first sample of `name` whose labels include every `label="value"` of
/// `labels` (0 when there is none).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sample(text, name, labels).unwrap_or(0.0)
}

/// The value of the first sample of `name` whose labels include every `label="value"` of
/// `labels`.
pub fn metric_sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
