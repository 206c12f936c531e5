//! The backlog gauges of the metrics, per topic, per bucket and in total: the relay reads the
//! backlog every few seconds
//! ([`Store::backlog_by_topic_and_bucket`](crate::store::Store::backlog_by_topic_and_bucket))
//! and publishes it here. Their label values are bounded: the [`TOPIC_SERIES`] topics with the
//! most events get their own series, the rest are summed into `topic="other"`; buckets are at
//! most 256. A topic or bucket whose backlog drained reads 0 instead of disappearing.

use std::collections::BTreeSet;

use crate::metrics::Metrics;
use crate::store::{BucketBacklog, TopicBacklog};

/// Most topics with a series of their own; the others are summed into `other`.
pub const TOPIC_SERIES: usize = 20;

/// The label of the topics past [`TOPIC_SERIES`].
pub const OTHER_TOPICS: &str = "other";

/// Folds the per-topic backlog into at most [`TOPIC_SERIES`] topics plus [`OTHER_TOPICS`]
/// (input largest first).
pub fn bounded(by_topic: Vec<TopicBacklog>) -> Vec<TopicBacklog> {
    let mut out: Vec<TopicBacklog> = by_topic.iter().take(TOPIC_SERIES).cloned().collect();
    let rest = &by_topic[out.len()..];
    if !rest.is_empty() {
        out.push(TopicBacklog {
            topic: OTHER_TOPICS.to_owned(),
            events: rest.iter().map(|t| t.events).sum(),
            oldest_age_seconds: rest
                .iter()
                .map(|t| t.oldest_age_seconds)
                .fold(0.0, f64::max),
        });
    }
    out
}

/// Remembers which topic series exist, so a topic whose backlog drained reads 0 (instead of
/// disappearing), and the number of series stays bounded.
#[derive(Debug, Default)]
pub struct TopicSeries {
    shown: BTreeSet<String>,
}

impl TopicSeries {
    /// Publishes one refresh: the total backlog and oldest age, and the per-topic gauges.
    pub fn publish(&mut self, metrics: &Metrics, by_topic: Vec<TopicBacklog>) {
        let total: i64 = by_topic.iter().map(|t| t.events).sum();
        let oldest = by_topic
            .iter()
            .map(|t| t.oldest_age_seconds)
            .fold(0.0, f64::max);
        metrics.backlog.set(total);
        metrics.oldest_age.set(oldest);
        let now = bounded(by_topic);
        // Past twice the bound of remembered series (topics come and go), start over.
        if self.shown.len() > 2 * TOPIC_SERIES {
            metrics.backlog_by_topic.reset();
            metrics.oldest_age_by_topic.reset();
            self.shown.clear();
        }
        for gone in self
            .shown
            .iter()
            .filter(|t| !now.iter().any(|n| &n.topic == *t))
        {
            metrics.backlog_by_topic.with_label_values(&[gone]).set(0);
            metrics
                .oldest_age_by_topic
                .with_label_values(&[gone])
                .set(0.0);
        }
        for t in now {
            metrics
                .backlog_by_topic
                .with_label_values(&[&t.topic])
                .set(t.events);
            metrics
                .oldest_age_by_topic
                .with_label_values(&[&t.topic])
                .set(t.oldest_age_seconds);
            self.shown.insert(t.topic);
        }
    }
}

/// Remembers which bucket series exist, so a bucket whose backlog drained reads 0.
#[derive(Debug, Default)]
pub struct BucketSeries {
    shown: BTreeSet<i16>,
}

impl BucketSeries {
    /// Publishes one refresh of the per-bucket gauges.
    pub fn publish(&mut self, metrics: &Metrics, by_bucket: Vec<BucketBacklog>) {
        for gone in self
            .shown
            .iter()
            .filter(|b| !by_bucket.iter().any(|n| n.bucket == **b))
        {
            let label = gone.to_string();
            metrics
                .backlog_by_bucket
                .with_label_values(&[&label])
                .set(0);
            metrics
                .oldest_age_by_bucket
                .with_label_values(&[&label])
                .set(0.0);
        }
        for b in by_bucket {
            let label = b.bucket.to_string();
            metrics
                .backlog_by_bucket
                .with_label_values(&[&label])
                .set(b.events);
            metrics
                .oldest_age_by_bucket
                .with_label_values(&[&label])
                .set(b.oldest_age_seconds);
            self.shown.insert(b.bucket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(topic: &str, events: i64, age: f64) -> TopicBacklog {
        TopicBacklog {
            topic: topic.into(),
            events,
            oldest_age_seconds: age,
        }
    }

    #[test]
    fn topics_past_the_bound_are_summed_into_other() {
        let many: Vec<_> = (0..TOPIC_SERIES + 5)
            .map(|i| t(&format!("t{i}"), 100 - i as i64, i as f64))
            .collect();
        let b = bounded(many);
        assert_eq!(b.len(), TOPIC_SERIES + 1);
        let other = b.last().unwrap();
        assert_eq!(other.topic, OTHER_TOPICS);
        assert_eq!(
            other.events,
            (TOPIC_SERIES as i64..TOPIC_SERIES as i64 + 5)
                .map(|i| 100 - i)
                .sum::<i64>()
        );
        assert_eq!(other.oldest_age_seconds, (TOPIC_SERIES + 4) as f64);
        assert_eq!(bounded(vec![t("a", 1, 1.0)]), vec![t("a", 1, 1.0)]);
    }

    #[test]
    fn a_drained_topic_reads_zero() {
        let m = Metrics::new();
        let mut s = TopicSeries::default();
        s.publish(&m, vec![t("a", 5, 2.0), t("b", 1, 9.0)]);
        assert_eq!(m.backlog.get(), 6);
        assert_eq!(m.oldest_age.get(), 9.0);
        s.publish(&m, vec![t("b", 1, 10.0)]);
        assert_eq!(m.backlog_by_topic.with_label_values(&["a"]).get(), 0);
        assert_eq!(m.backlog_by_topic.with_label_values(&["b"]).get(), 1);
        assert_eq!(m.backlog.get(), 1);
    }

    #[test]
    fn a_drained_bucket_reads_zero() {
        let b = |bucket, events| BucketBacklog {
            bucket,
            events,
            oldest_age_seconds: 1.5,
        };
        let m = Metrics::new();
        let mut s = BucketSeries::default();
        s.publish(&m, vec![b(0, 3), b(5, 2)]);
        s.publish(&m, vec![b(5, 1)]);
        assert_eq!(m.backlog_by_bucket.with_label_values(&["0"]).get(), 0);
        assert_eq!(m.oldest_age_by_bucket.with_label_values(&["0"]).get(), 0.0);
        assert_eq!(m.backlog_by_bucket.with_label_values(&["5"]).get(), 1);
        assert_eq!(m.oldest_age_by_bucket.with_label_values(&["5"]).get(), 1.5);
    }
}
