//! A child process with its output in a log file, killed when dropped, and the small pieces
//! every harness that starts processes needs: a free port, signals, waiting for an exit, an
//! HTTP GET of what the process exposes.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process with no input and its output appended to a log file; killed when dropped.
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
    /// Its log file.
    pub log: PathBuf,
}

impl ChildProcess {
    /// Spawns `cmd` with no input, its stdout and stderr appended to `log`.
    ///
    /// # Errors
    /// When the log cannot be opened or the program cannot be started.
    pub fn spawn(cmd: &mut Command, log: PathBuf) -> std::io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        Ok(Self { child, log })
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The process id, as `/proc` names it.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait up to `timeout` for the exit; returns how long it took, or `None`
    /// when it had not exited by then (it is then killed).
    pub fn terminate(&mut self, timeout: Duration) -> Option<(Duration, ExitStatus)> {
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

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Waits up to `timeout` for `child` to exit; its status, or `None` if it still runs.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
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
///
/// # Panics
/// When kill(1) fails (no such process, say).
pub fn signal(pid: i32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success());
    assert!(matches!(ok, Ok(true)), "kill -{sig} {pid} failed");
}

/// A free TCP port on the loopback interface.
pub fn free_port() -> u16 {
    // The port is free when the probe socket closes, so two tests asking at once can be given
    // the same one (then one server fails to bind and its clients reach the other test's: seen
    // as a TLS test's client meeting another test's certificate). Never hand a port out twice
    // in this process.
    static GIVEN: std::sync::Mutex<Option<std::collections::HashSet<u16>>> =
        std::sync::Mutex::new(None);
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let given = given.get_or_insert_with(Default::default);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

/// A minimal HTTP/1.0 GET; the body on status 200, `None` otherwise (or while nothing
/// answers).
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
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
