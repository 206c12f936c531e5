-- The transactional outbox (contract: shared DESIGN.md). Producers INSERT here inside their
-- own business transaction; the relay publishes committed rows and deletes them once the
-- broker acknowledged them, so every row in this table is an unpublished event.
CREATE TABLE IF NOT EXISTS outbox (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       uuid        NOT NULL DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    topic          text        NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT outbox_headers_is_object CHECK (jsonb_typeof(headers) = 'object')
);

-- The table is a queue: rows are inserted and deleted at the same rate. Vacuum it after a
-- fixed number of dead rows instead of a fraction of its (tiny) size, and without throttling,
-- so the primary-key index the relay scans from its left end stays small under churn.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 10000
);

-- Leader lease: one active relay per (database, lease name). `epoch` is the fencing token:
-- it grows on every change of holder, and the relay deletes published rows only while the
-- lease still carries the epoch it acquired. Times come from the database clock only.
CREATE TABLE IF NOT EXISTS outbox_relay_lease (
    name         text        PRIMARY KEY,
    holder       text        NOT NULL,
    epoch        bigint      NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    renewed_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
