-- Where a bucket's record of the last marked transaction is: the offset of that record in the
-- relay's records topic (see the book's "Several relays at once"). A relay taking the bucket
-- over reads the records after it, and marks the rows a committed transaction published but
-- its owner did not get to mark, instead of sending them again. NULL: no record marked yet.
ALTER TABLE outbox_relay_lease ADD COLUMN IF NOT EXISTS record_offset bigint;

-- When the holder released the lease (SIGTERM: its producer flushed, its transactions ended),
-- NULL while held or when it merely expired: changing the bucket count waits for a lease that
-- expired without a release until the holder's Kafka transactions have timed out.
ALTER TABLE outbox_relay_lease ADD COLUMN IF NOT EXISTS released_at timestamptz;
