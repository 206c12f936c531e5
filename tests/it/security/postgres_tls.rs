//! Connecting to a secured PostgreSQL (harness: `e2e::secured`): `ssl=on`, `hostssl ...
//! scram-sha-256` only; the relay and a service connect with `sslmode=verify-full` and the
//! password from `DATABASE_PASSWORD_FILE`, every session over TLS; a client certificate where
//! the server wants one; a wrong CA, a wrong host name and no TLS are refused with an error that
//! says so.

use std::time::Duration;

use e2e::proc::ServiceProcess;
use e2e::secured::{env_refs, secret_file, Pki, SecuredPg, PG_ADMIN_PASSWORD};
use sqlx::Connection;

/// Creates role `app` (password `app_password`) and databases `relaydb`, `stockdb`, `mtls`
/// owned by it, as the superuser over `verify-full` (trusting `pki`'s CA).
async fn create_app_role(pg: &SecuredPg, pki: &Pki, app_password: &str) {
    let admin_url = pg.url("postgres", "localhost", "postgres", &pki.path("ca.pem"));
    let admin_pw = secret_file(pki, PG_ADMIN_PASSWORD);
    let options = outbox_process::pg::connect_options_with(&admin_url, Some(&admin_pw)).unwrap();
    let mut admin = sqlx::PgConnection::connect_with(&options)
        .await
        .expect("the superuser connects with verify-full");
    sqlx::query(&format!("CREATE ROLE app LOGIN PASSWORD '{app_password}'"))
        .execute(&mut admin)
        .await
        .unwrap();
    for db in ["relaydb", "stockdb", "mtls"] {
        sqlx::query(&format!("CREATE DATABASE {db} OWNER app"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

/// A small pool on `url` with the password from `password_file`.
async fn pool(url: &str, password_file: &std::path::Path) -> sqlx::PgPool {
    let options = outbox_process::pg::connect_options_with(url, Some(password_file)).unwrap();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("connect with verify-full")
}

/// `outbox-relay <args>` with `envs`, on a blocking thread; (exit ok, stderr).
async fn relay_cli_with_env(args: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = e2e::proc::relay_cli_with_env(&args, &env_refs(&envs));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_and_a_service_connect_to_postgres_with_verify_full_and_a_password_file() {
    let pki = Pki::new();
    let pg = SecuredPg::start(&pki);
    let ca = pki.path("ca.pem");
    let app_password = "App-Secret-pw-41";
    create_app_role(&pg, &pki, app_password).await;
    let pw_file = secret_file(&pki, app_password);
    let pw_file = pw_file.display().to_string();

    let relay_url = pg.url("app", "localhost", "relaydb", &ca);
    let envs = [
        ("DATABASE_URL", relay_url.as_str()),
        ("DATABASE_PASSWORD_FILE", pw_file.as_str()),
    ];
    let (ok, stderr) = relay_cli_with_env(&["migrate"], &envs).await;
    assert!(ok, "outbox-relay migrate over verify-full: {stderr}");
    let (ok, stderr) = relay_cli_with_env(&["status", "--json"], &envs).await;
    assert!(ok, "outbox-relay status over verify-full: {stderr}");

    // A service: the stock consumer migrates its database; its sessions are TLS ones. (No
    // broker is needed for that: it starts while Kafka is unreachable, as during an outage.)
    let stock_url = pg.url("app", "localhost", "stockdb", &ca);
    let brokers = "127.0.0.1:1".to_owned();
    let prefix = e2e::unique_topic_prefix();
    let consumer = ServiceProcess::start(
        "stock-consumer",
        "stock-verify-full",
        &[],
        &[
            ("DATABASE_URL", stock_url.as_str()),
            ("DATABASE_PASSWORD_FILE", pw_file.as_str()),
            ("KAFKA_BROKERS", brokers.as_str()),
            ("OUTBOX_TOPIC_PREFIX", prefix.as_str()),
            ("KAFKA_GROUP_ID", &format!("{prefix}stock")),
            ("CONSUMER_CREATE_MISSING_TOPICS", "true"),
            ("LISTEN_ADDR", "127.0.0.1:0"),
        ],
    );
    let admin_url = pg.url("postgres", "localhost", "postgres", &ca);
    let admin_pw = secret_file(&pki, PG_ADMIN_PASSWORD);
    let admin = pool(&admin_url, &admin_pw).await;
    let tls_sessions = e2e::wait_for(
        "the stock consumer's sessions on stockdb",
        Duration::from_secs(60),
        || {
            let admin = admin.clone();
            async move {
                let (all_tls, n): (Option<bool>, i64) = sqlx::query_as(
                    "SELECT bool_and(s.ssl), count(*) FROM pg_stat_activity a \
                     JOIN pg_stat_ssl s USING (pid) WHERE a.usename = 'app' AND a.datname = 'stockdb'",
                )
                .fetch_one(&admin)
                .await
                .ok()?;
                (n > 0).then_some(all_tls == Some(true))
            }
        },
    )
    .await;
    assert!(tls_sessions, "every session of the service uses TLS");
    let stock = pool(&stock_url, std::path::Path::new(&pw_file)).await;
    let migrated = e2e::wait_for("the stock schema", Duration::from_secs(60), || {
        let stock = stock.clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT to_regclass('reservations') IS NOT NULL")
                .fetch_one(&stock)
                .await
                .ok()
                .filter(|b| *b)
        }
    })
    .await;
    assert!(migrated);
    assert!(!consumer.log_text().contains(app_password));

    // Client certificates: database `mtls` wants one (clientcert=verify-full).
    let mtls = pg.url("app", "localhost", "mtls", &ca);
    let without =
        outbox_process::pg::connect_options_with(&mtls, Some(std::path::Path::new(&pw_file)))
            .unwrap();
    let e = sqlx::PgConnection::connect_with(&without)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("certificate"),
        "no client certificate: {e}"
    );
    let with_cert = format!(
        "{mtls}&sslcert={}&sslkey={}",
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let envs = [
        ("DATABASE_URL", with_cert.as_str()),
        ("DATABASE_PASSWORD_FILE", pw_file.as_str()),
    ];
    let (ok, stderr) = relay_cli_with_env(&["migrate"], &envs).await;
    assert!(
        ok,
        "outbox-relay migrate with a client certificate: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_refuses_a_wrong_ca_a_wrong_host_name_and_no_tls_with_clear_errors() {
    let pki = Pki::new();
    let pg = SecuredPg::start(&pki);
    let ca = pki.path("ca.pem");
    let app_password = "App-Secret-pw-42";
    create_app_role(&pg, &pki, app_password).await;
    let pw_file = secret_file(&pki, app_password).display().to_string();

    let port = pg.cluster.port;
    let cases = [
        (
            "an untrusted CA",
            pg.url("app", "localhost", "relaydb", &pki.path("other-ca.pem")),
            "certificate verify failed",
        ),
        (
            "a host name not in the certificate",
            pg.url("app", "127.0.0.1", "relaydb", &ca),
            "certificate verify failed",
        ),
        (
            "no TLS",
            format!("postgres://app@localhost:{port}/relaydb?sslmode=disable"),
            "no encryption",
        ),
        (
            "a CA file that does not exist",
            pg.url("app", "localhost", "relaydb", "/nonexistent/ca.pem"),
            "sslrootcert: cannot read /nonexistent/ca.pem",
        ),
    ];
    for (what, url, expected) in cases {
        let pw_file = pw_file.clone();
        let (ok, stderr) = relay_cli_with_env(
            &["status"],
            &[
                ("DATABASE_URL", url.as_str()),
                ("DATABASE_PASSWORD_FILE", pw_file.as_str()),
            ],
        )
        .await;
        assert!(!ok, "{what}: the connection must be refused");
        assert!(
            stderr.contains(expected),
            "{what}: the error should say `{expected}`: {stderr}"
        );
        assert!(!stderr.contains(app_password));
    }
    // The wrong-name case names the mismatch itself.
    let url = pg.url("app", "127.0.0.1", "relaydb", &ca);
    let (_, stderr) = relay_cli_with_env(
        &["status"],
        &[
            ("DATABASE_URL", url.as_str()),
            ("DATABASE_PASSWORD_FILE", pw_file.as_str()),
        ],
    )
    .await;
    // The certificate names `localhost` only; 127.0.0.1 is the same server under a name the
    // certificate does not hold (OpenSSL says "IP address mismatch" for an address, "Hostname
    // mismatch" for a name).
    assert!(
        stderr.contains("IP address mismatch"),
        "the error should name the mismatch: {stderr}"
    );
}
