-- What an event can put on the wire besides a JSON value (README, "Payloads, tombstones and
-- keys"):
-- - `payload_bytes`: raw bytes (Protobuf, Avro, anything the writer serialized), published
--   unchanged as the Kafka value, with `content_type` (default `application/octet-stream`) in
--   the message's `content-type` header. An event has a JSON `payload` or `payload_bytes`,
--   never both.
-- - neither: a tombstone (null value, same key) for compacted topics, as Debezium's
--   `route.tombstone.on.empty.payload` does.
-- - `message_key`: the Kafka key, when it is not the aggregate id. The relay still orders by
--   aggregate.
--
-- Existing rows and writers keep working: a plain INSERT of a JSON `payload` is what it was.
-- The three columns are nullable without a default, so adding them rewrites nothing; the checks
-- read the table once (it holds only the unpublished events).
ALTER TABLE outbox
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN IF NOT EXISTS payload_bytes bytea NULL,
    ADD COLUMN IF NOT EXISTS content_type  text  NULL,
    ADD COLUMN IF NOT EXISTS message_key   text  NULL,
    ADD CONSTRAINT outbox_one_payload CHECK (payload IS NULL OR payload_bytes IS NULL),
    ADD CONSTRAINT outbox_content_type_of_bytes
        CHECK (content_type IS NULL OR (payload_bytes IS NOT NULL AND content_type <> '')),
    ADD CONSTRAINT outbox_message_key_not_empty CHECK (message_key <> '');

-- `discard` keeps the whole event, so its audit table gets the same columns.
ALTER TABLE outbox_discarded
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN IF NOT EXISTS payload_bytes bytea NULL,
    ADD COLUMN IF NOT EXISTS content_type  text  NULL,
    ADD COLUMN IF NOT EXISTS message_key   text  NULL;
