//! What the per-aggregate insert lock rests on, enforced (migration
//! `20260101000006_aggregate_lock_preconditions.sql`; docs/src/publishing.md, "Order"): only a
//! transaction-local opt-out turns it off, explicit ids are refused, and an id sequence with a
//! cache is refused by `outbox-relay run` and `migrate`.

use std::time::Duration;

use e2e::proc::{relay_cli, RelayArgs, RelayProcess};
use sqlx::{Connection, PgConnection};

/// Inserts one event of aggregate `aggregate` on `conn` (in whatever transaction is open).
async fn insert(conn: &mut PgConnection, aggregate: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', $1, 'E', '{}') RETURNING id",
    )
    .bind(aggregate)
    .fetch_one(conn)
    .await
}

/// Advisory locks `conn`'s backend holds (the insert lock is one per aggregate).
async fn advisory_locks(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A pooled connection keeps a session-level `SET outbox.aggregate_lock = 'off'` into every
/// later transaction: such a transaction (and one with the old `SET LOCAL`) still takes the
/// lock; only `outbox_aggregate_lock_off()`, for its own transaction, turns it off, and not for
/// the next one.
#[tokio::test(flavor = "multi_thread")]
async fn only_a_transaction_local_opt_out_turns_the_insert_lock_off() {
    let db = e2e::db::fresh_database().await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();

    // Someone's earlier session-level opt-out, left on the pooled connection.
    sqlx::query("SET outbox.aggregate_lock = 'off'")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    insert(&mut tx, "a-1").await.unwrap();
    assert_eq!(
        advisory_locks(&mut tx).await,
        1,
        "a later, unrelated transaction on that connection takes the aggregate's lock"
    );
    tx.commit().await.unwrap();

    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET LOCAL outbox.aggregate_lock = 'off'")
        .execute(&mut *tx)
        .await
        .unwrap();
    insert(&mut tx, "a-2").await.unwrap();
    assert_eq!(
        advisory_locks(&mut tx).await,
        1,
        "SET LOCAL is not the opt-out either"
    );
    tx.commit().await.unwrap();

    // The opt-out: this transaction only.
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT outbox_aggregate_lock_off()")
        .execute(&mut *tx)
        .await
        .unwrap();
    insert(&mut tx, "a-3").await.unwrap();
    insert(&mut tx, "a-4").await.unwrap();
    assert_eq!(
        advisory_locks(&mut tx).await,
        0,
        "the function turns it off for its transaction"
    );
    tx.commit().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    insert(&mut tx, "a-5").await.unwrap();
    assert_eq!(advisory_locks(&mut tx).await, 1, "and for no later one");
    tx.commit().await.unwrap();
}

/// An explicit id (`OVERRIDING SYSTEM VALUE`) is refused with a clear error, and nothing is
/// written.
#[tokio::test(flavor = "multi_thread")]
async fn an_explicit_outbox_id_is_refused_with_a_clear_error() {
    let db = e2e::db::fresh_database().await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    // Once in a fresh session, once after the session inserted rows (the sequence has a
    // current value then), once with the lock turned off.
    for (n, opt_out) in [(1_000_000i64, false), (2, false), (3, true)] {
        if n == 2 {
            insert(&mut conn, "before").await.unwrap();
        }
        let mut tx = conn.begin().await.unwrap();
        if opt_out {
            sqlx::query("SELECT outbox_aggregate_lock_off()")
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        let err = sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             OVERRIDING SYSTEM VALUE VALUES ($1, 'order', 'x', 'E', '{}')",
        )
        .bind(n)
        .execute(&mut *tx)
        .await
        .expect_err("an explicit id must be refused");
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("428C9"), "{err}");
        assert!(
            db_err.message().contains("may not be given its id"),
            "the error says what is wrong: {err}"
        );
        tx.rollback().await.unwrap();
    }
    let explicit: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE aggregate_id = 'x'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(explicit, 0, "nothing written");
}

/// An id sequence with a cache hands each session a block of ids: ids stop following commit
/// order. `migrate` refuses it and so does `run`, each naming the fix, and neither publishes.
#[tokio::test(flavor = "multi_thread")]
async fn an_id_sequence_with_a_cache_is_refused_by_migrate_and_run() {
    let db = e2e::db::fresh_database().await;
    let brokers = e2e::kafka_brokers();
    let prefix = e2e::unique_topic_prefix();
    sqlx::query("ALTER SEQUENCE outbox_id_seq CACHE 20")
        .execute(&db.pool)
        .await
        .unwrap();
    let out = relay_cli(&["migrate", "--database-url", &db.url]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "migrate must refuse: {said}");
    assert!(
        said.contains("CACHE 20") && said.contains("ALTER SEQUENCE outbox_id_seq CACHE 1"),
        "migrate names the problem and the fix: {said}"
    );

    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    insert(&mut conn, "o-1").await.unwrap();
    let mut relay = RelayProcess::start(&RelayArgs::new(&db.url, &brokers, &prefix, "cached-seq"));
    let status = e2e::wait_for(
        "the relay to refuse and exit",
        Duration::from_secs(60),
        || {
            let status = relay.try_wait();
            async move { status }
        },
    )
    .await;
    assert!(!status.success(), "the relay exits non-zero");
    let log = relay.log_text();
    assert!(
        log.contains("ALTER SEQUENCE outbox_id_seq CACHE 1"),
        "the relay names the fix: {log}"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "nothing was published");

    sqlx::query("ALTER SEQUENCE outbox_id_seq CACHE 1")
        .execute(&db.pool)
        .await
        .unwrap();
    let out = relay_cli(&["migrate", "--database-url", &db.url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
