//! The SQL `debezium-install` generates: the trigger function that copies each inserted row of
//! the Debezium table into the relay's `outbox`, encoded as Debezium's converters encode it,
//! and the trigger. (It stays beside the router's configuration it is generated from; the
//! statements the command runs against the catalog are in `store/debezium.rs`.)

use std::collections::BTreeMap;

use super::columns::{Column, ColumnKind};
use super::router::{Converter, RouterConfig};

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The column expression `NEW."c"`.
fn new(column: &str) -> String {
    format!("NEW.{}", ident(column))
}

/// The column's text as Debezium reads it: PostgreSQL's output of the value (NULL for NULL).
/// A cast to `text` would drop a `char(n)`'s padding, so such a column goes through its output
/// function.
fn text_of(column: &str, kind: ColumnKind) -> String {
    match kind {
        ColumnKind::Char => format!("textin(bpcharout({}))", new(column)),
        _ => format!("{}::text", new(column)),
    }
}

/// SQL rendering a non-NULL value of `column` as JsonConverter writes it (a JSON value, text).
fn json_value(column: &str, kind: ColumnKind, outbox_schema: &str) -> String {
    let c = new(column);
    let string = ident(outbox_schema) + ".outbox_json_string";
    match kind {
        ColumnKind::Int(_) | ColumnKind::Bool => format!("{c}::text"),
        ColumnKind::Bytes => {
            format!("'\"' || translate(encode({c}, 'base64'), E'\\n', '') || '\"'")
        }
        _ => format!("{string}({})", text_of(column, kind)),
    }
}

/// SQL rendering `column` with `converter` as text (NULL for a NULL value unless the converter
/// writes something for it).
fn converted(
    column: &str,
    col: Column,
    converter: Converter,
    outbox_schema: &str,
) -> Result<String, String> {
    let c = new(column);
    Ok(match converter {
        Converter::String => match col.kind {
            ColumnKind::Bytes => {
                return Err(format!(
                    "column {column} is bytea: StringConverter cannot write bytes the way Debezium does; use JsonConverter"
                ))
            }
            _ => text_of(column, col.kind),
        },
        Converter::Bytes => {
            return Err(format!(
                "column {column} is not the payload: a binary converter writes only a bytea payload"
            ))
        }
        Converter::Json { schemas: false } => format!(
            "CASE WHEN {c} IS NULL THEN 'null' ELSE {} END",
            json_value(column, col.kind, outbox_schema)
        ),
        Converter::Json { schemas: true } => format!(
            "'{{\"schema\":' || {} || ',\"payload\":' || CASE WHEN {c} IS NULL THEN 'null' ELSE {} END || '}}'",
            literal(&col.kind.schema(col.nullable)),
            json_value(column, col.kind, outbox_schema)
        ),
    })
}

/// Names of the trigger and its function on the Debezium table.
pub fn trigger_name(table: &str) -> String {
    format!("{table}_to_outbox_relay")
}

/// The statements that make the relay publish `config`'s table as Debezium would: a trigger
/// function (owned by the installing role, running as it: writers need no right on `outbox`)
/// copying each inserted row into `outbox_schema.outbox`, encoded, and the AFTER INSERT
/// trigger. `columns` are the table's (name → column); a column the configuration needs that
/// is missing or of a type Debezium's mapping the relay does not reproduce is an error naming
/// it.
///
/// # Errors
/// A message naming the column or option.
pub fn install_sql(
    config: &RouterConfig,
    columns: &BTreeMap<String, Column>,
    outbox_schema: &str,
) -> Result<Vec<String>, String> {
    let table = format!("{}.{}", config.schema, config.table);
    let column = |name: &str, role: &str| -> Result<Column, String> {
        columns.get(name).copied().ok_or_else(|| {
            format!("{table} has no column {name} (the {role}); name it in the connector's options")
        })
    };
    let refuse = |name: &str, role: &str, what: &str| {
        Err::<(), String>(format!("column {name} of {table} (the {role}) is {what}"))
    };
    let id = column(&config.id_column, "event id, table.field.event.id")?;
    if id.kind != ColumnKind::Uuid {
        refuse(
            &config.id_column,
            "event id",
            "not a uuid: the relay's event id is a uuid",
        )?;
    }
    let key = column(&config.key_column, "key, table.field.event.key")?;
    if !matches!(
        key.kind,
        ColumnKind::Text | ColumnKind::Char | ColumnKind::Uuid | ColumnKind::Int(_)
    ) {
        refuse(
            &config.key_column,
            "key",
            "not text, uuid or an integer (the types the relay encodes as Debezium does)",
        )?;
    }
    let route = column(&config.route_by, "routed-by value, route.by.field")?;
    if !route.kind.is_text() {
        refuse(&config.route_by, "routed-by value", "not text")?;
    }
    let payload = column(&config.payload_column, "payload, table.field.event.payload")?;
    if !matches!(
        payload.kind,
        ColumnKind::Json { .. } | ColumnKind::Text | ColumnKind::Char | ColumnKind::Bytes
    ) {
        refuse(
            &config.payload_column,
            "payload",
            "not jsonb, json, text or bytea",
        )?;
    }
    let event_type = match (columns.get(&config.type_column.0), config.type_column.1) {
        (Some(c), _) if c.kind.is_text() => {
            format!("coalesce({}, '')", text_of(&config.type_column.0, c.kind))
        }
        (Some(_), _) => {
            return Err(format!(
                "column {} of {table} (the event type, table.field.event.type) is not text",
                config.type_column.0
            ))
        }
        (None, true) => {
            column(&config.type_column.0, "event type, table.field.event.type")?;
            unreachable!("the column is missing")
        }
        (None, false) => "''".to_owned(),
    };
    let created_at = match &config.timestamp_column {
        None => "now()".to_owned(),
        Some(name) => match column(name, "timestamp, table.field.event.timestamp")?.kind {
            ColumnKind::Timestamp(true) => format!("coalesce({}, now())", new(name)),
            ColumnKind::Timestamp(false) => {
                format!("coalesce({} AT TIME ZONE 'UTC', now())", new(name))
            }
            _ => {
                return Err(format!(
                    "column {name} of {table} (the timestamp) is not a timestamp"
                ))
            }
        },
    };
    let mut headers = vec![format!("'id', {}::text", new(&config.id_column))];
    for h in &config.headers {
        let c = column(
            &h.column,
            "placed header, table.fields.additional.placement",
        )?;
        let value = match c.kind {
            ColumnKind::Int(_) | ColumnKind::Bool => format!("to_jsonb({})", new(&h.column)),
            ColumnKind::Text | ColumnKind::Char | ColumnKind::Uuid => {
                format!("to_jsonb({})", text_of(&h.column, c.kind))
            }
            _ => {
                return Err(format!(
                    "column {} of {table} (placed as header {}) is not text, uuid, an integer or a boolean",
                    h.column, h.alias
                ))
            }
        };
        headers.push(format!("{}, {value}", literal(&h.alias)));
    }
    let topic = config
        .topic
        .iter()
        .map(|part| match part {
            Some(text) => literal(text),
            None => text_of(&config.route_by, route.kind),
        })
        .collect::<Vec<_>>()
        .join(" || ");
    let topic = if topic.is_empty() {
        "''".to_owned()
    } else {
        topic
    };
    // The aggregate type, with the key the relay's unit of order: Debezium keeps a key's
    // events in order per topic (one key, one partition). The routed-by value when the topic
    // names it (then one value is one topic), else the one topic every event goes to: a key's
    // events keep their order across routed-by values, as Debezium's do.
    let aggregate_type = if config.topic.iter().any(Option::is_none) {
        text_of(&config.route_by, route.kind)
    } else {
        topic.clone()
    };
    // The key. StringConverter writes no key for a NULL: an empty `message_key` says so (on a
    // row without the relay's headers); its '' is NULL, the aggregate id then being ''.
    // JsonConverter writes a key for a NULL too (`null`, or the envelope).
    let key_text = text_of(&config.key_column, key.kind);
    let message_key = match config.key_converter {
        Converter::String => format!(
            "CASE WHEN {} IS NULL THEN '' ELSE nullif({key_text}, '') END",
            new(&config.key_column)
        ),
        c => converted(&config.key_column, key, c, outbox_schema)?,
    };
    // The unit of order (with the routed-by value): the key's text. A NULL key under
    // StringConverter is no key: such records go to any partition (as the Java producer
    // spreads them), so each is its own unit (its event id) and their writers never wait for
    // each other. Under JsonConverter a NULL key is one key (the same bytes, one partition):
    // one unit, ''.
    let aggregate_id = match config.key_converter {
        Converter::String => format!("coalesce({key_text}, {}::text)", new(&config.id_column)),
        _ => format!("coalesce({key_text}, '')"),
    };
    // The value: the jsonb itself for StringConverter (the relay sends its text, as Debezium
    // does), else the converter's bytes; a NULL payload is a tombstone when the router says
    // so, else what the converter writes for a null value (nothing for StringConverter and,
    // without schemas, `null`; with schemas, the envelope with a null payload).
    let p = new(&config.payload_column);
    let (payload_json, payload_bytes) = match (config.value_converter, payload.kind) {
        (Converter::String, ColumnKind::Json { binary: true }) => (p.clone(), "NULL".to_owned()),
        // Expanded as Debezium's router expands it (schemaless JsonConverter only: the
        // properties refuse the others); where Debezium keeps the payload a string, that.
        (Converter::Json { schemas: false }, ColumnKind::Json { binary: true })
            if config.expand_json_payload =>
        {
            (
                "NULL".to_owned(),
                format!(
                    "convert_to(CASE WHEN {p} IS NULL THEN 'null' ELSE coalesce({}.outbox_debezium_expand({p}, {}), {}.outbox_json_string({p}::text)) END, 'UTF8')",
                    ident(outbox_schema),
                    config.json_payload_null_as_bytes,
                    ident(outbox_schema),
                ),
            )
        }
        (Converter::Json { .. }, ColumnKind::Json { binary: false } | ColumnKind::Text | ColumnKind::Char)
            if config.expand_json_payload =>
        {
            return Err(format!(
                "column {} of {}.{} (the payload) is not jsonb: with table.expand.json.payload=true the relay expands jsonb payloads only (Debezium parses the text as written)",
                config.payload_column, config.schema, config.table
            ))
        }
        // The application's bytes as they are; none for a NULL (the converter writes null).
        (Converter::Bytes, ColumnKind::Bytes) => ("NULL".to_owned(), p.clone()),
        (Converter::Bytes, _) => {
            return Err(format!(
                "column {} of {}.{} (the payload, table.field.event.payload) is not bytea: value.converter (BinaryDataConverter, ByteArrayConverter) writes a bytea payload's bytes only",
                config.payload_column, config.schema, config.table
            ))
        }
        (c, _) => (
            "NULL".to_owned(),
            format!(
                "convert_to({}, 'UTF8')",
                converted(&config.payload_column, payload, c, outbox_schema)?
            ),
        ),
    };
    let payload_bytes = if config.tombstone_on_empty_payload {
        format!("CASE WHEN {p} IS NULL THEN NULL ELSE {payload_bytes} END")
    } else {
        payload_bytes
    };
    let outbox = format!("{}.outbox", ident(outbox_schema));
    let function = format!(
        "{}.{}",
        ident(&config.schema),
        ident(&trigger_name(&config.table))
    );
    let table = format!("{}.{}", ident(&config.schema), ident(&config.table));
    // The function runs with its owner's rights (it writes the outbox, which the Debezium
    // table's writers may not): it copies rows of this one table (or of its partitions: a
    // partitioned table's row trigger fires on the partition, and attaching one takes the
    // table's owner), fired after each insert of a row, and nothing else, whoever attached it
    // to what.
    let body = format!(
        "BEGIN\n    \
             IF (TG_RELID IS DISTINCT FROM {table_oid}::regclass \
                 AND {table_oid}::regclass NOT IN (SELECT relid FROM pg_partition_ancestors(TG_RELID))) \
                OR TG_OP <> 'INSERT' \
                OR TG_LEVEL <> 'ROW' OR TG_WHEN <> 'AFTER' THEN\n        \
                 RAISE EXCEPTION 'outbox-relay: % copies only the rows inserted into %', \
                     {function_text}, {table_text} USING ERRCODE = '42501';\n    \
             END IF;\n    \
             INSERT INTO {outbox} (event_id, aggregate_type, aggregate_id, event_type, payload, \
             payload_bytes, message_key, headers, topic, created_at, relay_headers)\n    \
             VALUES ({id}, {route}, {key}, {event_type}, {payload_json}, {payload_bytes}, \
             {message_key}, jsonb_build_object({headers}), {topic}, {created_at}, false);\n    \
             RETURN NULL;\n\
         END",
        table_oid = literal(&table),
        function_text = literal(&function),
        table_text = literal(&table),
        id = new(&config.id_column),
        route = aggregate_type,
        key = aggregate_id,
        headers = headers.join(", "),
    );
    const TAG: &str = "$outbox_relay$";
    if body.contains(TAG) {
        return Err(format!(
            "a column name or an option value contains {TAG}; the relay refuses it"
        ));
    }
    Ok(vec![
        format!(
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql \
             SECURITY DEFINER SET search_path = pg_catalog, {}, pg_temp \
             SET standard_conforming_strings = on AS {TAG}\n{body}\n{TAG}",
            ident(outbox_schema)
        ),
        // `standard_conforming_strings = on` whatever the writer's session says: the body's
        // literals (and the JSON encoder's backslashes it calls) are parsed when it runs, and
        // with it off a backslash would be an escape (every insert failed, or a backslash in an
        // option changed the SQL).
        // Functions are executable by PUBLIC when created: no other role may attach this one
        // to a table of its own (a trigger's function needs EXECUTE when the trigger is
        // created; the Debezium table's writers need nothing to fire it).
        format!("REVOKE ALL ON FUNCTION {function}() FROM PUBLIC"),
        format!(
            "COMMENT ON FUNCTION {function}() IS {}",
            literal(
                "outbox-relay debezium-install: copies each inserted row into the outbox, encoded as Debezium's Outbox Event Router would publish it"
            )
        ),
        format!(
            "CREATE OR REPLACE TRIGGER {} AFTER INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {function}()",
            ident(&trigger_name(&config.table)),
            table
        ),
        // For every writer: one with `session_replication_role = replica` (a bulk loader, a
        // logical-replication target) fires only triggers enabled ALWAYS, and Debezium, which
        // decodes the WAL, publishes its rows too.
        format!(
            "ALTER TABLE {table} ENABLE ALWAYS TRIGGER {}",
            ident(&trigger_name(&config.table))
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::debezium::properties::tests::{props, BASE};

    #[test]
    fn the_trigger_needs_a_uuid_id_and_known_types() {
        let c = RouterConfig::from_properties(&props(BASE)).unwrap();
        let col = |kind| Column {
            kind,
            nullable: false,
        };
        let mut columns: BTreeMap<String, Column> = [
            ("id", col(ColumnKind::Uuid)),
            ("aggregatetype", col(ColumnKind::Text)),
            ("aggregateid", col(ColumnKind::Text)),
            ("type", col(ColumnKind::Text)),
            ("payload", col(ColumnKind::Json { binary: true })),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let sql = install_sql(&c, &columns, "public").unwrap().join("\n");
        assert!(
            sql.contains(r#"{"type":"string","optional":false}"#),
            "{sql}"
        );
        assert!(sql.contains("relay_headers"), "{sql}");
        let mut binary = c.clone();
        binary.value_converter = Converter::Bytes;
        let err = install_sql(&binary, &columns, "public").unwrap_err();
        assert!(
            err.contains("not bytea") && err.contains("value.converter"),
            "{err}"
        );
        columns.insert("payload".into(), col(ColumnKind::Bytes));
        let sql = install_sql(&binary, &columns, "public").unwrap().join("\n");
        assert!(sql.contains(r#"NULL, NEW."payload", "#), "{sql}");
        columns.insert("id".into(), col(ColumnKind::Int("int64")));
        let err = install_sql(&c, &columns, "public").unwrap_err();
        assert!(err.contains("not a uuid"), "{err}");
        columns.remove("id");
        let err = install_sql(&c, &columns, "public").unwrap_err();
        assert!(err.contains("has no column id"), "{err}");
    }
}
