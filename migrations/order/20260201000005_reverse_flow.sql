-- The reverse flow exact in money (issue 19).
--
-- A payment flagged for refund on an order cancelled after payment (for lack of stock, or a
-- marketplace trade first seen closed with the money it took) owes `refund_due_cents` to the
-- buyer. A refund the platform makes afterwards takes its amount from that flag, and a refund
-- closed without paying out gives its amount back to it, so the money is owed to exactly one
-- place. Once refunds cover all of it the payment is `REFUND_COVERED` (nothing left for an
-- operator to give back); a refund closing later makes it `REFUND_REQUIRED` again.
-- The old constraints go first: rows are rewritten below.
ALTER TABLE payments DROP CONSTRAINT payments_disposition_check;
ALTER TABLE payments DROP CONSTRAINT payments_flag_reason_iff_refund_required;
ALTER TABLE payments DROP CONSTRAINT payments_refund_due_iff_refund_required;
-- A stock rejection whose earlier refunds reserved everything flagged 0 due: covered.
UPDATE payments SET disposition = 'REFUND_COVERED'
    WHERE disposition = 'REFUND_REQUIRED' AND refund_due_cents = 0;
ALTER TABLE payments ADD CONSTRAINT payments_disposition_check
    CHECK (disposition IN ('APPLIED', 'REFUND_REQUIRED', 'REFUND_COVERED'));
ALTER TABLE payments ADD CONSTRAINT payments_flag_reason_iff_flagged
    CHECK ((disposition <> 'APPLIED') = (flag_reason IS NOT NULL));
ALTER TABLE payments ADD CONSTRAINT payments_refund_due_iff_flagged
    CHECK ((disposition <> 'APPLIED') = (refund_due_cents IS NOT NULL));
ALTER TABLE payments ADD CONSTRAINT payments_due_matches_disposition
    CHECK (disposition <> 'REFUND_REQUIRED' OR refund_due_cents > 0);
ALTER TABLE payments ADD CONSTRAINT payments_covered_owes_nothing
    CHECK (disposition <> 'REFUND_COVERED' OR refund_due_cents = 0);
