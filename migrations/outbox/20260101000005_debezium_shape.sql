-- Debezium-shaped outbox tables (README, "Coming from Debezium"; `outbox-relay
-- debezium-install`). The trigger that command puts on a Debezium outbox table copies each
-- inserted row here with the message already encoded as Debezium's converters encode it; these
-- are the two things it needs from the outbox.
--
-- `relay_headers`: false for such a copy. The message then carries the row's `headers` only
-- (Debezium's `id` header and the placed columns), none of the relay's own (`event_id`,
-- `event_type`, `occurred_at`, ...), so consumers see what Debezium sent them. A JSON null in
-- `headers` is then a header without a value, as Kafka Connect writes a NULL column. Existing
-- rows and writers keep the relay's headers: the default is true (a constant default, so adding
-- the column rewrites nothing).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS relay_headers boolean NOT NULL DEFAULT true;
ALTER TABLE outbox_discarded ADD COLUMN IF NOT EXISTS relay_headers boolean NOT NULL DEFAULT true;

-- A text as a JSON string, byte for byte as Kafka Connect's JsonConverter (Jackson) writes it:
-- `"` and `\` escaped, \b \t \n \f \r as such, the other control characters as \u00XX, and a
-- character beyond the Basic Multilingual Plane as its UTF-16 surrogate pair (\uD83D\uDCE6);
-- hex digits in upper case. PostgreSQL's to_json differs only on those last two (raw UTF-8,
-- lower case), so it serves every text that has neither.
CREATE OR REPLACE FUNCTION outbox_json_string(t text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT CASE
    WHEN t !~ '[\x01-\x07\x0b\x0e-\x1f\U00010000-\U0010ffff]' THEN to_json(t)::text
    ELSE '"' || (
        SELECT string_agg(CASE
            WHEN c = '"' THEN '\"'
            WHEN c = '\' THEN '\\'
            WHEN c = E'\b' THEN '\b'
            WHEN c = E'\t' THEN '\t'
            WHEN c = E'\n' THEN '\n'
            WHEN c = E'\f' THEN '\f'
            WHEN c = E'\r' THEN '\r'
            WHEN ascii(c) < 32 THEN '\u' || upper(lpad(to_hex(ascii(c)), 4, '0'))
            WHEN ascii(c) > 65535 THEN
                '\u' || upper(to_hex(55296 + ((ascii(c) - 65536) >> 10)))
                || '\u' || upper(to_hex(56320 + ((ascii(c) - 65536) & 1023)))
            ELSE c END, '' ORDER BY n)
        FROM regexp_split_to_table(t, '') WITH ORDINALITY AS s(c, n)
    ) || '"'
END
$$;
