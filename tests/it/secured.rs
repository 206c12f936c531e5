//! Production connectivity against real secured servers (harness: `e2e::secured`):
//!
//! - Kafka: Apache Kafka whose own listeners do the security, with a test CA: SASL_SSL
//!   (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN) and SSL with client certificates. Every client (the
//!   relay, the stock consumer's runtime with its admin client and dead-letter producer, its
//!   `dlq list` reader, kafka-python) logs in with SASL_SSL + SCRAM-SHA-512; the relay also
//!   publishes with PLAIN; librdkafka logs in with both SCRAM mechanisms and with a client
//!   certificate. A wrong password or an untrusted CA stops the relay and the consumer at
//!   start-up, naming the cause, with nothing published and nothing marked; so does a broker
//!   that first answers after start-up; a broker advertised under a name its certificate
//!   lacks is refused at start-up, one advertised out of reach is named and let through; an
//!   impostor's certificate shows on `/healthz` until the real broker is back.
//! - PostgreSQL: `ssl=on`, `hostssl ... scram-sha-256` only; the relay and a service connect
//!   with `sslmode=verify-full` and the password from `DATABASE_PASSWORD_FILE`; a client
//!   certificate where the server wants one; a wrong CA, a wrong host name and no TLS are
//!   refused with an error that says so.

use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::proc::{workspace_binary, RelayArgs, RelayProcess, ServiceProcess};
use e2e::secured::{
    env_refs, Advertised, Pki, SecuredKafka, SecuredPg, KAFKA_PASSWORD, PG_ADMIN_PASSWORD,
};
use e2e::stream::{write_stream, StreamSpec};
use e2e::verify::{check, dump_secured, kafka_tool, python};
use outbox_kit::kafka::{
    check_connection, KafkaSecurityArgs, KafkaSettings, ProbeError, SaslMechanism, SecurityProtocol,
};
use serde_json::json;
use sqlx::Connection;
use uuid::Uuid;

/// Runs kafka_tool.py with `envs` on a blocking thread; (exit ok, stdout, stderr).
async fn kafka_tool_run(args: &[&str], envs: &[(String, String)]) -> (bool, String, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let envs = envs.to_vec();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(python())
            .arg(kafka_tool())
            .args(&args)
            .envs(env_refs(&envs))
            .stdin(Stdio::null())
            .output()
            .expect("run kafka_tool.py");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// A file holding `secret` (and a newline, as `echo` writes it) in `pki`'s directory, which
/// goes with it.
fn secret_file(pki: &Pki, secret: &str) -> std::path::PathBuf {
    let name = format!("secret-{:08x}", rand::random::<u32>());
    e2e::secured::write_secret_file(&pki.dir, &name, secret).into()
}

/// The relay's security flags for SASL_SSL + SCRAM-SHA-512 with the password in `file`.
fn relay_security_flags(password_file: &str, ca: &str) -> Vec<String> {
    SecuredKafka::client_flags(password_file, ca)
}

/// The relay's security flags for SASL_SSL + `mechanism` with the password in `file`.
fn relay_login_flags(mechanism: &str, password_file: &str, ca: &str) -> Vec<String> {
    SecuredKafka::login_flags(mechanism, password_file, ca)
}

/// Five events `{"n": i}` of type `event_type` for aggregates `aggregate(i)`, in one
/// transaction on `db`.
async fn write_five_events(
    db: &e2e::db::TestDb,
    aggregate: impl Fn(usize) -> String,
    event_type: &str,
) {
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..5 {
        let payload = json!({"n": i});
        outbox_kit::enqueue(
            &mut *tx,
            &outbox_kit::NewEvent::new("order", &aggregate(i), event_type, &payload),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

/// The stock consumer logging in over SASL_SSL with the password in `password_file`, trusting
/// `ca`, on `[database url, brokers, topic prefix]`.
fn stock_consumer(
    name: &str,
    password_file: &str,
    ca: &str,
    [database_url, brokers, prefix]: [&str; 3],
    extra: &[(&str, &str)],
) -> ServiceProcess {
    let mut envs = SecuredKafka::client_env(KAFKA_PASSWORD, ca);
    envs.retain(|(k, _)| k != "KAFKA_SASL_PASSWORD");
    envs.extend(
        [
            ("KAFKA_SASL_PASSWORD_FILE", password_file),
            ("DATABASE_URL", database_url),
            ("KAFKA_BROKERS", brokers),
            ("OUTBOX_TOPIC_PREFIX", prefix),
            ("LISTEN_ADDR", "127.0.0.1:0"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    ServiceProcess::start("stock-consumer", name, &[], &env_refs(&envs))
}

/// Waits for `p` to exit; its exit status.
async fn exited(p: &mut ServiceProcess, what: &str) -> std::process::ExitStatus {
    e2e::wait_for(what, Duration::from_secs(60), || {
        let status = p.try_wait();
        async move { status }
    })
    .await
}

/// Starts a relay with `args` that should stop by itself (`what`); its log once it has.
async fn relay_stopped(args: &RelayArgs, what: &str) -> String {
    let mut relay = RelayProcess::start(args);
    e2e::wait_for(what, Duration::from_secs(60), || {
        let running = relay.is_running();
        async move { (!running).then_some(()) }
    })
    .await;
    relay.log_text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_python_logs_in_with_scram_sha_512_over_tls_and_a_wrong_password_is_refused() {
    let pki = Pki::new();
    let kafka = SecuredKafka::start(&pki, &[("secured.check", 1)]);
    let brokers = kafka.brokers();
    let ca = pki.path("ca.pem");
    let good = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    let produce = [
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        "secured.check",
        "--key",
        "k",
        "--value",
        "{\"n\":1}",
        "--timeout",
        "20",
    ];
    let (ok, _, stderr) = kafka_tool_run(&produce, &good).await;
    assert!(ok, "produce with the right password failed: {stderr}");
    let produce = produce.map(str::to_owned);
    let produce: Vec<&str> = produce.iter().map(String::as_str).collect();
    let records = tokio::task::spawn_blocking({
        let (brokers, good) = (brokers.clone(), good.clone());
        move || dump_secured(&brokers, &["secured.check".to_owned()], &env_refs(&good))
    })
    .await
    .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].value.as_deref(), Some("{\"n\":1}"));

    // A wrong password: Kafka answers the SCRAM exchange's last step with an authentication
    // error (and its log says so) and closes the connection; kafka-python never gets connected
    // and gives up at its timeout. Nothing is written.
    let wrong = SecuredKafka::client_env("not-the-password", &ca);
    let (ok, stdout, stderr) = kafka_tool_run(&produce, &wrong).await;
    assert!(!ok, "a wrong password must be refused: {stdout}");
    assert!(stderr.contains("Unable to bootstrap"), "{stderr}");
    // kafka-python reports the broker's answer as SaslAuthenticationFailedError only when it
    // reads the answer before the close (the two often come in one read, and then it reports
    // a disconnection): the broker's log is the account that does not depend on the race.
    let broker_log = std::fs::read_to_string(kafka.broker.log_path()).unwrap();
    assert!(
        broker_log.contains(
            "Authentication failed during authentication due to invalid credentials with SASL \
             mechanism SCRAM-SHA-512"
        ),
        "the broker should have refused the login, not the network failed: {stderr}"
    );
    let records = tokio::task::spawn_blocking(move || {
        dump_secured(&brokers, &["secured.check".to_owned()], &env_refs(&good))
    })
    .await
    .unwrap();
    assert_eq!(
        records.len(),
        1,
        "nothing was written with the wrong password"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_publishes_a_stream_over_sasl_ssl_once_and_in_order() {
    let pki = Pki::new();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let kafka = SecuredKafka::start(&pki, &[(&topic, 3)]);
    let brokers = kafka.brokers();
    let ca = pki.path("ca.pem");
    let db = e2e::db::fresh_database().await;
    let password = secret_file(&pki, KAFKA_PASSWORD);
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "secured-relay");
    args.extra = relay_security_flags(&password.display().to_string(), &ca);
    let relay = RelayProcess::start(&args);

    let spec = StreamSpec {
        events: 3_000,
        writers: 4,
        ..StreamSpec::default()
    };
    let written = write_stream(&db.pool, "order", &spec).await;
    assert!(
        written.committed.len() >= 2_000,
        "{}",
        written.committed.len()
    );
    e2e::wait_for("the outbox to drain", Duration::from_secs(180), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    let env = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    let records = tokio::task::spawn_blocking({
        let (brokers, topic) = (brokers.clone(), topic.clone());
        move || dump_secured(&brokers, &[topic], &env_refs(&env))
    })
    .await
    .unwrap();
    let report = check(&written, &records, "order");
    assert!(
        report.is_clean(),
        "{report:?}\nrelay log:\n{}",
        relay.log_text()
    );
    assert_eq!(report.delivered, written.committed.len());
    assert_eq!(
        report.duplicates, 0,
        "nothing failed, so nothing is sent twice"
    );
    let log = relay.log_text();
    assert!(
        !log.contains(KAFKA_PASSWORD),
        "the password reached the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_publishes_with_sasl_plain_over_tls_and_a_wrong_plain_password_is_refused() {
    let pki = Pki::new();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let kafka = SecuredKafka::start(&pki, &[(&topic, 1)]);
    let brokers = kafka.brokers();
    let ca = pki.path("ca.pem");
    let db = e2e::db::fresh_database().await;
    write_five_events(&db, |_| "a1".to_owned(), "Numbered").await;

    // A wrong PLAIN password: the broker checks it and refuses the login; the relay stops at
    // start-up naming the cause, with nothing published and nothing marked.
    let wrong_password = "wrong-Password-123";
    let wrong = secret_file(&pki, wrong_password).display().to_string();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "relay-plain-wrong");
    args.extra = relay_login_flags("PLAIN", &wrong, &ca);
    let log = relay_stopped(&args, "the relay with a wrong PLAIN password to stop").await;
    assert!(
        log.contains("Kafka refused the connection (authentication)"),
        "the relay should name the cause:\n{log}"
    );
    assert!(!log.contains(wrong_password));
    let broker_log = std::fs::read_to_string(kafka.broker.log_path()).unwrap();
    assert!(
        broker_log.contains("Authentication failed: Invalid username or password"),
        "the broker should have refused the PLAIN login"
    );
    assert_eq!(e2e::db::backlog(&db.pool).await.unwrap(), 5);

    // The right one: every event goes out once, in order, over PLAIN inside TLS.
    let password = secret_file(&pki, KAFKA_PASSWORD).display().to_string();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "relay-plain");
    args.extra = relay_login_flags("PLAIN", &password, &ca);
    let relay = RelayProcess::start(&args);
    e2e::wait_for("the outbox to drain", Duration::from_secs(60), || async {
        matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(())
    })
    .await;
    let mut env = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    for (k, v) in &mut env {
        if k == "KAFKA_SASL_MECHANISM" {
            "PLAIN".clone_into(v);
        }
    }
    let records =
        tokio::task::spawn_blocking(move || dump_secured(&brokers, &[topic], &env_refs(&env)))
            .await
            .unwrap();
    let values: Vec<i64> = records
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        values,
        (0..5).collect::<Vec<i64>>(),
        "each event once, in order"
    );
    assert!(
        !relay.log_text().contains(KAFKA_PASSWORD),
        "the password reached the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stock_consumer_applies_and_dead_letters_over_sasl_ssl_and_exports_spans_over_https() {
    let pki = Pki::new();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    // Only the source topic exists: the consumer's admin client creates the others (its
    // dead-letter topics, `outbound`) over the same login.
    let kafka = SecuredKafka::start(&pki, &[(&topic, 3)]);
    let brokers = kafka.brokers();
    let ca = pki.path("ca.pem");
    let db = e2e::db::fresh_database().await;
    // Its spans go to an OTLP receiver behind a TLS forwarder with the broker's certificate:
    // HTTPS with a private CA (OpenSSL's SSL_CERT_FILE).
    let receiver = e2e::otlp::Receiver::start().await;
    let receiver_port: u16 = receiver
        .endpoint
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let otlp_tls = e2e::secured::TlsForwarder::start(&pki, receiver_port);
    let otlp_endpoint = format!("https://localhost:{}", otlp_tls.port);
    let mut envs = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    envs.extend(
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("SSL_CERT_FILE", ca.as_str()),
            ("DATABASE_URL", db.url.as_str()),
            ("KAFKA_BROKERS", brokers.as_str()),
            ("OUTBOX_TOPIC_PREFIX", prefix.as_str()),
            ("KAFKA_GROUP_ID", &format!("{prefix}stock")),
            ("CONSUMER_CREATE_MISSING_TOPICS", "true"),
            ("CONSUMER_TOPIC_PARTITIONS", "3"),
            ("KAFKA_CONSUMER_CONFIG", "session.timeout.ms=6000"),
            ("LISTEN_ADDR", "127.0.0.1:0"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let consumer = ServiceProcess::start("stock-consumer", "secured-stock", &[], &env_refs(&envs));
    e2e::wait_for(
        "the stock consumer to be assigned its partitions",
        Duration::from_secs(90),
        || async {
            consumer
                .log_text()
                .contains("Partitions assigned")
                .then_some(())
        },
    )
    .await;

    sqlx::query("INSERT INTO stock (sku_id, on_hand) VALUES ('S1', 10)")
        .execute(&db.pool)
        .await
        .unwrap();
    let order = Uuid::new_v4();
    let paid = json!({"order_id": order, "items": [{"sku_id": "S1", "quantity": 2}]}).to_string();
    let event_id = Uuid::new_v4().to_string();
    let order_id = order.to_string();
    let headers = [
        format!("event_id={event_id}"),
        "event_type=OrderPaid".to_owned(),
        "aggregate_type=order".to_owned(),
        format!("aggregate_id={order_id}"),
    ];
    let mut argv: Vec<String> = [
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &topic,
        "--key",
        &order_id,
        "--value",
        &paid,
    ]
    .map(str::to_owned)
    .into();
    for h in &headers {
        argv.extend(["--header".to_owned(), h.clone()]);
    }
    // And one message without the contract's headers: dead-lettered at once.
    let broken: Vec<String> = [
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &topic,
        "--key",
        "broken",
        "--value",
        "{}",
    ]
    .map(str::to_owned)
    .into();
    let env = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    for a in [argv, broken] {
        let env = env.clone();
        let (ok, _, stderr) = {
            let refs: Vec<&str> = a.iter().map(String::as_str).collect();
            kafka_tool_run(&refs, &env).await
        };
        assert!(ok, "produce: {stderr}");
    }

    e2e::wait_for(
        "the reservation of the paid order",
        Duration::from_secs(60),
        || async {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM reservations WHERE order_id = $1")
                    .bind(order)
                    .fetch_one(&db.pool)
                    .await
                    .ok()?;
            (n > 0).then_some(())
        },
    )
    .await;
    // The dead-letter producer wrote the broken message; `dlq list` reads it back, each over
    // SASL_SSL.
    let letters = e2e::wait_for(
        "dlq list to show the broken message",
        Duration::from_secs(60),
        || {
            let envs = envs.clone();
            async move {
                let out = tokio::task::spawn_blocking(move || {
                    Command::new(workspace_binary("stock-consumer"))
                        .args(["dlq", "list", "--json"])
                        .envs(env_refs(&envs))
                        .envs(e2e::auth::ENV)
                        .stdin(Stdio::null())
                        .output()
                        .unwrap()
                })
                .await
                .unwrap();
                let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
                let letters = doc["dead_letters"].as_array()?.clone();
                (!letters.is_empty()).then_some(letters)
            }
        },
    )
    .await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let (status, reserved): (String, i64) = sqlx::query_as(
        "SELECT r.status, s.reserved FROM reservations r, stock s \
         WHERE r.order_id = $1 AND s.sku_id = 'S1'",
    )
    .bind(order)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), reserved), ("RESERVED", 2), "applied once");
    let span = e2e::wait_for(
        "the consumer's span over OTLP/HTTPS",
        Duration::from_secs(60),
        || {
            let spans = receiver.spans();
            async move {
                spans
                    .into_iter()
                    .find(|s| s.kind == e2e::otlp::kind::CONSUMER)
            }
        },
    )
    .await;
    assert!(span.name.contains(&topic), "{span:?}");
    assert!(!consumer.log_text().contains(KAFKA_PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_password_or_an_untrusted_ca_stops_relay_and_consumer_naming_the_cause() {
    let pki = Pki::new();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let kafka = SecuredKafka::start(&pki, &[(&topic, 1)]);
    let brokers = kafka.brokers();
    let ca = pki.path("ca.pem");
    let db = e2e::db::fresh_database().await;
    write_five_events(&db, |i| format!("a{i}"), "Tested").await;

    let wrong_password = "wrong-Password-123";
    let wrong_file = secret_file(&pki, wrong_password);
    let good_file = secret_file(&pki, KAFKA_PASSWORD);
    let other_ca = pki.path("other-ca.pem");
    let cases = [
        (
            "wrong-password",
            wrong_file.display().to_string(),
            ca.clone(),
            "authentication",
        ),
        (
            "untrusted-ca",
            good_file.display().to_string(),
            other_ca.clone(),
            "tls",
        ),
    ];
    for (name, password_file, trusted, cause) in &cases {
        let mut args = RelayArgs::new(&db.url, &brokers, &prefix, &format!("relay-{name}"));
        args.extra = relay_security_flags(password_file, trusted);
        let log = relay_stopped(&args, &format!("the relay with a {name} to stop")).await;
        assert!(
            log.contains(&format!("Kafka refused the connection ({cause})")),
            "{name}: the relay should name the cause:\n{log}"
        );
        assert!(!log.contains(wrong_password) && !log.contains(KAFKA_PASSWORD));

        let mut consumer = stock_consumer(
            &format!("stock-{name}"),
            password_file,
            trusted,
            [&db.url, &brokers, &prefix],
            &[],
        );
        let status = exited(
            &mut consumer,
            &format!("the consumer with a {name} to stop"),
        )
        .await;
        assert!(!status.success(), "{name}: the consumer must exit non-zero");
        let log = consumer.log_text();
        assert!(
            log.contains(&format!("Kafka refused the connection ({cause})")),
            "{name}: the consumer should name the cause:\n{log}"
        );
    }

    // Nothing published, nothing marked: the rows are all still there, none failed or parked.
    assert_eq!(e2e::db::backlog(&db.pool).await.unwrap(), 5);
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_failure")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failures, 0);
    let env = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    let records = tokio::task::spawn_blocking(move || {
        e2e::verify::dump_secured(&brokers, &[topic], &env_refs(&env))
    })
    .await
    .unwrap();
    assert!(records.is_empty(), "{records:?}");
}

/// A process that has never reached a broker (none was up at start-up: it carries on, as
/// through any outage) still stops on the first refusal once a broker answers, naming the
/// cause, instead of retrying forever with only `/healthz` saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_that_comes_up_refusing_stops_a_relay_and_a_consumer_that_never_reached_one() {
    let pki = Pki::new();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let mut kafka = SecuredKafka::start(&pki, &[(&topic, 1)]);
    let brokers = kafka.brokers();
    let db = e2e::db::fresh_database().await;
    let payload = json!({"n": 0});
    outbox_kit::enqueue(
        &db.pool,
        &outbox_kit::NewEvent::new("order", "a0", "Tested", &payload),
    )
    .await
    .unwrap();
    // The broker is down: every connection is refused (an outage).
    kafka.broker.stop();

    // Both trust another CA than the one that signed the broker's certificate.
    let untrusted = pki.path("other-ca.pem");
    let password_file = secret_file(&pki, KAFKA_PASSWORD).display().to_string();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "relay-never-reached");
    args.extra = relay_security_flags(&password_file, &untrusted);
    let mut relay = RelayProcess::start(&args);
    // It creates its topics if missing: it waits in that step (retrying) when the refusal
    // comes, and must still stop with it.
    let mut consumer = stock_consumer(
        "stock-never-reached",
        &password_file,
        &untrusted,
        [&db.url, &brokers, &prefix],
        &[("CONSUMER_CREATE_MISSING_TOPICS", "true")],
    );
    let carried_on = "Kafka not reachable at start-up; carrying on";
    e2e::wait_for(
        "both to carry on past the start-up check",
        Duration::from_secs(60),
        || {
            let both =
                relay.log_text().contains(carried_on) && consumer.log_text().contains(carried_on);
            async move { both.then_some(()) }
        },
    )
    .await;
    assert!(relay.is_running(), "{}", relay.log_text());
    assert!(consumer.try_wait().is_none(), "{}", consumer.log_text());

    // The broker comes up, with a certificate neither process trusts.
    kafka.broker.start_again();
    let relay_status = e2e::wait_for(
        "the relay to stop on the refusal",
        Duration::from_secs(120),
        || {
            let status = relay.try_wait();
            async move { status }
        },
    )
    .await;
    let status = exited(&mut consumer, "the consumer to stop on the refusal").await;
    for (what, status, log) in [
        ("relay", relay_status, relay.log_text()),
        ("consumer", status, consumer.log_text()),
    ] {
        assert!(!status.success(), "{what} must exit non-zero:\n{log}");
        assert!(
            log.contains("Kafka refused the connection (tls)"),
            "{what} should name the cause:\n{log}"
        );
        assert!(!log.contains(KAFKA_PASSWORD), "{what} logged the password");
    }
    assert_eq!(
        e2e::db::backlog(&db.pool).await.unwrap(),
        1,
        "nothing published, nothing marked"
    );
}

/// Creates role `app` (password `app_password`) and databases `relaydb`, `stockdb`, `mtls`
/// owned by it, as the superuser over `verify-full` (trusting `pki`'s CA).
async fn create_app_role(pg: &SecuredPg, pki: &Pki, app_password: &str) {
    let admin_url = pg.url("postgres", "localhost", "postgres", &pki.path("ca.pem"));
    let admin_pw = secret_file(pki, PG_ADMIN_PASSWORD);
    let options = outbox_kit::pg::connect_options_with(&admin_url, Some(&admin_pw)).unwrap();
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
    let options = outbox_kit::pg::connect_options_with(url, Some(password_file)).unwrap();
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
        let out = Command::new(e2e::proc::relay_binary())
            .args(&args)
            .envs(env_refs(&envs))
            .stdin(Stdio::null())
            .output()
            .expect("run outbox-relay");
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
        outbox_kit::pg::connect_options_with(&mtls, Some(std::path::Path::new(&pw_file))).unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_whole_system_and_the_audit_run_over_sasl_ssl() {
    let pki = Pki::new();
    // No topic made beforehand: the relays and the consumers create theirs over the login.
    let kafka = SecuredKafka::start(&pki, &[]);
    let brokers = kafka.brokers();
    let ca = pki.path("ca.pem");
    let password = secret_file(&pki, KAFKA_PASSWORD).display().to_string();
    let mut env = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    env.retain(|(k, _)| k != "KAFKA_SASL_PASSWORD");
    env.push(("KAFKA_SASL_PASSWORD_FILE".to_owned(), password.clone()));
    let sys = e2e::fulfilment::System::start_with_env(&brokers, Vec::new(), env).await;
    sys.sku("lamp", 2_500).await;
    sys.set_stock("lamp", 10).await;
    let order = sys.paid_order("alice", &[("lamp", 2)]).await;
    let outbound = sys.wait_outbound(&order, "CREATED").await;
    sys.wait_stock("lamp", (10, 2)).await;
    let no = outbound["outbound_no"].as_str().unwrap();
    let (status, body, _) = sys.ship(no, "DHL", "T-secured-1").await;
    assert!(status.is_success(), "{body}");
    sys.wait_order(&order, "SHIPPED").await;
    sys.wait_stock("lamp", (8, 0)).await;
    sys.wait_outboxes_drained().await;

    let audit_flags = |password_file: &str| -> Vec<String> {
        let mut f: Vec<String> = ["--settle-s", "0", "--max-unpublished-age-s", "600"]
            .map(str::to_owned)
            .into();
        f.extend(relay_security_flags(password_file, &ca));
        f
    };
    let flags = audit_flags(&password);
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let clean = e2e::wait_for(
        "a clean audit over SASL_SSL",
        Duration::from_secs(60),
        || {
            let refs = refs.clone();
            let sys = &sys;
            let brokers = brokers.clone();
            async move {
                let r = e2e::audit::run(sys, &brokers, &refs).await;
                assert!(r.code == 0 || r.code == 1, "audit failed: {}", r.stderr);
                let ahead: i64 = ["order", "wms", "stock"]
                    .iter()
                    .map(|c| r.count(&format!("consumer.{c}.messages_ahead")))
                    .sum();
                (ahead == 0).then_some(r)
            }
        },
    )
    .await;
    assert_eq!(clean.code, 0, "{}", clean.report);
    assert!(clean.count("broker.messages") > 0, "{}", clean.report);

    let wrong = secret_file(&pki, "wrong-Password-123")
        .display()
        .to_string();
    let flags = audit_flags(&wrong);
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let refused = e2e::audit::run(&sys, &brokers, &refs).await;
    assert_eq!(refused.code, 2, "could not audit: {}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("Kafka refused the connection (authentication)"),
        "{}",
        refused.stderr
    );
}

/// The security flags of `args` as the settings every binary makes from them.
fn settings(args: KafkaSecurityArgs) -> KafkaSettings {
    args.settings(&[]).expect("valid security settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn librdkafka_logs_in_with_both_scram_mechanisms_and_refuses_a_wrong_scram_password() {
    let pki = Pki::new();
    let kafka = SecuredKafka::start(&pki, &[]);
    let brokers = kafka.brokers();
    let login = |mechanism: SaslMechanism, password: &str| KafkaSecurityArgs {
        kafka_security_protocol: Some(SecurityProtocol::SaslSsl),
        kafka_sasl_mechanism: Some(mechanism),
        kafka_sasl_username: Some(e2e::secured::KAFKA_USER.to_owned()),
        kafka_sasl_password: Some(password.to_owned()),
        kafka_ssl_ca_location: Some(pki.dir.join("ca.pem")),
        ..KafkaSecurityArgs::default()
    };
    // PLAIN: relay_publishes_with_sasl_plain_over_tls_and_a_wrong_plain_password_is_refused.
    for mechanism in [SaslMechanism::ScramSha256, SaslMechanism::ScramSha512] {
        check_connection(
            &brokers,
            &settings(login(mechanism, KAFKA_PASSWORD)),
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|e| panic!("{mechanism:?}: {e}"));
    }
    let e = check_connection(
        &brokers,
        &settings(login(SaslMechanism::ScramSha256, "wrong-Password-1")),
        Duration::from_secs(30),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            ProbeError::Refused {
                kind: "authentication",
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_connects_with_the_client_certificate_and_is_refused_without() {
    let pki = Pki::new();
    // The broker's SSL listener wants a client certificate signed by the CA
    // (`ssl.client.auth=required`).
    let kafka = SecuredKafka::start(&pki, &[]);
    let brokers = kafka.mtls_brokers();
    let tls = |with_cert: bool| KafkaSecurityArgs {
        kafka_security_protocol: Some(SecurityProtocol::Ssl),
        kafka_ssl_ca_location: Some(pki.dir.join("ca.pem")),
        kafka_ssl_certificate_location: with_cert.then(|| pki.dir.join("client.pem")),
        kafka_ssl_key_location: with_cert.then(|| pki.dir.join("client.key")),
        ..KafkaSecurityArgs::default()
    };
    check_connection(&brokers, &settings(tls(true)), Duration::from_secs(30))
        .await
        .expect("mutual TLS with the client certificate");
    let e = check_connection(&brokers, &settings(tls(false)), Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ProbeError::Refused { kind: "tls", .. }),
        "no client certificate is a TLS refusal: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_advertised_under_a_name_its_certificate_lacks_is_refused_at_start_up_every_time()
{
    let pki = Pki::new();
    // The bootstrap address carries the certificate's name (`localhost`); the broker advertises
    // `127.0.0.1`, which the certificate does not name. The bootstrap connection verifies;
    // every request after it would go to the advertised address and fail verification.
    let kafka = SecuredKafka::start_with(
        &pki,
        &[],
        &Advertised {
            host: "127.0.0.1".to_owned(),
            ..Advertised::default()
        },
    );
    let port = kafka.port;
    let ca = pki.path("ca.pem");
    let login = settings(KafkaSecurityArgs {
        kafka_security_protocol: Some(SecurityProtocol::SaslSsl),
        kafka_sasl_mechanism: Some(SaslMechanism::ScramSha512),
        kafka_sasl_username: Some(e2e::secured::KAFKA_USER.to_owned()),
        kafka_sasl_password: Some(KAFKA_PASSWORD.to_owned()),
        kafka_ssl_ca_location: Some(pki.dir.join("ca.pem")),
        ..KafkaSecurityArgs::default()
    });
    // Before, the check saw this only when the client's own connection to the advertised
    // address failed before the bootstrap's answer came: a race. Now every check sees it.
    for attempt in 1..=3 {
        let e = check_connection(&kafka.brokers(), &login, Duration::from_secs(30))
            .await
            .unwrap_err();
        match &e {
            // librdkafka names the connection: the advertised address, whichever client
            // of the check met it first.
            ProbeError::Refused {
                kind: "tls",
                reason,
            } => assert!(
                reason.contains(&format!("127.0.0.1:{port}")),
                "attempt {attempt}: {e}"
            ),
            _ => panic!("attempt {attempt}: a TLS refusal at the advertised address, got {e}"),
        }
    }
    // The relay stops at start-up naming it, rather than running and publishing nothing.
    let db = e2e::db::fresh_database().await;
    let password = secret_file(&pki, KAFKA_PASSWORD).display().to_string();
    let mut args = RelayArgs::new(
        &db.url,
        &kafka.brokers(),
        &e2e::unique_topic_prefix(),
        "relay-advertised",
    );
    args.extra = relay_security_flags(&password, &ca);
    let log = relay_stopped(
        &args,
        "the relay facing a broker advertised under another name to stop",
    )
    .await;
    assert!(
        log.contains("Kafka refused the connection (tls)")
            && log.contains(&format!("127.0.0.1:{port}")),
        "the relay should name the refusal and the advertised address:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_advertised_at_an_address_out_of_reach_is_named_and_not_fatal() {
    let pki = Pki::new();
    let (kafka, closed) = advertising_a_closed_port(&pki);
    let e = check_connection(
        &kafka.brokers(),
        &scram_login(&pki),
        Duration::from_secs(30),
    )
    .await
    .unwrap_err();
    assert_names_the_advertised_address(&e, closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advertised_address_out_of_reach_is_named_when_the_bootstrap_answers_slowly() {
    // The bootstrap's bytes crawl through a slow link (a loaded TLS terminator, a busy CI
    // machine), so each of the check's metadata requests times out before its answer comes,
    // while librdkafka's own request on connecting gets one and sends the next requests to the
    // advertised address. Once, this read as "no Kafka broker answered".
    let pki = Pki::new();
    let (kafka, closed) = advertising_a_closed_port(&pki);
    let link = e2e::proxy::Proxy::start(0, kafka.port).await;
    link.limit_rate(SLOW_LINK_BYTES_PER_SECOND);
    let e = check_connection(
        &format!("localhost:{}", link.port),
        &scram_login(&pki),
        Duration::from_secs(60),
    )
    .await
    .unwrap_err();
    assert_names_the_advertised_address(&e, closed);
}

/// Slow enough that a metadata answer takes longer than one of the check's steps (half a
/// second), fast enough that the TLS handshake and the SCRAM login end within the check's time.
const SLOW_LINK_BYTES_PER_SECOND: u64 = 300;

/// A broker whose SASL_SSL listener listens on one port and advertises another, where nothing
/// listens; and that port.
fn advertising_a_closed_port(pki: &Pki) -> (SecuredKafka, u16) {
    let closed = e2e::free_port();
    let kafka = SecuredKafka::start_with(
        pki,
        &[],
        &Advertised {
            sasl_ssl_port: Some(closed),
            ..Advertised::default()
        },
    );
    (kafka, closed)
}

/// The test user's SCRAM-SHA-512 login over TLS.
fn scram_login(pki: &Pki) -> KafkaSettings {
    settings(KafkaSecurityArgs {
        kafka_security_protocol: Some(SecurityProtocol::SaslSsl),
        kafka_sasl_mechanism: Some(SaslMechanism::ScramSha512),
        kafka_sasl_username: Some(e2e::secured::KAFKA_USER.to_owned()),
        kafka_sasl_password: Some(KAFKA_PASSWORD.to_owned()),
        kafka_ssl_ca_location: Some(pki.dir.join("ca.pem")),
        ..KafkaSecurityArgs::default()
    })
}

fn assert_names_the_advertised_address(e: &ProbeError, closed: u16) {
    assert!(
        matches!(e, ProbeError::AdvertisedUnreachable { address, .. } if *address == format!("localhost:{closed}")),
        "{e}"
    );
    assert!(!e.is_fatal(), "a broker answered: the process carries on");
}

/// The relay's `/healthz`: (HTTP status, body).
async fn relay_health(relay: &RelayProcess) -> Option<(u16, serde_json::Value)> {
    let r = reqwest::get(format!("http://{}/healthz", relay.metrics_addr))
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_relay_facing_an_untrusted_certificate_says_why_on_healthz_and_publishes_after() {
    let pki = Pki::new();
    let prefix = e2e::unique_topic_prefix();
    let topic = format!("{prefix}order");
    let mut kafka = SecuredKafka::start(&pki, &[(&topic, 1)]);
    let brokers = kafka.brokers();
    let ca = pki.path("ca.pem");
    let db = e2e::db::fresh_database().await;
    let password = secret_file(&pki, KAFKA_PASSWORD);
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "relay-impostor");
    args.extra = relay_security_flags(&password.display().to_string(), &ca);
    let relay = RelayProcess::start(&args);
    let write = |from: usize, n: usize| {
        let pool = db.pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            for i in from..from + n {
                let payload = json!({"n": i});
                outbox_kit::enqueue(
                    &mut *tx,
                    &outbox_kit::NewEvent::new("order", "a1", "Numbered", &payload),
                )
                .await
                .unwrap();
            }
            tx.commit().await.unwrap();
        }
    };
    write(0, 5).await;
    e2e::wait_for(
        "the first events to be published",
        Duration::from_secs(60),
        || async { matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(()) },
    )
    .await;

    // An impostor at the broker's address: a certificate of another CA (the broker restarted
    // with it, same ports).
    kafka.present(&pki, "rogue");
    write(5, 5).await;
    let (status, body) = e2e::wait_for(
        "/healthz to name the refused certificate",
        Duration::from_secs(60),
        || async {
            relay_health(&relay)
                .await
                .filter(|(_, b)| b["kafka"].as_str().is_some())
        },
    )
    .await;
    assert_eq!(status, 503, "{body}");
    let why = body["kafka"].as_str().unwrap();
    assert!(why.contains("certificate verify failed"), "{body}");
    assert_eq!(
        e2e::db::backlog(&db.pool).await.unwrap(),
        5,
        "nothing published to the impostor, nothing marked"
    );

    // The real broker is back: the waiting events go out, /healthz is clean again.
    kafka.present(&pki, "server");
    e2e::wait_for(
        "the rest to be published",
        Duration::from_secs(120),
        || async { matches!(e2e::db::backlog(&db.pool).await, Ok(0)).then_some(()) },
    )
    .await;
    let (_, body) = e2e::wait_for("/healthz to be clean", Duration::from_secs(30), || async {
        relay_health(&relay).await.filter(|(s, _)| *s == 200)
    })
    .await;
    assert!(body.get("kafka").is_none(), "{body}");
    let env = SecuredKafka::client_env(KAFKA_PASSWORD, &ca);
    let records =
        tokio::task::spawn_blocking(move || dump_secured(&brokers, &[topic], &env_refs(&env)))
            .await
            .unwrap();
    let values: Vec<i64> = records
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        values,
        (0..10).collect::<Vec<i64>>(),
        "each event once, in order"
    );
}
