//! A Debezium-shaped outbox table, published as Debezium's Outbox Event Router publishes it
//! (`outbox-relay debezium-install`; docs: "Coming from Debezium").
//!
//! Teams coming from Debezium keep their table, their writers and their consumers. The relay is
//! configured by the properties Kafka Connect runs Debezium with (the worker's file and the
//! connector's): [`RouterConfig::from_properties`] reads what decides the messages (the table,
//! the router's `transforms.<name>.*` options, the key and value converters) and refuses every
//! option it cannot reproduce, naming it. [`install_sql`] then turns that configuration and
//! the table's columns into one trigger on the table: each inserted row is copied, in the
//! writer's transaction, into the relay's `outbox` with the message already encoded as
//! Debezium's converters encode it (key and value bytes, the topic of `route.topic.replacement`,
//! the `id` header and the placed headers), and a row flag (`relay_headers = false`) that keeps
//! the relay's own headers off the message.
//!
//! So the relay's guarantees hold as they are (the copy goes through the outbox's insert lock:
//! per-aggregate order is commit order), and a writer that deletes its row right after
//! inserting it (Debezium's advice, Quarkus' `remove-after-insert`) loses nothing: the copy is
//! in the outbox already, in the same transaction.

use std::collections::BTreeMap;

mod install;
pub use install::install;

/// The router class the relay reproduces.
pub const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
const STRING_CONVERTER: &str = "org.apache.kafka.connect.storage.StringConverter";
const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
const SIMPLE_HEADER_CONVERTER: &str = "org.apache.kafka.connect.storage.SimpleHeaderConverter";
/// `route.topic.regex`'s default: the whole routed-by value, as group `routedByValue`.
const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
const ROUTED_BY_VALUE: &str = "${routedByValue}";

/// Java properties (`key=value`, `key: value`, `key value`; `#` and `!` comments; a trailing
/// backslash continues a line; `\t`, `\n`, `\uXXXX` escapes), as Kafka Connect reads its files.
/// Later keys override earlier ones.
///
/// # Errors
/// A `\u` escape that is not four hex digits.
pub fn parse_properties(text: &str, into: &mut BTreeMap<String, String>) -> Result<(), String> {
    let mut lines = text.lines().peekable();
    while let Some(first) = lines.next() {
        let mut logical = first.trim_start().to_owned();
        if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
            continue;
        }
        // An odd number of trailing backslashes continues the line.
        while logical.chars().rev().take_while(|&c| c == '\\').count() % 2 == 1 {
            logical.pop();
            match lines.next() {
                Some(next) => logical.push_str(next.trim_start()),
                None => break,
            }
        }
        let mut chars = logical.chars().peekable();
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ':' || c.is_whitespace() {
                break;
            }
            chars.next();
            key.push(if c == '\\' { unescape(&mut chars)? } else { c });
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if matches!(chars.peek(), Some('=' | ':')) {
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            value.push(if c == '\\' { unescape(&mut chars)? } else { c });
        }
        into.insert(key, value);
    }
    Ok(())
}

fn unescape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<char, String> {
    Ok(match chars.next() {
        Some('t') => '\t',
        Some('n') => '\n',
        Some('r') => '\r',
        Some('f') => '\u{c}',
        Some('u') => {
            let hex: String = chars.by_ref().take(4).collect();
            u32::from_str_radix(&hex, 16)
                .ok()
                .filter(|_| hex.len() == 4)
                .and_then(char::from_u32)
                .ok_or_else(|| format!("\\u{hex} is not a \\uXXXX escape"))?
        }
        Some(c) => c,
        None => '\\',
    })
}

/// How Kafka Connect turns a key or a value into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Converter {
    /// `StringConverter`: the value's text.
    String,
    /// `JsonConverter`; with `schemas.enable` the value is wrapped as `{"schema":…,"payload":…}`.
    Json {
        /// `schemas.enable` (JsonConverter's default: true).
        schemas: bool,
    },
}

/// One additional column placed as a header (`table.fields.additional.placement`,
/// `column:header:alias`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderPlacement {
    /// The table's column.
    pub column: String,
    /// The header's name (the column's when no alias is given).
    pub alias: String,
}

/// What the relay reproduces of a Debezium connector with the Outbox Event Router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// The outbox table's schema (`table.include.list`).
    pub schema: String,
    /// The outbox table's name.
    pub table: String,
    /// `table.field.event.id` (default `id`): the event id, the `id` header.
    pub id_column: String,
    /// `table.field.event.key` (default `aggregateid`): the message key.
    pub key_column: String,
    /// `table.field.event.type` (default `type`), and whether it was named explicitly (a
    /// default column the table lacks is no error: the relay's `event_type` is then empty).
    pub type_column: (String, bool),
    /// `table.field.event.payload` (default `payload`): the value.
    pub payload_column: String,
    /// `table.field.event.timestamp`: the event's time (the relay's `created_at`).
    pub timestamp_column: Option<String>,
    /// `table.fields.additional.placement` entries placed as headers.
    pub headers: Vec<HeaderPlacement>,
    /// `route.by.field` (default `aggregatetype`): the routed-by value, also the relay's
    /// aggregate type (the unit of order with the key).
    pub route_by: String,
    /// `route.topic.replacement` (default `outbox.event.${routedByValue}`) as literal parts and
    /// `None` for each `${routedByValue}`.
    pub topic: Vec<Option<String>>,
    /// `route.tombstone.on.empty.payload` (default false): a NULL payload is a tombstone; else
    /// the converter's rendering of a null value.
    pub tombstone_on_empty_payload: bool,
    /// `key.converter`.
    pub key_converter: Converter,
    /// `value.converter`.
    pub value_converter: Converter,
}

/// The router options the relay reproduces (under `transforms.<name>.`).
const ROUTER_OPTIONS: [&str; 15] = [
    "type",
    "table.field.event.id",
    "table.field.event.key",
    "table.field.event.type",
    "table.field.event.payload",
    "table.field.event.timestamp",
    "table.fields.additional.placement",
    "table.fields.additional.error.on.missing",
    "table.op.invalid.behavior",
    "route.by.field",
    "route.topic.regex",
    "route.topic.replacement",
    "route.tombstone.on.empty.payload",
    "table.expand.json.payload",
    "table.json.payload.null.behavior",
];

/// Connector options that change the messages and that the relay does not reproduce (prefixes).
const REFUSED_CONNECTOR_OPTIONS: [(&str, &str); 4] = [
    ("predicates", "predicates are not supported"),
    (
        "column.",
        "column masking, truncation, filtering and type propagation change the captured values",
    ),
    (
        "datatype.propagate.source.type",
        "type propagation changes the schema",
    ),
    ("converters", "custom value converters are not supported"),
];

impl RouterConfig {
    /// Reads the configuration from Kafka Connect properties (the worker's and the
    /// connector's, merged). Options that concern capturing (connection, slot, publication,
    /// snapshot) are not needed and not read; every option that changes the messages is either
    /// reproduced or refused here, by name.
    ///
    /// # Errors
    /// A message naming the first option the relay cannot reproduce, or a missing one.
    pub fn from_properties(p: &BTreeMap<String, String>) -> Result<Self, String> {
        for (key, value) in p {
            if let Some((prefix, why)) = REFUSED_CONNECTOR_OPTIONS
                .iter()
                .find(|(prefix, _)| key.starts_with(prefix))
            {
                if !value.trim().is_empty() {
                    // Named by its family: a key may hold a secret (column.mask.hash's salt).
                    let family = if prefix.ends_with('.') {
                        format!("{prefix}*")
                    } else {
                        (*prefix).to_owned()
                    };
                    return Err(format!("{family} is not supported by the relay: {why}"));
                }
            }
        }
        if let Some(mode) = p.get("binary.handling.mode") {
            if mode != "bytes" {
                return Err(format!(
                    "binary.handling.mode={mode} is not supported by the relay (only bytes, Debezium's default)"
                ));
            }
        }
        let (schema, table) = table_of(p)?;
        let router = router_name(p)?;
        let opt = |name: &str| p.get(&format!("transforms.{router}.{name}")).cloned();
        let prefix = format!("transforms.{router}.");
        for key in p.keys().filter(|k| k.starts_with(&prefix)) {
            let option = &key[prefix.len()..];
            if !ROUTER_OPTIONS.contains(&option) {
                return Err(format!(
                    "{key} is not supported by the relay (it reproduces {})",
                    ROUTER_OPTIONS[1..].join(", ")
                ));
            }
        }
        if let Some(v) = opt("table.expand.json.payload") {
            if parse_bool(&format!("{prefix}table.expand.json.payload"), &v)? {
                return Err(format!(
                    "{prefix}table.expand.json.payload=true is not supported by the relay"
                ));
            }
        }
        if let Some(regex) = opt("route.topic.regex") {
            if regex != DEFAULT_TOPIC_REGEX {
                return Err(format!(
                    "{prefix}route.topic.regex={regex} is not supported by the relay (only the default {DEFAULT_TOPIC_REGEX})"
                ));
            }
        }
        let replacement = opt("route.topic.replacement")
            .unwrap_or_else(|| format!("outbox.event.{ROUTED_BY_VALUE}"));
        let topic = topic_template(&replacement)
            .map_err(|e| format!("{prefix}route.topic.replacement={replacement}: {e}"))?;
        let mut headers = Vec::new();
        if let Some(list) = opt("table.fields.additional.placement") {
            for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
                match parts.as_slice() {
                    [column, "header"] | [column, "header", ""] => headers.push(HeaderPlacement {
                        column: (*column).to_owned(),
                        alias: (*column).to_owned(),
                    }),
                    [column, "header", alias] => headers.push(HeaderPlacement {
                        column: (*column).to_owned(),
                        alias: (*alias).to_owned(),
                    }),
                    [_, place, ..] => {
                        return Err(format!(
                            "{prefix}table.fields.additional.placement: {entry}: placement '{place}' is not supported by the relay (only header)"
                        ))
                    }
                    _ => {
                        return Err(format!(
                            "{prefix}table.fields.additional.placement: {entry}: give it as column:header[:alias]"
                        ))
                    }
                }
            }
        }
        if let Some(h) = headers.iter().find(|h| h.alias == "id") {
            return Err(format!(
                "{prefix}table.fields.additional.placement: {}:header:id would be a second `id` header; the relay refuses it",
                h.column
            ));
        }
        let tombstone_on_empty_payload = match opt("route.tombstone.on.empty.payload") {
            Some(v) => parse_bool(&format!("{prefix}route.tombstone.on.empty.payload"), &v)?,
            None => false,
        };
        if let Some(converter) = p.get("header.converter") {
            if converter != SIMPLE_HEADER_CONVERTER {
                return Err(format!(
                    "header.converter={converter} is not supported by the relay (only {SIMPLE_HEADER_CONVERTER}, Connect's default)"
                ));
            }
        }
        let type_explicit = opt("table.field.event.type");
        Ok(Self {
            schema,
            table,
            id_column: opt("table.field.event.id").unwrap_or_else(|| "id".into()),
            key_column: opt("table.field.event.key").unwrap_or_else(|| "aggregateid".into()),
            type_column: match type_explicit {
                Some(c) => (c, true),
                None => ("type".into(), false),
            },
            payload_column: opt("table.field.event.payload").unwrap_or_else(|| "payload".into()),
            timestamp_column: opt("table.field.event.timestamp").filter(|c| !c.is_empty()),
            headers,
            route_by: opt("route.by.field").unwrap_or_else(|| "aggregatetype".into()),
            topic,
            tombstone_on_empty_payload,
            key_converter: converter_of(p, "key")?,
            value_converter: converter_of(p, "value")?,
        })
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key}={value}: true or false")),
    }
}

/// `table.include.list` naming exactly one table, `schema.table` (the dot may be escaped).
fn table_of(p: &BTreeMap<String, String>) -> Result<(String, String), String> {
    let list = p
        .get("table.include.list")
        .ok_or("table.include.list is not set: name the outbox table as schema.table")?;
    let entries: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let [entry] = entries.as_slice() else {
        return Err(format!(
            "table.include.list={list}: the relay publishes one outbox table per connector; name exactly one"
        ));
    };
    let plain = entry.replace("\\.", ".");
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    match plain.split_once('.') {
        Some((schema, table)) if ident(schema) && ident(table) => {
            Ok((schema.to_owned(), table.to_owned()))
        }
        _ => Err(format!(
            "table.include.list={list}: give the outbox table as schema.table (no other regular expression)"
        )),
    }
}

/// The one transform of the chain, Debezium's EventRouter.
fn router_name(p: &BTreeMap<String, String>) -> Result<String, String> {
    let chain = p.get("transforms").map(String::as_str).unwrap_or_default();
    let names: Vec<&str> = chain
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    for name in &names {
        let class = p
            .get(&format!("transforms.{name}.type"))
            .map(String::as_str)
            .unwrap_or_default();
        if class != EVENT_ROUTER {
            return Err(format!(
                "transforms.{name}.type={class} is not supported by the relay (only one transform, {EVENT_ROUTER})"
            ));
        }
    }
    match names.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => Err(format!(
            "transforms is not set: the connector must route with {EVENT_ROUTER}"
        )),
        _ => Err(format!(
            "transforms={chain}: the relay reproduces one {EVENT_ROUTER}, not a chain"
        )),
    }
}

/// `route.topic.replacement` as parts: Java's replacement syntax, `${routedByValue}` and `\`
/// escapes; any other `$` reference is refused.
fn topic_template(replacement: &str) -> Result<Vec<Option<String>>, String> {
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = replacement;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix(ROUTED_BY_VALUE) {
            if !literal.is_empty() {
                parts.push(Some(std::mem::take(&mut literal)));
            }
            parts.push(None);
            rest = after;
            continue;
        }
        match c {
            '$' => return Err("only the group reference ${routedByValue} is supported".into()),
            '\\' => {
                let mut chars = rest[1..].chars();
                let escaped = chars.next().ok_or("a trailing backslash escapes nothing")?;
                literal.push(escaped);
                rest = chars.as_str();
            }
            _ => {
                literal.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    if !literal.is_empty() {
        parts.push(Some(literal));
    }
    Ok(parts)
}

/// `key.converter` or `value.converter` with its options.
fn converter_of(p: &BTreeMap<String, String>, which: &str) -> Result<Converter, String> {
    let key = format!("{which}.converter");
    let class = p.get(&key).ok_or_else(|| {
        format!(
            "{key} is not set: give the worker's properties too (a connector inherits the worker's converters)"
        )
    })?;
    let prefix = format!("{key}.");
    let options: BTreeMap<&str, &str> = p
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?, v.as_str())))
        .collect();
    let converter = match class.as_str() {
        STRING_CONVERTER => Converter::String,
        JSON_CONVERTER => Converter::Json {
            schemas: match options.get("schemas.enable") {
                Some(v) => parse_bool(&format!("{prefix}schemas.enable"), v)?,
                None => true,
            },
        },
        other => {
            return Err(format!(
                "{key}={other} is not supported by the relay (StringConverter or JsonConverter)"
            ))
        }
    };
    for (option, value) in options {
        let ok = match (converter, option) {
            (Converter::String, "encoding") => {
                value.eq_ignore_ascii_case("utf-8") || value.eq_ignore_ascii_case("utf8")
            }
            (Converter::Json { .. }, "schemas.enable" | "schemas.cache.size") => true,
            // Neither matters without decimals or defaults in the outbox's columns.
            (Converter::Json { .. }, "decimal.format" | "replace.null.with.default") => true,
            _ => false,
        };
        if !ok {
            // The key only: a converter option may hold a credential.
            return Err(format!("{prefix}{option} is not supported by the relay"));
        }
    }
    Ok(converter)
}

/// The kind of a column, as Debezium's PostgreSQL connector maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// `text`, `varchar`, `char`, `name`: a string.
    Text,
    /// `uuid`: a string named `io.debezium.data.Uuid`.
    Uuid,
    /// `smallint`, `integer`, `bigint`, with their Connect type.
    Int(&'static str),
    /// `boolean`.
    Bool,
    /// `json`, `jsonb`: a string named `io.debezium.data.Json`; `jsonb` is printed by
    /// PostgreSQL, `json` kept as written.
    Json {
        /// `jsonb`.
        binary: bool,
    },
    /// `bytea`: bytes.
    Bytes,
    /// `timestamptz` (true) or `timestamp`.
    Timestamp(bool),
}

impl ColumnKind {
    /// From `pg_type.typname`.
    pub fn of(typname: &str) -> Option<Self> {
        Some(match typname {
            "text" | "varchar" | "bpchar" | "name" => Self::Text,
            "uuid" => Self::Uuid,
            "int2" => Self::Int("int16"),
            "int4" => Self::Int("int32"),
            "int8" => Self::Int("int64"),
            "bool" => Self::Bool,
            "json" => Self::Json { binary: false },
            "jsonb" => Self::Json { binary: true },
            "bytea" => Self::Bytes,
            "timestamptz" => Self::Timestamp(true),
            "timestamp" => Self::Timestamp(false),
            _ => return None,
        })
    }

    /// Connect's schema of the column as JsonConverter writes it (field order included).
    fn schema(self, optional: bool) -> String {
        let (ty, name) = match self {
            Self::Text => ("string", None),
            Self::Uuid => ("string", Some("io.debezium.data.Uuid")),
            Self::Int(t) => (t, None),
            Self::Bool => ("boolean", None),
            Self::Json { .. } => ("string", Some("io.debezium.data.Json")),
            Self::Bytes => ("bytes", None),
            Self::Timestamp(_) => ("int64", Some("io.debezium.time.MicroTimestamp")),
        };
        match name {
            Some(n) => {
                format!(r#"{{"type":"{ty}","optional":{optional},"name":"{n}","version":1}}"#)
            }
            None => format!(r#"{{"type":"{ty}","optional":{optional}}}"#),
        }
    }
}

/// A column of the table: its kind and whether it may be NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Its kind.
    pub kind: ColumnKind,
    /// `NOT NULL` absent.
    pub nullable: bool,
}

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

/// SQL rendering a non-NULL value of `column` as JsonConverter writes it (a JSON value, text).
fn json_value(column: &str, kind: ColumnKind, outbox_schema: &str) -> String {
    let c = new(column);
    let string = ident(outbox_schema) + ".outbox_json_string";
    match kind {
        ColumnKind::Int(_) | ColumnKind::Bool => format!("{c}::text"),
        ColumnKind::Bytes => {
            format!("'\"' || translate(encode({c}, 'base64'), E'\\n', '') || '\"'")
        }
        _ => format!("{string}({c}::text)"),
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
            _ => format!("{c}::text"),
        },
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
        ColumnKind::Text | ColumnKind::Uuid | ColumnKind::Int(_)
    ) {
        refuse(
            &config.key_column,
            "key",
            "not text, uuid or an integer (the types the relay encodes as Debezium does)",
        )?;
    }
    let route = column(&config.route_by, "routed-by value, route.by.field")?;
    if route.kind != ColumnKind::Text {
        refuse(&config.route_by, "routed-by value", "not text")?;
    }
    let payload = column(&config.payload_column, "payload, table.field.event.payload")?;
    if !matches!(
        payload.kind,
        ColumnKind::Json { .. } | ColumnKind::Text | ColumnKind::Bytes
    ) {
        refuse(
            &config.payload_column,
            "payload",
            "not jsonb, json, text or bytea",
        )?;
    }
    let event_type = match (columns.get(&config.type_column.0), config.type_column.1) {
        (Some(c), _) if c.kind == ColumnKind::Text => {
            format!("coalesce({}::text, '')", new(&config.type_column.0))
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
            ColumnKind::Text | ColumnKind::Uuid => format!("to_jsonb({}::text)", new(&h.column)),
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
            None => format!("{}::text", new(&config.route_by)),
        })
        .collect::<Vec<_>>()
        .join(" || ");
    let topic = if topic.is_empty() {
        "''".to_owned()
    } else {
        topic
    };
    // The key: NULL (then the aggregate id, the same text) only for StringConverter's ''.
    let message_key = match config.key_converter {
        Converter::String => format!("nullif({}::text, '')", new(&config.key_column)),
        c => converted(&config.key_column, key, c, outbox_schema)?,
    };
    // The value: the jsonb itself for StringConverter (the relay sends its text, as Debezium
    // does), else the converter's bytes; a NULL payload is a tombstone when the router says
    // so, else what the converter writes for a null value (nothing for StringConverter and,
    // without schemas, `null`; with schemas, the envelope with a null payload).
    let p = new(&config.payload_column);
    let (payload_json, payload_bytes) = match (config.value_converter, payload.kind) {
        (Converter::String, ColumnKind::Json { binary: true }) => (p.clone(), "NULL".to_owned()),
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
    let body = format!(
        "BEGIN\n    \
             INSERT INTO {outbox} (event_id, aggregate_type, aggregate_id, event_type, payload, \
             payload_bytes, message_key, headers, topic, created_at, relay_headers)\n    \
             VALUES ({id}, {route}::text, {key}::text, {event_type}, {payload_json}, {payload_bytes}, \
             {message_key}, jsonb_build_object({headers}), {topic}, {created_at}, false);\n    \
             RETURN NULL;\n\
         END",
        id = new(&config.id_column),
        route = new(&config.route_by),
        key = new(&config.key_column),
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
             SECURITY DEFINER SET search_path = {}, pg_temp AS {TAG}\n{body}\n{TAG}",
            ident(outbox_schema)
        ),
        format!(
            "COMMENT ON FUNCTION {function}() IS {}",
            literal(
                "outbox-relay debezium-install: copies each inserted row into the outbox, encoded as Debezium's Outbox Event Router would publish it"
            )
        ),
        format!(
            "CREATE OR REPLACE TRIGGER {} AFTER INSERT ON {}.{} FOR EACH ROW EXECUTE FUNCTION {function}()",
            ident(&trigger_name(&config.table)),
            ident(&config.schema),
            ident(&config.table)
        ),
    ])
}

/// Reads the columns of `schema.table`.
///
/// # Errors
/// Database errors; a column of a type the relay does not know is left out (it is an error
/// only when the configuration needs it: [`install_sql`] names it then).
pub async fn table_columns(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    table: &str,
) -> Result<Option<BTreeMap<String, Column>>, sqlx::Error> {
    let rows: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT a.attname::text, t.typname::text, a.attnotnull \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         WHERE a.attrelid = to_regclass(format('%I.%I', $1::text, $2::text)) \
           AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        rows.into_iter()
            .filter_map(|(name, ty, not_null)| {
                Some((
                    name,
                    Column {
                        kind: ColumnKind::of(&ty)?,
                        nullable: !not_null,
                    },
                ))
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(text: &str) -> BTreeMap<String, String> {
        let mut p = BTreeMap::new();
        parse_properties(text, &mut p).unwrap();
        p
    }

    const BASE: &str = "\
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
table.include.list=dbz.outbox
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
";

    #[test]
    fn properties_read_as_java_reads_them() {
        let p = props("# comment\n! other\n  a = 1\nb:2\nc 3\nd=x\\\n   y\ne=\\u00e9\\t\\:\nf\n");
        assert_eq!(p["a"], "1");
        assert_eq!(p["b"], "2");
        assert_eq!(p["c"], "3");
        assert_eq!(p["d"], "xy");
        assert_eq!(p["e"], "é\t:");
        assert_eq!(p["f"], "");
        assert!(parse_properties("g=\\u00zz", &mut BTreeMap::new()).is_err());
    }

    #[test]
    fn debezium_defaults_apply() {
        let c = RouterConfig::from_properties(&props(BASE)).unwrap();
        assert_eq!((c.schema.as_str(), c.table.as_str()), ("dbz", "outbox"));
        assert_eq!(c.id_column, "id");
        assert_eq!(c.key_column, "aggregateid");
        assert_eq!(c.route_by, "aggregatetype");
        assert_eq!(c.topic, vec![Some("outbox.event.".to_owned()), None]);
        assert!(!c.tombstone_on_empty_payload);
        assert_eq!(c.key_converter, Converter::Json { schemas: true });
    }

    #[test]
    fn every_option_that_changes_messages_is_reproduced_or_refused_by_name() {
        for (extra, named) in [
            ("transforms.outbox.table.expand.json.payload=true", "table.expand.json.payload"),
            ("transforms.outbox.route.topic.regex=(.*)", "route.topic.regex"),
            ("transforms.outbox.route.topic.replacement=t.$1", "route.topic.replacement"),
            ("transforms.outbox.table.field.event.schema.version=v", "table.field.event.schema.version"),
            ("transforms.outbox.tracing.span.context.field=t", "tracing.span.context.field"),
            ("transforms.outbox.table.fields.additional.placement=a:envelope:b", "placement 'envelope'"),
            ("transforms.outbox.table.fields.additional.placement=a:partition", "placement 'partition'"),
            ("transforms.outbox.table.fields.additional.placement=a:header:id", "second `id` header"),
            ("transforms=outbox,x\ntransforms.x.type=org.apache.kafka.connect.transforms.InsertField$Value", "transforms.x.type"),
            ("value.converter=io.confluent.connect.avro.AvroConverter", "value.converter"),
            ("key.converter.schema.content={}", "key.converter.schema.content"),
            ("header.converter=org.apache.kafka.connect.json.JsonConverter", "header.converter"),
            ("column.mask.with.4.chars=dbz.outbox.payload", "column.*"),
            ("predicates=p", "predicates"),
            ("binary.handling.mode=base64", "binary.handling.mode"),
            ("table.include.list=dbz.outbox,dbz.other", "table.include.list"),
            ("table.include.list=dbz\\..*", "table.include.list"),
        ] {
            let err = RouterConfig::from_properties(&props(&format!("{BASE}{extra}\n")))
                .expect_err(extra);
            assert!(err.contains(named), "{extra}: {err}");
        }
        let err = RouterConfig::from_properties(&props("table.include.list=a.b\ntransforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n")).unwrap_err();
        assert!(err.contains("key.converter is not set"), "{err}");
    }

    #[test]
    fn a_refused_option_is_named_without_its_value() {
        let err = RouterConfig::from_properties(&props(&format!(
            "{BASE}value.converter.basic.auth.user.info=alice:s3cret-Passw0rd\n"
        )))
        .unwrap_err();
        assert!(
            err.contains("value.converter.basic.auth.user.info"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "no value in the message: {err}");
        let err = RouterConfig::from_properties(&props(&format!(
            "{BASE}column.mask.hash.SHA-256.with.salt.s3cret=dbz.outbox.payload\n"
        )))
        .unwrap_err();
        assert!(err.contains("column.*"), "{err}");
        assert!(
            !err.contains("s3cret") && !err.contains("dbz.outbox.payload"),
            "{err}"
        );
    }

    #[test]
    fn the_replacement_keeps_literals_and_escapes() {
        assert_eq!(
            topic_template("a.${routedByValue}.\\$x").unwrap(),
            vec![Some("a.".into()), None, Some(".$x".into())]
        );
        assert!(topic_template("a.$").is_err());
    }

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
        columns.insert("id".into(), col(ColumnKind::Int("int64")));
        let err = install_sql(&c, &columns, "public").unwrap_err();
        assert!(err.contains("not a uuid"), "{err}");
        columns.remove("id");
        let err = install_sql(&c, &columns, "public").unwrap_err();
        assert!(err.contains("has no column id"), "{err}");
    }
}
