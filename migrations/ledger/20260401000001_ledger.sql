-- Optional: the producer-side ledger that `outbox-audit` reconciles the broker against.
--
-- The relay deletes an outbox row once the broker acknowledged it, so after publishing nothing
-- in the database says what was written. This trigger records every committed outbox row
-- (its `id`, the relay order within an aggregate, and where it goes) in `outbox_ledger`, in the
-- writer's own transaction: a rolled-back event leaves no ledger row. With it the audit checks
-- that every published event is on its topic and that the first occurrences of an aggregate's
-- events on the broker are in `id` order. It costs one more small row per event; apply it
-- where you want to audit (`outbox_kit::schema::migrate_ledger`, or this file with psql), and
-- delete old rows as the topics' retention drops their messages.
CREATE TABLE IF NOT EXISTS outbox_ledger (
    outbox_id      bigint      PRIMARY KEY,
    event_id       uuid        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    topic          text        NULL,
    created_at     timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS outbox_ledger_created_at_idx ON outbox_ledger (created_at);

CREATE OR REPLACE FUNCTION outbox_ledger_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_ledger (outbox_id, event_id, aggregate_type, aggregate_id, event_type, topic, created_at)
    VALUES (NEW.id, NEW.event_id, NEW.aggregate_type, NEW.aggregate_id, NEW.event_type, NEW.topic, NEW.created_at);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER outbox_ledger_record AFTER INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_ledger_record();
