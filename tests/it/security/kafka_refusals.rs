//! A secured Kafka that refuses (harness: `e2e::secured`): a wrong password or an untrusted CA
//! stops the relay and the consumer at start-up, naming the cause, with nothing published and
//! nothing marked; so does a broker that first answers after start-up; a broker advertised
//! under a name its certificate lacks is refused at start-up, one advertised out of reach is
//! named and let through; an impostor's certificate shows on `/healthz` until the real broker is
//! back, and nothing is published to it.

use std::time::Duration;

use e2e::proc::{RelayArgs, RelayProcess, ServiceProcess};
use e2e::secured::{
    env_refs, secret_file, settings, Advertised, Pki, SecuredKafka, KAFKA_PASSWORD,
};
use e2e::verify::dump_secured;
use outbox_kafka::{
    check_connection, KafkaSecurityArgs, KafkaSettings, ProbeError, SaslMechanism, SecurityProtocol,
};
use serde_json::json;

use crate::common::{relay_stopped, write_five_events};

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

    let wrong_password = "Wr0ng-7f3a9c1e5b2d8e4f60";
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
        args.extra = SecuredKafka::client_flags(password_file, trusted);
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
    outbox_writer::enqueue(
        &db.pool,
        &outbox_writer::NewEvent::new("order", "a0", "Tested", &payload),
    )
    .await
    .unwrap();
    // The broker is down: every connection is refused (an outage).
    kafka.broker.stop();

    // Both trust another CA than the one that signed the broker's certificate.
    let untrusted = pki.path("other-ca.pem");
    let password_file = secret_file(&pki, KAFKA_PASSWORD).display().to_string();
    let mut args = RelayArgs::new(&db.url, &brokers, &prefix, "relay-never-reached");
    args.extra = SecuredKafka::client_flags(&password_file, &untrusted);
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
    args.extra = SecuredKafka::client_flags(&password, &ca);
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
    args.extra = SecuredKafka::client_flags(&password.display().to_string(), &ca);
    let relay = RelayProcess::start(&args);
    let write = |from: usize, n: usize| {
        let pool = db.pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            for i in from..from + n {
                let payload = json!({"n": i});
                outbox_writer::enqueue(
                    &mut *tx,
                    &outbox_writer::NewEvent::new("order", "a1", "Numbered", &payload),
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
    let values = crate::common::numbers(&records);
    assert_eq!(
        values,
        (0..10).collect::<Vec<i64>>(),
        "each event once, in order"
    );
}
