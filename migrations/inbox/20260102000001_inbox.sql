-- The inbox (contract: shared DESIGN.md, "Inbox"): one row per event a consumer applied,
-- inserted in the same transaction as the event's business effect. The primary key is the
-- dedupe: a second delivery of the same event (same event_id) conflicts, its effect is skipped
-- and the offset moves on. Consumers in any language only need the first three columns.
CREATE TABLE IF NOT EXISTS inbox (
    consumer_name     text        NOT NULL,
    event_id          uuid        NOT NULL,
    processed_at      timestamptz NOT NULL DEFAULT now(),
    -- How many later deliveries of this event were recognised and skipped (redeliveries after
    -- a crash or rebalance, producers resending): the inbox counts its duplicates.
    duplicates        integer     NOT NULL DEFAULT 0 CHECK (duplicates >= 0),
    last_duplicate_at timestamptz NULL,
    PRIMARY KEY (consumer_name, event_id)
);

-- For a retention job that forgets rows older than any possible redelivery.
CREATE INDEX IF NOT EXISTS inbox_processed_at_idx ON inbox (processed_at);
