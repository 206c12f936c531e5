//! `outbox-relay run` as a child process, as the end-to-end tests and the benchmark start it:
//! the arguments every run gets, a metrics address of its own, its `/metrics`. What each caller
//! adds (topic creation and debug logs in the tests, the batch size in the benchmark) it adds
//! through [`RelayChild::spawn`]'s `more`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::{free_port, http_get, ChildProcess};

/// What every relay run is given.
#[derive(Debug, Clone)]
pub struct RunArgs<'a> {
    /// The `outbox-relay` binary.
    pub binary: &'a Path,
    /// `--database-url`.
    pub database_url: &'a str,
    /// `--kafka-brokers`.
    pub brokers: &'a str,
    /// `--topic-prefix`.
    pub topic_prefix: &'a str,
    /// `--instance-id`.
    pub instance_id: &'a str,
}

/// A running relay ([`ChildProcess`], which it derefs to, plus its metrics address); killed
/// when dropped.
#[derive(Debug)]
pub struct RelayChild {
    process: ChildProcess,
    /// Its metrics address (`--metrics-addr`).
    pub metrics_addr: String,
}

impl std::ops::Deref for RelayChild {
    type Target = ChildProcess;

    fn deref(&self) -> &ChildProcess {
        &self.process
    }
}

impl std::ops::DerefMut for RelayChild {
    fn deref_mut(&mut self) -> &mut ChildProcess {
        &mut self.process
    }
}

impl RelayChild {
    /// Starts `outbox-relay run` with `run`'s arguments and a free metrics port, then what
    /// `more` adds (arguments, environment), its output appended to `log`.
    ///
    /// # Errors
    /// When the log cannot be opened or the binary cannot be started.
    pub fn spawn(
        run: &RunArgs<'_>,
        more: impl FnOnce(&mut Command),
        log: PathBuf,
    ) -> std::io::Result<Self> {
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(run.binary);
        cmd.arg("run")
            .args(["--database-url", run.database_url])
            .args(["--kafka-brokers", run.brokers])
            .args(["--topic-prefix", run.topic_prefix])
            .args(["--metrics-addr", &metrics_addr])
            .args(["--instance-id", run.instance_id]);
        more(&mut cmd);
        let process = ChildProcess::spawn(&mut cmd, log)?;
        Ok(Self {
            process,
            metrics_addr,
        })
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Its `/metrics` text, `None` while it does not answer.
    pub async fn metrics(&self) -> Option<String> {
        http_get(&self.metrics_addr, "/metrics").await
    }
}
