//! Reading Kafka Connect's properties: the Java properties format
//! ([`parse_properties`]), and the configuration they give the router
//! ([`RouterConfig::from_properties`]), which refuses, by name, every option that changes the
//! messages and that the relay does not reproduce.

use std::collections::BTreeMap;

use super::router::{
    topic_template, Converter, HeaderPlacement, RouterConfig, DEFAULT_TOPIC_REGEX, EVENT_ROUTER,
    ROUTED_BY_VALUE, ROUTER_OPTIONS,
};

const STRING_CONVERTER: &str = "org.apache.kafka.connect.storage.StringConverter";
const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
const BINARY_DATA_CONVERTER: &str = "io.debezium.converters.BinaryDataConverter";
const BYTE_ARRAY_CONVERTER: &str = "org.apache.kafka.connect.converters.ByteArrayConverter";
const SIMPLE_HEADER_CONVERTER: &str = "org.apache.kafka.connect.storage.SimpleHeaderConverter";

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

/// The properties Kafka Connect runs one connector with, as two layers: the worker's and the
/// connector's. Connect takes each converter (key, value, header) from the connector's
/// properties when they name its class (`key.converter=...`), configured with the connector's
/// options of it (`key.converter.*`) only, and else from the worker's, with the worker's options
/// only: a connector's option of a converter it does not name is ignored, and so is a worker's
/// of a converter the connector names (Connect's `Worker` and `Plugins.newConverter`). Every
/// other option the relay reads is the connector's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectProperties {
    /// The worker's properties.
    pub worker: BTreeMap<String, String>,
    /// The connector's properties.
    pub connector: BTreeMap<String, String>,
}

impl ConnectProperties {
    /// The layers of `files` (name, properties), in `--config` order: the worker's files come
    /// first, then the connector's, the first of which is the first file setting
    /// `connector.class` (Connect needs it in a connector's properties); a later file
    /// overrides an earlier one's keys within its layer. A single file that does not set it is
    /// the connector's (converters named in it are the connector's own).
    ///
    /// # Errors
    /// Several files, none of which sets `connector.class` (the worker's and the connector's
    /// cannot be told apart).
    pub fn from_files(files: Vec<(String, BTreeMap<String, String>)>) -> Result<Self, String> {
        let first = files
            .iter()
            .position(|(_, p)| p.contains_key("connector.class"));
        let first = match (first, files.len()) {
            (Some(i), _) => i,
            (None, 0 | 1) => 0,
            (None, _) => {
                let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!(
                    "none of {} sets connector.class: give the worker's properties first, then the connector's (its file names connector.class), as Kafka Connect takes a converter from the connector's properties only when they name its class",
                    names.join(", ")
                ));
            }
        };
        let mut me = Self::default();
        for (i, (_, p)) in files.into_iter().enumerate() {
            if i < first {
                &mut me.worker
            } else {
                &mut me.connector
            }
            .extend(p);
        }
        Ok(me)
    }

    /// The layer Connect configures `converter` (`key.converter`, ...) from: the connector's
    /// when it names the class, else the worker's.
    fn converter_layer(&self, converter: &str) -> &BTreeMap<String, String> {
        if self.connector.contains_key(converter) {
            &self.connector
        } else {
            &self.worker
        }
    }
}

impl RouterConfig {
    /// [`Self::from_connect`] with `p` as the connector's properties and no worker's.
    ///
    /// # Errors
    /// As [`Self::from_connect`].
    pub fn from_properties(p: &BTreeMap<String, String>) -> Result<Self, String> {
        Self::from_connect(&ConnectProperties {
            worker: BTreeMap::new(),
            connector: p.clone(),
        })
    }

    /// Reads the configuration from Kafka Connect properties: the converters as Connect layers
    /// them ([`ConnectProperties`]), the rest from the connector's. Options that concern
    /// capturing (connection, slot, publication, snapshot) are not needed and not read; every
    /// option that changes the messages is either reproduced or refused here, by name.
    ///
    /// # Errors
    /// A message naming the first option the relay cannot reproduce, or a missing one.
    pub fn from_connect(layers: &ConnectProperties) -> Result<Self, String> {
        let p = &layers.connector;
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
        let expand_json_payload = match opt("table.expand.json.payload") {
            Some(v) => parse_bool(&format!("{prefix}table.expand.json.payload"), &v)?,
            None => false,
        };
        let json_payload_null_as_bytes = match opt("table.json.payload.null.behavior") {
            None => false,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "ignore" => false,
                "optional_bytes" => true,
                _ => {
                    return Err(format!(
                        "{prefix}table.json.payload.null.behavior={v}: ignore or optional_bytes"
                    ))
                }
            },
        };
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
        if let Some(converter) = layers
            .converter_layer("header.converter")
            .get("header.converter")
        {
            if converter != SIMPLE_HEADER_CONVERTER {
                return Err(format!(
                    "header.converter={converter} is not supported by the relay (only {SIMPLE_HEADER_CONVERTER}, Connect's default)"
                ));
            }
        }
        let key_converter = converter_of(layers.converter_layer("key.converter"), "key")?;
        let value_converter = converter_of(layers.converter_layer("value.converter"), "value")?;
        if expand_json_payload {
            // What Debezium's router makes of a JSON payload it expands is a struct with the
            // schema it infers from each payload; the relay writes that struct as a
            // schemaless JsonConverter does, not the schema itself.
            match value_converter {
                Converter::Json { schemas: true } => {
                    return Err(format!(
                        "{prefix}table.expand.json.payload=true with value.converter.schemas.enable=true (JsonConverter's default) is not supported by the relay: the schema Debezium infers from each payload (struct names from field paths, int32, int64 or float64 by each number's value, array elements' schemas merged in an order that varies between runs) is not reproduced; set value.converter.schemas.enable=false or table.expand.json.payload=false"
                    ))
                }
                Converter::String => {
                    return Err(format!(
                        "{prefix}table.expand.json.payload=true with value.converter=StringConverter is not supported by the relay: StringConverter writes the expanded struct as Kafka Connect's Struct.toString(), not JSON"
                    ))
                }
                Converter::Json { schemas: false } | Converter::Bytes => {}
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
            expand_json_payload,
            json_payload_null_as_bytes,
            key_converter,
            value_converter,
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
        BINARY_DATA_CONVERTER | BYTE_ARRAY_CONVERTER if which == "value" => Converter::Bytes,
        BINARY_DATA_CONVERTER | BYTE_ARRAY_CONVERTER => {
            return Err(format!(
                "{key}={class} is not supported by the relay: the key column is text, a uuid or an integer, not bytes (use StringConverter or JsonConverter for keys)"
            ))
        }
        other => {
            return Err(format!(
                "{key}={other} is not supported by the relay (StringConverter, JsonConverter, or for a bytea payload {BINARY_DATA_CONVERTER} or {BYTE_ARRAY_CONVERTER})"
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
            // BinaryDataConverter's converter for values that are not bytes: never used on a
            // bytea payload (the only one the relay accepts with it), whatever it names.
            (Converter::Bytes, o) if class.as_str() == BINARY_DATA_CONVERTER => {
                o == "delegate.converter.type" || o.starts_with("delegate.converter.type.")
            }
            _ => false,
        };
        if !ok {
            // The key only: a converter option may hold a credential.
            return Err(format!("{prefix}{option} is not supported by the relay"));
        }
    }
    Ok(converter)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn props(text: &str) -> BTreeMap<String, String> {
        let mut p = BTreeMap::new();
        parse_properties(text, &mut p).unwrap();
        p
    }

    pub(crate) const BASE: &str = "\
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
            ("transforms.outbox.table.expand.json.payload=true", "table.expand.json.payload=true with value.converter.schemas.enable=true"),
            ("transforms.outbox.table.expand.json.payload=yes", "table.expand.json.payload"),
            ("transforms.outbox.table.json.payload.null.behavior=drop", "table.json.payload.null.behavior"),
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
            ("key.converter=io.debezium.converters.BinaryDataConverter", "key column is text"),
            ("key.converter=org.apache.kafka.connect.converters.ByteArrayConverter", "key.converter"),
            ("value.converter=org.apache.kafka.connect.converters.ByteArrayConverter\nvalue.converter.delegate.converter.type=x", "value.converter.delegate.converter.type"),
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
    fn expanding_a_json_payload_is_refused_where_its_bytes_are_not_reproduced_saying_why() {
        let expand = "transforms.outbox.table.expand.json.payload=true\n";
        let err = RouterConfig::from_properties(&props(&format!("{BASE}{expand}"))).unwrap_err();
        assert!(
            err.contains("table.expand.json.payload=true with value.converter.schemas.enable=true")
                && err.contains("the schema Debezium infers"),
            "{err}"
        );
        let string = "value.converter=org.apache.kafka.connect.storage.StringConverter\n";
        let err =
            RouterConfig::from_properties(&props(&format!("{BASE}{expand}{string}"))).unwrap_err();
        assert!(err.contains("Struct.toString()"), "{err}");
        let c = RouterConfig::from_properties(&props(&format!(
            "{BASE}{expand}value.converter.schemas.enable=false\n\
             transforms.outbox.table.json.payload.null.behavior=OPTIONAL_BYTES\n"
        )))
        .unwrap();
        assert!(c.expand_json_payload && c.json_payload_null_as_bytes);
    }

    #[test]
    fn a_binary_value_converter_is_accepted_with_its_delegates_options() {
        let c = RouterConfig::from_properties(&props(&format!(
            "{BASE}value.converter=io.debezium.converters.BinaryDataConverter\n\
             value.converter.delegate.converter.type=org.apache.kafka.connect.json.JsonConverter\n\
             value.converter.delegate.converter.type.schemas.enable=false\n"
        )))
        .unwrap();
        assert_eq!(c.value_converter, Converter::Bytes);
    }

    #[test]
    fn converters_are_the_connectors_when_it_names_them_else_the_workers() {
        let layers = |worker: &str, connector: &str| {
            ConnectProperties::from_files(vec![
                ("worker".into(), props(worker)),
                (
                    "connector".into(),
                    props(&format!("connector.class=x\n{connector}")),
                ),
            ])
            .unwrap()
        };
        let json = "key.converter=org.apache.kafka.connect.json.JsonConverter\n\
                    key.converter.schemas.enable=true\n\
                    value.converter=org.apache.kafka.connect.json.JsonConverter\n\
                    value.converter.basic.auth.user.info=a:b\n";
        let router = "table.include.list=dbz.outbox\ntransforms=outbox\n\
                      transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n";
        let string = "org.apache.kafka.connect.storage.StringConverter";
        // The connector names both: the worker's options of them do not apply.
        let c = RouterConfig::from_connect(&layers(
            json,
            &format!("{router}key.converter={string}\nvalue.converter={string}\n"),
        ))
        .unwrap();
        assert_eq!(
            (c.key_converter, c.value_converter),
            (Converter::String, Converter::String)
        );
        // The connector's option of a converter it does not name is ignored.
        let c = RouterConfig::from_connect(&layers(
            json.replace("value.converter.basic.auth.user.info=a:b\n", "")
                .as_str(),
            &format!("{router}key.converter.schemas.enable=false\n"),
        ))
        .unwrap();
        assert_eq!(c.key_converter, Converter::Json { schemas: true });
        // The worker's converter with the worker's options: refused by name.
        let err = RouterConfig::from_connect(&layers(json, router)).unwrap_err();
        assert!(
            err.contains("value.converter.basic.auth.user.info"),
            "{err}"
        );
        // The router's options are the connector's only.
        let err = RouterConfig::from_connect(&layers(&format!("{json}{router}"), "")).unwrap_err();
        assert!(err.contains("table.include.list is not set"), "{err}");
        // Several files and no connector.class: which is the worker's is unknown.
        let err = ConnectProperties::from_files(vec![
            ("a.properties".into(), props(json)),
            ("b.properties".into(), props(router)),
        ])
        .unwrap_err();
        assert!(
            err.contains("a.properties, b.properties") && err.contains("connector.class"),
            "{err}"
        );
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
}
