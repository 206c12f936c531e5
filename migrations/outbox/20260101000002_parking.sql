-- Failure isolation (relay bookkeeping; producers never touch these tables).
--
-- outbox_failure: one row per unpublished event that failed at least once. While it exists,
-- the event's aggregate (aggregate_type, aggregate_id) is left out of every claim until
-- `retry_at`, and for good once `parked_at` is set: later events of the aggregate wait behind
-- it (order), every other aggregate flows. Written only by the relay holding the lease (fenced
-- by its epoch), so parking survives restarts, SIGKILL and leader changes. `outbox-relay
-- redrive` deletes the row (the event is sent again, before the ones behind it); `outbox-relay
-- discard` moves the event into outbox_discarded. A row whose outbox event is gone is ignored
-- and cleaned up by the relay. No foreign key: the relay's delete of published rows must not
-- pay a trigger per row.
CREATE TABLE IF NOT EXISTS outbox_failure (
    outbox_id       bigint      PRIMARY KEY,
    event_id        uuid        NOT NULL,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    error_class     text        NOT NULL,
    error_message   text        NOT NULL,
    attempts        integer     NOT NULL CHECK (attempts > 0),
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    retry_at        timestamptz NOT NULL,
    parked_at       timestamptz NULL
);
CREATE INDEX IF NOT EXISTS outbox_failure_aggregate ON outbox_failure (aggregate_type, aggregate_id);

-- Events an operator removed from the outbox with `outbox-relay discard`: the full event, why,
-- when and by whom, so nothing disappears silently.
CREATE TABLE IF NOT EXISTS outbox_discarded (
    event_id        uuid        PRIMARY KEY,
    outbox_id       bigint      NOT NULL,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL,
    topic           text        NULL,
    created_at      timestamptz NOT NULL,
    error_class     text        NULL,
    error_message   text        NULL,
    attempts        integer     NULL,
    reason          text        NOT NULL CHECK (reason <> ''),
    discarded_by    text        NOT NULL,
    discarded_at    timestamptz NOT NULL DEFAULT now()
);
