-- Line-aware refunds and returns (issue 19, item 5).
--
-- A return-and-refund may name the lines it takes back (`refund_lines`): before shipping the
-- warehouse takes those units out of the outbound and ships the rest; after shipping it expects
-- only those units back. A refund without lines takes back the whole order, as before. The
-- foreign key to `order_items (order_id, sku_id)` makes "a line of this order" the database's
-- rule; "no more units than ordered across the order's live refunds" is checked under the
-- order's lock (refunds.rs).
CREATE TABLE refund_lines (
    refund_no text NOT NULL REFERENCES refunds (refund_no),
    order_id  uuid NOT NULL,
    sku_id    text NOT NULL,
    quantity  int  NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (refund_no, sku_id),
    CONSTRAINT refund_lines_of_the_order
        FOREIGN KEY (order_id, sku_id) REFERENCES order_items (order_id, sku_id)
);

CREATE INDEX refund_lines_order_idx ON refund_lines (order_id, sku_id);

-- Units the warehouse has received back, per line (cumulative, from `ReturnReceived`). An
-- order with some units back and others not is partly returned: it keeps its status (SHIPPED,
-- DELIVERED, COMPLETED) and shows the returned units; RETURNED means every shipped unit came
-- back.
ALTER TABLE order_items ADD COLUMN returned_quantity int NOT NULL DEFAULT 0;
ALTER TABLE order_items ADD CONSTRAINT order_items_returned_within_quantity
    CHECK (returned_quantity >= 0 AND returned_quantity <= quantity);
