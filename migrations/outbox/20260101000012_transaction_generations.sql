-- The generation of a bucket's Kafka `transactional.id`s (see the book's "Several relays at
-- once"). A transaction aborted while one of its partitions had died cannot finish at the
-- coordinator until that partition is back (its abort marker cannot be written), and until
-- then no producer can initialise that `transactional.id`: the bucket would stand still. Its
-- holder then moves the bucket to a new id (`<id>.g<generation>`), bumping this column under its
-- lease, so that every relay taking the bucket over initialises, and fences, the id in use.
-- 0: the id without a suffix, as relays without generations use.
ALTER TABLE outbox_relay_lease ADD COLUMN IF NOT EXISTS txn_generation integer NOT NULL DEFAULT 0;
