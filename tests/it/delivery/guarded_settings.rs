//! Guarantee 6: the Kafka settings the other guarantees rest on (idempotence, acks, an
//! unbounded delivery timeout, key partitioning, the gapless guarantee) cannot be overridden
//! with `--kafka-config`: the relay refuses each override at start-up, naming it.

use e2e::proc::relay_cli;

#[test]
fn overrides_of_the_guarantees_are_refused_at_start_up() {
    for setting in [
        "message.timeout.ms=30000",
        "delivery.timeout.ms=30000",
        "partitioner=random",
        "enable.idempotence=false",
        "max.in.flight.requests.per.connection=20",
        "acks=1",
        "enable.gapless.guarantee=false",
    ] {
        let out = relay_cli(&[
            "run",
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
            "--kafka-brokers",
            "127.0.0.1:1",
            "--metrics-addr",
            "127.0.0.1:0",
            "--kafka-config",
            setting,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let key = setting.split('=').next().unwrap();
        assert!(!out.status.success(), "{setting} accepted");
        assert!(
            stderr.contains(&format!("--kafka-config {setting} is refused")),
            "{setting}: {stderr}"
        );
        assert!(stderr.contains(key));
    }
}
