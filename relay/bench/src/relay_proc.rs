//! The release `outbox-relay run` binary as a child process: started against a phase's
//! database and topic prefix, watched through its `/metrics` and `/proc/<pid>/status`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

/// A running relay; killed when dropped.
#[derive(Debug)]
pub struct RelayProc {
    child: Child,
    /// Address of its `/metrics`.
    pub metrics_addr: String,
    /// Its log file.
    pub log: PathBuf,
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
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        if let Some(dir) = spec.log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let out = std::fs::File::create(&spec.log)
            .with_context(|| format!("creating {}", spec.log.display()))?;
        let child = Command::new(spec.binary)
            .arg("run")
            .args(["--database-url", spec.database_url])
            .args(["--kafka-brokers", spec.brokers])
            .args(["--topic-prefix", spec.topic_prefix])
            .args(["--metrics-addr", &metrics_addr])
            .args(["--instance-id", "relay-bench"])
            .args(["--batch-size", &spec.batch_size.to_string()])
            .args(spec.extra)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_RELAY_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", spec.binary.display()))?;
        Ok(Self {
            child,
            metrics_addr,
            log: spec.log.clone(),
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails (with the end of its log) when the process has exited.
    ///
    /// # Errors
    /// When it is no longer running.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the relay exited ({status}); end of {}:\n{}",
                self.log.display(),
                self.log_tail(20)
            );
        }
        Ok(())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Its `/metrics` text, `None` while it does not answer.
    pub async fn metrics(&self) -> Option<String> {
        http_get(&self.metrics_addr, "/metrics").await
    }

    /// Its memory now.
    pub fn memory(&self) -> Option<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let field = |name: &str| -> Option<u64> {
            status
                .lines()
                .find(|l| l.starts_with(name))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        Some(Memory {
            rss_kb: field("VmRSS:")?,
            hwm_kb: field("VmHWM:")?,
        })
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
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        bail!("the relay did not stop within 15 s of SIGTERM")
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A free TCP port on the loopback interface.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(9187, |a| a.port())
}

/// A minimal HTTP/1.0 GET; the body on status 200, `None` otherwise.
async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?;
    (status == "200").then(|| body.to_owned())
}
