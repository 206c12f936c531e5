-- The stock consumer's own tables, next to its inbox (migrations/inbox) and outbox
-- (migrations/outbox). The invariants are the database's: stock never goes below zero, never
-- more is reserved than is on hand, and an order line never moves twice the same way.

CREATE TABLE stock (
    sku_id     text        PRIMARY KEY,
    on_hand    bigint      NOT NULL CHECK (on_hand >= 0),
    reserved   bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stock_reserved_within_on_hand CHECK (reserved <= on_hand)
);

-- One decision per order (the business key that makes a second OrderPaid for the same order,
-- under a new event id, a no-op), and where its reserved goods went:
--   RESERVED -> DEDUCTED (shipped) -> RESTOCKED (returned)
--   RESERVED -> RELEASED (cancelled or refunded before shipping)
--   REJECTED (some line lacked stock: nothing was reserved)
CREATE TABLE reservations (
    order_id   uuid        PRIMARY KEY,
    status     text        NOT NULL
        CHECK (status IN ('RESERVED', 'REJECTED', 'RELEASED', 'DEDUCTED', 'RESTOCKED')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every change of stock caused by an order, one row per order line and kind.
CREATE TABLE stock_movements (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   uuid        NOT NULL REFERENCES reservations (order_id),
    sku_id     text        NOT NULL REFERENCES stock (sku_id),
    kind       text        NOT NULL CHECK (kind IN ('RESERVE', 'RELEASE', 'DEDUCT', 'RESTOCK')),
    quantity   bigint      NOT NULL CHECK (quantity > 0),
    -- The event that caused it.
    event_id   uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stock_movements_once_per_line UNIQUE (order_id, sku_id, kind)
);
