-- The relay's claim floor (issue: a parked aggregate's backlog must not slow every claim).
--
-- While an event is parked or waiting for a retry, the events behind it stay in the outbox
-- and become its head; the relay then starts each claim above a floor: an `id` at or below
-- which every row is held back by a failure it knows, or gone. It may only raise the floor
-- past an `id` once no transaction can still commit a row at or below it, which it tells by
-- transaction ids: every transaction that took an outbox id before a given moment must have
-- had its own transaction id by then. An insert gets its transaction id when its row is
-- written, after this trigger took the id; so the trigger now takes the transaction id first
-- (`pg_current_xact_id()`, free for a transaction that already has one). Otherwise unchanged
-- from 20260101000006.
--
-- The table is locked against writers while the function is replaced, so that no insert that
-- ran the old body (an outbox id before its transaction id) is still open when a relay of
-- this version starts: the migration waits for the writers' open transactions (at most
-- `lock_timeout`, then it fails and can be run again), and writers wait for it (briefly).

SET LOCAL lock_timeout = '30s';
LOCK TABLE outbox IN SHARE MODE;

CREATE OR REPLACE FUNCTION outbox_order_by_aggregate() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER AS $$
DECLARE
    opt_out text := coalesce(current_setting('outbox.aggregate_lock', true), '');
    seen text := current_setting('outbox.id_seen', true);
    defaulted bigint;
BEGIN
    BEGIN
        defaulted := currval('outbox_id_seq');
    EXCEPTION WHEN object_not_in_prerequisite_state THEN
        defaulted := NULL;
    END;
    IF NEW.id IS DISTINCT FROM defaulted OR defaulted::text = seen THEN
        RAISE EXCEPTION 'an outbox row may not be given its id (% was given with OVERRIDING SYSTEM VALUE)', NEW.id
            USING ERRCODE = 'generated_always',
                  HINT = 'Leave id out of the INSERT: the outbox gives it after taking the aggregate''s lock, so that an aggregate''s id order is its commit order.';
    END IF;
    IF opt_out <> '' THEN
        -- outbox_aggregate_lock_off() took the transaction id before the identity default
        -- took this row's id.
        IF opt_out = 'off:' || txid_current() THEN
            PERFORM set_config('outbox.id_seen', NEW.id::text, false);
            RETURN NEW;
        END IF;
        IF opt_out = 'off'
           AND coalesce(current_setting('outbox.aggregate_lock_warned', true), '') <> txid_current()::text THEN
            PERFORM set_config('outbox.aggregate_lock_warned', txid_current()::text, true);
            RAISE WARNING 'outbox.aggregate_lock = ''off'' is not honoured (a session-level setting would turn the lock off for every later transaction of a pooled connection); the lock is taken'
                USING HINT = 'To turn it off for one transaction: SELECT outbox_aggregate_lock_off(); inside it.';
        END IF;
    END IF;
    -- Length-prefixed, so ('a/b', 'c') and ('a', 'b/c') are different keys.
    PERFORM pg_advisory_xact_lock(hashtextextended(
        length(NEW.aggregate_type)::text || ':' || NEW.aggregate_type || NEW.aggregate_id,
        7046));
    -- The transaction id before the outbox id (see above).
    PERFORM pg_current_xact_id();
    NEW.id := nextval('outbox_id_seq');
    PERFORM set_config('outbox.id_seen', NEW.id::text, false);
    RETURN NEW;
END
$$;

-- CREATE OR REPLACE resets the function's settings: pin its search_path again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_order_by_aggregate() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
