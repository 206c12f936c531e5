-- Dead letters `dlq redrive` sent back, one row per letter (its dead-letter topic, partition
-- and offset), written once the broker acknowledged the redriven message. `dlq redrive --all`
-- skips the letters listed here: the inbox row that would turn a second redrive into a
-- duplicate is purged after the retention window, while the dead-letter topic usually keeps
-- its letters longer. Not purged by the inbox retention (one row per redriven letter).
CREATE TABLE IF NOT EXISTS dlq_redriven (
    consumer_name   text        NOT NULL,
    dlq_topic       text        NOT NULL,
    dlq_partition   integer     NOT NULL,
    dlq_offset      bigint      NOT NULL,
    event_id        uuid        NULL,
    -- Where the redriven message landed.
    redrive_topic     text      NOT NULL,
    redrive_partition integer   NOT NULL,
    redrive_offset    bigint    NOT NULL,
    redriven_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, dlq_topic, dlq_partition, dlq_offset)
);
