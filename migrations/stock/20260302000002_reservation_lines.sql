-- Stock moves by line (issue 19, item 5: partial refunds and returns).
--
-- A reservation used to move whole: every line released, deducted or restocked once. Now the
-- warehouse says per line what is left to ship (`OutboundLinesCancelled`: lines refunded before
-- shipping are released), what shipped (the rest is released) and how many units came back so
-- far (a return may be partial). So each reserved line keeps its running amounts here, and every
-- event moves them up to its target, never down: a redelivered or stale event changes nothing.
-- The CHECKs are the invariants: nothing is released or deducted beyond what was reserved, and
-- nothing restocked beyond what was deducted.
CREATE TABLE reservation_lines (
    order_id   uuid        NOT NULL REFERENCES reservations (order_id),
    sku_id     text        NOT NULL REFERENCES stock (sku_id),
    reserved   bigint      NOT NULL CHECK (reserved > 0),
    released   bigint      NOT NULL DEFAULT 0 CHECK (released >= 0),
    deducted   bigint      NOT NULL DEFAULT 0 CHECK (deducted >= 0),
    restocked  bigint      NOT NULL DEFAULT 0 CHECK (restocked >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, sku_id),
    CONSTRAINT reservation_lines_settled_within_reserved CHECK (released + deducted <= reserved),
    CONSTRAINT reservation_lines_restocked_within_deducted CHECK (restocked <= deducted)
);

-- An upgraded database: the lines' amounts are the sums of their movements so far (each kind
-- happened at most once per line until now).
INSERT INTO reservation_lines (order_id, sku_id, reserved, released, deducted, restocked)
SELECT order_id, sku_id,
       sum(quantity) FILTER (WHERE kind = 'RESERVE'),
       COALESCE(sum(quantity) FILTER (WHERE kind = 'RELEASE'), 0),
       COALESCE(sum(quantity) FILTER (WHERE kind = 'DEDUCT'), 0),
       COALESCE(sum(quantity) FILTER (WHERE kind = 'RESTOCK'), 0)
FROM stock_movements
GROUP BY order_id, sku_id
HAVING sum(quantity) FILTER (WHERE kind = 'RESERVE') IS NOT NULL;

-- `reservations.status` stays the order's summary: RESERVED (something still held), REJECTED,
-- RELEASED (every unit released), DEDUCTED (shipped; possibly partly restocked), RESTOCKED
-- (every deducted unit restocked).

-- `stock_movements` stays the log of every change, one row per line and step, with the event
-- that caused it. A line is still reserved once and deducted once (at shipping), but released
-- and restocked possibly in several steps: the unique key keeps only the former.
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_once_per_line;
CREATE UNIQUE INDEX stock_movements_reserve_and_deduct_once
    ON stock_movements (order_id, sku_id, kind) WHERE kind IN ('RESERVE', 'DEDUCT');
CREATE INDEX stock_movements_order ON stock_movements (order_id, sku_id);
-- Every movement belongs to a reserved line.
ALTER TABLE stock_movements ADD CONSTRAINT stock_movements_line
    FOREIGN KEY (order_id, sku_id) REFERENCES reservation_lines (order_id, sku_id);
