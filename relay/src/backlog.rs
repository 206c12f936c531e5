//! The relay's periodic view of its database for the metrics: the backlog per topic (and in
//! total), and the age of the oldest open transaction of the database.
//!
//! The backlog is grouped by the topic an event goes to (`topic` if set, else
//! `<prefix><aggregate_type>`), one statement every few seconds. Its label values are bounded:
//! the [`TOPIC_SERIES`] topics with the most events get their own series, the rest are summed
//! into `topic="other"`.
//!
//! The oldest open transaction matters because the outbox is a table of constant churn: every
//! published row is deleted, and vacuum can only reclaim dead rows no open transaction may
//! still see. One transaction left open for an hour (a stuck client, a forgotten `psql`) makes
//! the outbox and its index grow for that hour, and every claim scans the dead rows.

use std::collections::BTreeSet;

use sqlx::Row;

use crate::metrics::Metrics;
use crate::store::Store;

/// Most topics with a series of their own; the others are summed into `other`.
pub const TOPIC_SERIES: usize = 20;

/// The label of the topics past [`TOPIC_SERIES`].
pub const OTHER_TOPICS: &str = "other";

/// Unpublished events of one topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicBacklog {
    /// The topic (or [`OTHER_TOPICS`]).
    pub topic: String,
    /// Unpublished events.
    pub events: i64,
    /// Age of the oldest of them in seconds.
    pub oldest_age_seconds: f64,
}

impl Store {
    /// Unpublished events and the oldest one's age per destination topic, largest first.
    ///
    /// # Errors
    /// Database errors.
    pub async fn backlog_by_topic(&self, prefix: &str) -> Result<Vec<TopicBacklog>, sqlx::Error> {
        let mut s = self.session().await?;
        let rows = sqlx::query(
            "SELECT COALESCE(topic, $1 || aggregate_type) AS topic, count(*) AS n, \
                    extract(epoch FROM now() - min(created_at))::float8 AS age \
             FROM outbox GROUP BY 1 ORDER BY n DESC, topic",
        )
        .bind(prefix)
        .fetch_all(s.conn())
        .await?;
        s.finish().await?;
        Ok(rows
            .iter()
            .map(|r| TopicBacklog {
                topic: r.get("topic"),
                events: r.get("n"),
                oldest_age_seconds: r.get::<f64, _>("age").max(0.0),
            })
            .collect())
    }

    /// Seconds since the start of the oldest transaction still open in this database (other
    /// client backends than this one; 0 when there is none). Needs `pg_read_all_stats` (or
    /// the same role as the other sessions) to see other roles' transactions.
    ///
    /// # Errors
    /// Database errors.
    pub async fn oldest_transaction_age(&self) -> Result<f64, sqlx::Error> {
        let mut s = self.session().await?;
        let age: f64 = sqlx::query_scalar(
            "SELECT COALESCE(extract(epoch FROM now() - min(xact_start)), 0)::float8 \
             FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND backend_type = 'client backend' AND xact_start IS NOT NULL",
        )
        .fetch_one(s.conn())
        .await?;
        s.finish().await?;
        Ok(age.max(0.0))
    }
}

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
}
