//! Unit tests of the security flags and the settings made from them: what each combination
//! gives or why it is refused, and that no secret shows in `Debug` or an error.

use std::path::PathBuf;

use clap::Parser;
use outbox_process::secret_file::{read_secret_file, SecretFileError};
use rdkafka::config::ClientConfig;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    security: KafkaSecurityArgs,
}

fn args(argv: &[&str]) -> KafkaSecurityArgs {
    let mut full = vec!["test"];
    full.extend_from_slice(argv);
    Cli::try_parse_from(full).unwrap().security
}

fn pairs(s: &KafkaSettings) -> Vec<(&str, &str)> {
    s.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn temp_file(name: &str, content: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "outbox-kit-kafka-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

#[test]
fn nothing_set_changes_nothing() {
    let user = vec![("linger.ms".to_owned(), "1".to_owned())];
    let s = args(&[]).settings(&user).unwrap();
    assert_eq!(pairs(&s), vec![("linger.ms", "1")]);
}

#[test]
fn sasl_ssl_scram_with_a_password_file_and_a_ca() {
    let pw = temp_file("pw", "s3cret-pass\n");
    let ca = temp_file("ca.pem", "not parsed here");
    let s = args(&[
        "--kafka-security-protocol",
        "sasl_ssl",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "relay",
        "--kafka-sasl-password-file",
        pw.to_str().unwrap(),
        "--kafka-ssl-ca-location",
        ca.to_str().unwrap(),
    ])
    .settings(&[])
    .unwrap();
    assert_eq!(s.get("security.protocol"), Some("SASL_SSL"));
    assert_eq!(s.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
    assert_eq!(s.get("sasl.username"), Some("relay"));
    assert_eq!(s.get("sasl.password"), Some("s3cret-pass"));
    assert_eq!(s.get("ssl.ca.location"), ca.to_str());
    assert_eq!(
        s.get("ssl.endpoint.identification.algorithm"),
        Some("https")
    );
    let shown = format!("{s:?}");
    assert!(!shown.contains("s3cret-pass"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

#[test]
fn debug_of_the_flags_hides_the_passwords() {
    let a = args(&[
        "--kafka-sasl-password",
        "hunter2-hunter2",
        "--kafka-ssl-key-password",
        "key-pass-99",
    ]);
    let shown = format!("{a:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(!shown.contains("key-pass-99"), "{shown}");
}

#[test]
fn sasl_needs_a_mechanism_a_user_and_a_password() {
    let e = args(&["--kafka-security-protocol", "SASL_SSL"])
        .settings(&[])
        .unwrap_err();
    assert!(e.to_string().contains("KAFKA_SASL_MECHANISM"), "{e}");
    let e = args(&[
        "--kafka-security-protocol",
        "SASL_SSL",
        "--kafka-sasl-mechanism",
        "PLAIN",
    ])
    .settings(&[])
    .unwrap_err();
    assert!(e.to_string().contains("KAFKA_SASL_USERNAME"), "{e}");
    let e = args(&[
        "--kafka-security-protocol",
        "SASL_SSL",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-256",
        "--kafka-sasl-username",
        "u",
    ])
    .settings(&[])
    .unwrap_err();
    assert!(e.to_string().contains("KAFKA_SASL_PASSWORD"), "{e}");
}

#[test]
fn sasl_settings_without_a_sasl_protocol_are_refused_not_ignored() {
    let e = args(&["--kafka-sasl-mechanism", "PLAIN"])
        .settings(&[])
        .unwrap_err();
    assert!(e.to_string().contains("KAFKA_SASL_MECHANISM"), "{e}");
    assert!(e.to_string().contains("PLAINTEXT"), "{e}");
    let ca = temp_file("ca.pem", "x");
    let e = args(&["--kafka-ssl-ca-location", ca.to_str().unwrap()])
        .settings(&[])
        .unwrap_err();
    assert!(e.to_string().contains("KAFKA_SSL_CA_LOCATION"), "{e}");
}

#[test]
fn the_protocol_may_come_from_kafka_config() {
    let user = vec![("security.protocol".to_owned(), "sasl_ssl".to_owned())];
    let s = args(&[
        "--kafka-sasl-mechanism",
        "scram-sha-256",
        "--kafka-sasl-username",
        "u",
        "--kafka-sasl-password",
        "p-p-p-p",
    ])
    .settings(&user)
    .unwrap();
    assert_eq!(s.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
    assert_eq!(s.get("security.protocol"), Some("sasl_ssl"));
}

#[test]
fn a_flag_and_kafka_config_that_disagree_are_refused() {
    let user = vec![("sasl.mechanism".to_owned(), "PLAIN".to_owned())];
    let e = args(&[
        "--kafka-security-protocol",
        "SASL_PLAINTEXT",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "u",
        "--kafka-sasl-password",
        "p",
    ])
    .settings(&user)
    .unwrap_err();
    assert!(e.to_string().contains("sasl.mechanism"), "{e}");
}

#[test]
fn a_client_certificate_needs_its_key_and_files_must_exist() {
    let cert = temp_file("client.pem", "x");
    let e = args(&[
        "--kafka-security-protocol",
        "SSL",
        "--kafka-ssl-certificate-location",
        cert.to_str().unwrap(),
    ])
    .settings(&[])
    .unwrap_err();
    assert!(e.to_string().contains("KAFKA_SSL_KEY_LOCATION"), "{e}");
    let e = args(&[
        "--kafka-security-protocol",
        "SSL",
        "--kafka-ssl-ca-location",
        "/nonexistent/ca.pem",
    ])
    .settings(&[])
    .unwrap_err();
    assert!(e.to_string().contains("KAFKA_SSL_CA_LOCATION"), "{e}");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}

#[test]
fn a_secret_given_twice_or_empty_is_refused_without_showing_it() {
    let pw = temp_file("pw", "from-file\n");
    let e = args(&[
        "--kafka-security-protocol",
        "SASL_SSL",
        "--kafka-sasl-mechanism",
        "PLAIN",
        "--kafka-sasl-username",
        "u",
        "--kafka-sasl-password",
        "inline-secret",
        "--kafka-sasl-password-file",
        pw.to_str().unwrap(),
    ])
    .settings(&[])
    .unwrap_err();
    assert!(!e.to_string().contains("inline-secret"), "{e}");
    assert!(e.to_string().contains("KAFKA_SASL_PASSWORD_FILE"), "{e}");
    let empty = temp_file("empty", "\n");
    let e = read_secret_file(&empty).unwrap_err();
    assert!(matches!(e, SecretFileError::Empty));
    assert_eq!(
        read_secret_file(&temp_file("crlf", "abc\r\n")).unwrap(),
        "abc"
    );
}

#[test]
fn this_librdkafka_has_tls_and_scram_but_no_oidc_token_endpoint() {
    use rdkafka::producer::BaseProducer;
    let create = |pairs: &[(&str, &str)]| {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", "127.0.0.1:1");
        for (k, v) in pairs {
            cfg.set(*k, *v);
        }
        cfg.create::<BaseProducer>().map(drop)
    };
    create(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", "u"),
        ("sasl.password", "p"),
    ])
    .expect("built with OpenSSL and SCRAM");
    create(&[("security.protocol", "SSL")]).expect("built with OpenSSL");
    let e = create(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "oidc"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("oidc"), "{e}");
}

#[test]
fn unsupported_mechanisms_are_refused_by_the_parser() {
    let mut argv = vec!["test", "--kafka-sasl-mechanism", "GSSAPI"];
    assert!(Cli::try_parse_from(argv.clone()).is_err());
    argv[2] = "OAUTHBEARER";
    assert!(Cli::try_parse_from(argv).is_err());
}
