//! Guarantee 4 at its root, the consumer runtime's transaction against PostgreSQL only: an
//! event's effect and its inbox row commit together or not at all (a retryable failure rolls
//! both back, an effect the database refuses is dead-lettered with nothing kept), a redelivery
//! is skipped and counted, and ten concurrent deliveries of one event apply it once.

use e2e::fulfilment::count;
use outbox_consumer::{
    apply, Applied, Disposition, Effect, Event, Handler, HandlerError, RawMessage,
};
use serde_json::{json, Value};
use sqlx::PgConnection;
use uuid::Uuid;

/// Records each event in `effects`; the payload says how to fail.
struct Recorder;

impl Handler for Recorder {
    fn versions(&self, _event_type: &str) -> Option<&'static [u32]> {
        Some(&[1])
    }

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Effect, HandlerError> {
        let n = event.payload["n"].as_i64().unwrap_or(1);
        let sleep_ms = event.payload["sleep_ms"].as_i64().unwrap_or(0);
        sqlx::query("INSERT INTO effects (event_id, n) VALUES ($1, $2)")
            .bind(event.event_id())
            .bind(n)
            .execute(&mut *conn)
            .await?;
        if sleep_ms > 0 {
            sqlx::query("SELECT pg_sleep($1::float8 / 1000)")
                .bind(sleep_ms)
                .execute(&mut *conn)
                .await?;
        }
        match event.payload["fail"].as_str() {
            Some("transient") => Err(HandlerError::Transient("dependency down".into())),
            _ => Ok(Effect::Changed),
        }
    }
}

fn event(id: Uuid, payload: Value) -> Event {
    let raw = RawMessage {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        key: Some(b"k".to_vec()),
        payload: Some(payload.to_string().into_bytes()),
        headers: vec![
            ("event_id".into(), Some(id.to_string().into_bytes())),
            ("event_type".into(), Some(b"Thing".to_vec())),
        ],
    };
    raw.envelope().unwrap().into_event(&raw, &[1]).unwrap()
}

async fn inbox_db() -> sqlx::PgPool {
    let db = e2e::db::fresh_database().await;
    outbox_writer::schema::migrate_inbox(&db.pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE effects (event_id uuid NOT NULL, n bigint NOT NULL CHECK (n >= 0))")
        .execute(&db.pool)
        .await
        .unwrap();
    db.pool
}

#[tokio::test]
async fn apply_commits_the_effect_with_its_inbox_row_or_neither() {
    let pool = inbox_db().await;
    let effects = |id: Uuid| {
        let pool = pool.clone();
        async move {
            count(
                &pool,
                &format!("SELECT count(*) FROM effects WHERE event_id = '{id}'"),
            )
            .await
        }
    };
    let inbox = |id: Uuid| {
        let pool = pool.clone();
        async move {
            count(
                &pool,
                &format!("SELECT count(*) FROM inbox WHERE event_id = '{id}'"),
            )
            .await
        }
    };

    // First delivery: effect and inbox row commit together.
    let ok = Uuid::new_v4();
    let first = apply(&pool, "test", &Recorder, &event(ok, json!({})))
        .await
        .unwrap();
    assert_eq!(first, Applied::Effect(Effect::Changed));
    assert_eq!((effects(ok).await, inbox(ok).await), (1, 1));
    // Redelivery: skipped, counted in the inbox row.
    assert_eq!(
        apply(&pool, "test", &Recorder, &event(ok, json!({})))
            .await
            .unwrap(),
        Applied::Duplicate
    );
    assert_eq!(
        apply(&pool, "test", &Recorder, &event(ok, json!({})))
            .await
            .unwrap(),
        Applied::Duplicate
    );
    assert_eq!(effects(ok).await, 1, "no second effect");
    assert_eq!(
        count(
            &pool,
            &format!("SELECT duplicates::bigint FROM inbox WHERE event_id = '{ok}'")
        )
        .await,
        2
    );
    // Another consumer of the same database has its own inbox rows.
    assert_eq!(
        apply(&pool, "other", &Recorder, &event(ok, json!({})))
            .await
            .unwrap(),
        Applied::Effect(Effect::Changed)
    );

    // A retryable failure rolls back the effect and the inbox row: the retry applies it.
    let flaky = Uuid::new_v4();
    let err = apply(
        &pool,
        "test",
        &Recorder,
        &event(flaky, json!({"fail": "transient"})),
    )
    .await
    .unwrap_err();
    assert_eq!(err.disposition(), Disposition::Retry);
    assert_eq!((effects(flaky).await, inbox(flaky).await), (0, 0));
    assert_eq!(
        apply(&pool, "test", &Recorder, &event(flaky, json!({})))
            .await
            .unwrap(),
        Applied::Effect(Effect::Changed)
    );

    // An effect the database refuses (CHECK) can never apply: dead-lettered, nothing kept.
    let refused = Uuid::new_v4();
    let err = apply(&pool, "test", &Recorder, &event(refused, json!({"n": -1})))
        .await
        .unwrap_err();
    assert_eq!(
        err.disposition(),
        Disposition::DeadLetter,
        "{}",
        err.describe()
    );
    assert!(
        err.describe().contains("SQLSTATE 23514"),
        "{}",
        err.describe()
    );
    assert_eq!((effects(refused).await, inbox(refused).await), (0, 0));
}

#[tokio::test]
async fn concurrent_deliveries_of_one_event_apply_it_once() {
    let pool = inbox_db().await;
    let id = Uuid::new_v4();
    // Ten deliveries at once, each holding its transaction open for a while.
    let results: Vec<Applied> = futures::future::join_all((0..10).map(|_| {
        let pool = pool.clone();
        async move {
            apply(
                &pool,
                "test",
                &Recorder,
                &event(id, json!({"sleep_ms": 200})),
            )
            .await
            .unwrap()
        }
    }))
    .await;
    let applied = results
        .iter()
        .filter(|a| **a == Applied::Effect(Effect::Changed))
        .count();
    assert_eq!(applied, 1, "{results:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM effects").await, 1);
    assert_eq!(
        count(&pool, "SELECT sum(duplicates)::bigint FROM inbox").await,
        9
    );
}
