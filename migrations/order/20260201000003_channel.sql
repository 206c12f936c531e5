-- The marketplace channel (services/order-service/src/channel). Three layers keep a pushed
-- change from having a second effect; each is a unique key here.

-- Layer 1, transport: one row per platform msg_id. A message seen again only bumps
-- `duplicates` (the layer-1 count: SELECT sum(duplicates) FROM channel_messages).
CREATE TABLE channel_messages (
    msg_id            text        PRIMARY KEY,
    channel           text        NOT NULL,
    msg_type          text        NOT NULL CHECK (msg_type IN ('TradeSync', 'RefundSync')),
    external_order_id text        NOT NULL,
    -- How the change got here: pushed, or fetched by the compensation poller.
    source            text        NOT NULL CHECK (source IN ('push', 'query')),
    -- applied | duplicate_change (layer 2 absorbed it) | stale (an older refund snapshot)
    outcome           text        NOT NULL CHECK (outcome IN ('applied', 'duplicate_change', 'stale')),
    duplicates        int         NOT NULL DEFAULT 0,
    received_at       timestamptz NOT NULL DEFAULT now(),
    last_duplicate_at timestamptz NULL
);

-- Layer 2, business: one row per change, whatever msg_id carried it.
CREATE TABLE channel_changes (
    channel            text        NOT NULL,
    external_order_id  text        NOT NULL,
    kind               text        NOT NULL CHECK (kind IN ('trade', 'refund')),
    external_refund_id text        NOT NULL DEFAULT '',
    status             text        NOT NULL,
    modified_ms        bigint      NOT NULL,
    msg_id             text        NOT NULL REFERENCES channel_messages (msg_id),
    applied_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel, external_order_id, kind, external_refund_id, status, modified_ms)
);

-- A channel order is one of our orders: unique both ways.
CREATE TABLE channel_orders (
    channel           text        NOT NULL,
    external_order_id text        NOT NULL,
    order_id          uuid        NOT NULL UNIQUE REFERENCES orders (order_id),
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel, external_order_id)
);

-- A channel refund is one of our refunds; `last_modified_ms` is the newest snapshot applied,
-- so an older one arriving late changes nothing.
CREATE TABLE channel_refunds (
    channel            text        NOT NULL,
    external_refund_id text        NOT NULL,
    external_order_id  text        NOT NULL,
    refund_no          text        NOT NULL UNIQUE REFERENCES refunds (refund_no),
    last_status        text        NOT NULL,
    last_modified_ms   bigint      NOT NULL,
    PRIMARY KEY (channel, external_refund_id)
);

-- The compensation poller's durable watermark: the platform `modified` up to which changes
-- were fetched and applied (a change that failed keeps it below itself).
CREATE TABLE channel_watermarks (
    channel     text        PRIMARY KEY,
    modified_ms bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Ship-backs: a channel order's tracking number reported to the platform, once per
-- (order, tracking number). `result` is `shipped`, or `already_shipped` (the platform had it).
CREATE TABLE channel_shipbacks (
    order_id          uuid        NOT NULL REFERENCES orders (order_id),
    out_sid           text        NOT NULL,
    channel           text        NOT NULL,
    external_order_id text        NOT NULL,
    result            text        NOT NULL CHECK (result IN ('shipped', 'already_shipped')),
    attempts          int         NOT NULL,
    reported_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, out_sid)
);
