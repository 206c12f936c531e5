//! The servers under test: a fresh database and fresh topics for every phase (so no phase
//! inherits another's dead rows, bloated indexes or partition logs), and the server settings
//! reported with the figures.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// Connection to the two servers, and a run id that names this run's databases and topics.
pub struct Infra {
    admin_url: String,
    brokers: String,
    kafka: outbox_kafka::KafkaSettings,
    partitions: i32,
    run_id: String,
    seq: AtomicU32,
    admin: AdminClient<DefaultClientContext>,
    /// Per-process CPU accounting of the servers (see [`crate::cpu`]).
    pub cpu: crate::cpu::CpuProbe,
}

impl std::fmt::Debug for Infra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Infra")
            .field("brokers", &self.brokers)
            .field("run_id", &self.run_id)
            .finish()
    }
}

/// Connects to `url` as the relay does (TLS from the URL, `DATABASE_PASSWORD_FILE`).
///
/// # Errors
/// An invalid URL or setting, an unreachable database.
pub async fn connect(url: &str) -> Result<PgConnection, sqlx::Error> {
    PgConnection::connect_with(&outbox_process::pg::connect_options(url)?).await
}

/// A database created for one phase.
#[derive(Debug, Clone)]
pub struct BenchDb {
    /// Database name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// A pool on it.
    pub pool: PgPool,
}

/// Server facts that change what the figures mean.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSettings {
    /// `SHOW synchronous_commit`.
    pub synchronous_commit: String,
    /// `SHOW fsync`.
    pub fsync: String,
    /// `SHOW server_version`.
    pub server_version: String,
    /// `SHOW shared_buffers`.
    pub shared_buffers: String,
}

impl Infra {
    /// Connects an admin client to the broker (nothing is sent yet).
    ///
    /// # Errors
    /// Invalid broker settings.
    pub fn new(
        admin_url: &str,
        brokers: &str,
        kafka: &outbox_kafka::KafkaSettings,
        partitions: i32,
    ) -> anyhow::Result<Self> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", brokers)
            .set("enable.metrics.push", "false");
        kafka.apply(&mut cfg);
        let admin = cfg.create().context("creating the Kafka admin client")?;
        Ok(Self {
            admin_url: admin_url.to_owned(),
            brokers: brokers.to_owned(),
            kafka: kafka.clone(),
            partitions,
            run_id: format!("{:08x}", rand::random::<u32>()),
            seq: AtomicU32::new(1),
            admin,
            cpu: crate::cpu::CpuProbe::default(),
        })
    }

    /// Kafka bootstrap servers.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// A client configuration for the brokers with the bench's security settings.
    pub fn client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.brokers);
        self.kafka.apply(&mut cfg);
        cfg
    }

    /// Partitions of the topics this run creates.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// A new topic prefix of this run for `phase`; the relay routes `order` events to
    /// `<prefix>order`.
    pub fn topic_prefix(&self, phase: &str) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("bench-{}.{phase}{seq}.", self.run_id)
    }

    /// Creates a database for `phase` and applies the outbox schema.
    ///
    /// # Errors
    /// Database errors.
    pub async fn fresh_database(&self, phase: &str) -> anyhow::Result<BenchDb> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let name = format!("bench_{}_{phase}{seq}", self.run_id);
        let db = test_support::db::create(
            &self.admin_url,
            &name,
            PgPoolOptions::new().max_connections(8),
        )
        .await
        .with_context(|| format!("creating database {name}"))?;
        outbox_writer::schema::migrate(&db.pool)
            .await
            .context("applying the outbox schema")?;
        Ok(BenchDb {
            name,
            url: db.url,
            pool: db.pool,
        })
    }

    /// Drops a phase's database (its pool is closed first).
    ///
    /// # Errors
    /// Database errors.
    pub async fn drop_database(&self, db: BenchDb) -> anyhow::Result<()> {
        db.pool.close().await;
        let mut admin = crate::infra::connect(&self.admin_url).await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name))
            .execute(&mut admin)
            .await
            .with_context(|| format!("dropping database {}", db.name))?;
        Ok(())
    }

    /// Flushes dirty buffers so the write-ahead log and checkpoints of preparing a backlog do
    /// not land in the timed part. Needs superuser; skipped quietly otherwise.
    pub async fn checkpoint(&self) {
        if let Ok(mut c) = crate::infra::connect(&self.admin_url).await {
            let _ = sqlx::query("CHECKPOINT").execute(&mut c).await;
        }
    }

    /// The CPU probe of this machine's processes, the postmaster found as the parent of a
    /// backend while that backend's connection is still open (once closed, the backend may
    /// be gone before `/proc` is read, and PostgreSQL's CPU would go unaccounted).
    pub async fn cpu_probe(&self) -> crate::cpu::CpuProbe {
        let Ok(mut c) = crate::infra::connect(&self.admin_url).await else {
            return crate::cpu::CpuProbe::new(None);
        };
        let pid: Option<i32> = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut c)
            .await
            .ok();
        let probe = crate::cpu::CpuProbe::new(pid.and_then(|p| u32::try_from(p).ok()));
        let _ = c.close().await;
        probe
    }

    /// Server settings reported with the figures.
    ///
    /// # Errors
    /// Database errors.
    pub async fn server_settings(&self) -> anyhow::Result<ServerSettings> {
        let mut c = crate::infra::connect(&self.admin_url)
            .await
            .context("connecting to DATABASE_URL")?;
        let mut show = Vec::new();
        for name in [
            "synchronous_commit",
            "fsync",
            "server_version",
            "shared_buffers",
        ] {
            let v: String = sqlx::query_scalar(&format!("SHOW {name}"))
                .fetch_one(&mut c)
                .await?;
            show.push(v);
        }
        let [synchronous_commit, fsync, server_version, shared_buffers] =
            <[String; 4]>::try_from(show).expect("four settings");
        Ok(ServerSettings {
            synchronous_commit,
            fsync,
            server_version,
            shared_buffers,
        })
    }

    /// Creates `topic` with this run's partition count (replication 1) and waits until the
    /// broker's metadata shows all its partitions.
    ///
    /// # Errors
    /// When the broker refuses or the topic does not show up within 30 s.
    pub async fn create_topic(&self, topic: &str) -> anyhow::Result<()> {
        self.create_topics(&[topic.to_owned()]).await
    }

    /// Creates every topic of `topics` (in requests of 100) and waits until the broker's
    /// metadata shows all their partitions.
    ///
    /// # Errors
    /// When the broker refuses or the topics do not show up within 30 s (plus 30 ms a topic).
    pub async fn create_topics(&self, topics: &[String]) -> anyhow::Result<()> {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for chunk in topics.chunks(100) {
            let new: Vec<NewTopic<'_>> = chunk
                .iter()
                .map(|t| NewTopic::new(t, self.partitions, TopicReplication::Fixed(1)))
                .collect();
            for r in self.admin.create_topics(&new, &opts).await? {
                match r {
                    Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((name, code)) => bail!("creating topic {name}: {code}"),
                }
            }
        }
        let wait = Duration::from_secs(30) + Duration::from_millis(30) * topics.len() as u32;
        let deadline = std::time::Instant::now() + wait;
        let mut missing: Vec<&String> = topics.iter().collect();
        loop {
            // One topic: ask for it alone; many: one request for the whole cluster.
            let one = (missing.len() == 1).then(|| missing[0].as_str());
            let md = tokio::task::block_in_place(|| {
                self.admin
                    .inner()
                    .fetch_metadata(one, Duration::from_secs(10))
            });
            if let Ok(md) = md {
                let ready: std::collections::HashSet<&str> = md
                    .topics()
                    .iter()
                    .filter(|t| {
                        t.error().is_none() && t.partitions().len() == self.partitions as usize
                    })
                    .map(|t| t.name())
                    .collect();
                missing.retain(|t| !ready.contains(t.as_str()));
                if missing.is_empty() {
                    return Ok(());
                }
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "{} of {} topics (first {}) did not appear in the broker's metadata within {wait:?}",
                    missing.len(),
                    topics.len(),
                    missing.first().map_or("-", |t| t.as_str())
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes `topics`, best effort (frees the memory of a broker that keeps them in memory);
    /// returns how many the broker refused.
    pub async fn delete_topics(&self, topics: &[String]) -> usize {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let mut refused = 0;
        for chunk in topics.chunks(100) {
            let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
            match self.admin.delete_topics(&names, &opts).await {
                Ok(rs) => refused += rs.iter().filter(|r| r.is_err()).count(),
                Err(_) => refused += names.len(),
            }
        }
        refused
    }
}
