//! The deployment files, validated without a container engine or a cluster: the compose file
//! against the compose-spec schema, the Kubernetes manifests against the API schemas of
//! Kubernetes 1.30, the alert rules with promtool (syntax and unit tests), the Prometheus
//! configuration, and `deploy/check_deploy.py`: every binary, subcommand, flag and environment
//! variable the Dockerfile, compose and the manifests give our binaries is one those binaries
//! offer (their real `--help`), and every dashboard query parses.
//!
//! The tools come from `deploy/local/install-deps.sh` (venv: check-jsonschema,
//! kubernetes-validate, PyYAML; Debian: promtool).

use std::process::Command;

use e2e::observe::{run_in_workspace, system_tool, venv_tool};

/// The Kubernetes version the manifests are validated against (kubernetes-validate 1.37.0
/// ships schemas from 1.x up to 1.37; 1.30 is the oldest minor still commonly supported).
const KUBERNETES_VERSION: &str = "1.30.0";

fn k8s_manifests() -> Vec<String> {
    let dir = e2e::workspace_root().join("deploy/k8s");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "manifests in {}: {files:?}",
        dir.display()
    );
    files
}

#[test]
fn compose_file_matches_the_compose_spec() {
    let out = run_in_workspace(
        "check-jsonschema on deploy/compose/compose.yaml",
        Command::new(venv_tool("check-jsonschema")).args([
            "--builtin-schema",
            "vendor.compose-spec",
            "deploy/compose/compose.yaml",
            "deploy/compose/broker-port.yaml",
        ]),
    );
    assert!(out.contains("ok"), "{out}");
}

/// The Kafka release the local scripts and the tests run (`deploy/local/lib.sh`).
fn local_kafka_version() -> String {
    let lib = std::fs::read_to_string(e2e::workspace_root().join("deploy/local/lib.sh")).unwrap();
    lib.lines()
        .find_map(|l| l.strip_prefix("KAFKA_VERSION="))
        .expect("KAFKA_VERSION= in deploy/local/lib.sh")
        .trim()
        .to_owned()
}

#[test]
fn compose_pom_and_scripts_run_one_kafka_release() {
    let version = local_kafka_version();
    let root = e2e::workspace_root();
    let compose = std::fs::read_to_string(root.join("deploy/compose/compose.yaml")).unwrap();
    let images: Vec<&str> = compose
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: apache/kafka:"))
        .collect();
    assert!(!images.is_empty(), "compose runs apache/kafka");
    assert!(
        images.iter().all(|v| *v == version),
        "compose's apache/kafka images {images:?} are not the local release {version}"
    );
    let pom = std::fs::read_to_string(root.join("deploy/local/kafka/pom.xml")).unwrap();
    assert!(
        pom.contains(&format!("<kafka.version>{version}</kafka.version>")),
        "deploy/local/kafka/pom.xml does not pin {version}"
    );
}

#[test]
fn kubernetes_manifests_match_the_api_schemas() {
    let out = run_in_workspace(
        "kubernetes-validate on deploy/k8s",
        Command::new(venv_tool("kubernetes-validate"))
            .args(["-k", KUBERNETES_VERSION, "--strict"])
            .args(k8s_manifests()),
    );
    let passed = out.matches(" passed for resource ").count();
    eprintln!("kubernetes-validate -k {KUBERNETES_VERSION}: {passed} resources passed");
    assert!(passed >= 10, "{out}");
    assert!(!out.contains("ERROR"), "{out}");
}

#[test]
fn alert_rules_pass_promtool_checks_and_unit_tests() {
    let promtool = system_tool("promtool");
    let out = run_in_workspace(
        "promtool check rules",
        Command::new(&promtool).args(["check", "rules", "deploy/prometheus/alerts.yaml"]),
    );
    assert!(out.contains("SUCCESS"), "{out}");
    let out = run_in_workspace(
        "promtool test rules",
        Command::new(&promtool).args(["test", "rules", "deploy/prometheus/alerts.test.yaml"]),
    );
    assert!(out.contains("SUCCESS"), "{out}");
    let out = run_in_workspace(
        "promtool check config",
        Command::new(&promtool).args(["check", "config", "deploy/prometheus/prometheus.yml"]),
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_flag_and_variable_given_to_our_binaries_exists() {
    // The binaries' --help, from the build the end-to-end tests use.
    let bin_dir = e2e::proc::workspace_binary("outbox-relay")
        .parent()
        .unwrap()
        .to_path_buf();
    let out = run_in_workspace(
        "deploy/check_deploy.py",
        Command::new(venv_tool("python"))
            .arg("deploy/check_deploy.py")
            .arg("--bin-dir")
            .arg(&bin_dir),
    );
    eprint!("{out}");
    assert!(out.contains("check_deploy: ok"), "{out}");
}
