-- pgbench script for the demo: one business transaction that appends 1-5 events for one
-- order, locking the order's row first (as a real service does) so that its events' id
-- order is their commit order.
\set order_id random(1, 500)
\set n random(1, 5)
BEGIN;
INSERT INTO demo_orders (id, version) VALUES (:order_id, 0)
    ON CONFLICT (id) DO UPDATE SET version = demo_orders.version + 1;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', :order_id::text, 'OrderUpdated',
       jsonb_build_object('order_id', :order_id::text, 'version', o.version, 'step', g)
FROM demo_orders o, generate_series(1, :n) g WHERE o.id = :order_id;
COMMIT;
