//! Child processes: the workspace's binaries (the relay among them) with their output in a log
//! file, signals, and reading what they expose (`/metrics`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use test_support::metrics::{
    histogram, histogram_delta, histogram_quantile, metric, metric_sample, metric_series,
    metric_value,
};
pub use test_support::process::{http_get, signal, wait_exit, ChildProcess};
use test_support::relay::{RelayChild, RunArgs};

/// Path of the `outbox-relay` binary (`OUTBOX_RELAY_BIN`, else the workspace's debug build).
pub fn relay_binary() -> PathBuf {
    if let Ok(p) = std::env::var("OUTBOX_RELAY_BIN") {
        return p.into();
    }
    workspace_binary("outbox-relay")
}

/// The relay of the last release without buckets (one whole-outbox lease), built from this
/// repository's history by `deploy/local/build-old-relay.sh` (cached; the first call builds it,
/// minutes), or `OUTBOX_RELAY_OLD_BIN` when set.
pub fn old_relay_binary() -> PathBuf {
    if let Ok(p) = std::env::var("OUTBOX_RELAY_OLD_BIN") {
        return p.into();
    }
    let script = crate::workspace_root().join("deploy/local/build-old-relay.sh");
    let out = run_ok(
        "deploy/local/build-old-relay.sh",
        Command::new("bash").arg(&script),
    );
    let path = out
        .lines()
        .find(|l| l.ends_with("/outbox-relay"))
        .unwrap_or_else(|| panic!("build-old-relay.sh printed no binary: {out}"));
    path.trim().into()
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

/// A child process with its output in a log file ([`ChildProcess`], which it derefs to); killed
/// when dropped. The one wrapper the harness's processes share: any workspace binary
/// ([`ServiceProcess::start`]), the relay ([`RelayProcess`]), a restartable service
/// ([`crate::fulfilment::Service`]), Prometheus.
#[derive(Debug)]
pub struct ServiceProcess(ChildProcess);

impl std::ops::Deref for ServiceProcess {
    type Target = ChildProcess;

    fn deref(&self) -> &ChildProcess {
        &self.0
    }
}

impl std::ops::DerefMut for ServiceProcess {
    fn deref_mut(&mut self) -> &mut ChildProcess {
        &mut self.0
    }
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
        let program = cmd.get_program().to_string_lossy().into_owned();
        let log_name = log.display().to_string();
        Self(
            ChildProcess::spawn(cmd, log)
                .unwrap_or_else(|e| panic!("start {program} (log {log_name}): {e}")),
        )
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

/// A running relay process ([`RelayChild`], which it derefs to: its process and its metrics
/// address); killed when dropped.
#[derive(Debug)]
pub struct RelayProcess(RelayChild);

impl std::ops::Deref for RelayProcess {
    type Target = RelayChild;

    fn deref(&self) -> &RelayChild {
        &self.0
    }
}

impl std::ops::DerefMut for RelayProcess {
    fn deref_mut(&mut self) -> &mut RelayChild {
        &mut self.0
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
        Self::start_binary(args, &relay_binary())
    }

    /// Starts `binary run` with the given arguments (another version's relay, for example).
    pub fn start_binary(args: &RelayArgs, binary: &Path) -> Self {
        let run = RunArgs {
            binary,
            database_url: &args.database_url,
            brokers: &args.brokers,
            topic_prefix: &args.topic_prefix,
            instance_id: &args.name,
        };
        let relay = RelayChild::spawn(
            &run,
            |cmd| {
                cmd.args(["--create-missing-topics", "--topic-partitions", "3"])
                    .args(&args.extra)
                    .env("RUST_LOG", "info,outbox_relay=debug")
                    .envs(args.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            },
            log_file(&args.name),
        )
        .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        Self(relay)
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
