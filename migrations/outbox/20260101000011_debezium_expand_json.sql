-- Debezium's `table.expand.json.payload=true` with a schemaless JsonConverter
-- (`outbox-relay debezium-install`): the Outbox Event Router parses a JSON payload's text
-- (Jackson), infers a Kafka Connect schema from it (Debezium's JsonSchemaData), builds a struct
-- and JsonConverter writes that struct. These functions give the same bytes from a jsonb
-- payload, or say that Debezium's would not be a struct: NULL when the router keeps the payload
-- a string (its inference threw), an error when Debezium's connector would stop at the row
-- (a value its struct cannot hold) or its bytes depend on the JVM run (an array of objects
-- whose shapes merge in a HashSet's order).

-- A double as Java's Double.toString writes it (JsonConverter's FLOAT64): the shortest digits
-- that read back as the same double; plain between 10^-3 and 10^7 with at least one decimal
-- (`100.0`), else `d.dddE-n`.
CREATE OR REPLACE FUNCTION outbox_java_double(d float8) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET extra_float_digits = 1 AS $$
DECLARE
    n numeric := abs(float8out(d)::text::numeric);
    t text := trim_scale(n)::text;
    sign text := CASE WHEN d < 0 THEN '-' ELSE '' END;
    digits text;
    e int;
BEGIN
    IF n = 0 THEN
        RETURN sign || '0.0';
    END IF;
    IF n >= 0.001 AND n < 10000000 THEN
        RETURN sign || t || CASE WHEN position('.' IN t) = 0 THEN '.0' ELSE '' END;
    END IF;
    IF n >= 1 THEN
        e := length(split_part(t, '.', 1)) - 1;
    ELSE
        e := -(length(split_part(t, '.', 2)) - length(ltrim(split_part(t, '.', 2), '0')) + 1);
    END IF;
    digits := rtrim(ltrim(replace(t, '.', ''), '0'), '0');
    RETURN sign || substr(digits, 1, 1) || '.' || coalesce(nullif(substr(digits, 2), ''), '0')
        || 'E' || e;
END
$$;

-- The schema Debezium infers for a JSON value, as jsonb: "string", "boolean", "int32", "int64",
-- "float64" (also for integers beyond int64), "bytes" (a null with `null_as_bytes`,
-- `table.json.payload.null.behavior=optional_bytes`), {"a": element} for an array,
-- {"s": [[name, schema], ...]} for an object (fields in the document's order, those without a
-- schema left out; with "req" when merged from an array's objects of different shapes, which
-- makes it required); NULL for none (a null; an empty array). SQLSTATE OXF01 where Debezium's
-- inference throws (an array of mixed types or number kinds, of nulls only, of empty arrays).
CREATE OR REPLACE FUNCTION outbox_debezium_schema(v jsonb, null_as_bytes boolean) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    t text := v #>> '{}';
    kinds text[];
    schemas jsonb[];
    longest jsonb;
    names jsonb;
    s jsonb;
    f jsonb;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'string' THEN RETURN '"string"';
    WHEN 'boolean' THEN RETURN '"boolean"';
    WHEN 'number' THEN
        IF t ~ '[.eE]' THEN RETURN '"float64"'; END IF;
        IF t::numeric BETWEEN -2147483648 AND 2147483647 THEN RETURN '"int32"'; END IF;
        IF t::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            RETURN '"int64"';
        END IF;
        RETURN '"float64"';
    WHEN 'null' THEN
        RETURN CASE WHEN null_as_bytes THEN '"bytes"'::jsonb END;
    WHEN 'object' THEN
        SELECT coalesce(jsonb_agg(jsonb_build_array(key, fs) ORDER BY n), '[]')
        INTO s
        FROM jsonb_each(v) WITH ORDINALITY AS e(key, value, n),
             LATERAL outbox_debezium_schema(value, null_as_bytes) AS fs
        WHERE fs IS NOT NULL;
        RETURN jsonb_build_object('s', s);
    ELSE -- an array
        IF jsonb_array_length(v) = 0 THEN
            RETURN NULL;
        END IF;
        SELECT array_agg(DISTINCT jsonb_typeof(e)) INTO kinds
        FROM jsonb_array_elements(v) AS e WHERE jsonb_typeof(e) <> 'null';
        IF kinds IS NULL THEN
            s := outbox_debezium_schema('null', null_as_bytes);
        ELSIF cardinality(kinds) > 1 THEN
            RAISE EXCEPTION 'not a homogenous array' USING ERRCODE = 'OXF01';
        ELSIF kinds[1] = 'object' THEN
            -- Debezium merges the elements' distinct schemas in a HashSet's order: the result
            -- is the same in every order only when each one's fields are a prefix of the
            -- longest one's and a field has one schema.
            SELECT array_agg(DISTINCT outbox_debezium_schema(e, null_as_bytes)) INTO schemas
            FROM jsonb_array_elements(v) AS e WHERE jsonb_typeof(e) = 'object';
            SELECT x INTO longest FROM unnest(schemas) AS x
            ORDER BY jsonb_array_length(x -> 's') DESC LIMIT 1;
            FOREACH s IN ARRAY schemas LOOP
                IF (SELECT jsonb_agg(f0) FROM jsonb_array_elements(longest -> 's') WITH ORDINALITY AS l(f0, i)
                    WHERE i <= jsonb_array_length(s -> 's')) IS DISTINCT FROM
                   (CASE WHEN jsonb_array_length(s -> 's') = 0 THEN NULL ELSE s -> 's' END) THEN
                    RAISE EXCEPTION 'the objects of an array of the payload differ in shape (fields % and %): Debezium merges their schemas in an order that varies between runs',
                        s -> 's', longest -> 's' USING ERRCODE = 'OXE01';
                END IF;
            END LOOP;
            -- A merged schema (Connect's copySchemaBasics) is no longer optional: a null
            -- element is then refused.
            s := CASE WHEN cardinality(schemas) > 1 THEN longest || '{"req": true}' ELSE longest END;
        ELSE
            IF kinds[1] = 'number' THEN
                SELECT array_agg(DISTINCT outbox_debezium_schema(e, null_as_bytes)) INTO schemas
                FROM jsonb_array_elements(v) AS e WHERE jsonb_typeof(e) = 'number';
                IF cardinality(schemas) > 1 THEN
                    RAISE EXCEPTION 'different number types' USING ERRCODE = 'OXF01';
                END IF;
            END IF;
            SELECT outbox_debezium_schema(e, null_as_bytes) INTO s
            FROM jsonb_array_elements(v) WITH ORDINALITY AS a(e, n)
            WHERE jsonb_typeof(e) <> 'null' ORDER BY n LIMIT 1;
        END IF;
        IF s IS NULL THEN
            RAISE EXCEPTION 'unrecognized member schema' USING ERRCODE = 'OXF01';
        END IF;
        RETURN jsonb_build_object('a', s);
    END CASE;
END
$$;

-- The value `v` in a struct of schema `s` (outbox_debezium_schema's), as JsonConverter writes
-- it; SQLSTATE OXE01 where Kafka Connect refuses the value for the schema (Debezium's task
-- fails).
CREATE OR REPLACE FUNCTION outbox_debezium_value(v jsonb, s jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    kind text := jsonb_typeof(v);
    t text := v #>> '{}';
    out text;
BEGIN
    IF v IS NULL OR kind = 'null' THEN
        IF s ? 'req' THEN
            RAISE EXCEPTION 'a null element in an array of objects of different shapes: the schema Debezium merges for them is not optional, Kafka Connect refuses the record and Debezium''s connector stops'
                USING ERRCODE = 'OXE01';
        END IF;
        RETURN 'null';
    END IF;
    IF s = '"string"' AND kind = 'string' THEN
        RETURN outbox_json_string(t);
    ELSIF s = '"boolean"' AND kind = 'boolean' THEN
        RETURN t;
    ELSIF s = '"int32"' AND kind = 'number' AND outbox_debezium_schema(v, false) = '"int32"' THEN
        RETURN t;
    ELSIF s = '"int64"' AND kind = 'number' AND outbox_debezium_schema(v, false) = '"int64"' THEN
        RETURN t;
    ELSIF s = '"float64"' AND kind = 'number' AND t ~ '[.eE]' THEN
        RETURN outbox_java_double(t::float8);
    ELSIF s ? 'a' AND kind = 'array' THEN
        SELECT '[' || coalesce(string_agg(outbox_debezium_value(e, s -> 'a'), ',' ORDER BY n), '') || ']'
        INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS a(e, n);
        RETURN out;
    ELSIF s ? 's' AND kind = 'object' THEN
        SELECT '{' || coalesce(string_agg(outbox_json_string(f ->> 0) || ':'
                   || outbox_debezium_value(v -> (f ->> 0), f -> 1), ',' ORDER BY n), '') || '}'
        INTO out FROM jsonb_array_elements(s -> 's') WITH ORDINALITY AS fs(f, n);
        RETURN out;
    END IF;
    RAISE EXCEPTION 'the payload''s % % does not fit the schema % Debezium infers for it: Kafka Connect refuses the record and Debezium''s connector stops',
        kind, left(t, 40), s USING ERRCODE = 'OXE01';
END
$$;

-- A jsonb payload expanded as Debezium's router expands it and a schemaless JsonConverter
-- writes it; NULL when Debezium keeps it a string (not an object or an array, or its schema
-- inference throws). An error (SQLSTATE OXE01) where Debezium's connector would stop or its
-- bytes depend on the run.
CREATE OR REPLACE FUNCTION outbox_debezium_expand(p jsonb, null_as_bytes boolean) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    s jsonb;
BEGIN
    IF jsonb_typeof(p) NOT IN ('object', 'array') THEN
        RETURN NULL;
    END IF;
    BEGIN
        s := outbox_debezium_schema(p, null_as_bytes);
    EXCEPTION WHEN SQLSTATE 'OXF01' THEN
        RETURN NULL;
    END;
    IF jsonb_typeof(p) = 'array' THEN
        IF s IS NULL THEN
            RETURN NULL; -- `[]`: no schema; Debezium keeps the string
        END IF;
        RAISE EXCEPTION 'outbox-relay: the Debezium copy (table.expand.json.payload=true) refuses this row: a payload that is a JSON array is no struct: Kafka Connect refuses the record and Debezium''s connector stops'
            USING ERRCODE = 'OXE01';
    END IF;
    RETURN outbox_debezium_value(p, s);
EXCEPTION WHEN SQLSTATE 'OXE01' THEN
    RAISE EXCEPTION 'outbox-relay: the Debezium copy (table.expand.json.payload=true) refuses this row: %', SQLERRM
        USING ERRCODE = 'OXE01';
END
$$;
