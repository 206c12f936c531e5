//! The release `outbox-relay run` binary as a child process: started against a phase's
//! database and topic prefix ([`test_support::relay`], as the end-to-end tests start it, plus
//! the bench's batch size and log level), watched through its `/metrics` and
//! `/proc/<pid>/status`, stopped with SIGTERM.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use test_support::relay::{RelayChild, RunArgs};

/// A running relay ([`RelayChild`], which it derefs to: its process, log and metrics address);
/// killed when dropped.
#[derive(Debug)]
pub struct RelayProc(RelayChild);

impl std::ops::Deref for RelayProc {
    type Target = RelayChild;

    fn deref(&self) -> &RelayChild {
        &self.0
    }
}

impl std::ops::DerefMut for RelayProc {
    fn deref_mut(&mut self) -> &mut RelayChild {
        &mut self.0
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct RelaySpec<'a> {
    /// The binary.
    pub binary: &'a Path,
    /// Database URL.
    pub database_url: &'a str,
    /// Brokers.
    pub brokers: &'a str,
    /// Topic prefix.
    pub topic_prefix: &'a str,
    /// `--batch-size`.
    pub batch_size: i64,
    /// More arguments.
    pub extra: &'a [String],
    /// Log file.
    pub log: PathBuf,
}

/// Memory of a process from `/proc/<pid>/status`, in KiB.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Memory {
    /// Resident set size now (`VmRSS`).
    pub rss_kb: u64,
    /// Peak resident set size (`VmHWM`).
    pub hwm_kb: u64,
}

impl Memory {
    /// Process `pid`'s memory now, from `/proc/<pid>/status`.
    pub fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| -> Option<u64> {
            status
                .lines()
                .find(|l| l.starts_with(name))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        Some(Self {
            rss_kb: field("VmRSS:")?,
            hwm_kb: field("VmHWM:")?,
        })
    }
}

impl RelayProc {
    /// Starts the relay.
    ///
    /// # Errors
    /// When the binary is missing or cannot be started.
    pub fn spawn(spec: &RelaySpec<'_>) -> anyhow::Result<Self> {
        if !spec.binary.exists() {
            bail!(
                "{} is missing: build it with `cargo build --release -p outbox-relay`",
                spec.binary.display()
            );
        }
        if let Some(dir) = spec.log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // A new log for every run (the child appends to it).
        std::fs::File::create(&spec.log)
            .with_context(|| format!("creating {}", spec.log.display()))?;
        // Named after its log (`relay-<label>[-<n>]`): relays sharing an outbox need distinct
        // instance ids (each is a member and a lease holder of its own).
        let instance_id = spec
            .log
            .file_stem()
            .map_or("relay-bench".into(), |s| s.to_string_lossy());
        let run = RunArgs {
            binary: spec.binary,
            database_url: spec.database_url,
            brokers: spec.brokers,
            topic_prefix: spec.topic_prefix,
            instance_id: &instance_id,
        };
        let relay = RelayChild::spawn(
            &run,
            |cmd| {
                cmd.args(["--batch-size", &spec.batch_size.to_string()])
                    .args(spec.extra)
                    .env(
                        "RUST_LOG",
                        std::env::var("BENCH_RELAY_LOG").unwrap_or_else(|_| "info".to_owned()),
                    );
            },
            spec.log.clone(),
        )
        .with_context(|| format!("starting {}", spec.binary.display()))?;
        Ok(Self(relay))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.id()
    }

    /// Fails (with the end of its log) when the process has exited.
    ///
    /// # Errors
    /// When it is no longer running.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.try_wait() {
            bail!(
                "the relay exited ({status}); end of {}:\n{}",
                self.log.display(),
                self.log_tail(20)
            );
        }
        Ok(())
    }

    /// Its memory now.
    pub fn memory(&self) -> Option<Memory> {
        Memory::of(self.pid())
    }

    /// Waits until it holds the lease (`outbox_relay_leader 1`).
    ///
    /// # Errors
    /// When it exits or does not lead within `timeout`.
    pub async fn wait_until_leading(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            if let Some(m) = self.metrics().await {
                if crate::stats::metric_value(&m, "outbox_relay_leader") == Some(1.0) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the relay did not take the lease within {timeout:?}; end of its log:\n{}",
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then waits up to 15 s for it to exit (SIGKILL after that).
    ///
    /// # Errors
    /// When it had to be killed.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if self.try_wait().is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
        bail!("the relay did not stop within 15 s of SIGTERM")
    }
}
