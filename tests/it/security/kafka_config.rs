//! `--kafka-config` never leaks or weakens a secret: `--help` does not print the environment
//! variable's value; a password with a comma is taken whole and never echoed; librdkafka's
//! other name of a checked setting (`sasl.mechanisms`, `metadata.broker.list`) is checked like
//! the setting itself. Each through the real binaries, before any connection.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::proc::{wait_exit, workspace_binary};

/// A tail no output may show.
const SECRET_TAIL: &str = "tail-of-the-Secret-7f3a";

/// Runs `bin args` with `env`; returns (exit code, stdout + stderr), or panics if it is still
/// running after 30 s (a process that should have refused its configuration).
fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = Command::new(workspace_binary(bin))
        .args(args)
        .env_remove("OUTBOX_KAFKA_CONFIG")
        .env_remove("KAFKA_CONSUMER_CONFIG")
        .env_remove("AUDIT_KAFKA_CONFIG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {bin}: {e}"));
    let status = wait_exit(&mut child, Duration::from_secs(30));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = status.unwrap_or_else(|| {
        panic!("{bin} {args:?} was still running after 30 s; its output:\n{out}")
    });
    (status.code(), out)
}

/// The binaries with a `--kafka-config`, the subcommand to ask for help, and its variable.
const BINARIES: [(&str, &[&str], &str); 4] = [
    ("outbox-relay", &["run", "--help"], "OUTBOX_KAFKA_CONFIG"),
    ("wms-consumer", &["--help"], "KAFKA_CONSUMER_CONFIG"),
    ("stock-consumer", &["--help"], "KAFKA_CONSUMER_CONFIG"),
    ("outbox-audit", &["--help"], "AUDIT_KAFKA_CONFIG"),
];

#[test]
fn help_never_prints_the_kafka_config_environment_value() {
    let value = format!("sasl.password={SECRET_TAIL}");
    for (bin, help, var) in BINARIES {
        let (code, out) = run(bin, help, &[(var, &value)]);
        assert_eq!(code, Some(0), "{bin} --help: {out}");
        assert!(out.contains("--kafka-config"), "{bin} --help: {out}");
        assert!(
            !out.contains(SECRET_TAIL),
            "{bin} --help printed {var}'s value:\n{out}"
        );
    }
}

/// `outbox-relay run` with SASL/SCRAM set by the security flags (the password too unless
/// `extra` gives it) and `--kafka-config` `extra`. Nothing listens at the addresses: a relay
/// that accepts its configuration does not exit within the 30 s `run` waits.
fn relay_with(extra: &str) -> (Option<i32>, String) {
    let password = format!("{:032x}", rand::random::<u128>());
    let mut env = vec![
        ("DATABASE_URL", "postgres://relay@127.0.0.1:1/outbox"),
        ("KAFKA_BROKERS", "127.0.0.1:1"),
        ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
        ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        ("KAFKA_SASL_USERNAME", "relay"),
        ("METRICS_ADDR", "127.0.0.1:0"),
    ];
    if !extra.contains("sasl.password") {
        env.push(("KAFKA_SASL_PASSWORD", &password));
    }
    run("outbox-relay", &["run", "--kafka-config", extra], &env)
}

#[test]
fn a_checked_setting_given_by_its_other_name_is_checked_like_it() {
    // SCRAM set by the flags, PLAIN (the password in clear on the wire) by librdkafka's alias.
    let (code, out) = relay_with("sasl.mechanisms=PLAIN");
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("sasl.mechanism") && out.contains("KAFKA_SASL_MECHANISM"),
        "the refusal names the setting and the flag it contradicts: {out}"
    );
    let (code, out) = relay_with("metadata.broker.list=elsewhere:9092");
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("metadata.broker.list=elsewhere:9092 is refused"),
        "{out}"
    );
}

#[test]
fn a_password_with_a_comma_is_taken_whole_and_never_echoed() {
    // The comma stays in the password; the start then stops at the contradiction that follows
    // (SCRAM by the flags, PLAIN by the alias), never at the password, and shows no part of it.
    let (code, out) = relay_with(&format!(
        "sasl.password=first-part,{SECRET_TAIL},sasl.mechanisms=PLAIN"
    ));
    assert_ne!(code, Some(0), "{out}");
    assert!(
        !out.contains(SECRET_TAIL),
        "a part of the password shown:\n{out}"
    );
    assert!(
        !out.contains("first-part"),
        "a part of the password shown:\n{out}"
    );
    assert!(
        out.contains("sasl.mechanism"),
        "the password was parsed whole and the next setting checked: {out}"
    );
}
