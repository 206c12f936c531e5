//! Secured servers for the connectivity tests (`tests/it/security/`: `kafka_logins.rs`,
//! `kafka_refusals.rs`, `postgres_tls.rs`) and the chaos run
//! ([`crate::chaos::world`]):
//!
//! - [`Pki`]: a test CA, a server certificate for `localhost` (and only that name, so a client
//!   that connects to `127.0.0.1` sees a wrong host name), a client certificate, and a second CA
//!   with a `localhost` certificate of its own (what an impostor would present); made with the
//!   openssl command line at test time, in a temporary directory (no key is ever committed);
//! - [`SecuredPg`]: a PostgreSQL cluster with `ssl=on`, whose `pg_hba.conf` has `hostssl ...
//!   scram-sha-256` lines only (one database also wants a client certificate);
//! - [`SecuredKafka`]: an Apache Kafka broker ([`Kafka`]) whose own listeners do the security: a
//!   SASL_SSL listener (SCRAM-SHA-512 and SCRAM-SHA-256 users made at storage format, PLAIN from
//!   the login module's configuration) and an SSL listener that wants a client certificate,
//!   both presenting the `localhost` certificate from PEM files; another certificate is a
//!   restart on the same ports and storage;
//! - [`TlsForwarder`]: TLS in front of a plaintext server of the test process (the OTLP
//!   receiver), `tests/tools/tls_forward.py`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::servers::{Kafka, KafkaOptions, PgCluster};

/// The openssl command line (deploy/local/install-deps.sh installs it) in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let mut c = Command::new("openssl");
    c.current_dir(dir).args(args);
    crate::proc::run_ok(&format!("openssl {}", args.join(" ")), &mut c);
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
        // The brokers' PEM key stores: the (PKCS#8, unencrypted) key, then the certificate.
        for name in ["server", "rogue"] {
            let key = std::fs::read_to_string(dir.join(format!("{name}.key"))).unwrap();
            let cert = std::fs::read_to_string(dir.join(format!("{name}.pem"))).unwrap();
            std::fs::write(dir.join(format!("{name}-keystore.pem")), key + &cert).unwrap();
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
    /// signed by the other CA; `server-keystore.pem` and `rogue-keystore.pem`: key and
    /// certificate in one file, as a broker's PEM key store).
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

/// The user every client of [`SecuredKafka`] logs in as (SCRAM-SHA-512, SCRAM-SHA-256 and
/// PLAIN all know it).
pub const KAFKA_USER: &str = "outbox";
/// Its password.
pub const KAFKA_PASSWORD: &str = "e2e-Kafka-pw-91c2";

/// Where [`SecuredKafka`]'s secured listeners say they are: the broker address in the
/// metadata, where clients send everything after the bootstrap.
#[derive(Debug, Clone)]
pub struct Advertised {
    /// The host name of both secured listeners (default `localhost`, the name the certificate
    /// holds).
    pub host: String,
    /// The port the SASL_SSL listener advertises instead of its own (nothing listens there).
    pub sasl_ssl_port: Option<u16>,
}

impl Default for Advertised {
    fn default() -> Self {
        Self {
            host: "localhost".to_owned(),
            sasl_ssl_port: None,
        }
    }
}

/// An Apache Kafka broker whose own listeners do the security, with `pki`'s `localhost`
/// certificate: SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN) and SSL wanting a client
/// certificate signed by the CA (mutual TLS). Its PLAINTEXT listener on `127.0.0.1` serves
/// only the harness (readiness, topic creation) and the broker itself (inter-broker traffic);
/// the tests' clients use the secured listeners.
#[derive(Debug)]
pub struct SecuredKafka {
    /// The broker ([`Kafka::stop`] / [`Kafka::start_again`] make it unreachable and back).
    pub broker: Kafka,
    /// The SASL_SSL port, on `localhost`.
    pub port: u16,
    /// The SSL port (client certificate required), on `localhost`.
    pub ssl_port: u16,
}

impl SecuredKafka {
    /// Starts the broker advertising `localhost` (see [`SecuredKafka::start_with`]).
    pub fn start(pki: &Pki, topics: &[(&str, u32)]) -> Self {
        Self::start_with(pki, topics, &Advertised::default())
    }

    /// Starts the broker with [`KAFKA_USER`] made at storage format (SCRAM-SHA-512 and
    /// SCRAM-SHA-256, so the login works from the first second) and in the PLAIN login
    /// module's configuration, presenting `pki`'s `server` certificate on its secured
    /// listeners, which advertise `advertised`; then creates `topics` (`(name, partitions)`)
    /// through the PLAINTEXT listener.
    pub fn start_with(pki: &Pki, topics: &[(&str, u32)], advertised: &Advertised) -> Self {
        let port = crate::free_port();
        let ssl_port = crate::free_port();
        let listener = |name: &str, port: u16, advertised_port: Option<u16>| {
            let listen = format!("{name}://localhost:{port}");
            let (host, port) = (&advertised.host, advertised_port.unwrap_or(port));
            if host == "localhost" && advertised_port.is_none() {
                listen
            } else {
                format!("{listen}={host}:{port}")
            }
        };
        let format_args = ["SCRAM-SHA-512", "SCRAM-SHA-256"]
            .iter()
            .flat_map(|mechanism| {
                [
                    "--add-scram".to_owned(),
                    format!("{mechanism}=[name={KAFKA_USER},password={KAFKA_PASSWORD}]"),
                ]
            })
            .collect();
        let broker = Kafka::start_with(KafkaOptions {
            listeners: vec![
                listener("SASL_SSL", port, advertised.sasl_ssl_port),
                listener("SSL", ssl_port, None),
            ],
            config: broker_config(pki, "server"),
            format_args,
            ..KafkaOptions::default()
        });
        for (topic, partitions) in topics {
            let partitions = i32::try_from(*partitions).expect("a partition count");
            crate::audit::create_topics(&broker.brokers(), partitions, &[topic]);
        }
        Self {
            broker,
            port,
            ssl_port,
        }
    }

    /// Restarts the broker (same ports, same storage) presenting certificate `cert` of `pki`
    /// (`rogue`: an impostor; `server`: the real one again). Open connections are cut.
    pub fn present(&mut self, pki: &Pki, cert: &str) {
        self.broker.restart_with_config(&broker_config(pki, cert));
    }

    /// The bootstrap address of the SASL_SSL listener, by the name the certificate holds.
    pub fn brokers(&self) -> String {
        format!("localhost:{}", self.port)
    }

    /// The bootstrap address of the SSL listener that wants a client certificate.
    pub fn mtls_brokers(&self) -> String {
        format!("localhost:{}", self.ssl_port)
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

    /// [`SecuredKafka::client_env`] with the password read from `password_file` instead
    /// (`KAFKA_SASL_PASSWORD_FILE`): nothing secret in the environment.
    pub fn client_env_with_password_file(password_file: &str, ca: &str) -> Vec<(String, String)> {
        let mut env = Self::client_env("", ca);
        env.retain(|(k, _)| k != "KAFKA_SASL_PASSWORD");
        env.push((
            "KAFKA_SASL_PASSWORD_FILE".to_owned(),
            password_file.to_owned(),
        ));
        env
    }

    /// The same login as command-line flags (`outbox-relay`, `outbox-audit`): SASL_SSL +
    /// SCRAM-SHA-512 as [`KAFKA_USER`] with the password in `password_file`, trusting `ca`.
    pub fn client_flags(password_file: &str, ca: &str) -> Vec<String> {
        Self::login_flags("SCRAM-SHA-512", password_file, ca)
    }

    /// [`SecuredKafka::client_flags`] with SASL mechanism `mechanism` (`PLAIN`,
    /// `SCRAM-SHA-256`, `SCRAM-SHA-512`).
    pub fn login_flags(mechanism: &str, password_file: &str, ca: &str) -> Vec<String> {
        [
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            mechanism,
            "--kafka-sasl-username",
            KAFKA_USER,
            "--kafka-sasl-password-file",
            password_file,
            "--kafka-ssl-ca-location",
            ca,
        ]
        .map(str::to_owned)
        .into()
    }
}

/// Writes `secret` (and a newline, which the binaries drop) to file `name` in `dir`, readable
/// by its owner only (`0600`: what `PGPASSFILE` needs, and what a secret deserves); its path.
pub fn write_secret_file(dir: &Path, name: &str, secret: &str) -> String {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    writeln!(f, "{secret}").unwrap();
    path.display().to_string()
}

/// A file holding `secret` (and a newline, as `echo` writes it) in `pki`'s directory, which
/// goes with it.
pub fn secret_file(pki: &Pki, secret: &str) -> PathBuf {
    let name = format!("secret-{:08x}", rand::random::<u32>());
    write_secret_file(&pki.dir, &name, secret).into()
}

/// The security flags of `args` as the settings every binary makes from them.
pub fn settings(args: outbox_kafka::KafkaSecurityArgs) -> outbox_kafka::KafkaSettings {
    args.settings(&[]).expect("valid security settings")
}

/// The broker's security settings with certificate `cert` of `pki` (PEM stores: the key and
/// certificate in `<cert>-keystore.pem`, the CA that signs client certificates in `ca.pem`).
/// SCRAM's credentials live in the cluster's metadata (made at format); PLAIN's in its login
/// module's options.
fn broker_config(pki: &Pki, cert: &str) -> String {
    format!(
        "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN\n\
         listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=\
         org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
         listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=\
         org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
         listener.name.sasl_ssl.plain.sasl.jaas.config=\
         org.apache.kafka.common.security.plain.PlainLoginModule required \
         user_{KAFKA_USER}=\"{KAFKA_PASSWORD}\";\n\
         ssl.keystore.type=PEM\nssl.keystore.location={keystore}\n\
         ssl.truststore.type=PEM\nssl.truststore.location={ca}\n\
         listener.name.ssl.ssl.client.auth=required\n",
        keystore = pki.path(&format!("{cert}-keystore.pem")),
        ca = pki.path("ca.pem"),
    )
}

/// TLS with `pki`'s `localhost` certificate in front of a plaintext server of the test process
/// (the OTLP receiver): `tests/tools/tls_forward.py`, run with the venv's Python. Stopped when
/// dropped.
///
/// It binds its port itself (port 0) and prints it: a port probed free beforehand can be taken
/// by another server before it binds, and a client would then meet that server instead.
#[derive(Debug)]
pub struct TlsForwarder {
    child: Child,
    log: PathBuf,
    /// The TLS port, on `127.0.0.1`.
    pub port: u16,
}

impl TlsForwarder {
    /// Listens on a free port of `127.0.0.1` (TLS, [`TlsForwarder::port`]) and forwards to
    /// `127.0.0.1:target`.
    pub fn start(pki: &Pki, target: u16) -> Self {
        let log = std::env::temp_dir().join(format!(
            "outbox-tls-forward-{:08x}.log",
            rand::random::<u32>()
        ));
        let mut child = Command::new(crate::verify::python())
            .arg(crate::workspace_root().join("tests/tools/tls_forward.py"))
            .args(["--cert", &pki.path("server.pem")])
            .args(["--key", &pki.path("server.key")])
            .args(["--target", &format!("127.0.0.1:{target}")])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start tests/tools/tls_forward.py");
        let mut line = String::new();
        // One line once it listens; end of file if it exits first.
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "tls_forward.py did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Self { child, log, port }
    }
}

impl Drop for TlsForwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `(String, String)` pairs as the `(&str, &str)` the process helpers take.
pub fn env_refs(envs: &[(String, String)]) -> Vec<(&str, &str)> {
    envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}
