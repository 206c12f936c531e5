-- Ship-backs are called outside the consumer's transaction (issue 19, item 9): the intent is
-- recorded first (`result` NULL), the platform is called with no transaction open, and the
-- answer is recorded after. A row with a NULL result is a ship-back requested and not (yet)
-- answered; `last_error` says why the latest call did not end it.
ALTER TABLE channel_shipbacks ALTER COLUMN result DROP NOT NULL;
ALTER TABLE channel_shipbacks ALTER COLUMN reported_at DROP NOT NULL;
ALTER TABLE channel_shipbacks ALTER COLUMN reported_at DROP DEFAULT;
ALTER TABLE channel_shipbacks ADD COLUMN requested_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE channel_shipbacks ADD COLUMN last_error text NULL;
ALTER TABLE channel_shipbacks ADD CONSTRAINT channel_shipbacks_answered
    CHECK ((result IS NULL) = (reported_at IS NULL));
