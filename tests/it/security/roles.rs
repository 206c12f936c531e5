//! Least-privilege roles (`deploy/postgres/roles.sql`): a relay connected as the relay role is
//! refused every read and write of a business table (permission denied), the service role
//! cannot touch the relay's tables, and the migrator owns the schema (it applies a new
//! migration with a trigger on the outbox, after which the service still writes events). The
//! relay and the services running as these roles: `tests/it/services/order_events.rs` and
//! `delivery/committed_events.rs`.

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect as {url}: {e}"))
}

/// The SQLSTATE of `sql`'s failure, asserting it failed.
async fn refused(pool: &PgPool, sql: &str) -> (String, String) {
    match sqlx::query(sql).execute(pool).await {
        Ok(_) => panic!("{sql} was allowed"),
        Err(sqlx::Error::Database(e)) => (
            e.code().map(|c| c.into_owned()).unwrap_or_default(),
            e.message().to_owned(),
        ),
        Err(e) => panic!("{sql}: {e}"),
    }
}

async fn assert_denied(pool: &PgPool, who: &str, sql: &str) {
    let (code, message) = refused(pool, sql).await;
    assert_eq!(code, "42501", "{who}: {sql}: {message}");
    assert!(
        message.contains("permission denied"),
        "{who}: {sql}: {message}"
    );
}

const BUSINESS_TABLES: [&str; 8] = [
    "orders",
    "order_items",
    "payments",
    "refunds",
    "idempotency_keys",
    "skus",
    "channel_orders",
    "inbox",
];

#[tokio::test]
async fn the_relay_role_cannot_read_or_change_a_business_table() {
    let db = e2e::db::fresh_database().await;
    // A database migrated by the superuser before the roles existed: the script adopts it.
    order_service::migrate(&db.pool).await.unwrap();
    sqlx::query("INSERT INTO skus (sku_id, name, price_cents) VALUES ('s', 'Lamp', 100)")
        .execute(&db.pool)
        .await
        .unwrap();
    let urls = e2e::roles::apply(&db.url, "order_service");
    let relay = pool(&urls.relay).await;
    for table in BUSINESS_TABLES {
        assert_denied(&relay, "relay", &format!("SELECT * FROM {table}")).await;
        assert_denied(&relay, "relay", &format!("DELETE FROM {table}")).await;
    }
    assert_denied(&relay, "relay", "UPDATE skus SET price_cents = 1").await;
    assert_denied(&relay, "relay", "UPDATE orders SET status = status").await;
    assert_denied(
        &relay,
        "relay",
        "INSERT INTO skus (sku_id, name, price_cents) VALUES ('x', 'x', 1)",
    )
    .await;
    assert_denied(&relay, "relay", "CREATE TABLE relay_was_here (x int)").await;
    let price: i64 = sqlx::query_scalar("SELECT price_cents FROM skus WHERE sku_id = 's'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(price, 100, "the business table is unchanged");
    // What the relay needs it has.
    for sql in [
        "SELECT count(*) FROM outbox",
        "SELECT id FROM outbox FOR UPDATE SKIP LOCKED",
        "DELETE FROM outbox WHERE id = -1",
        "SELECT count(*) FROM outbox_relay_lease",
        "SELECT count(*) FROM outbox_relay_member",
        "SELECT 1 FROM outbox_buckets FOR SHARE",
        "UPDATE outbox_failure SET attempts = attempts WHERE outbox_id = -1",
        "DELETE FROM outbox_discarded WHERE outbox_id = -1",
    ] {
        sqlx::query(sql)
            .execute(&relay)
            .await
            .unwrap_or_else(|e| panic!("relay: {sql}: {e}"));
    }

    // The service: its tables and INSERT on the outbox, nothing of the relay's.
    let service = pool(&urls.service).await;
    sqlx::query("UPDATE skus SET price_cents = 200 WHERE sku_id = 's'")
        .execute(&service)
        .await
        .unwrap();
    for sql in [
        "SELECT * FROM outbox_relay_lease",
        "SELECT * FROM outbox_failure",
        "SELECT * FROM outbox_discarded",
        "DELETE FROM outbox",
        "UPDATE outbox SET topic = 'x'",
        "SELECT * FROM _sqlx_migrations",
        "CREATE TABLE service_was_here (x int)",
    ] {
        assert_denied(&service, "service", sql).await;
    }

    // The migrator owns the schema: it applies a migration that adds a table and a trigger on
    // the outbox; after the script runs again the service writes events through the trigger.
    let migrator = pool(&urls.migrator).await;
    outbox_writer::schema::migrate_ledger(&migrator)
        .await
        .unwrap();
    let urls = e2e::roles::apply(&db.url, "order_service");
    let service = pool(&urls.service).await;
    let mut tx = service.begin().await.unwrap();
    outbox_writer::enqueue(
        &mut *tx,
        &outbox_writer::NewEvent::new("order", "o-1", "OrderCreated", &serde_json::json!({})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_ledger")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ledger, 1);
    let relay = pool(&urls.relay).await;
    assert_denied(&relay, "relay", "SELECT * FROM outbox_ledger").await;
}

#[tokio::test]
async fn the_wms_and_stock_databases_migrated_by_the_migrator_give_each_role_its_own_tables() {
    for (bin, role, table) in [
        ("wms-consumer", "wms_service", "outbounds"),
        ("stock-consumer", "stock_service", "stock"),
    ] {
        let db = e2e::db::fresh_database().await;
        // The way the Kubernetes init container does it: DATABASE_MIGRATIONS=only as the migrator.
        let urls = e2e::roles::migrate_as_migrator(bin, &db.url, role);
        let owner: String = sqlx::query_scalar(
            "SELECT tableowner::text FROM pg_tables WHERE schemaname = 'public' AND tablename = $1",
        )
        .bind(table)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            owner,
            e2e::roles::MIGRATOR,
            "{bin}: {table} owned by the migrator"
        );
        let service = pool(&urls.service).await;
        for sql in [
            format!("SELECT count(*) FROM {table}"),
            "SELECT count(*) FROM inbox".to_owned(),
        ] {
            sqlx::query(&sql)
                .execute(&service)
                .await
                .unwrap_or_else(|e| panic!("{role}: {sql}: {e}"));
        }
        let relay = pool(&urls.relay).await;
        assert_denied(&relay, "relay", &format!("SELECT * FROM {table}")).await;
        assert_denied(
            &relay,
            "relay",
            &format!("UPDATE {table} SET updated_at = now()"),
        )
        .await;
        assert_denied(&relay, "relay", "SELECT * FROM inbox").await;
        if bin == "wms-consumer" {
            // Outbound numbers come from a standalone sequence: the service's, not the relay's.
            sqlx::query("SELECT nextval('outbound_no_seq')")
                .execute(&service)
                .await
                .unwrap();
            assert_denied(&relay, "relay", "SELECT nextval('outbound_no_seq')").await;
        }
    }
}
