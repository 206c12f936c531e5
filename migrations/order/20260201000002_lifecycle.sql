-- The full order lifecycle (services/order-service/src/domain/lifecycle.rs): delivered,
-- refunded in full before shipping, returned after shipping.
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN (
    'PENDING_PAYMENT', 'PAID', 'SHIPPED', 'DELIVERED', 'COMPLETED', 'CANCELLED', 'REFUNDED', 'RETURNED'));

-- What a refund gives back. Existing refunds were all treated as return-and-refund.
ALTER TABLE refunds ADD COLUMN kind text NOT NULL DEFAULT 'RETURN_AND_REFUND'
    CHECK (kind IN ('REFUND_ONLY', 'RETURN_AND_REFUND'));

-- How much of a REFUND_REQUIRED payment must go back. For a paid order cancelled for lack of
-- stock it is what no refund had reserved yet (the rest is reserved on the order in the same
-- transaction, under orders_refunds_within_paid), so the money is never given back twice.
ALTER TABLE payments ADD COLUMN refund_due_cents bigint NULL CHECK (refund_due_cents >= 0);
UPDATE payments SET refund_due_cents = amount_cents WHERE disposition = 'REFUND_REQUIRED';
ALTER TABLE payments ADD CONSTRAINT payments_refund_due_iff_refund_required
    CHECK ((disposition = 'REFUND_REQUIRED') = (refund_due_cents IS NOT NULL));
