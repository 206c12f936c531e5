//! Secured servers for the connectivity tests (tests/it/secured.rs):
//!
//! - [`Pki`]: a test CA, a server certificate for `localhost` (and only that name, so a client
//!   that connects to `127.0.0.1` sees a wrong host name), a client certificate, and a second CA
//!   with a `localhost` certificate of its own (what an impostor would present); made with the openssl command line at test time, in a temporary
//!   directory (no key is ever committed);
//! - [`SecuredPg`]: a PostgreSQL cluster with `ssl=on`, whose `pg_hba.conf` has `hostssl ...
//!   scram-sha-256` lines only (one database also wants a client certificate);
//! - [`SecuredKafka`]: a tansu broker with `--authentication` (SCRAM users made before through
//!   tansu's own CLI, which cannot authenticate) behind stunnel, the TLS terminator, which the
//!   broker advertises as `localhost:<port>`;
//! - [`TlsTerminator`]: that stunnel, also in front of other plaintext servers (the OTLP
//!   receiver).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers::{PgCluster, Tansu};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl: install it (deploy/local/install-deps.sh)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Test certificates in a temporary directory (removed when dropped).
#[derive(Debug)]
pub struct Pki {
    /// The directory holding them.
    pub dir: PathBuf,
}

impl Pki {
    /// Makes the CAs and certificates (RSA 2048, valid 2 days).
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-pki-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        for ca in ["ca", "other-ca"] {
            openssl(
                &dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.pem"),
                    "-subj",
                    &format!("/CN=outbox test {ca}"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            );
        }
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("client.ext"),
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        for (name, cn, ca) in [
            ("server", "localhost", "ca"),
            ("client", "app", "ca"),
            ("rogue", "localhost", "other-ca"),
        ] {
            openssl(
                &dir,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={cn}"),
                ],
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{ca}.pem"),
                    "-CAkey",
                    &format!("{ca}.key"),
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &format!("{name}.pem"),
                    "-extfile",
                    if name == "client" {
                        "client.ext"
                    } else {
                        "server.ext"
                    },
                ],
            );
        }
        // Readable by the `postgres` user that runs the cluster (the test's own copies).
        let _ = Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(&dir)
            .status();
        Self { dir }
    }

    /// A file of the PKI (`ca.pem`, `other-ca.pem`, `server.pem`, `server.key`,
    /// `client.pem`, `client.key`, and `rogue.pem` / `rogue.key`: a `localhost` certificate
    /// signed by the other CA).
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The superuser's password of [`SecuredPg`].
pub const PG_ADMIN_PASSWORD: &str = "e2e-Admin-pw-7f3a";

/// A PostgreSQL cluster reachable only over TLS with SCRAM passwords.
#[derive(Debug)]
pub struct SecuredPg {
    /// The cluster.
    pub cluster: PgCluster,
    pwfile_dir: PathBuf,
}

impl SecuredPg {
    /// initdb with a SCRAM password for `postgres`, the server certificate of `pki`,
    /// `pg_hba.conf` with `hostssl` lines only; database `mtls` also wants a client
    /// certificate signed by the CA (`clientcert=verify-full`).
    pub fn start(pki: &Pki) -> Self {
        let pwfile_dir =
            std::env::temp_dir().join(format!("outbox-pgpw-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&pwfile_dir).unwrap();
        let pwfile = pwfile_dir.join("pw");
        std::fs::write(&pwfile, format!("{PG_ADMIN_PASSWORD}\n")).unwrap();
        let _ = Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(&pwfile_dir)
            .status();
        let pwfile_arg = format!("--pwfile={}", pwfile.display());
        let pki_dir = pki.dir.clone();
        let cluster = PgCluster::start_with(
            &["--auth=scram-sha-256", &pwfile_arg],
            move |data: &Path| {
                for f in ["server.pem", "server.key", "ca.pem"] {
                    std::fs::copy(pki_dir.join(f), data.join(f)).unwrap();
                }
                let _ = Command::new("chmod")
                    .arg("600")
                    .arg(data.join("server.key"))
                    .status();
                let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
                conf.push_str(
                    "\nssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\n\
                     ssl_ca_file = 'ca.pem'\npassword_encryption = 'scram-sha-256'\n",
                );
                std::fs::write(data.join("postgresql.conf"), conf).unwrap();
                std::fs::write(
                    data.join("pg_hba.conf"),
                    "hostssl mtls all 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n\
                     hostssl mtls all ::1/128 scram-sha-256 clientcert=verify-full\n\
                     hostssl all all 127.0.0.1/32 scram-sha-256\n\
                     hostssl all all ::1/128 scram-sha-256\n",
                )
                .unwrap();
            },
        );
        Self {
            cluster,
            pwfile_dir,
        }
    }

    /// A `verify-full` URL for `user` (no password in it) on database `db`, reaching the
    /// server as `host` and trusting `ca` (a path).
    pub fn url(&self, user: &str, host: &str, db: &str, ca: &str) -> String {
        format!(
            "postgres://{user}@{host}:{}/{db}?sslmode=verify-full&sslrootcert={ca}",
            self.cluster.port
        )
    }
}

impl Drop for SecuredPg {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pwfile_dir);
    }
}

/// The SCRAM-SHA-512 user every client of [`SecuredKafka`] logs in as.
pub const KAFKA_USER: &str = "outbox";
/// Its password.
pub const KAFKA_PASSWORD: &str = "e2e-Kafka-pw-91c2";

/// A tansu broker with `--authentication` behind stunnel.
#[derive(Debug)]
pub struct SecuredKafka {
    /// The broker (plaintext, on `broker.port`: reached only through the terminator).
    pub broker: Tansu,
    /// stunnel in front of it.
    pub terminator: TlsTerminator,
    /// The terminator's port (what the broker advertises, as `localhost`).
    pub port: u16,
}

impl SecuredKafka {
    /// Starts the broker without authentication, creates [`KAFKA_USER`] (SCRAM-SHA-512, and
    /// SCRAM-SHA-256) and `topics` (`(name, partitions)`) with tansu's CLI, restarts it with
    /// `--authentication` advertising `localhost:<terminator port>`, and starts stunnel in
    /// front of it with `pki`'s server certificate.
    pub fn start(pki: &Pki, topics: &[(&str, u32)]) -> Self {
        // The terminator first, on a port of its own choosing (see [`TlsTerminator`]); the
        // broker then advertises it.
        let broker_port = crate::free_port();
        let terminator = TlsTerminator::start(pki, broker_port);
        let port = terminator.port;
        let mut broker = Tansu::start_on_behind(broker_port, port, "127.0.0.1");
        for mechanism in ["scram512", "scram256"] {
            broker.cli(&[
                "user",
                "create",
                KAFKA_USER,
                KAFKA_PASSWORD,
                "--mechanism",
                mechanism,
            ]);
        }
        for (topic, partitions) in topics {
            broker.cli(&[
                "topic",
                "create",
                topic,
                "--partitions",
                &partitions.to_string(),
            ]);
        }
        broker.restart_with(&["--authentication"], "localhost");
        Self {
            broker,
            terminator,
            port,
        }
    }

    /// Replaces the terminator by one presenting certificate `cert` of `pki` on the same port
    /// (`rogue`: an impostor; `server`: the real one again). Open connections are cut.
    pub fn present(&mut self, pki: &Pki, cert: &str) {
        self.terminator.stop();
        self.terminator = TlsTerminator::start_with(pki, self.port, self.broker.port, cert, "");
    }

    /// The bootstrap address clients use: the terminator, by the name its certificate holds.
    pub fn brokers(&self) -> String {
        format!("localhost:{}", self.port)
    }

    /// The environment of a client logging in with SASL_SSL + SCRAM-SHA-512 as [`KAFKA_USER`]
    /// with `password`, trusting `ca` (a path): the variables every binary and kafka_tool.py
    /// read.
    pub fn client_env(password: &str, ca: &str) -> Vec<(String, String)> {
        [
            ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("KAFKA_SASL_USERNAME", KAFKA_USER),
            ("KAFKA_SASL_PASSWORD", password),
            ("KAFKA_SSL_CA_LOCATION", ca),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }
}

/// stunnel: TLS with `pki`'s `localhost` certificate on a port of its own, plaintext to a
/// local port behind it. Stopped when dropped.
///
/// stunnel binds the port itself (port 0) and the port is read back from its log: a port
/// probed free beforehand can be taken by another server before stunnel binds it, and a
/// readiness check by TCP connect then succeeds against that other listener (seen as a client
/// meeting another test's certificate).
#[derive(Debug)]
pub struct TlsTerminator {
    child: Child,
    dir: PathBuf,
    /// The TLS port.
    pub port: u16,
}

impl TlsTerminator {
    /// Listens on a free port of `127.0.0.1` (TLS, [`TlsTerminator::port`]) and forwards to
    /// `127.0.0.1:target`.
    pub fn start(pki: &Pki, target: u16) -> Self {
        Self::start_with(pki, 0, target, "server", "")
    }

    /// [`TlsTerminator::start`] that also wants a client certificate signed by `pki`'s CA
    /// (mutual TLS): a client without one fails the handshake.
    pub fn start_requiring_client_cert(pki: &Pki, target: u16) -> Self {
        Self::start_with(
            pki,
            0,
            target,
            "server",
            &format!("verifyChain = yes\nCAfile = {}\n", pki.path("ca.pem")),
        )
    }

    /// Listens on `port` (0: one stunnel picks) with certificate `cert` of `pki` (`server`, or
    /// `rogue`: the same name signed by the other CA). Ready once stunnel's log says it bound
    /// the port; fails at once, with the log, if stunnel exits (a fixed port already taken).
    pub fn start_with(
        pki: &Pki,
        port: u16,
        target: u16,
        cert: &str,
        service_options: &str,
    ) -> Self {
        let dir =
            std::env::temp_dir().join(format!("outbox-stunnel-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("stunnel.conf");
        let log = dir.join("stunnel.log");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\ndebug = 6\noutput = {log}\n\n[tls]\n\
                 accept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{target}\ncert = {cert}\n\
                 key = {key}\n{service_options}",
                log = log.display(),
                cert = pki.path(&format!("{cert}.pem")),
                key = pki.path(&format!("{cert}.key")),
            ),
        )
        .unwrap();
        let bin = ["stunnel4", "stunnel"]
            .into_iter()
            .find(|b| {
                Command::new("sh")
                    .args(["-c", &format!("command -v {b}")])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .expect("stunnel missing: run deploy/local/install-deps.sh");
        let mut child = Command::new(bin)
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start stunnel");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(bound) = bound_port(&text) {
                break bound;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("stunnel exited ({status}) before listening on port {port}:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "stunnel did not start; see {}",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            "stunnel says it listens on {port}, but nothing answers there"
        );
        Self { child, dir, port }
    }
}

/// The port of stunnel's `Service [tls] (FD=8) bound to 127.0.0.1:PORT` log line (debug 6).
fn bound_port(log: &str) -> Option<u16> {
    log.lines().find_map(|line| {
        let (_, rest) = line.split_once("Service [tls] (FD=")?;
        let (_, addr) = rest.split_once(") bound to ")?;
        addr.rsplit(':').next()?.trim().parse().ok()
    })
}

impl TlsTerminator {
    /// Kills stunnel (its port is free afterwards).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TlsTerminator {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `(String, String)` pairs as the `(&str, &str)` the process helpers take.
pub fn env_refs(envs: &[(String, String)]) -> Vec<(&str, &str)> {
    envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}
