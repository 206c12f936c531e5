-- Refunds and returns by line (issue 19, item 5).
--
-- A refund's hold may name the units it takes back (`lines`, `[{"sku_id", "quantity"}]`; NULL:
-- the whole order, and for cancellation and `held:` holds). When such a refund succeeds before
-- the parcel left, its units are taken out of the outbound (`cut`: `PENDING` until the outbound
-- exists and they are taken out, then `DONE`) and the rest ships; after shipping, only its
-- units are expected back. A hold whose return arrived is `received_at`: it no longer recalls
-- the outbound, whatever its refund does afterwards.
ALTER TABLE order_holds ADD COLUMN lines jsonb NULL;
ALTER TABLE order_holds ADD COLUMN cut text NULL CHECK (cut IN ('PENDING', 'DONE'));
ALTER TABLE order_holds ADD COLUMN received_at timestamptz NULL;

-- Units received back per line (cumulative). An outbound with some units back and the rest
-- with the buyer is `SHIPPED` again; `RETURNED` means every shipped unit came back.
ALTER TABLE outbound_lines ADD COLUMN returned_quantity int NOT NULL DEFAULT 0;
ALTER TABLE outbound_lines ADD CONSTRAINT outbound_lines_returned_within_quantity
    CHECK (returned_quantity >= 0 AND returned_quantity <= quantity);
-- Before this migration a return was always whole.
UPDATE outbound_lines l SET returned_quantity = l.quantity
    FROM outbounds o WHERE o.outbound_no = l.outbound_no AND o.status = 'RETURNED';
