//! What the relay reproduces of Debezium's Outbox Event Router: the router's options
//! ([`RouterConfig`], the ones it reproduces in [`ROUTER_OPTIONS`]), the key and value
//! converters ([`Converter`]) and the topic template of `route.topic.replacement`.
//! [`RouterConfig::from_connect`] reads it from Kafka Connect's properties (`properties`).

/// The router class the relay reproduces.
pub const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
/// `route.topic.regex`'s default: the whole routed-by value, as group `routedByValue`.
pub(super) const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
pub(super) const ROUTED_BY_VALUE: &str = "${routedByValue}";

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
    /// Debezium's `BinaryDataConverter` or Kafka's `ByteArrayConverter`, for values: a `bytea`
    /// payload's bytes as they are (the application serialised them: Avro, Protobuf, ...).
    Bytes,
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
    /// aggregate type (the unit of order with the key) when the topic names it (else the
    /// topic is).
    pub route_by: String,
    /// `route.topic.replacement` (default `outbox.event.${routedByValue}`) as literal parts and
    /// `None` for each `${routedByValue}`.
    pub topic: Vec<Option<String>>,
    /// `route.tombstone.on.empty.payload` (default false): a NULL payload is a tombstone; else
    /// the converter's rendering of a null value.
    pub tombstone_on_empty_payload: bool,
    /// `table.expand.json.payload` (default false): a jsonb payload is published as the
    /// object Debezium's router expands it to (schemaless JsonConverter only).
    pub expand_json_payload: bool,
    /// `table.json.payload.null.behavior=optional_bytes` (default `ignore`): when expanding, a
    /// null field is kept (`null`) instead of left out.
    pub json_payload_null_as_bytes: bool,
    /// `key.converter`.
    pub key_converter: Converter,
    /// `value.converter`.
    pub value_converter: Converter,
}

/// The router options the relay reproduces (under `transforms.<name>.`).
pub(super) const ROUTER_OPTIONS: [&str; 15] = [
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

/// `route.topic.replacement` as parts: Java's replacement syntax, `${routedByValue}` and `\`
/// escapes; any other `$` reference is refused.
pub(super) fn topic_template(replacement: &str) -> Result<Vec<Option<String>>, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replacement_keeps_literals_and_escapes() {
        assert_eq!(
            topic_template("a.${routedByValue}.\\$x").unwrap(),
            vec![Some("a.".into()), None, Some(".$x".into())]
        );
        assert!(topic_template("a.$").is_err());
    }
}
