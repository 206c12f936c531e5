//! No shipped secrets: every placeholder secret this project ever published, given to each
//! service in each of its secret settings, makes the process exit non-zero naming the setting
//! (and not echoing the value); the development switch lets it start with a warning; random
//! secrets start normally. Every secret-like value written in our deploy files, READMEs and
//! scripts is refused by the rule.

use std::time::Duration;

use e2e::proc::ServiceProcess;
use outbox_process::secrets::{weakness, SecretKind, SHIPPED};

/// The placeholders the deploy files and READMEs held before they stopped shipping secrets
/// (also in [`SHIPPED`]).
const DEPLOY_PLACEHOLDERS: [&str; 6] = [
    "CHANGE-ME-TO-32-OR-MORE-RANDOM-BYTES",
    "local-only-jwt-secret-change-me-32b",
    "change-me",
    "CHANGE-ME",
    "postgres",
    "admin",
];

/// A random value that passes the rule.
fn strong() -> String {
    format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    )
}

/// One way to give a binary a secret.
struct Case {
    bin: &'static str,
    /// The setting as the error names it.
    setting: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// SASL/SCRAM settings with `password` as the Kafka password.
fn kafka_sasl(password: &str) -> Vec<(String, String)> {
    [
        ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
        ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        ("KAFKA_SASL_USERNAME", "svc"),
        ("KAFKA_SASL_PASSWORD", password),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

fn db_url(password: &str) -> String {
    // Never reached: the check runs before the first connection.
    format!("postgres://svc:{password}@127.0.0.1:1/db")
}

/// Every secret setting of every binary, set to `value`, the others strong.
fn cases(value: &str) -> Vec<Case> {
    let s = strong();
    let mut out = Vec::new();
    for bin in ["order-service", "wms-consumer", "stock-consumer"] {
        let base = |jwt: &str, url: String| {
            let mut env = vec![
                ("JWT_HS256_SECRET".to_owned(), jwt.to_owned()),
                ("DATABASE_URL".to_owned(), url),
                ("KAFKA_BROKERS".to_owned(), "127.0.0.1:1".to_owned()),
                ("LISTEN_ADDR".to_owned(), "127.0.0.1:0".to_owned()),
                ("ALLOW_WEAK_SECRETS".to_owned(), "false".to_owned()),
            ];
            if bin == "order-service" {
                env.push(("PAYMENT_CALLBACK_SECRET".to_owned(), s.clone()));
                env.push(("MARKETPLACE_SECRET".to_owned(), s.clone()));
            }
            env
        };
        out.push(Case {
            bin,
            setting: "JWT_HS256_SECRET",
            args: vec![],
            env: base(value, db_url(&s)),
        });
        out.push(Case {
            bin,
            setting: "DATABASE_URL",
            args: vec![],
            env: base(&s, db_url(value)),
        });
        let mut kafka = base(&s, db_url(&s));
        kafka.extend(kafka_sasl(value));
        out.push(Case {
            bin,
            setting: "KAFKA_SASL_PASSWORD",
            args: vec![],
            env: kafka,
        });
        if bin == "order-service" {
            for setting in ["PAYMENT_CALLBACK_SECRET", "MARKETPLACE_SECRET"] {
                let mut env = base(&s, db_url(&s));
                env.retain(|(k, _)| k != setting);
                env.push((setting.to_owned(), value.to_owned()));
                out.push(Case {
                    bin,
                    setting,
                    args: vec![],
                    env,
                });
            }
        }
    }
    out.push(Case {
        bin: "outbox-relay",
        setting: "DATABASE_URL",
        args: vec!["run".into()],
        env: vec![
            ("DATABASE_URL".to_owned(), db_url(value)),
            ("KAFKA_BROKERS".to_owned(), "127.0.0.1:1".to_owned()),
            ("METRICS_ADDR".to_owned(), "127.0.0.1:0".to_owned()),
        ],
    });
    let mut relay_kafka = vec![
        ("DATABASE_URL".to_owned(), db_url(&s)),
        ("KAFKA_BROKERS".to_owned(), "127.0.0.1:1".to_owned()),
        ("METRICS_ADDR".to_owned(), "127.0.0.1:0".to_owned()),
    ];
    relay_kafka.extend(kafka_sasl(value));
    out.push(Case {
        bin: "outbox-relay",
        setting: "KAFKA_SASL_PASSWORD",
        args: vec!["run".into()],
        env: relay_kafka,
    });
    out.push(Case {
        bin: "mint-token",
        setting: "JWT_HS256_SECRET",
        args: vec![
            "--sub".into(),
            "ops".into(),
            "--role".into(),
            "operator".into(),
        ],
        env: vec![
            ("JWT_HS256_SECRET".to_owned(), value.to_owned()),
            ("JWT_ISSUER".to_owned(), "i".to_owned()),
            ("JWT_AUDIENCE".to_owned(), "a".to_owned()),
            ("ALLOW_WEAK_SECRETS".to_owned(), "false".to_owned()),
        ],
    });
    out
}

fn start(case: &Case, extra: &[(&str, &str)]) -> ServiceProcess {
    let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
    let mut env: Vec<(&str, &str)> = case
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // ServiceProcess sets the tests' development switch; these runs go without it.
    env.push(("ALLOW_WEAK_SECRETS", "false"));
    env.extend_from_slice(extra);
    ServiceProcess::start(case.bin, &format!("{}-secret", case.bin), &args, &env)
}

#[tokio::test]
async fn every_shipped_placeholder_secret_makes_every_service_exit_naming_the_setting() {
    let mut checked = 0;
    for value in DEPLOY_PLACEHOLDERS {
        for case in cases(value) {
            let mut p = start(&case, &[]);
            let what = format!("{} with {} = {value:?}", case.bin, case.setting);
            let status = e2e::wait_for(&format!("{what} to exit"), Duration::from_secs(30), || {
                std::future::ready(p.try_wait())
            })
            .await;
            assert!(!status.success(), "{what} started");
            let log = p.log_text();
            assert!(
                log.contains("weak or published secret") && log.contains(case.setting),
                "{what}: the error does not name the setting: {log}"
            );
            assert!(
                !log.contains(value) || value.len() < 6,
                "{what}: the log echoes the secret: {log}"
            );
            checked += 1;
        }
    }
    eprintln!(
        "{checked} refusals checked ({} placeholders x 14 settings)",
        DEPLOY_PLACEHOLDERS.len()
    );
    assert_eq!(checked, DEPLOY_PLACEHOLDERS.len() * 14);
}

#[tokio::test]
async fn the_development_switch_starts_with_a_warning_and_strong_secrets_start_without() {
    let db = e2e::db::fresh_database().await;
    let (jwt_strong, callback_strong) = (strong(), strong());
    for (name, jwt, callback, switch) in [
        (
            "weak-with-switch",
            "local-only-jwt-secret-change-me-32b",
            "change-me",
            "true",
        ),
        (
            "strong",
            jwt_strong.as_str(),
            callback_strong.as_str(),
            "false",
        ),
    ] {
        let addr = format!("127.0.0.1:{}", e2e::free_port());
        let p = ServiceProcess::start(
            "order-service",
            &format!("order-service-{name}"),
            &["--listen", &addr, "--database-url", &db.url],
            &[
                ("JWT_HS256_SECRET", jwt),
                ("PAYMENT_CALLBACK_SECRET", callback),
                ("ALLOW_WEAK_SECRETS", switch),
            ],
        );
        let http = reqwest::Client::new();
        e2e::wait_for(
            &format!("order-service ({name}) to serve"),
            Duration::from_secs(30),
            || async {
                http.get(format!("http://{addr}/healthz"))
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
            },
        )
        .await;
        let log = p.log_text();
        let warned = log.contains("ALLOW_WEAK_SECRETS is set")
            && log.contains("PAYMENT_CALLBACK_SECRET")
            && log.contains("JWT_HS256_SECRET");
        assert_eq!(warned, switch == "true", "{name}: {log}");
        assert!(
            !log.contains("change-me"),
            "{name}: the log echoes a secret: {log}"
        );
    }
}

/// Secret-like values written in the files a user reads and copies: deploy files, READMEs,
/// the book's pages, scripts. `NAME: value`, `NAME=value`, `"value"` after a secret's key.
fn written_secrets() -> Vec<(String, String)> {
    let root = e2e::workspace_root();
    let mut files = vec![root.join("README.md"), root.join("Dockerfile")];
    for dir in [
        "deploy/compose",
        "deploy/k8s",
        "deploy/local",
        "services/order-service",
        "services/wms-consumer",
        "services/stock-consumer",
        "services/outbox-consumer-service",
        "services/marketplace-sim",
        "docs/src",
    ] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                files.push(p);
            }
        }
    }
    let key = regex::Regex::new(
        r#"(?i)([A-Z0-9_-]*(?:SECRET|PASSWORD)[A-Z0-9_-]*)["']?\s*[:=]\s*["']?([^\s"'`,;)]+)"#,
    )
    .unwrap();
    // Compose's `${NAME:-default}`: the default is a literal.
    let default =
        regex::Regex::new(r"\$\{([A-Z0-9_]*(?:SECRET|PASSWORD)[A-Z0-9_]*):?-([^}]*)\}").unwrap();
    let mut out = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for c in default.captures_iter(&text) {
            if c[2].contains("$(") {
                continue; // generated per run
            }
            out.push((
                format!("{}: {} default", f.display(), &c[1]),
                c[2].to_owned(),
            ));
        }
        for c in key.captures_iter(&text) {
            let value = c[2].to_owned();
            // References and generated values, not literals.
            if value.starts_with('$')
                || value.starts_with('-')
                || value.starts_with('?')
                || value.starts_with('<')
                || value.starts_with('{')
                || value.contains("$(")
                || value.starts_with("...")
                || value.ends_with(':')
                || value.eq_ignore_ascii_case("true")
                || value.eq_ignore_ascii_case("false")
            {
                continue;
            }
            out.push((format!("{}: {}", f.display(), &c[1]), value));
        }
    }
    out
}

#[test]
fn every_secret_written_in_our_files_is_refused_by_the_rule() {
    let found = written_secrets();
    for (where_, value) in &found {
        for kind in [SecretKind::SigningKey, SecretKind::Password] {
            assert!(
                weakness(kind, value).is_some(),
                "{where_} = {value:?} passes the secret rule as {kind:?}: add it to \
                 outbox_process::secrets::SHIPPED or make it a placeholder"
            );
        }
    }
    for v in DEPLOY_PLACEHOLDERS {
        assert!(SHIPPED.contains(&v), "{v} missing from SHIPPED");
    }
    eprintln!(
        "{} secret-like literals in our files, all refused",
        found.len()
    );
}
