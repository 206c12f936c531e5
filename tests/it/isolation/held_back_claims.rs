//! The relay's failure SQL: the claim leaves out what waits behind a failure, the same way
//! whichever plan it uses (the hashed subplans for a small failure table, the per-row probe for
//! a large one), and a failure is recorded whatever its attempt count; a column whose type
//! drifted from the migrations' fails the claim by name.

use std::collections::HashMap;
use std::time::Duration;

use outbox_relay::failure::FailureClass;
use outbox_relay::parking::{FailureState, FailureView, NewFailure, ParkPolicy, Recorded};
use outbox_relay::store::{
    ClaimLimits, ClaimedBatch, FailureFilter, LeaseToken, Store, SMALL_FAILURE_TABLE,
};

/// Changes the type of the outbox's `topic` column: `type_using` is `<type> USING <expr>`.
async fn alter_topic(pool: &sqlx::PgPool, type_using: &str) {
    sqlx::query(&format!(
        "ALTER TABLE outbox ALTER COLUMN topic TYPE {type_using}"
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// A fresh outbox database, its store, and the lease held there by `instance`.
async fn leased(instance: &str) -> (e2e::db::TestDb, Store, LeaseToken) {
    let db = e2e::db::fresh_database().await;
    let store = Store::from_pool(db.pool.clone());
    let token = store
        .try_acquire_lease("default", instance, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    (db, store, token)
}

async fn event(pool: &sqlx::PgPool, aggregate: &str) -> (i64, uuid::Uuid) {
    sqlx::query_as(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', $1, 'E', '{}') RETURNING id, event_id",
    )
    .bind(aggregate)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn failure(
    pool: &sqlx::PgPool,
    (id, event_id): (i64, uuid::Uuid),
    aggregate: &str,
    state: &str,
) {
    sqlx::query(
        "INSERT INTO outbox_failure (outbox_id, event_id, aggregate_type, aggregate_id, \
             error_class, error_message, attempts, retry_at, parked_at) \
         VALUES ($1, $2, 'order', $3, 'delivery', 'x', 3, \
                 CASE $4 WHEN 'due' THEN now() ELSE now() + interval '1 hour' END, \
                 CASE $4 WHEN 'parked' THEN now() END)",
    )
    .bind(id)
    .bind(event_id)
    .bind(aggregate)
    .bind(state)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn hashed_and_probed_claims_leave_out_the_same_held_back_events() {
    let (db, store, token) = leased("claim-filter").await;

    // due-1: its first event failed and is due for a retry; two events wait behind it.
    // later-1: failed, retried in an hour. parked-1: parked. healthy-*: nothing failed.
    let mut expected = Vec::new();
    let due = event(&db.pool, "due-1").await;
    failure(&db.pool, due, "due-1", "due").await;
    expected.push(due.0);
    for _ in 0..2 {
        event(&db.pool, "due-1").await;
    }
    for (agg, state) in [("later-1", "later"), ("parked-1", "parked")] {
        let first = event(&db.pool, agg).await;
        failure(&db.pool, first, agg, state).await;
        event(&db.pool, agg).await;
    }
    for i in 0..5 {
        expected.push(event(&db.pool, &format!("healthy-{i}")).await.0);
    }

    let claim = |filter| {
        let store = store.clone();
        let token = token.clone();
        async move {
            let limits = ClaimLimits {
                rows: 1_000,
                bytes: 1 << 30,
                failures: filter,
                ids: outbox_relay::store::IdRange::ALL,
            };
            let ClaimedBatch::Rows(rows, _) = store.claim(&token, limits).await.unwrap() else {
                panic!("lease lost")
            };
            rows.iter()
                .map(|r| (r.id(), r.attempts))
                .collect::<Vec<_>>()
        }
    };
    let ids = |rows: &[(i64, Option<i32>)]| rows.iter().map(|(id, _)| *id).collect::<Vec<_>>();

    let small = store.failure_view().await.unwrap();
    assert!(small.any && !small.large, "{small:?}");
    let hashed = claim(FailureFilter::Hashed).await;
    assert_eq!(
        ids(&hashed),
        expected,
        "hashed: the due event, not what waits behind it"
    );
    assert_eq!(
        hashed[0],
        (due.0, Some(3)),
        "the due event's attempts come with it"
    );

    // Past the small-table bound (parked failures of other aggregates, as after an outage).
    sqlx::query(
        "INSERT INTO outbox_failure (outbox_id, event_id, aggregate_type, aggregate_id, \
             error_class, error_message, attempts, retry_at, parked_at) \
         SELECT -g, gen_random_uuid(), 'order', 'gone-' || g, 'delivery', 'x', 1, now(), now() \
         FROM generate_series(1, $1) g",
    )
    .bind(SMALL_FAILURE_TABLE + 10)
    .execute(&db.pool)
    .await
    .unwrap();
    let large: FailureView = store.failure_view().await.unwrap();
    assert!(large.any && large.large, "{large:?}");
    let probed = claim(FailureFilter::Probed).await;
    assert_eq!(ids(&probed), expected, "probed: the same rows as hashed");
    let attempts: HashMap<i64, Option<i32>> = probed.into_iter().collect();
    assert_eq!(
        attempts[&due.0],
        Some(3),
        "the due event's attempts come with it"
    );
    assert!(
        expected[1..].iter().all(|id| attempts[id].is_none()),
        "healthy rows have no attempts"
    );
    assert_eq!(ids(&claim(FailureFilter::Hashed).await), expected);
}

#[tokio::test]
async fn a_failure_past_a_thousand_attempts_is_recorded_without_overflow() {
    let (db, store, token) = leased("overflow").await;
    let (id, event_id) = event(&db.pool, "long-1").await;
    failure(&db.pool, (id, event_id), "long-1", "due").await;
    sqlx::query("UPDATE outbox_failure SET attempts = 1100 WHERE outbox_id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    // `--park-after 5000`: 2^1100 half-seconds do not fit a double; the delay is capped.
    let policy = ParkPolicy {
        park_after: 5_000,
        ..ParkPolicy::default()
    };
    let failure = NewFailure {
        id,
        event_id,
        aggregate_type: "order".into(),
        aggregate_id: "long-1".into(),
        class: FailureClass::Delivery,
        message: "still failing".into(),
        park: false,
        retry_now: false,
    };
    let recorded = store
        .record_failures(&token, &[failure], policy)
        .await
        .expect("recorded without a numeric overflow");
    assert_eq!(
        recorded,
        Recorded::Written(vec![FailureState {
            id,
            attempts: 1101,
            parked: false
        }])
    );
    let wait: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM retry_at - now())::float8 FROM outbox_failure WHERE outbox_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        wait <= policy.max_delay.as_secs_f64() + 1.0,
        "the delay is capped at the longest one: {wait} s"
    );
}

/// The claim decodes its rows without sqlx's per-value type check, having checked the
/// statement's column types once: an outbox whose schema drifted from the migrations' is an
/// error naming the column, not a misread value, and nothing is claimed.
#[tokio::test]
async fn a_column_of_another_type_than_the_migrations_fails_the_claim_by_name() {
    let (db, _store, token) = leased("drift").await;
    let (id, _) = event(&db.pool, "drift-1").await;
    let limits = ClaimLimits {
        rows: 10,
        bytes: 1 << 20,
        failures: FailureFilter::Off,
        ids: outbox_relay::store::IdRange::ALL,
    };
    // A relay's own pool (four connections), kept running through the migrations below.
    let running = Store::connect_lazy(&db.url).unwrap();
    let ClaimedBatch::Rows(rows, _) = running.claim(&token, limits).await.unwrap() else {
        panic!("lease lost")
    };
    let row = rows[0].message.as_ref().expect("decodes");
    assert_eq!(
        (
            rows.len(),
            row.id,
            row.aggregate_id.as_str(),
            row.topic.as_deref()
        ),
        (1, id, "drift-1", None),
        "the migrations' schema claims the row"
    );

    // An 8-byte integer where the relay reads text: decoded unchecked it would be 8 bytes of
    // garbage (or invalid UTF-8), not an error.
    alter_topic(&db.pool, "bigint USING 42").await;
    // A relay started after the change (the pool's connections would refuse their cached
    // statement instead: "cached plan must not change result type").
    let restarted = Store::from_pool(sqlx::PgPool::connect(&db.url).await.unwrap());
    let err = restarted
        .claim(&token, limits)
        .await
        .expect_err("a text column that holds bigints cannot be claimed");
    let message = err.to_string();
    assert!(
        message.contains("topic") && message.contains("INT8") && message.contains("TEXT"),
        "the error names the column and both types: {message}"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "nothing was marked");

    // A compatible type again (`varchar` decodes as text), under the relay that kept running:
    // a connection that prepared the claim before the changes has it refused ("cached plan
    // must not change result type") and is closed; a new one prepares it afresh. At most one
    // refusal per connection of the relay's pool (four), then the relay claims on.
    alter_topic(&db.pool, "varchar(249) USING topic::text").await;
    let mut refusals = Vec::new();
    let rows = loop {
        match running.claim(&token, limits).await {
            Ok(ClaimedBatch::Rows(rows, _)) => break rows,
            Ok(ClaimedBatch::LeaseLost) => panic!("lease lost"),
            Err(e) => refusals.push(e.to_string()),
        }
        assert!(
            refusals.len() <= 4,
            "the running relay's claims keep failing after the migration: {refusals:?}"
        );
    };
    assert_eq!(
        rows[0].message.as_ref().expect("decodes").topic.as_deref(),
        Some("42"),
        "claimed after {refusals:?}"
    );
    // No connection with the stale statement is left to hand out.
    for i in 0..8 {
        if let Err(e) = running.claim(&token, limits).await {
            panic!("claim {i} after recovering failed again ({refusals:?} before): {e}");
        }
    }

    // An incompatible type under the running relay: refused (by PostgreSQL, on connections
    // that prepared the claim before, or by the type check), never claimed.
    alter_topic(&db.pool, "bigint USING topic::bigint").await;
    let mut errors = Vec::new();
    let named = loop {
        let err = match running.claim(&token, limits).await {
            Ok(ClaimedBatch::Rows(rows, _)) => panic!("claimed {rows:?} with topic bigint"),
            Ok(ClaimedBatch::LeaseLost) => panic!("lease lost"),
            Err(e) => e.to_string(),
        };
        if err.contains("topic") {
            break err;
        }
        errors.push(err);
        assert!(errors.len() <= 4, "the column is never named: {errors:?}");
    };
    assert!(named.contains("INT8"), "{named}");
}

#[tokio::test]
async fn a_floored_claim_skips_what_its_failures_hold_below_it_until_one_of_them_goes() {
    use outbox_relay::store::FloorQuery;
    let (db, store, token) = leased("claim-floor").await;
    // parked-1: parked, 30 events behind it. due-1: failed, due now, 2 behind it.
    let parked = event(&db.pool, "parked-1").await;
    failure(&db.pool, parked, "parked-1", "parked").await;
    let due = event(&db.pool, "due-1").await;
    failure(&db.pool, due, "due-1", "due").await;
    for _ in 0..30 {
        event(&db.pool, "parked-1").await;
    }
    for _ in 0..2 {
        event(&db.pool, "due-1").await;
    }
    let below = event(&db.pool, "parked-1").await.0;
    let above: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(event(&db.pool, &format!("healthy-{i}")).await.0);
        }
        v
    };
    let claim = |floor: Option<i64>, held: Vec<i64>| {
        let store = store.clone();
        let token = token.clone();
        async move {
            let (batch, seen) = store
                .claim_above(
                    &token,
                    1_000,
                    1 << 30,
                    FloorQuery {
                        id: floor,
                        held: &held,
                    },
                )
                .await
                .unwrap();
            let ClaimedBatch::Rows(rows, _) = batch else {
                panic!("lease lost")
            };
            (rows.iter().map(|r| r.id()).collect::<Vec<_>>(), seen)
        }
    };

    // From the head: the due event and the healthy ones; the figures of the snapshot.
    let (ids, seen) = claim(None, vec![]).await;
    assert_eq!(ids, [vec![due.0], above.clone()].concat());
    assert!(seen.applied);
    assert_eq!(seen.failed, vec![parked.0, due.0]);
    assert_eq!(seen.top, above.last().copied());
    assert!(seen.xmin > 0);

    // Above a floor set under both failures: the due event still comes (from the failure
    // table), the healthy ones above the floor too.
    let (ids, seen) = claim(Some(below), vec![parked.0, due.0]).await;
    assert!(seen.applied);
    assert_eq!(ids, [vec![due.0], above.clone()].concat());
    // A floor above a healthy row leaves it out: the relay sets it only once such rows are
    // published (this shows the claim starts above it, not that it reads everything).
    let (ids, _) = claim(Some(above[0]), vec![parked.0, due.0]).await;
    assert_eq!(ids, [vec![due.0], above[1..].to_vec()].concat());

    // The parked event's failure row goes (a redrive): the floor no longer holds, the claim
    // starts at the head and the parked aggregate flows again, in id order.
    sqlx::query("DELETE FROM outbox_failure WHERE outbox_id = $1")
        .bind(parked.0)
        .execute(&db.pool)
        .await
        .unwrap();
    let (ids, seen) = claim(Some(above[0]), vec![parked.0, due.0]).await;
    assert!(!seen.applied, "a failure row of the floor's set is gone");
    assert_eq!(ids.first(), Some(&parked.0));
    assert_eq!(ids.len(), 1 + 1 + 31 + 3, "{ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(ids.contains(&below) && ids.contains(&above[0]));

    // Without its premises (here the insert trigger disabled, as `session_replication_role`
    // or a restore tool may leave it) no floor holds: the claim reads from the head.
    sqlx::query("ALTER TABLE outbox DISABLE TRIGGER outbox_order_by_aggregate")
        .execute(&db.pool)
        .await
        .unwrap();
    let (ids, seen) = claim(Some(above[0]), vec![due.0]).await;
    assert!(!seen.sound && !seen.applied, "{seen:?}");
    assert_eq!(ids.first(), Some(&parked.0));
    // Enabled the default way (or for replicas only), it skips some writers (those with
    // `session_replication_role = replica`, or all the others): no floor either. Only enabled
    // ALWAYS, as the migrations leave it, does it fire for every writer.
    for (enable, sound) in [
        ("ENABLE", false),
        ("ENABLE REPLICA", false),
        ("ENABLE ALWAYS", true),
    ] {
        sqlx::query(&format!(
            "ALTER TABLE outbox {enable} TRIGGER outbox_order_by_aggregate"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
        let (_, seen) = claim(Some(above[0]), vec![due.0]).await;
        assert_eq!(
            (seen.sound, seen.applied),
            (sound, sound),
            "{enable}: {seen:?}"
        );
    }
}
