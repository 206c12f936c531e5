-- A return the warehouse received before its refund was decided (issue 19, item 8): the order
-- stays shipped, with the time the goods came back, until the refund succeeds (then RETURNED)
-- or closes (goods back, money kept: an operator sends the goods back or refunds; the audit
-- names it `return_without_refund`).
ALTER TABLE orders ADD COLUMN return_received_at timestamptz NULL;
