-- The order service's own tables. They live in the same database as the outbox table
-- (migrations/outbox) so that every state change and its event commit in one transaction.
-- Money is integer cents everywhere. Constraints hold what must never happen twice; the
-- application's checks only make the errors readable.

-- The catalog: prices come from here, never from the client.
CREATE TABLE skus (
    sku_id      text        PRIMARY KEY,
    name        text        NOT NULL,
    price_cents bigint      NOT NULL CHECK (price_cents > 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per order. `status` only moves forward (PENDING_PAYMENT -> PAID -> SHIPPED ->
-- COMPLETED, or PENDING_PAYMENT -> CANCELLED) through conditional updates; every writer locks
-- the row first, so the order's outbox events are appended in commit order.
CREATE TABLE orders (
    order_id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id               text        NOT NULL,
    status                text        NOT NULL
        CHECK (status IN ('PENDING_PAYMENT', 'PAID', 'SHIPPED', 'COMPLETED', 'CANCELLED')),
    amount_cents          bigint      NOT NULL CHECK (amount_cents > 0),
    -- What the applied payment brought in (0 until PAID).
    paid_cents            bigint      NOT NULL DEFAULT 0 CHECK (paid_cents >= 0),
    -- Refunds requested or succeeded; a closed refund gives its amount back. The CHECK is the
    -- truth behind "a refund may not exceed what was paid minus earlier refunds".
    refund_reserved_cents bigint      NOT NULL DEFAULT 0 CHECK (refund_reserved_cents >= 0),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    paid_at               timestamptz NULL,
    cancelled_at          timestamptz NULL,
    CONSTRAINT orders_refunds_within_paid CHECK (refund_reserved_cents <= paid_cents)
);

CREATE INDEX orders_user_id_idx ON orders (user_id, created_at);

-- Order lines, priced from the catalog when the order was created.
CREATE TABLE order_items (
    order_id         uuid   NOT NULL REFERENCES orders (order_id),
    line_no          int    NOT NULL,
    sku_id           text   NOT NULL REFERENCES skus (sku_id),
    name             text   NOT NULL,
    quantity         int    NOT NULL CHECK (quantity > 0),
    unit_price_cents bigint NOT NULL CHECK (unit_price_cents > 0),
    line_total_cents bigint NOT NULL CHECK (line_total_cents = unit_price_cents * quantity),
    PRIMARY KEY (order_id, line_no),
    CONSTRAINT order_items_one_line_per_sku UNIQUE (order_id, sku_id)
);

-- Idempotency keys of POST /orders, scoped per user. The row is inserted first thing in the
-- request's transaction and completed (response, order) at its end, so it is only ever
-- visible completed: a concurrent duplicate blocks on the uncommitted row and then reads the
-- committed response, and a request that fails rolls its key row back with everything else.
CREATE TABLE idempotency_keys (
    user_id         text        NOT NULL,
    idempotency_key text        NOT NULL,
    -- SHA-256 of the canonical request: the same key with another body is refused.
    request_hash    bytea       NOT NULL,
    order_id        uuid        NULL REFERENCES orders (order_id),
    response_status smallint    NULL,
    response_body   jsonb       NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, idempotency_key),
    CONSTRAINT idempotency_keys_response_complete
        CHECK ((response_status IS NULL) = (response_body IS NULL))
);

-- For a future retention job that forgets old keys.
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);

-- Payment notifications, one row per provider transaction id. `APPLIED` is the payment that
-- moved the order to PAID (at most one per order); `REFUND_REQUIRED` is money received for an
-- order that could not take it (cancelled, or already paid by another transaction).
CREATE TABLE payments (
    transaction_id text        PRIMARY KEY,
    order_id       uuid        NOT NULL REFERENCES orders (order_id),
    amount_cents   bigint      NOT NULL CHECK (amount_cents > 0),
    disposition    text        NOT NULL CHECK (disposition IN ('APPLIED', 'REFUND_REQUIRED')),
    flag_reason    text        NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT payments_flag_reason_iff_refund_required
        CHECK ((disposition = 'REFUND_REQUIRED') = (flag_reason IS NOT NULL))
);

CREATE UNIQUE INDEX payments_one_applied_per_order ON payments (order_id)
    WHERE disposition = 'APPLIED';

-- Refunds of paid orders. `refund_no` is the merchant's refund number, unique across orders.
-- REQUESTED -> SUCCEEDED or REQUESTED -> CLOSED, once; `provider_modified_ms` is the
-- `modified` of the provider snapshot that was applied, so an older snapshot changes nothing.
CREATE TABLE refunds (
    refund_no            text        PRIMARY KEY,
    order_id             uuid        NOT NULL REFERENCES orders (order_id),
    amount_cents         bigint      NOT NULL CHECK (amount_cents > 0),
    reason               text        NOT NULL,
    status               text        NOT NULL CHECK (status IN ('REQUESTED', 'SUCCEEDED', 'CLOSED')),
    provider_modified_ms bigint      NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT refunds_terminal_has_snapshot
        CHECK ((status = 'REQUESTED') = (provider_modified_ms IS NULL))
);

CREATE INDEX refunds_order_id_idx ON refunds (order_id, created_at);
