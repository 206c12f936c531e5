//! The claim is exclusive: in the style of crates.io's worker-runner tests, a batch claimed
//! by one relay cannot be claimed by another while the first holds it, and a relay that lost
//! its lease can neither claim nor mark (guarantee 3); a late commit with a smaller id is still
//! claimed (guarantee 2).

use std::sync::Arc;
use std::time::Duration;

use outbox_relay::failure::FailureClass;
use outbox_relay::parking::{NewFailure, ParkPolicy, Recorded};
use outbox_relay::store::{ClaimedBatch, LeaseToken, Marked, Store};
use outbox_writer::{enqueue, NewEvent};
use tokio::sync::Barrier;

async fn insert_events(pool: &sqlx::PgPool, n: usize) {
    let payload = serde_json::json!({"k": "v"});
    let mut tx = pool.begin().await.unwrap();
    for i in 0..n {
        enqueue(
            &mut *tx,
            &NewEvent::new("order", &format!("o{i}"), "E", &payload),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn a_claimed_batch_cannot_be_claimed_by_another_relay() {
    let db = e2e::db::fresh_database().await;
    insert_events(&db.pool, 10).await;
    let ttl = Duration::from_millis(1500);

    // Two relays race for the lease at the same moment: exactly one wins.
    let barrier = Arc::new(Barrier::new(2));
    let mut tasks = Vec::new();
    for name in ["r1", "r2"] {
        let store = Store::from_pool(db.pool.clone());
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.try_acquire_lease("default", name, ttl).await.unwrap()
        }));
    }
    let mut tokens = Vec::new();
    for t in tasks {
        tokens.extend(t.await.unwrap());
    }
    assert_eq!(
        tokens.len(),
        1,
        "exactly one relay gets the lease: {tokens:?}"
    );
    let owner = tokens.pop().unwrap();
    let other_name = if owner.holder == "r1" { "r2" } else { "r1" };
    let a = Store::from_pool(db.pool.clone());
    let b = Store::from_pool(db.pool.clone());

    // The owner claims a batch and holds it (no mark yet).
    let ClaimedBatch::Rows(batch, _) = a.claim_batch(&owner, 100).await.unwrap() else {
        panic!("owner lost its lease")
    };
    assert_eq!(batch.len(), 10);

    // Meanwhile the other relay can neither take the lease nor claim with a forged token.
    assert!(b
        .try_acquire_lease("default", other_name, ttl)
        .await
        .unwrap()
        .is_none());
    let mut forged = owner.clone();
    forged.holder = other_name.to_owned();
    assert!(matches!(
        b.claim_batch(&forged, 100).await.unwrap(),
        ClaimedBatch::LeaseLost
    ));
    assert_eq!(
        b.mark_published(&forged, &[batch[0].id()]).await.unwrap(),
        Marked::LeaseLost
    );
    // Nor with the owner's name and an epoch that is not the current one (a token from an
    // earlier term, or a guessed next one), for claims, marks and failure records alike.
    for epoch in [owner.epoch - 1, owner.epoch + 1] {
        let stale = LeaseToken {
            epoch,
            ..owner.clone()
        };
        assert!(matches!(
            b.claim_batch(&stale, 100).await.unwrap(),
            ClaimedBatch::LeaseLost
        ));
        assert_eq!(
            b.mark_published(&stale, &[batch[0].id()]).await.unwrap(),
            Marked::LeaseLost
        );
        let failure = NewFailure {
            id: batch[0].id(),
            event_id: batch[0].event_id(),
            aggregate_type: "order".into(),
            aggregate_id: batch[0].aggregate().1.to_owned(),
            class: FailureClass::Delivery,
            message: "stale".into(),
            park: true,
            retry_now: false,
        };
        assert_eq!(
            b.record_failures(&stale, &[failure], ParkPolicy::default())
                .await
                .unwrap(),
            Recorded::LeaseLost
        );
    }
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_failure")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failures, 0, "a fenced failure record writes nothing");

    // The owner stops renewing; once the lease expires the other takes it with a new epoch.
    let taken = e2e::wait_for("the lease to expire", Duration::from_secs(10), || async {
        b.try_acquire_lease("default", other_name, ttl)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(taken.epoch, owner.epoch + 1);

    // The old owner is fenced: it can neither claim nor mark its acknowledged batch...
    assert!(matches!(
        a.claim_batch(&owner, 100).await.unwrap(),
        ClaimedBatch::LeaseLost
    ));
    let ids: Vec<i64> = batch.iter().map(|r| r.id()).collect();
    assert_eq!(
        a.mark_published(&owner, &ids).await.unwrap(),
        Marked::LeaseLost
    );
    assert_eq!(
        e2e::db::backlog(&db.pool).await.unwrap(),
        10,
        "a fenced mark deletes nothing"
    );
    // ...not even by renewing: the lease changed hands.
    assert!(!a.renew_lease(&owner, ttl).await.unwrap());

    // The new owner sees the same rows, in the same order, and marks them.
    let ClaimedBatch::Rows(again, _) = b.claim_batch(&taken, 100).await.unwrap() else {
        panic!("new owner lost its lease")
    };
    assert_eq!(again.iter().map(|r| r.id()).collect::<Vec<_>>(), ids);
    assert_eq!(
        b.mark_published(&taken, &ids).await.unwrap(),
        Marked::Deleted(10)
    );
    assert_eq!(e2e::db::backlog(&db.pool).await.unwrap(), 0);
}

#[tokio::test]
async fn a_late_commit_with_a_smaller_id_is_still_claimed() {
    let db = e2e::db::fresh_database().await;
    let store = Store::from_pool(db.pool.clone());
    let lease = store
        .try_acquire_lease("default", "r", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let payload = serde_json::json!({});

    // T1 takes a small id and holds its commit; T2 takes a larger id and commits first.
    let mut t1 = db.pool.begin().await.unwrap();
    let early = enqueue(&mut *t1, &NewEvent::new("order", "a", "E", &payload))
        .await
        .unwrap();
    let mut t2 = db.pool.begin().await.unwrap();
    let late = enqueue(&mut *t2, &NewEvent::new("order", "b", "E", &payload))
        .await
        .unwrap();
    assert!(early.id < late.id);
    t2.commit().await.unwrap();

    let ClaimedBatch::Rows(first, _) = store.claim_batch(&lease, 100).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        first.iter().map(|r| r.id()).collect::<Vec<_>>(),
        vec![late.id]
    );
    assert_eq!(
        store.mark_published(&lease, &[late.id]).await.unwrap(),
        Marked::Deleted(1)
    );

    // T1 commits after a larger id was already published: it must still be found.
    t1.commit().await.unwrap();
    let ClaimedBatch::Rows(second, _) = store.claim_batch(&lease, 100).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        second.iter().map(|r| r.id()).collect::<Vec<_>>(),
        vec![early.id]
    );
}

/// Fencing is by epoch, not by name: a relay restarted with the same `--instance-id` takes a
/// new epoch, and the old process under that name (a zombie holding the old epoch) can neither
/// claim, mark, park nor renew.
#[tokio::test]
async fn the_same_instance_id_with_a_stale_epoch_is_fenced() {
    use outbox_relay::failure::FailureClass;
    use outbox_relay::parking::{NewFailure, ParkPolicy, Recorded};
    let db = e2e::db::fresh_database().await;
    let payload = serde_json::json!({});
    for _ in 0..5 {
        enqueue(&db.pool, &NewEvent::new("order", "a", "E", &payload))
            .await
            .unwrap();
    }
    let store = Store::from_pool(db.pool.clone());
    let ttl = Duration::from_millis(400);
    let old = store
        .try_acquire_lease("default", "relay-1", ttl)
        .await
        .unwrap()
        .unwrap();
    let ClaimedBatch::Rows(batch, _) = store.claim_batch(&old, 100).await.unwrap() else {
        panic!("lost the lease at once")
    };
    // The process is restarted under the same name once the lease expired.
    let new = e2e::wait_for("the lease to expire", Duration::from_secs(10), || async {
        store
            .try_acquire_lease("default", "relay-1", ttl)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(new.holder, old.holder);
    assert_eq!(new.epoch, old.epoch + 1);
    assert!(matches!(
        store.claim_batch(&old, 100).await.unwrap(),
        ClaimedBatch::LeaseLost
    ));
    let ids: Vec<i64> = batch.iter().map(|r| r.id()).collect();
    assert_eq!(
        store.mark_published(&old, &ids).await.unwrap(),
        Marked::LeaseLost
    );
    let failure = NewFailure {
        id: batch[0].id(),
        event_id: batch[0].event_id(),
        aggregate_type: "order".into(),
        aggregate_id: "a".into(),
        class: FailureClass::Delivery,
        message: "zombie".into(),
        park: true,
        retry_now: false,
    };
    assert_eq!(
        store
            .record_failures(&old, &[failure], ParkPolicy::default())
            .await
            .unwrap(),
        Recorded::LeaseLost
    );
    assert!(!store.renew_lease(&old, ttl).await.unwrap());
    assert_eq!(
        e2e::db::backlog(&db.pool).await.unwrap(),
        5,
        "nothing marked"
    );
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_failure")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failures, 0, "nothing parked");
}
