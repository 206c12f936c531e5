//! The operator's `discard` and `redrive` of one parked event, run at the same time as real
//! processes, each paused by a real lock at the step where the other may slip in: whichever
//! wins, the event ends in exactly one place (the outbox, to be sent, or the audit table) and
//! both commands say what really happened (guarantee 5: a parked event is either redriven or
//! discarded into the audit table).

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use e2e::proc::relay_binary;
use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

/// One event, parked as the relay parks it.
async fn parked_event(pool: &PgPool) -> Uuid {
    let (id, event_id): (i64, Uuid) = sqlx::query_as(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'race-1', 'E', '{}') RETURNING id, event_id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox_failure (outbox_id, event_id, aggregate_type, aggregate_id, \
             error_class, error_message, attempts, retry_at, parked_at) \
         VALUES ($1, $2, 'order', 'race-1', 'refused', 'too large', 3, now(), now())",
    )
    .bind(id)
    .bind(event_id)
    .execute(pool)
    .await
    .unwrap();
    event_id
}

fn start(args: &[&str], url: &str) -> Child {
    Command::new(relay_binary())
        .args(args)
        .args(["--database-url", url, "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start outbox-relay")
}

/// Waits for the command to exit; its exit code and JSON answer.
async fn finish(child: Mutex<Child>) -> (i32, Value) {
    let child = child.into_inner().unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// Waits until a backend runs a statement starting with `prefix` and waits for a lock, or
/// until `child` exited (it did not have to wait); true when it waits.
async fn waits_for_lock(pool: &PgPool, prefix: &str, child: &Mutex<Child>) -> bool {
    let like = format!("{prefix}%");
    e2e::wait_for(
        &format!("a statement '{prefix}...' waiting for a lock, or its command exiting"),
        Duration::from_secs(20),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                   AND ltrim(query) LIKE $1",
            )
            .bind(&like)
            .fetch_one(pool)
            .await
            .unwrap();
            if waiting > 0 {
                return Some(true);
            }
            child.lock().unwrap().try_wait().unwrap().map(|_| false)
        },
    )
    .await
}

/// Where the event is: (in the outbox, in the audit table, has a failure row).
async fn whereabouts(pool: &PgPool, event_id: Uuid) -> (bool, bool, bool) {
    sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM outbox WHERE event_id = $1), \
                EXISTS (SELECT 1 FROM outbox_discarded WHERE event_id = $1), \
                EXISTS (SELECT 1 FROM outbox_failure WHERE event_id = $1)",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn discard_paused_at_its_copy_while_redrive_runs_keeps_the_event_in_the_audit_table() {
    let db = e2e::db::fresh_database().await;
    let event_id = parked_event(&db.pool).await;
    let id = event_id.to_string();

    // The audit table is locked: discard stops at its copy, after it read "parked".
    let mut holder = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("LOCK TABLE outbox_discarded IN SHARE MODE")
        .execute(&mut holder)
        .await
        .unwrap();
    let discard = Mutex::new(start(
        &["discard", "--event-id", &id, "--reason", "race test"],
        &db.url,
    ));
    assert!(
        waits_for_lock(&db.pool, "INSERT INTO outbox_discarded", &discard).await,
        "discard waits at its copy step"
    );
    // Redrive of the same event meanwhile: it must wait for discard, not release the event
    // under its feet.
    let redrive = Mutex::new(start(&["redrive", "--event-id", &id], &db.url));
    let redrive_waited = waits_for_lock(&db.pool, "DELETE FROM outbox_failure", &redrive).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    let (discard_code, discarded) = finish(discard).await;
    let (redrive_code, redriven) = finish(redrive).await;
    let place = whereabouts(&db.pool, event_id).await;
    assert_eq!(
        (discard_code, discarded["result"].as_str()),
        (0, Some("discarded")),
        "{discarded}"
    );
    assert_eq!(
        place,
        (false, true, false),
        "the event is in the audit table only (outbox, audit, failure row); redrive: {redriven}"
    );
    assert_eq!(
        (redrive_code, redriven["redriven"].as_i64()),
        (2, Some(0)),
        "redrive found nothing to release once the event was discarded: {redriven}"
    );
    assert!(redrive_waited, "redrive waited for the discard to finish");
}

#[tokio::test]
async fn redrive_paused_before_its_delete_while_discard_runs_keeps_the_event_to_be_sent() {
    let db = e2e::db::fresh_database().await;
    let event_id = parked_event(&db.pool).await;
    let id = event_id.to_string();

    // The failure row is locked: redrive's delete waits; discard starts behind it.
    let mut holder = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_failure WHERE event_id = $1 FOR UPDATE")
        .bind(event_id)
        .execute(&mut holder)
        .await
        .unwrap();
    let redrive = Mutex::new(start(&["redrive", "--event-id", &id], &db.url));
    assert!(
        waits_for_lock(&db.pool, "DELETE FROM outbox_failure", &redrive).await,
        "redrive waits at its delete"
    );
    let discard = Mutex::new(start(
        &["discard", "--event-id", &id, "--reason", "race test"],
        &db.url,
    ));
    // Discard reads the event (parked, as far as committed data goes) and must wait for the
    // failure row before it acts on that.
    let discard_waited = e2e::wait_for(
        "discard to wait for a lock or exit",
        Duration::from_secs(20),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                 AND ltrim(query) NOT LIKE 'DELETE FROM outbox_failure WHERE event_id%'",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap();
            if waiting > 0 {
                return Some(true);
            }
            discard.lock().unwrap().try_wait().unwrap().map(|_| false)
        },
    )
    .await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    let (redrive_code, redriven) = finish(redrive).await;
    let (discard_code, discarded) = finish(discard).await;
    let place = whereabouts(&db.pool, event_id).await;
    assert_eq!(
        (redrive_code, redriven["redriven"].as_i64()),
        (0, Some(1)),
        "{redriven}"
    );
    assert_eq!(
        place,
        (true, false, false),
        "the redriven event waits in the outbox to be sent, not in the audit table \
         (outbox, audit, failure row); discard: {discarded}"
    );
    assert_eq!(
        (discard_code, discarded["result"].as_str()),
        (2, Some("not_parked")),
        "discard refused an event that was no longer parked: {discarded}"
    );
    assert!(discard_waited, "discard waited for the redrive to finish");
}
