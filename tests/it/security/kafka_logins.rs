//! Logging in to a secured Kafka (harness: `e2e::secured`): Apache Kafka whose own listeners do
//! the security, with a test CA: SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN) and SSL with
//! client certificates. Every client (the relay, the stock consumer's runtime with its admin
//! client and dead-letter producer, its `dlq list` reader, the audit, kafka-python) logs in with
//! SASL_SSL + SCRAM-SHA-512 and does its work: a stream published once and in order, a message
//! applied and one dead-lettered, the whole system audited clean; the relay also publishes with
//! PLAIN; librdkafka logs in with both SCRAM mechanisms and with a client certificate. A wrong
//! password is refused by the broker and reaches no log.

use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::proc::{workspace_binary, RelayArgs, RelayProcess, ServiceProcess};
use e2e::secured::{env_refs, secret_file, settings, Pki, SecuredKafka, KAFKA_PASSWORD};
use e2e::stream::{write_stream, StreamSpec};
use e2e::verify::{check, dump_secured, kafka_tool, try_python_with_env};
use outbox_kafka::{
    check_connection, KafkaSecurityArgs, ProbeError, SaslMechanism, SecurityProtocol,
};
use serde_json::json;
use uuid::Uuid;

use crate::common::{relay_stopped, write_five_events};

/// Runs kafka_tool.py with `envs` on a blocking thread; (exit ok, stdout, stderr).
async fn kafka_tool_run(args: &[&str], envs: &[(String, String)]) -> (bool, String, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let envs = envs.to_vec();
    tokio::task::spawn_blocking(move || {
        let out = try_python_with_env(&kafka_tool(), &args, &env_refs(&envs));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
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
    args.extra = SecuredKafka::client_flags(&password.display().to_string(), &ca);
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
    let wrong_password = "Wr0ng-7f3a9c1e5b2d8e4f60";
    let wrong = secret_file(&pki, wrong_password).display().to_string();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "relay-plain-wrong");
    args.extra = SecuredKafka::login_flags("PLAIN", &wrong, &ca);
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
    args.extra = SecuredKafka::login_flags("PLAIN", &password, &ca);
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
    let values = crate::common::numbers(&records);
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
        f.extend(SecuredKafka::client_flags(password_file, &ca));
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
