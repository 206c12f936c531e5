-- Buckets: the outbox split by a hash of the aggregate, so that several relays publish at once,
-- each bucket under a lease of its own (see the book's "Several relays at once").
--
-- `bucket` is set by the insert trigger `outbox_bucket`, which exists only while the outbox
-- has more than one bucket (`outbox-relay buckets set`): with one bucket (the default) every
-- row is bucket 0 and writers pay nothing for it.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS bucket smallint NOT NULL DEFAULT 0;

-- How many buckets the outbox has, and the layout: a number bumped by every change of the
-- count, part of every bucket's lease name and Kafka `transactional.id`, so no name of an
-- old layout is reused by a new one. One row.
CREATE TABLE IF NOT EXISTS outbox_buckets (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    buckets    integer     NOT NULL CHECK (buckets BETWEEN 1 AND 256),
    layout     integer     NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_buckets (buckets, layout) VALUES (1, 1) ON CONFLICT DO NOTHING;

-- The relays that share an outbox's buckets: each renews its row while it runs, and takes
-- its share, ceil(buckets / live members), of the buckets.
CREATE TABLE IF NOT EXISTS outbox_relay_member (
    lease      text        NOT NULL,
    instance   text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (lease, instance)
);
