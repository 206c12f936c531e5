-- The WMS consumer's own tables. They live in the same database as its inbox
-- (migrations/inbox) and its outbox (migrations/outbox): an event's effect, its inbox row and
-- the events it causes commit in one transaction. Constraints hold what must never happen
-- twice; the application's checks only make the errors readable.

CREATE SEQUENCE outbound_no_seq;

-- One outbound order per order: `order_id` is the business key that makes a second
-- "reserved" event for the same order (under a new event id) a no-op. `outbound_no` is the
-- warehouse's own number.
--   CREATED -> SHIPPED -> RECALL -> RETURNED      (refund after shipping: a return is expected)
--   CREATED <-> INTERCEPTED -> CANCELLED          (refund or cancellation before shipping)
-- RECALL goes back to SHIPPED, INTERCEPTED back to CREATED, when every refund holding the
-- order was closed without paying out.
CREATE TABLE outbounds (
    outbound_no text        PRIMARY KEY
        DEFAULT ('OB' || lpad(nextval('outbound_no_seq')::text, 10, '0')),
    order_id    uuid        NOT NULL,
    status      text        NOT NULL
        CHECK (status IN ('CREATED', 'INTERCEPTED', 'CANCELLED', 'SHIPPED', 'RECALL', 'RETURNED')),
    carrier     text        NULL,
    tracking_no text        NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    shipped_at  timestamptz NULL,
    returned_at timestamptz NULL,
    CONSTRAINT outbounds_one_per_order UNIQUE (order_id),
    -- A tracking number identifies one parcel.
    CONSTRAINT outbounds_tracking_no_once UNIQUE (carrier, tracking_no),
    CONSTRAINT outbounds_shipment_complete
        CHECK ((carrier IS NULL) = (tracking_no IS NULL) AND (tracking_no IS NULL) = (shipped_at IS NULL)),
    CONSTRAINT outbounds_shipped_iff_shipment
        CHECK ((status IN ('SHIPPED', 'RECALL', 'RETURNED')) = (shipped_at IS NOT NULL)),
    CONSTRAINT outbounds_returned_iff_returned_at
        CHECK ((status = 'RETURNED') = (returned_at IS NOT NULL))
);

CREATE TABLE outbound_lines (
    outbound_no text NOT NULL REFERENCES outbounds (outbound_no),
    sku_id      text NOT NULL,
    quantity    int  NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (outbound_no, sku_id)
);

-- What stops an order's fulfilment, whether or not its outbound exists yet (events of
-- different topics arrive in any order): one row per refund (`refund:<refund_no>`) and one
-- for a cancellation (`order-cancelled`). A refund's hold is released when the refund is
-- closed, and becomes permanent when it succeeds; a cancellation's is permanent at once.
CREATE TABLE order_holds (
    order_id   uuid        NOT NULL,
    hold       text        NOT NULL,
    active     boolean     NOT NULL,
    permanent  boolean     NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, hold),
    CONSTRAINT order_holds_permanent_is_active CHECK (active OR NOT permanent)
);
