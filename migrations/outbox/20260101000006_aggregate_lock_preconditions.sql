-- What the per-aggregate insert lock (20260101000003_aggregate_order.sql) rests on, enforced
-- (README, "Publishing an event"; the relay checks the third at start-up and in `migrate`):
--
-- 1. Only a transaction-local opt-out turns the lock off. `SET outbox.aggregate_lock = 'off'`
--    at session level survives on a pooled connection and would turn the lock off for later,
--    unrelated transactions; `SET LOCAL` cannot be told apart from it. So the opt-out is now
--    `SELECT outbox_aggregate_lock_off()` inside the transaction: it stores the transaction's
--    own id in the setting, and the trigger honours only the id of the transaction it runs in.
--    A plain 'off' is no longer honoured: the lock is taken, and the transaction gets one
--    WARNING naming the function.
-- 2. Explicit ids (`OVERRIDING SYSTEM VALUE`) are refused: the id must come from the outbox,
--    after the lock, so that an aggregate's id order is its commit order. The identity default
--    has just called nextval when no id was given: an id that is not the sequence's current
--    value in this session was given explicitly, and so was one equal to the value the
--    trigger's previous row ended with (`outbox.id_seen`: no nextval since).
-- 3. The id sequence hands out one value at a time (CACHE 1): with a larger cache each session
--    takes a block of values, and ids stop following commit order. Not a trigger's business:
--    `outbox-relay run` and `migrate` refuse a sequence with a cache above 1, naming the fix.

CREATE OR REPLACE FUNCTION outbox_aggregate_lock_off() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('outbox.aggregate_lock', 'off:' || txid_current(), true);
END
$$;

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
