//! What the `debezium` phase is given ([`DebeziumSpec`]) and what it reports
//! ([`DebeziumFigures`], a [`Side`] per publisher).

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::cpu::CpuFigures;
use crate::stats::Percentiles;

/// What the phase needs to know.
#[derive(Debug, Clone)]
pub struct DebeziumSpec<'a> {
    /// Events in the backlog.
    pub events: u64,
    /// Distinct aggregates.
    pub aggregates: u64,
    /// Approximate payload size, bytes.
    pub payload_bytes: u64,
    /// Offered events per second in the latency runs.
    pub rate: u64,
    /// Seconds of each latency run.
    pub seconds: u64,
    /// The relay binary.
    pub binary: &'a Path,
    /// `--batch-size`.
    pub batch_size: i64,
    /// Extra relay arguments.
    pub extra: &'a [String],
    /// How long a drain may take.
    pub timeout: Duration,
    /// Directory of the logs.
    pub log_dir: &'a Path,
    /// Connector options beyond Debezium's defaults.
    pub connector: &'a [(String, String)],
}

/// One publisher's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Side {
    /// `debezium` or `relay`.
    pub name: &'static str,
    /// Backlog drained per second.
    pub drain_events_per_s: Option<f64>,
    /// CPU of the drain: `relay_s` is the publisher's (the JVM for Debezium), `postgres_s`
    /// the server's.
    pub drain_cpu: Option<CpuFigures>,
    /// Publisher + PostgreSQL CPU per drained event, µs.
    pub drain_total_us_per_event: Option<f64>,
    /// CPU of the publisher's own PostgreSQL backends per drained event (Debezium's WAL
    /// sender; the relay's connections), µs: the part of the server's CPU that is the
    /// publisher's, without the writers' and the server's housekeeping.
    pub drain_backends_us_per_event: Option<f64>,
    /// Commit → seen by a consumer under the offered load, ms.
    pub commit_to_seen_ms: Option<Percentiles>,
    /// CPU under the offered load, per event.
    pub load_cpu: Option<CpuFigures>,
    /// Publisher + PostgreSQL CPU per event under the load, µs.
    pub load_total_us_per_event: Option<f64>,
    /// CPU of the publisher's own PostgreSQL backends per event under the load, µs.
    pub load_backends_us_per_event: Option<f64>,
    /// Events committed under the load that the consumer did not see.
    pub not_seen: u64,
    /// Peak resident memory of the publisher process, KiB.
    pub peak_rss_kb: Option<u64>,
}

/// The phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct DebeziumFigures {
    /// Backlog events.
    pub events: u64,
    /// Aggregates.
    pub aggregates: u64,
    /// Payload bytes (approximate).
    pub payload_bytes: u64,
    /// Offered load, events per second.
    pub rate: u64,
    /// Seconds of load.
    pub seconds: u64,
    /// The converters both publish with.
    pub converters: &'static str,
    /// Debezium's connector options beyond its defaults.
    pub debezium_config: Vec<(String, String)>,
    /// Debezium.
    pub debezium: Side,
    /// The relay.
    pub relay: Side,
}

impl DebeziumFigures {
    /// Relay over Debezium of publisher + PostgreSQL CPU per drained event.
    pub fn drain_cpu_ratio(&self) -> Option<f64> {
        Some(self.relay.drain_total_us_per_event? / self.debezium.drain_total_us_per_event?)
    }
}
