//! Consumer lag per partition (`consumer_lag_messages{topic, partition}`): the partition's
//! high watermark minus the group's committed offset, the messages this consumer group still
//! has to apply.
//!
//! librdkafka's calls for it (`committed_offsets`, `fetch_watermarks`) are requests to the
//! broker that block, so they run on the blocking pool from their own task every
//! [`LAG_INTERVAL`], never in the fetch loop. Only assigned partitions have a series; a
//! partition revoked from this process loses its series (its new owner reports it).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::Offset;
use tokio_util::sync::CancellationToken;

use super::metrics::ConsumerMetrics;

/// Time between two lag measurements.
pub const LAG_INTERVAL: Duration = Duration::from_secs(5);

/// How long one broker request of a measurement may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The lag of one assigned partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLag {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// High watermark minus the committed offset (the low watermark when nothing was
    /// committed yet), at least 0.
    pub messages: i64,
}

/// Messages between `committed` (or `low` when nothing was committed) and `high`.
pub fn lag_of(committed: Offset, low: i64, high: i64) -> i64 {
    let done = match committed {
        Offset::Offset(o) => o,
        _ => low,
    };
    (high - done.max(low)).max(0)
}

/// Measures the lag of every partition assigned to `consumer` (blocking).
///
/// # Errors
/// When the broker does not answer in time.
pub fn measure<C: ConsumerContext>(consumer: &StreamConsumer<C>) -> KafkaResult<Vec<PartitionLag>> {
    let assignment = consumer.assignment()?;
    if assignment.count() == 0 {
        return Ok(vec![]);
    }
    let committed = consumer.committed_offsets(assignment, REQUEST_TIMEOUT)?;
    let mut out = Vec::with_capacity(committed.count());
    for e in committed.elements() {
        let (low, high) = consumer.fetch_watermarks(e.topic(), e.partition(), REQUEST_TIMEOUT)?;
        out.push(PartitionLag {
            topic: e.topic().to_owned(),
            partition: e.partition(),
            messages: lag_of(e.offset(), low, high),
        });
    }
    Ok(out)
}

/// Measures and publishes the lag every [`LAG_INTERVAL`] until `stop`.
pub async fn report<C: ConsumerContext + 'static>(
    consumer: Arc<StreamConsumer<C>>,
    metrics: ConsumerMetrics,
    stop: CancellationToken,
) {
    let mut shown: BTreeSet<(String, i32)> = BTreeSet::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(LAG_INTERVAL) => {}
            () = stop.cancelled() => break,
        }
        let c = consumer.clone();
        match tokio::task::spawn_blocking(move || measure(&c)).await {
            Ok(Ok(lags)) => {
                let now: BTreeSet<(String, i32)> = lags
                    .iter()
                    .map(|l| (l.topic.clone(), l.partition))
                    .collect();
                for (topic, partition) in shown.difference(&now) {
                    let _ = metrics
                        .lag
                        .remove_label_values(&[topic, &partition.to_string()]);
                }
                for l in &lags {
                    metrics
                        .lag
                        .with_label_values(&[&l.topic, &l.partition.to_string()])
                        .set(l.messages);
                }
                shown = now;
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "Could not measure the consumer lag"),
            Err(e) => tracing::debug!(error = %e, "Consumer lag measurement did not run"),
        }
    }
    for (topic, partition) in &shown {
        let _ = metrics
            .lag
            .remove_label_values(&[topic, &partition.to_string()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_from_the_committed_offset_or_the_start() {
        assert_eq!(lag_of(Offset::Offset(40), 0, 100), 60);
        assert_eq!(lag_of(Offset::Invalid, 10, 100), 90);
        assert_eq!(
            lag_of(Offset::Offset(3), 10, 100),
            90,
            "below the log start"
        );
        assert_eq!(lag_of(Offset::Offset(100), 0, 100), 0);
        assert_eq!(lag_of(Offset::Offset(120), 0, 100), 0);
    }
}
