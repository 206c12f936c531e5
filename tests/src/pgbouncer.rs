//! A private PgBouncer (`pool_mode = transaction`) in front of the test PostgreSQL, on a free
//! port, with a generated ini: for the relay's `--pgbouncer` mode.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running PgBouncer; stopped when dropped.
#[derive(Debug)]
pub struct PgBouncer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its log file.
    pub log: PathBuf,
}

/// The PgBouncer binary (Debian's package installs it in /usr/sbin).
pub fn pgbouncer_binary() -> PathBuf {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("pgbouncer is not installed: run deploy/local/install-deps.sh")
}

/// Host, port and user of a `postgres://user@host:port/db` URL.
fn server_of(url: &str) -> (String, u16, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (auth, rest) = rest.split_once('@').unwrap_or(("postgres", rest));
    let user = auth.split(':').next().unwrap_or("postgres").to_owned();
    let hostport = rest.split(['/', '?']).next().unwrap_or("127.0.0.1:5432");
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, "5432"));
    (host.to_owned(), port.parse().unwrap_or(5432), user)
}

impl PgBouncer {
    /// Starts PgBouncer in front of the server of `admin_url`, transaction pooling with at
    /// most `pool_size` server connections per database and user, and waits until it accepts
    /// connections.
    pub async fn start(admin_url: &str, pool_size: u32) -> Self {
        let (host, pg_port, user) = server_of(admin_url);
        let port = crate::free_port();
        let dir = crate::proc::log_dir().join(format!("pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("pgbouncer.log");
        std::fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        // What the runbook asks for (docs/src/runbook.md, PgBouncer), with trust auth.
        let ini = format!(
            "[databases]\n\
             * = host={host} port={pg_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {auth}\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 500\n\
             ignore_startup_parameters = extra_float_digits\n\
             server_reset_query = DEALLOCATE ALL\n\
             server_reset_query_always = 1\n\
             logfile = {log}\n\
             pidfile = {pid}\n",
            auth = dir.join("userlist.txt").display(),
            log = log.display(),
            pid = dir.join("pgbouncer.pid").display(),
        );
        let ini_path = dir.join("pgbouncer.ini");
        std::fs::write(&ini_path, ini).unwrap();
        let mut cmd = Command::new(pgbouncer_binary());
        // PgBouncer refuses to run as root; the test cluster's OS user owns PostgreSQL.
        if crate::servers::is_root() {
            Command::new("chmod")
                .args(["-R", "a+rwX"])
                .arg(&dir)
                .status()
                .unwrap();
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(&ini_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let bouncer = Self { child, port, log };
        crate::wait_for(
            "pgbouncer to accept connections",
            Duration::from_secs(20),
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await;
        bouncer
    }

    /// `url` with its server replaced by this PgBouncer (same database and user).
    pub fn url_for(&self, url: &str) -> String {
        let (host, pg_port, _) = server_of(url);
        url.replacen(
            &format!("{host}:{pg_port}"),
            &format!("127.0.0.1:{}", self.port),
            1,
        )
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::server_of;

    #[test]
    fn reads_the_server_of_a_url() {
        assert_eq!(
            server_of("postgres://postgres@127.0.0.1:43495/outbox"),
            ("127.0.0.1".into(), 43495, "postgres".into())
        );
        assert_eq!(
            server_of("postgres://u:pw@h:5/x?sslmode=disable"),
            ("h".into(), 5, "u".into())
        );
    }
}
