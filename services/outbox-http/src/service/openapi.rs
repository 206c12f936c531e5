//! The generated OpenAPI document of a service, finished and served: every service registers
//! its handlers through `utoipa_axum::router::OpenApiRouter` (the route paths come from the
//! handlers' `#[utoipa::path]` annotations, so a route cannot exist without its description),
//! then [`serve_openapi`] adds what every service shares (the error envelope, 500/503 on every
//! operation, `/openapi.json` itself, the JSON 404/405 fallbacks) and serves the document.
//! Error answers that several operations give are declared once
//! ([`error_answers!`](crate::error_answers): [`OperatorOnly`], [`JsonBodyRefused`], the
//! services' own) and named in their `responses(...)`.

use std::collections::BTreeMap;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use utoipa::openapi::path::{Operation, OperationBuilder, PathItem};
use utoipa::openapi::{ContentBuilder, HttpMethod, OpenApi, RefOr, Response, ResponseBuilder};
use utoipa::{PartialSchema, ToSchema};

use super::extract::with_fallbacks;

/// The error envelope every service answers a refusal or a failure with.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // Only its schema is used; answers are built by `ApiError`.
pub struct ErrorBody {
    /// What went wrong.
    error: ErrorDetail,
}

/// `code`, `message` and, where they apply, details such as `field` (the offending request
/// field) or `current_status`.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetail {
    /// Stable machine-readable code (`validation_failed`, `malformed_json`, `not_found`, ...).
    code: String,
    /// Human-readable explanation.
    message: String,
    /// The request field (JSON path, path or query parameter) that failed validation.
    #[schema(nullable = false)]
    field: Option<String>,
}

/// The `/healthz` answer.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // Only its schema is used; the answer is built by `healthz`.
pub struct Health {
    /// `ok` or `unavailable`.
    #[schema(pattern = "^(ok|unavailable)$")]
    status: String,
    /// `ok` or `unreachable`.
    #[schema(pattern = "^(ok|unreachable)$")]
    database: String,
    /// Consuming services only: `running` or `stopped`.
    #[schema(nullable = false, pattern = "^(running|stopped)$")]
    consumer: Option<String>,
}

/// A response with the error envelope as its JSON body.
pub fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                    "ErrorBody",
                ))))
                .build(),
        )
        .build()
}

/// Error answers by status, each the error envelope with its description: what a type
/// declared by [`error_answers!`](crate::error_answers) gives `responses(...)` of
/// `#[utoipa::path]`.
pub fn error_answers(answers: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    answers
        .iter()
        .map(|(status, description)| (status.to_string(), RefOr::T(error_response(description))))
        .collect()
}

/// Declares a type naming error answers that several operations give, to list in their
/// `responses(...)` beside their own (`responses((status = 200, ...), OperatorOnly)`): each
/// answer is the error envelope with its description.
///
/// ```ignore
/// outbox_http::error_answers!(
///     /// A path naming an order of someone else, or none.
///     pub(crate) OrderPath {
///         400 => "`invalid_path`",
///         404 => "`order_not_found` (also another customer's order)",
///     }
/// );
/// ```
#[macro_export]
macro_rules! error_answers {
    ($(#[$doc:meta])* $vis:vis $name:ident { $($status:literal => $description:expr),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug)]
        $vis struct $name;

        impl $crate::__utoipa::IntoResponses for $name {
            fn responses() -> ::std::collections::BTreeMap<
                String,
                $crate::__utoipa::openapi::RefOr<$crate::__utoipa::openapi::response::Response>,
            > {
                $crate::service::error_answers(&[$(($status, $description)),+])
            }
        }
    };
}

error_answers!(
    /// The answer of an operation that needs the operator role (`Operator`) to a token without
    /// it.
    pub OperatorOnly {
        403 => "`forbidden`: the operator role is required",
    }
);

error_answers!(
    /// The answers of an operation that reads a JSON body and a path to a body it cannot decode,
    /// one too large, or a field that is not valid.
    pub JsonBodyRefused {
        400 => "Malformed JSON body or undecodable path",
        413 => "Body too large",
        422 => "`validation_failed`: `field` names the invalid one",
    }
);

/// The answers every operation may give besides its own: 500 (a server fault) and 503 (a
/// transient failure; `Retry-After` says when to send the same request again).
pub fn error_responses() -> [(&'static str, Response); 2] {
    [
        (
            "500",
            error_response("Server fault; the client learns no internals"),
        ),
        (
            "503",
            error_response(
                "Temporarily unavailable (database unreachable); retry the same request",
            ),
        ),
    ]
}

fn operations_mut(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// Adds the shared parts to `doc` (title and version, the envelope's schemas, 500/503 on every
/// operation but the operational ones, `GET /openapi.json`; for operations that declare
/// `security(("bearerAuth" = []))`, the bearer scheme and their 401), routes `GET
/// /openapi.json` to the finished document on `router`, installs the JSON fallbacks, and
/// returns both (the document as served).
///
/// # Panics
/// When the document does not serialize (a programming error in an annotation).
pub fn serve_openapi<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    mut doc: OpenApi,
    title: &str,
    description: &str,
) -> (Router<S>, serde_json::Value) {
    doc.info.title = title.to_owned();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.info.description = Some(description.to_owned());
    doc.info.license = None;
    doc.info.contact = None;
    let components = doc.components.get_or_insert_with(Default::default);
    components
        .schemas
        .insert("ErrorBody".to_owned(), ErrorBody::schema());
    components
        .schemas
        .insert("ErrorDetail".to_owned(), ErrorDetail::schema());
    for (path, item) in doc.paths.paths.iter_mut() {
        if matches!(path.as_str(), "/healthz" | "/metrics") {
            continue;
        }
        for op in operations_mut(item) {
            for (status, response) in error_responses() {
                op.responses
                    .responses
                    .entry(status.to_owned())
                    .or_insert_with(|| RefOr::T(response));
            }
        }
    }
    let openapi_op = OperationBuilder::new()
        .tag("operations")
        .operation_id(Some("openapi"))
        .summary(Some("This document (OpenAPI 3.1, generated from the code)"))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The OpenAPI document")
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(
                            utoipa::openapi::schema::ObjectBuilder::new()
                                .schema_type(utoipa::openapi::schema::Type::Object),
                        ))
                        .build(),
                ),
        )
        .build();
    doc.paths.paths.insert(
        "/openapi.json".to_owned(),
        PathItem::new(HttpMethod::Get, openapi_op),
    );
    let mut value = serde_json::to_value(&doc).expect("the OpenAPI document serializes");
    fix_link_field_names(&mut value);
    add_bearer_scheme(&mut value);
    let json = value.to_string();
    let router = router.route(
        "/openapi.json",
        get(move || {
            let json = json.clone();
            async move { ([(header::CONTENT_TYPE, "application/json")], json).into_response() }
        }),
    );
    (with_fallbacks(router), value)
}

/// The name operations use in `security(("bearerAuth" = []))`.
pub const BEARER_SCHEME: &str = "bearerAuth";

/// For every operation that requires [`BEARER_SCHEME`]: a 401 answer (unless it documents its
/// own) and, once, the scheme itself (`http`, `bearer`, JWT).
fn add_bearer_scheme(doc: &mut serde_json::Value) {
    let unauthorized = serde_json::json!({
        "description": "`missing_token` (no bearer token) or `invalid_token` (expired, bad \
            signature, wrong audience or issuer), with `WWW-Authenticate: Bearer`; nothing changed",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    });
    let mut used = false;
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        for op in paths
            .values_mut()
            .filter_map(|item| item.as_object_mut())
            .flat_map(|item| item.values_mut())
            .filter_map(|op| op.as_object_mut())
        {
            let secured = op
                .get("security")
                .and_then(|s| s.as_array())
                .is_some_and(|reqs| reqs.iter().any(|r| r.get(BEARER_SCHEME).is_some()));
            if !secured {
                continue;
            }
            used = true;
            if let Some(responses) = op.get_mut("responses").and_then(|r| r.as_object_mut()) {
                responses
                    .entry("401")
                    .or_insert_with(|| unauthorized.clone());
            }
        }
    }
    if used {
        doc["components"]["securitySchemes"][BEARER_SCHEME] = serde_json::json!({
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "A JWT from the identity provider (`sub` = the user; the `operator` \
                role in `roles` for catalog, warehouse and stock operations)"
        });
    }
}

/// utoipa 5.5 writes a response link's fields in snake case (`operation_id`); OpenAPI names
/// them `operationId`, `operationRef`, `requestBody`, and tools ignore a link without them.
fn fix_link_field_names(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let links = paths
        .values_mut()
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("responses").and_then(|r| r.as_object_mut()))
        .flat_map(|responses| responses.values_mut())
        .filter_map(|r| r.get_mut("links").and_then(|l| l.as_object_mut()))
        .flat_map(|links| links.values_mut())
        .filter_map(|l| l.as_object_mut());
    for link in links {
        for (from, to) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(v) = link.remove(from) {
                link.insert(to.to_owned(), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use utoipa::OpenApi;

    use super::*;

    /// The answers as each operation would list them.
    #[utoipa::path(get, path = "/listed", responses(
        (status = 400, description = "Malformed JSON body or undecodable path", body = ErrorBody),
        (status = 403, description = "`forbidden`: the operator role is required", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "`validation_failed`: `field` names the invalid one", body = ErrorBody),
    ))]
    #[allow(dead_code)]
    fn listed() {}

    /// The same answers, declared once.
    #[utoipa::path(get, path = "/declared", responses(JsonBodyRefused, OperatorOnly))]
    #[allow(dead_code)]
    fn declared() {}

    #[derive(OpenApi)]
    #[openapi(paths(listed, declared))]
    struct Doc;

    #[test]
    fn declared_answers_document_what_listing_them_would() {
        let doc = serde_json::to_value(Doc::openapi()).unwrap();
        let responses = |path: &str| doc["paths"][path]["get"]["responses"].clone();
        assert_eq!(responses("/declared"), responses("/listed"));
        assert_eq!(
            responses("/declared")["403"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorBody"
        );
    }
}
