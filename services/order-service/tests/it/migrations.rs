//! Migrations applied over data written by the versions before them.

use std::borrow::Cow;

use crate::support::fresh_pool;

/// The first migration of the reverse flow (refunds and returns exact in money).
const REVERSE_FLOW: i64 = 20260201000005;

#[tokio::test]
async fn the_reverse_flow_migration_keeps_flagged_payments_and_covers_those_owing_nothing() {
    let pool = fresh_pool().await;
    outbox_writer::schema::migrate(&pool).await.unwrap();
    outbox_writer::schema::migrate_inbox(&pool).await.unwrap();
    let mut before = order_service::server::migrator();
    before.migrations = Cow::Owned(
        before
            .migrations
            .iter()
            .filter(|m| m.version < REVERSE_FLOW)
            .cloned()
            .collect(),
    );
    before.run(&pool).await.unwrap();
    // As the earlier version left them: a stock rejection whose refund reserved everything
    // (0 due), one that owes 400, a payment that paid its order.
    sqlx::raw_sql(
        "INSERT INTO skus (sku_id, name, price_cents) VALUES ('S', 'S', 1000); \
         INSERT INTO orders (order_id, user_id, status, amount_cents, paid_cents, refund_reserved_cents) VALUES \
             ('00000000-0000-0000-0000-000000000001', 'u', 'CANCELLED', 1000, 1000, 1000), \
             ('00000000-0000-0000-0000-000000000002', 'u', 'CANCELLED', 1000, 1000, 1000), \
             ('00000000-0000-0000-0000-000000000003', 'u', 'PAID', 1000, 1000, 0); \
         INSERT INTO payments (transaction_id, order_id, amount_cents, disposition, flag_reason, refund_due_cents) VALUES \
             ('t1', '00000000-0000-0000-0000-000000000001', 1000, 'REFUND_REQUIRED', 'stock_rejected', 0), \
             ('t2', '00000000-0000-0000-0000-000000000002', 1000, 'REFUND_REQUIRED', 'stock_rejected', 400), \
             ('t3', '00000000-0000-0000-0000-000000000003', 1000, 'APPLIED', NULL, NULL);",
    )
    .execute(&pool)
    .await
    .unwrap();
    order_service::server::migrator().run(&pool).await.unwrap();
    let rows: Vec<(String, String, Option<i64>)> = sqlx::query_as(
        "SELECT transaction_id, disposition, refund_due_cents FROM payments ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("t1".to_owned(), "REFUND_COVERED".to_owned(), Some(0)),
            ("t2".to_owned(), "REFUND_REQUIRED".to_owned(), Some(400)),
            ("t3".to_owned(), "APPLIED".to_owned(), None),
        ]
    );
}
