//! Order lines and their parsing: the line of a request body as received and the validated
//! line it becomes. Orders (`POST /orders` `items`), refunds that take goods back (`lines`),
//! marketplace trades and the refund lines the store records all share them, so they live in
//! this leaf, which imports only the domain.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::domain::{Quantity, SkuId, ValidationError};

/// Most lines in one order.
pub const MAX_ITEMS: usize = 100;

/// One line of a request body as received: an order's `items[]`, a refund's `lines[]`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOrderItemBody {
    /// Catalog SKU.
    #[schema(schema_with = SkuId::schema_object)]
    pub sku_id: String,
    /// Units.
    #[serde(deserialize_with = "outbox_http::validate::integer")]
    #[schema(schema_with = Quantity::schema_object)]
    pub quantity: i64,
}

/// A validated order line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderLine {
    /// Catalog SKU.
    pub sku_id: SkuId,
    /// Units.
    pub quantity: Quantity,
}

impl OrderLine {
    /// Validates lines (of an order, or of a refund that takes some back): at most
    /// [`MAX_ITEMS`], each SKU once, quantities in range; `field` names the list in errors
    /// (`items[2].quantity`).
    ///
    /// # Errors
    /// [`ValidationError`] naming the first bad line, a SKU listed twice, or too many lines.
    pub fn parse_all(
        field: &str,
        lines: Vec<CreateOrderItemBody>,
    ) -> Result<Vec<Self>, ValidationError> {
        if lines.len() > MAX_ITEMS {
            return Err(ValidationError::new(
                field,
                format!("must have at most {MAX_ITEMS} lines"),
            ));
        }
        let mut seen = HashSet::new();
        let mut parsed = Vec::with_capacity(lines.len());
        for (i, line) in lines.into_iter().enumerate() {
            let sku_id = SkuId::parse(&format!("{field}[{i}].sku_id"), line.sku_id)?;
            let quantity = Quantity::parse(&format!("{field}[{i}].quantity"), line.quantity)?;
            if !seen.insert(sku_id.clone()) {
                return Err(ValidationError::new(
                    format!("{field}[{i}].sku_id"),
                    "each SKU may appear once; add up the quantities",
                ));
            }
            parsed.push(Self { sku_id, quantity });
        }
        Ok(parsed)
    }
}
