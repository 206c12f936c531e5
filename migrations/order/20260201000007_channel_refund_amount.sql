-- The amount of the newest refund snapshot applied (issue 19): the audit compares it with our
-- refund's (`refund_amount_mismatch`), so a platform amount we did not book is visible.
ALTER TABLE channel_refunds ADD COLUMN last_refund_cents bigint NULL;
