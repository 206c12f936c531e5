//! The columns of the Debezium table, as Debezium's PostgreSQL connector maps their types
//! ([`ColumnKind`]), and the schema JsonConverter writes for each.

use std::collections::BTreeMap;

/// The kind of a column, as Debezium's PostgreSQL connector maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// `text`, `varchar`, `name`: a string.
    Text,
    /// `char(n)` (`bpchar`): a string, blank-padded to its width as PostgreSQL prints it and
    /// Debezium sends it (a cast to `text` would drop the padding).
    Char,
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
    /// A string of Debezium's (text, varchar, name or char(n)).
    pub fn is_text(self) -> bool {
        matches!(self, Self::Text | Self::Char)
    }

    /// From `pg_type.typname`.
    pub fn of(typname: &str) -> Option<Self> {
        Some(match typname {
            "text" | "varchar" | "name" => Self::Text,
            "bpchar" => Self::Char,
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
    pub(super) fn schema(self, optional: bool) -> String {
        let (ty, name) = match self {
            Self::Text | Self::Char => ("string", None),
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

/// Reads the columns of `schema.table`.
///
/// # Errors
/// Database errors; a column of a type the relay does not know is left out (it is an error
/// only when the configuration needs it: [`install_sql`](super::install_sql) names it then).
pub async fn table_columns(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    table: &str,
) -> Result<Option<BTreeMap<String, Column>>, sqlx::Error> {
    let rows = crate::store::debezium::table_columns(conn, schema, table).await?;
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
