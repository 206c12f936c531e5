//! Harness for the deployment and observability tests: the validators that
//! `deploy/local/install-deps.sh` installs (the venv's check-jsonschema and kubernetes-validate,
//! promtool), a real Prometheus server as a child process scraping the test's processes, PromQL
//! through its HTTP API, and the queries of the Grafana dashboard users import.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// The dashboard file, relative to the workspace root.
pub const DASHBOARD: &str = "deploy/grafana/outbox-relay.json";

/// The project venv's `bin` directory: next to `PYTHON`, else `$OUTBOX_CACHE/venv/bin` (default
/// `~/.cache/outbox-relay/venv/bin`), as `deploy/local/lib.sh` sets it up.
pub fn venv_bin_dir() -> PathBuf {
    if let Ok(p) = std::env::var("PYTHON") {
        if let Some(dir) = Path::new(&p).parent() {
            return dir.to_path_buf();
        }
    }
    let cache = std::env::var("OUTBOX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/outbox-relay")
        });
    cache.join("venv/bin")
}

/// A program of the project venv; panics with what to run when it is missing.
pub fn venv_tool(name: &str) -> PathBuf {
    let p = venv_bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `bash deploy/local/install-deps.sh` (it installs {name} into the \
         project venv), or set PYTHON to a venv's python that has it",
        p.display()
    );
    p
}

/// A program on `PATH` (promtool, prometheus); panics with what to run when it is missing.
pub fn system_tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not on PATH: run `bash deploy/local/install-deps.sh` (it installs \
                 Debian's prometheus package, which has prometheus and promtool)"
            )
        })
}

/// Runs `cmd` in the workspace root ([`crate::proc::run_ok`]): what the deployment checks
/// run, whose paths are the repository's.
pub fn run_in_workspace(what: &str, cmd: &mut Command) -> String {
    crate::proc::run_ok(what, cmd.current_dir(crate::workspace_root()))
}

/// One process for Prometheus to scrape.
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    /// The `job` label, as in `deploy/prometheus/prometheus.yml`.
    pub job: String,
    /// `host:port` serving `/metrics`.
    pub addr: String,
    /// Extra target labels (the relays' `database`).
    pub labels: Vec<(String, String)>,
}

impl ScrapeTarget {
    /// A target of `job` at `addr`, with `labels`.
    pub fn new(job: &str, addr: &str, labels: &[(&str, &str)]) -> Self {
        Self {
            job: job.to_owned(),
            addr: addr.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }
}

/// A Prometheus server as a child process, on a free port, with its storage in a directory of
/// its own under `target/e2e-logs`; killed and its directory removed when dropped.
#[derive(Debug)]
pub struct Prometheus {
    process: crate::proc::ServiceProcess,
    /// `127.0.0.1:port` of its HTTP API.
    pub addr: String,
    dir: PathBuf,
    /// Its log file.
    pub log: PathBuf,
    http: reqwest::Client,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` every second and evaluating `rule_files`.
    pub fn start(targets: &[ScrapeTarget], rule_files: &[PathBuf]) -> Self {
        let dir = crate::proc::log_dir().join(format!("prometheus-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = scrape_config(targets, rule_files);
        std::fs::write(dir.join("prometheus.yml"), &config).unwrap();
        let addr = format!("127.0.0.1:{}", crate::free_port());
        let log = dir.join("prometheus.log");
        let process = crate::proc::ServiceProcess::spawn(
            Command::new(system_tool("prometheus"))
                .arg(format!(
                    "--config.file={}",
                    dir.join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}")),
            log.clone(),
        );
        Self {
            process,
            addr,
            dir,
            log,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    /// Waits until `/-/ready` answers 200 and every target has been scraped successfully
    /// (`up == 1` for all `n_targets`).
    pub async fn wait_ready(&self, n_targets: usize, timeout: Duration) {
        let what = format!(
            "prometheus on {} to scrape all {n_targets} targets (log {})",
            self.addr,
            self.log.display()
        );
        crate::wait_for(&what, timeout, || async {
            let ready = self
                .http
                .get(format!("http://{}/-/ready", self.addr))
                .send()
                .await
                .ok()?;
            if !ready.status().is_success() {
                return None;
            }
            let up = self.query("up == 1").await.ok()?;
            (up.len() == n_targets).then_some(())
        })
        .await;
    }

    /// GET `path` of its HTTP API as JSON (e.g. `/api/v1/rules`).
    ///
    /// # Errors
    /// A transport error or a body that is not JSON.
    pub async fn api(&self, path: &str) -> Result<Value, String> {
        let r = self
            .http
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        r.json().await.map_err(|e| e.to_string())
    }

    /// Evaluates `expr` now (`/api/v1/query`); the result's series (or scalar) on success.
    ///
    /// # Errors
    /// The error Prometheus gave (a query that does not parse), or a transport error.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let r = self
            .http
            .get(format!("http://{}/api/v1/query", self.addr))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = r.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        match &body["data"]["result"] {
            Value::Array(series) => Ok(series.clone()),
            // A scalar or string result counts as one value.
            other => Ok(vec![other.clone()]),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.process.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A Prometheus configuration: one scrape job per distinct `job`, a 1 s interval.
pub fn scrape_config(targets: &[ScrapeTarget], rule_files: &[PathBuf]) -> String {
    let jobs: Vec<&str> = targets.iter().map(|t| t.job.as_str()).collect();
    let mut out = String::from(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  scrape_timeout: 1s\n",
    );
    if !rule_files.is_empty() {
        out.push_str("rule_files:\n");
        for f in rule_files {
            out.push_str(&format!(
                "  - {}\n",
                serde_json::json!(f.display().to_string())
            ));
        }
    }
    out.push_str("scrape_configs:\n");
    let mut seen = std::collections::HashSet::new();
    for job in jobs {
        if !seen.insert(job) {
            continue;
        }
        out.push_str(&format!(
            "  - job_name: {}\n    static_configs:\n",
            serde_json::json!(job)
        ));
        for t in targets.iter().filter(|t| t.job == job) {
            let labels: serde_json::Map<String, Value> = t
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            out.push_str(&format!(
                "      - targets: [{}]\n        labels: {}\n",
                serde_json::json!(t.addr),
                Value::Object(labels)
            ));
        }
    }
    out
}

/// Every query of the dashboard: `(panel title, expr)`, rows skipped.
///
/// # Panics
/// When the file is missing or is not a dashboard with panels.
pub fn dashboard_queries(path: &Path) -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = vec![];
    let mut panels: Vec<&Value> = dash["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = panels.pop() {
        if let Some(inner) = p["panels"].as_array() {
            panels.extend(inner);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((
                    p["title"].as_str().unwrap_or("").to_owned(),
                    expr.to_owned(),
                ));
            }
        }
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_has_queries() {
        let q = dashboard_queries(&crate::workspace_root().join(DASHBOARD));
        assert!(q.len() >= 15, "{q:?}");
        assert!(q.iter().any(|(_, e)| e.contains("outbox_backlog_events")));
    }

    #[test]
    fn scrape_config_groups_targets_by_job() {
        let c = scrape_config(
            &[
                ScrapeTarget::new("outbox-relay", "127.0.0.1:1", &[("database", "order")]),
                ScrapeTarget::new("outbox-relay", "127.0.0.1:2", &[("database", "wms")]),
                ScrapeTarget::new("order-service", "127.0.0.1:3", &[]),
            ],
            &[PathBuf::from("/x/alerts.yaml")],
        );
        assert_eq!(c.matches("job_name").count(), 2, "{c}");
        assert!(c.contains(r#"labels: {"database":"wms"}"#), "{c}");
        assert!(c.contains(r#"- "/x/alerts.yaml""#), "{c}");
    }
}
