-- The state gauges (issue 19: business metrics) read the open rows every interval, on every
-- replica: each reads a partial index of its open rows, never the whole table.
CREATE INDEX payments_refund_required_idx ON payments (order_id)
    WHERE disposition = 'REFUND_REQUIRED';
CREATE INDEX refunds_open_idx ON refunds (created_at) WHERE status = 'REQUESTED';
CREATE INDEX refunds_updated_at_idx ON refunds (updated_at);
CREATE INDEX channel_shipbacks_unreported_idx ON channel_shipbacks (requested_at)
    WHERE result IS NULL;
-- The payment timeout's pass (every PAYMENT_TIMEOUT_INTERVAL_MS) reads the oldest unpaid
-- orders: on this index, not a scan of every order.
CREATE INDEX orders_pending_payment_idx ON orders (created_at) WHERE status = 'PENDING_PAYMENT';
