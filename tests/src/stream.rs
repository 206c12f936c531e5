//! A stream of outbox events from concurrent writer transactions: varied sizes, some commits
//! held back (they keep a small `id` while later ones commit), some rollbacks. Each writer owns
//! its aggregates, so per-aggregate `id` order equals commit order (as the real services get by
//! locking the aggregate row).

use std::collections::HashMap;
use std::time::Duration;

use outbox_writer::{enqueue, NewEvent};
use rand::Rng;
use sqlx::PgPool;
use uuid::Uuid;

/// Shape of the stream.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Concurrent writer tasks.
    pub writers: usize,
    /// Events attempted in all (committed + rolled back).
    pub events: usize,
    /// Aggregates per writer.
    pub aggregates_per_writer: usize,
    /// Largest transaction (events); sizes vary from 1 to this.
    pub max_txn_events: usize,
    /// One transaction in this many sleeps before committing.
    pub late_every: usize,
    /// One transaction in this many rolls back.
    pub rollback_every: usize,
    /// Pause between a writer's transactions (spreads the stream over time).
    pub pause: Duration,
    /// Number of the first writer: a second stream into the same topic starts past the first
    /// one's writers, so their aggregates (`w<writer>-a<n>`) and sequences never collide.
    pub first_writer: usize,
}

impl Default for StreamSpec {
    fn default() -> Self {
        Self {
            writers: 8,
            events: 10_000,
            aggregates_per_writer: 50,
            max_txn_events: 20,
            late_every: 15,
            rollback_every: 10,
            pause: Duration::from_millis(2),
            first_writer: 0,
        }
    }
}

/// One event as the writer saw it.
#[derive(Debug, Clone)]
pub struct WrittenEvent {
    /// Event id.
    pub event_id: Uuid,
    /// Aggregate (Kafka key).
    pub aggregate_id: String,
    /// Position in its aggregate's sequence (grows with commit order).
    pub seq: u64,
}

/// What the writers did.
#[derive(Debug, Default)]
pub struct Written {
    /// Committed.
    pub committed: Vec<WrittenEvent>,
    /// Rolled back on purpose: must never reach the broker.
    pub rolled_back: Vec<Uuid>,
    /// The commit failed with a connection error: the outcome is unknown (may or may not be
    /// on the broker, but if it is, in order).
    pub unknown: Vec<WrittenEvent>,
    /// Transactions that failed before commit and were rolled back by the server.
    pub failed_txns: usize,
}

impl Written {
    /// Appends another writer's results.
    pub fn merge(&mut self, other: Written) {
        self.committed.extend(other.committed);
        self.rolled_back.extend(other.rolled_back);
        self.unknown.extend(other.unknown);
        self.failed_txns += other.failed_txns;
    }
}

/// Writes the stream with `spec.writers` concurrent tasks; returns when all are done.
pub async fn write_stream(pool: &PgPool, aggregate_type: &str, spec: &StreamSpec) -> Written {
    let per_writer = spec.events.div_ceil(spec.writers);
    let mut tasks = Vec::new();
    for w in spec.first_writer..spec.first_writer + spec.writers {
        let pool = pool.clone();
        let spec = spec.clone();
        let aggregate_type = aggregate_type.to_owned();
        tasks.push(tokio::spawn(async move {
            writer(pool, &aggregate_type, w, per_writer, &spec).await
        }));
    }
    let mut all = Written::default();
    for t in tasks {
        all.merge(t.await.unwrap());
    }
    all
}

async fn writer(
    pool: PgPool,
    aggregate_type: &str,
    w: usize,
    events: usize,
    spec: &StreamSpec,
) -> Written {
    let mut out = Written::default();
    let mut seqs: HashMap<String, u64> = HashMap::new();
    let mut attempted = 0;
    let mut txn_no = 0usize;
    let pad = "x".repeat(200);
    while attempted < events {
        txn_no += 1;
        let (size, late, rollback) = {
            let mut rng = rand::thread_rng();
            (
                rng.gen_range(1..=spec.max_txn_events)
                    .min(events - attempted),
                txn_no.is_multiple_of(spec.late_every),
                txn_no.is_multiple_of(spec.rollback_every),
            )
        };
        let mut batch = Vec::with_capacity(size);
        let result: Result<(), sqlx::Error> = async {
            let mut tx = pool.begin().await?;
            for _ in 0..size {
                let a = rand::thread_rng().gen_range(0..spec.aggregates_per_writer);
                let agg = format!("w{w}-a{a}");
                // Sequence numbers are never reused, so a transaction with an unknown outcome
                // cannot make a later event look out of order.
                let seq = seqs.entry(agg.clone()).or_default();
                *seq += 1;
                let payload =
                    serde_json::json!({"aggregate": agg, "seq": *seq, "writer": w, "pad": pad});
                let ev = enqueue(
                    &mut *tx,
                    &NewEvent::new(aggregate_type, &agg, "StreamEvent", &payload),
                )
                .await
                .map_err(|e| match e {
                    outbox_writer::OutboxError::Database(e) => e,
                    other => panic!("{other}"),
                })?;
                batch.push(WrittenEvent {
                    event_id: ev.event_id,
                    aggregate_id: agg,
                    seq: *seq,
                });
            }
            if late {
                let hold = Duration::from_millis(rand::thread_rng().gen_range(100..400));
                tokio::time::sleep(hold).await;
            }
            if rollback {
                tx.rollback().await?;
                return Ok(());
            }
            match tx.commit().await {
                Ok(()) => Ok(()),
                Err(e) => Err(sqlx::Error::Protocol(format!(
                    "commit outcome unknown: {e}"
                ))),
            }
        }
        .await;
        attempted += batch.len().max(1);
        match result {
            Ok(()) if rollback => out
                .rolled_back
                .extend(batch.into_iter().map(|e| e.event_id)),
            Ok(()) => out.committed.extend(batch),
            Err(sqlx::Error::Protocol(m)) if m.starts_with("commit outcome unknown") => {
                out.unknown.extend(batch)
            }
            Err(_) => {
                // Failed before commit: the server rolled it back. Wait until the database
                // answers again (for a while; the next transaction finds out either way).
                out.failed_txns += 1;
                out.rolled_back
                    .extend(batch.into_iter().map(|e| e.event_id));
                let answers = || async {
                    let mut conn = pool.acquire().await.ok()?;
                    sqlx::query("SELECT 1")
                        .execute(&mut *conn)
                        .await
                        .ok()
                        .map(drop)
                };
                outbox_process::poll::poll_every(
                    Duration::from_millis(100),
                    Duration::from_secs(10),
                    answers,
                )
                .await;
            }
        }
        if !spec.pause.is_zero() {
            tokio::time::sleep(spec.pause).await;
        }
    }
    out
}
