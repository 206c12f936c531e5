//! The producer's settings: the relay's defaults, the user's `--kafka-config` on top, and the
//! settings the relay's guarantees depend on, forced last; an override of those is refused at
//! start-up with the reason.

use rdkafka::config::ClientConfig;

/// Settings the relay always uses; `enable.idempotence` and `acks` cannot be overridden.
///
/// `message.timeout.ms=0` (no local timeout) keeps per-partition order through broker
/// outages: a message that times out while queued leaves a gap that later messages of the
/// same key would jump over. librdkafka retries until the broker is back; the relay reports
/// the outage and SIGTERM abandons what is in flight (it is sent again after restart).
/// `partitioner=murmur2_random` places keys like the Java client (and Debezium, Kafka
/// Connect, kafka-python) do, so a key lands on the same partition whoever produced it.
pub const PRODUCER_DEFAULTS: [(&str, &str); 10] = [
    ("partitioner", "murmur2_random"),
    // The relay hands over whole batches at once; lingering only idles at a batch's end.
    ("linger.ms", "1"),
    ("batch.num.messages", "10000"),
    ("batch.size", "1000000"),
    ("compression.type", "lz4"),
    ("message.timeout.ms", "0"),
    ("queue.buffering.max.messages", "500000"),
    ("queue.buffering.max.kbytes", "1048576"),
    ("enable.metrics.push", "false"),
    ("client.id", "outbox-relay"),
];

/// Settings the relay's guarantees depend on (shared DESIGN.md, guarantee 6), with the reason
/// an override is refused at start-up.
pub const PROTECTED_SETTINGS: [(&str, &str); 16] = [
    ("enable.idempotence", "the idempotent producer keeps each partition in order across retries and writes no duplicates of its own"),
    ("acks", "an event counts as published only once every in-sync replica has it (acks=all)"),
    ("request.required.acks", "an event counts as published only once every in-sync replica has it (acks=all)"),
    ("message.timeout.ms", "a finite delivery timeout lets a later event of a key overtake an earlier one that timed out while queued"),
    ("delivery.timeout.ms", "a finite delivery timeout lets a later event of a key overtake an earlier one that timed out while queued"),
    ("partitioner", "events of one aggregate must land on one partition, placed like the Java client does (murmur2_random)"),
    ("max.in.flight.requests.per.connection", "the idempotent producer keeps order only with at most 5 requests in flight; librdkafka sets it"),
    ("max.in.flight", "the idempotent producer keeps order only with at most 5 requests in flight; librdkafka sets it"),
    ("enable.gapless.guarantee", "a batch the broker refuses must stop the producer instead of letting later events of its partition through"),
    ("retries", "librdkafka must retry until the broker takes the event"),
    ("message.send.max.retries", "librdkafka must retry until the broker takes the event"),
    ("transactional.id", "the relay derives it from the lease when --transactions is on (see --transactional-id)"),
    ("transaction.timeout.ms", "the relay sets it with its transactional id"),
    ("bootstrap.servers", "set the brokers with --kafka-brokers / KAFKA_BROKERS"),
    ("metadata.broker.list", "set the brokers with --kafka-brokers / KAFKA_BROKERS"),
    ("queue.buffering.backpressure.threshold", "the relay bounds what is in flight by its batch size"),
];

/// Refuses `--kafka-config` settings the relay's guarantees depend on.
///
/// # Errors
/// A message naming the first refused setting and why it cannot be changed.
pub fn check_overrides(extra: &[(String, String)]) -> Result<(), String> {
    for (k, v) in extra {
        let key = k.trim();
        if let Some((_, why)) = PROTECTED_SETTINGS.iter().find(|(p, _)| *p == key) {
            return Err(format!(
                "--kafka-config {key}={v} is refused: {why}. The relay sets `{key}` itself."
            ));
        }
    }
    Ok(())
}

/// Defaults of a transactional producer, before the user's settings. `retry.backoff.ms`: a
/// batch's transaction begins while the coordinator still completes the last one, and the
/// broker answers CONCURRENT_TRANSACTIONS until it has; librdkafka waits this long before
/// asking again (its default, 100 ms, put the p50 of commit → seen by a `read_committed`
/// reader at 62 ms at 1 000 events/s; 10 ms puts it at 12 ms, `relay-bench --phases
/// transactions`). Outage retries still back off exponentially up to `retry.backoff.max.ms`.
pub const TRANSACTIONAL_DEFAULTS: [(&str, &str); 1] = [("retry.backoff.ms", "10")];

/// How long a Kafka transaction of the relay may stay open: the coordinator aborts it after
/// that (a relay that died mid-batch holds back `read_committed` readers of its partitions at
/// most this long when no standby takes over sooner; a new leader aborts it at once).
pub const TRANSACTION_TIMEOUT_MS: &str = "60000";

/// Builds the producer configuration: defaults, then the user's settings, then the settings
/// the relay's guarantees depend on.
pub fn producer_config(brokers: &str, extra: &[(String, String)]) -> ClientConfig {
    transactional_producer_config(brokers, extra, None)
}

/// [`producer_config`] of a transactional producer when `transactional_id` is given: each
/// batch is one transaction, and a producer that initialises the same id fences this one at
/// the broker. A transactional producer needs a finite `message.timeout.ms` (at most the
/// transaction's timeout); a message that times out aborts its whole transaction, so it
/// leaves no gap for a later event of its key to jump over.
pub fn transactional_producer_config(
    brokers: &str,
    extra: &[(String, String)],
    transactional_id: Option<&str>,
) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers);
    for (k, v) in PRODUCER_DEFAULTS {
        cfg.set(k, v);
    }
    if transactional_id.is_some() {
        for (k, v) in TRANSACTIONAL_DEFAULTS {
            cfg.set(k, v);
        }
    }
    for (k, v) in extra {
        cfg.set(k, v);
    }
    for (k, v) in FORCED_SETTINGS {
        cfg.set(k, v);
    }
    if let Some(id) = transactional_id {
        cfg.set("transactional.id", id)
            .set("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
            .set("message.timeout.ms", TRANSACTION_TIMEOUT_MS);
    }
    cfg
}

/// Set after the user's settings, whatever they say ([`check_overrides`] refuses them first).
/// `enable.gapless.guarantee`: when the broker refuses a record batch, librdkafka would
/// otherwise bump the idempotent epoch and resend the partition's later batches, so a later
/// event of an aggregate would land before the refused one is sent again. With it the
/// producer stops instead (a fatal error; the broker's sequence check refuses the later
/// batches already in flight), and the relay replaces the producer and resends from the table.
pub const FORCED_SETTINGS: [(&str, &str); 5] = [
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("enable.gapless.guarantee", "true"),
    ("message.timeout.ms", "0"),
    ("partitioner", "murmur2_random"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarantees_cannot_be_configured_away() {
        let cfg = producer_config(
            "b:9092",
            &[
                ("enable.idempotence".into(), "false".into()),
                ("acks".into(), "1".into()),
                ("linger.ms".into(), "20".into()),
            ],
        );
        assert_eq!(cfg.get("enable.idempotence"), Some("true"));
        assert_eq!(cfg.get("acks"), Some("all"));
        assert_eq!(cfg.get("enable.gapless.guarantee"), Some("true"));
        assert_eq!(
            cfg.get("linger.ms"),
            Some("20"),
            "user settings override defaults"
        );
        assert_eq!(cfg.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(cfg.get("message.timeout.ms"), Some("0"));
    }

    #[test]
    fn a_transactional_producer_has_its_id_and_a_delivery_timeout_within_its_transaction() {
        let plain = producer_config("b:9092", &[]);
        assert_eq!(plain.get("transactional.id"), None);
        let txn = transactional_producer_config("b:9092", &[], Some("outbox-relay.db.default"));
        assert_eq!(txn.get("transactional.id"), Some("outbox-relay.db.default"));
        assert_eq!(
            txn.get("transaction.timeout.ms"),
            Some(TRANSACTION_TIMEOUT_MS)
        );
        assert_eq!(txn.get("message.timeout.ms"), Some(TRANSACTION_TIMEOUT_MS));
        assert_eq!(txn.get("enable.gapless.guarantee"), Some("true"));
        assert_eq!(txn.get("retry.backoff.ms"), Some("10"));
        let mine = [("retry.backoff.ms".to_owned(), "50".to_owned())];
        let txn = transactional_producer_config("b:9092", &mine, Some("x"));
        assert_eq!(
            txn.get("retry.backoff.ms"),
            Some("50"),
            "a default, not forced"
        );
    }

    #[test]
    fn overrides_of_guarantees_are_refused_by_name() {
        let kv = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        for (k, v) in [
            ("message.timeout.ms", "30000"),
            ("delivery.timeout.ms", "30000"),
            ("partitioner", "random"),
            ("enable.idempotence", "false"),
            ("max.in.flight.requests.per.connection", "20"),
            ("max.in.flight", "20"),
            ("acks", "1"),
            ("enable.gapless.guarantee", "false"),
            ("transactional.id", "x"),
            ("transaction.timeout.ms", "900000"),
        ] {
            let err = check_overrides(&kv(k, v)).unwrap_err();
            assert!(err.contains(k), "{err}");
        }
        for (k, v) in [
            ("compression.type", "zstd"),
            ("linger.ms", "5"),
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "PLAIN"),
            ("client.id", "x"),
        ] {
            assert!(check_overrides(&kv(k, v)).is_ok(), "{k} refused");
        }
    }
}
