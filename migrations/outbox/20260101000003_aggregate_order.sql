-- Per-aggregate commit order for every writer (contract: DESIGN.md, guarantee 3).
--
-- The relay publishes an aggregate's events in `id` order. An identity value is taken when
-- the row is inserted, not when its transaction commits: two transactions writing events of
-- one aggregate can commit in the opposite order of their ids, and without this trigger the
-- later commit would be published first. So before each insert the trigger takes a
-- transaction-scoped advisory lock on the aggregate, and only then gives the row its `id`
-- (a second value from the same sequence: the first, from the column default, was taken
-- before the lock and is skipped). A second writer of the same aggregate waits at its insert
-- until the first one committed or rolled back, so among the transactions writing one
-- aggregate, `id` order is commit order. Writers of different aggregates never wait for each
-- other (the lock key is a 64-bit hash of the aggregate; a collision only makes two
-- aggregates' writers take turns).
--
-- What writers should know (README, "Publishing an event"):
-- - Two transactions that write events of the same two aggregates in opposite orders can
--   deadlock; PostgreSQL aborts one of them (SQLSTATE 40P01) and the other commits. Write a
--   transaction's aggregates in a fixed order, or retry on 40P01.
-- - Each distinct aggregate a transaction writes holds one entry of PostgreSQL's shared lock
--   table until commit (max_locks_per_transaction × max_connections entries in all, 6 400 by
--   default). A bulk load of more distinct aggregates in one transaction fails with "out of
--   shared memory": split it, raise max_locks_per_transaction, or, when nothing else writes
--   those aggregates meanwhile (or the writer already serializes them, e.g. by locking the
--   aggregate's own row first), turn the lock off for that transaction with
--   `SET LOCAL outbox.aggregate_lock = 'off'`.
--
-- The function runs as its owner (SECURITY DEFINER): `nextval` needs USAGE on the identity
-- sequence, which a writer role with only INSERT on `outbox` does not have (an identity default
-- needs none). It does nothing but take the lock and the next value, and its search_path is
-- pinned to the outbox's schema.
CREATE OR REPLACE FUNCTION outbox_order_by_aggregate() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER AS $$
BEGIN
    IF coalesce(current_setting('outbox.aggregate_lock', true), '') <> 'off' THEN
        -- Length-prefixed, so ('a/b', 'c') and ('a', 'b/c') are different keys.
        PERFORM pg_advisory_xact_lock(hashtextextended(
            length(NEW.aggregate_type)::text || ':' || NEW.aggregate_type || NEW.aggregate_id,
            7046));
        NEW.id := nextval('outbox_id_seq');
    END IF;
    RETURN NEW;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_order_by_aggregate() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

CREATE OR REPLACE TRIGGER outbox_order_by_aggregate BEFORE INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_order_by_aggregate();
