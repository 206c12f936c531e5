//! End-to-end tests: real PostgreSQL, a real Kafka-protocol broker, relay processes, and an
//! independent client (kafka-python) checking what landed on the broker.
//!
//! Grouped by what they prove, so that one goes from a guarantee of the book's "Guarantees"
//! page (docs/src/guarantees.md) to the tests that prove it: a folder per guarantee or
//! component, a file per claim.

mod common;

/// What the relay guarantees about delivery: nothing committed is lost, nothing is skipped,
/// order per aggregate, duplicates on the broker only from failures, the settings these rest on
/// cannot be overridden, and with `--transactions` a deposed leader cannot add to the log
/// (guarantees 1, 2, 3, 4, 6 and 7); through crashes, outages, failovers, PgBouncer and chaos.
mod delivery {
    mod buckets;
    mod chaos;
    mod commit_order;
    mod committed_events;
    mod each_event_once;
    mod failover;
    mod fencing;
    mod guarded_settings;
    mod insert_lock;
    mod lease;
    mod outages;
    mod pgbouncer;
    mod upgrade;
}

/// An event that cannot be sent holds back only its own aggregate (guarantee 5), one partition
/// the cluster cannot write only the aggregates it carries (guarantee 8): parked, sent alone,
/// left out of the claim, resolved by the operator; and around them nothing is skipped or
/// reordered (guarantees 2 and 3).
mod isolation {
    mod held_back_claims;
    mod lone_sends;
    mod operator_races;
    mod parked_backlog;
    mod parking;
    mod record_batches;
    mod unwritable_partition;
}

/// What the consumer runtime guarantees: an effect commits with its inbox row, duplicates are
/// absorbed (guarantee 4), failing messages are retried or dead-lettered, a redrive is applied
/// once.
mod consumers {
    mod dead_letters;
    mod duplicates;
    mod inbox;
    mod outages;
    mod redrive;
    mod runtime;
}

/// What goes on the wire: binary payloads, tombstones, keys, CloudEvents.
mod publishing {
    mod batch_interval;
    mod topic_durability;
    mod wire_formats;
}

/// Compatibility with Debezium's Outbox Event Router: Debezium itself, run in the harness, as
/// the reference for what teams coming from it have on their topics.
mod compat {
    mod debezium;
}

/// The services' business rules end to end: the order flow, fulfilment by the WMS and stock
/// consumers, the marketplace channel, refunds and returns, the payment timeout.
mod services {
    mod by_line;
    mod flows;
    mod marketplace;
    mod marketplace_refunds;
    mod order_events;
    mod payment_timeout;
    mod ship_backs;
}

/// Secured connections, access control, least-privilege roles, secrets, hostile input.
mod security {
    mod access;
    mod exhaustion;
    mod http_fuzz;
    mod kafka_config;
    mod kafka_logins;
    mod kafka_refusals;
    mod openapi_fuzz;
    mod postgres_tls;
    mod roles;
    mod secrets;
}

/// Running it: the audit, the benchmark, metrics and the dashboard, retention, tracing, the
/// deployment files.
mod operations {
    mod audit;
    mod bench;
    mod business_metrics;
    mod dashboard;
    mod deploy;
    mod relay_metrics;
    mod retention;
    mod trace;
}
