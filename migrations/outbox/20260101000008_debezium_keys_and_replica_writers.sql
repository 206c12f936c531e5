-- Rows copied from a Debezium-shaped table (`outbox-relay debezium-install`) whose key column is
-- NULL: Debezium publishes them with what the key converter writes for a null, which for
-- StringConverter is a record without a key (not an empty one). The outbox says so with an
-- empty `message_key`, allowed only on a row without the relay's headers (`relay_headers =
-- false`, the copies): such a row has no key. Before this an empty `message_key` was refused
-- on every row, so no row written before means anything else by it; a row with the relay's
-- headers still needs a non-empty one or none (then its key is the aggregate id).
--
-- The copy gives such a row an `aggregate_id` of its own (its event id): records without a
-- key go to any partition, as the Java producer spreads them, so they have no order to keep
-- and their writers need not take turns at the aggregate's insert lock.
--
-- The new check reads the table once (it holds only the unpublished events).
ALTER TABLE outbox
    DROP CONSTRAINT IF EXISTS outbox_message_key_not_empty,
    ADD CONSTRAINT outbox_message_key_not_empty CHECK (message_key <> '' OR NOT relay_headers);

-- The outbox's insert trigger fires for every writer, one with `session_replication_role =
-- replica` too (bulk loaders, logical-replication targets, and the copy `debezium-install`
-- puts on a Debezium table, which fires for them since Debezium publishes their rows): a
-- trigger enabled the default way ('O') fires only for the others, and such a writer's rows
-- would skip the aggregate's lock (per-aggregate order) and take their ids before their
-- transaction ids (the claim floor). The relay counts the trigger as the floor's premise only
-- when it is enabled ALWAYS. A trigger someone disabled stays disabled (the relay then reads
-- every claim from the head, and the order is the writers' business).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'outbox'::regclass
               AND tgname = 'outbox_order_by_aggregate' AND tgenabled <> 'D') THEN
        ALTER TABLE outbox ENABLE ALWAYS TRIGGER outbox_order_by_aggregate;
    END IF;
END
$$;
