//! The backlog as `status` and the metrics read it: how many events are unpublished and how old
//! the oldest is, in total, per destination topic and per bucket (their gauges are
//! [`crate::backlog_gauges`]); and the age of the oldest open transaction of the database.
//!
//! The backlog per topic is grouped by the topic an event goes to (`topic` if set, else
//! `<prefix><aggregate_type>`), one statement every few seconds.
//!
//! The oldest open transaction matters because the outbox is a table of constant churn: every
//! published row is deleted, and vacuum can only reclaim dead rows no open transaction may
//! still see. One transaction left open for an hour (a stuck client, a forgotten `psql`) makes
//! the outbox and its index grow for that hour, and every claim scans the dead rows.

use sqlx::Row;

use super::pool::Store;

/// Backlog figures for `status` and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    /// Unpublished events.
    pub unpublished: i64,
    /// Age of the oldest unpublished event in seconds (0 when there is none).
    pub oldest_age_seconds: f64,
}

/// Unpublished events of one topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicBacklog {
    /// The topic (or [`OTHER_TOPICS`](crate::backlog_gauges::OTHER_TOPICS)).
    pub topic: String,
    /// Unpublished events.
    pub events: i64,
    /// Age of the oldest of them in seconds.
    pub oldest_age_seconds: f64,
}

/// Unpublished events of one bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketBacklog {
    /// The bucket.
    pub bucket: i16,
    /// Unpublished events.
    pub events: i64,
    /// Age of the oldest of them in seconds.
    pub oldest_age_seconds: f64,
}

impl Store {
    /// Unpublished events in total and the oldest one's age.
    ///
    /// # Errors
    /// Database errors.
    pub async fn backlog(&self) -> Result<Backlog, sqlx::Error> {
        let mut s = self.session().await?;
        let row = sqlx::query(
            "SELECT count(*) AS n, \
                    COALESCE(extract(epoch FROM now() - min(created_at))::float8, 0) AS age \
             FROM outbox",
        )
        .fetch_one(s.conn())
        .await?;
        s.finish().await?;
        Ok(Backlog {
            unpublished: row.get("n"),
            oldest_age_seconds: row.get::<f64, _>("age").max(0.0),
        })
    }

    /// Unpublished events and the oldest one's age per destination topic (largest first) and
    /// per bucket (by bucket), in one scan of the outbox.
    ///
    /// # Errors
    /// Database errors.
    pub async fn backlog_by_topic_and_bucket(
        &self,
        prefix: &str,
    ) -> Result<(Vec<TopicBacklog>, Vec<BucketBacklog>), sqlx::Error> {
        let mut s = self.session().await?;
        let rows = sqlx::query(
            "SELECT topic, bucket, GROUPING(topic) = 1 AS per_bucket, count(*) AS n, \
                    extract(epoch FROM now() - min(created_at))::float8 AS age \
             FROM (SELECT COALESCE(topic, $1 || aggregate_type) AS topic, bucket, created_at \
                   FROM outbox) o \
             GROUP BY GROUPING SETS ((topic), (bucket)) ORDER BY n DESC, topic, bucket",
        )
        .bind(prefix)
        .fetch_all(s.conn())
        .await?;
        s.finish().await?;
        let (mut topics, mut buckets) = (Vec::new(), Vec::new());
        for r in &rows {
            let (events, oldest_age_seconds) = (r.get("n"), r.get::<f64, _>("age").max(0.0));
            if r.get("per_bucket") {
                buckets.push(BucketBacklog {
                    bucket: r.get("bucket"),
                    events,
                    oldest_age_seconds,
                });
            } else {
                topics.push(TopicBacklog {
                    topic: r.get("topic"),
                    events,
                    oldest_age_seconds,
                });
            }
        }
        buckets.sort_by_key(|b| b.bucket);
        Ok((topics, buckets))
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
