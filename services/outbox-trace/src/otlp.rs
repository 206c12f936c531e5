//! Optional export of the hops' spans over OTLP/HTTP (protobuf), with the standard
//! OpenTelemetry environment variables: on only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off again. Off, nothing is set up: no exporter, no
//! thread, and [`super::TracedSpan`] builds no OpenTelemetry span.
//!
//! On, the SDK's batch span processor exports from its own thread through a blocking HTTP
//! client; `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES` work as the specification says. The exported spans have exactly
//! the ids the logs and the propagated `traceparent` show: this module builds each span with the
//! hop's own trace and span id below the remote parent.

use std::str::FromStr;
use std::sync::OnceLock;

use opentelemetry::trace::{
    Span as _, SpanContext, Status, TraceContextExt, TraceFlags, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

use super::{Attribute, SpanKind, TraceContext};

/// The standard variable that switches export on (`http://collector:4318`; the exporter appends
/// `/v1/traces`).
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The traces-only endpoint (used as is), also switching export on.
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Why export could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The exporter refused its configuration (e.g. an endpoint that is not a URL).
    #[error("cannot build the OTLP exporter")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// [`init`] already set up export in this process.
    #[error("OTLP export is already set up in this process")]
    AlreadySetUp,
}

/// Keeps the export running; dropping it flushes the spans not yet exported and stops the
/// exporter's thread. Hold it until the end of `main`.
#[derive(Debug)]
#[must_use = "dropping it stops the export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// No export.
    pub fn off() -> Self {
        Self { provider: None }
    }

    /// Whether spans are exported.
    pub fn is_exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "Could not flush the last spans to the OTLP endpoint");
            }
        }
    }
}

fn set(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether the environment asks for export (see the module documentation).
pub fn enabled_by_env() -> bool {
    enabled(set)
}

/// [`enabled_by_env`] over any variable lookup (`var` gives a set, non-blank value).
fn enabled(var: impl Fn(&str) -> Option<String>) -> bool {
    let is =
        |name: &str, value: &str| var(name).is_some_and(|v| v.trim().eq_ignore_ascii_case(value));
    let endpoint =
        var(OTEL_EXPORTER_OTLP_ENDPOINT).or_else(|| var(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT));
    endpoint.is_some() && !is("OTEL_SDK_DISABLED", "true") && !is("OTEL_TRACES_EXPORTER", "none")
}

/// Sets up export when the environment asks for it ([`enabled_by_env`]); `service_name` is the
/// `service.name` unless `OTEL_SERVICE_NAME` says otherwise.
///
/// # Errors
/// [`OtlpError`] when the exporter cannot be built or export is already set up.
pub fn init(service_name: &str) -> Result<Telemetry, OtlpError> {
    if !enabled_by_env() {
        return Ok(Telemetry::off());
    }
    if TRACER.get().is_some() {
        return Err(OtlpError::AlreadySetUp);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if set("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service_name.to_owned());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    TRACER
        .set(provider.tracer("outbox-kit"))
        .map_err(|_| OtlpError::AlreadySetUp)?;
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// [`init`], logging whether spans are exported; when the exporter refuses its settings, an
/// error is logged and the process runs without export.
pub fn init_or_run_without(service_name: &str) -> Telemetry {
    match init(service_name) {
        Ok(t) => {
            if t.is_exporting() {
                tracing::info!(service.name = %service_name, "Exporting trace spans over OTLP/HTTP");
            }
            t
        }
        Err(e) => {
            tracing::error!(error = %e, source = ?std::error::Error::source(&e), "OTLP span export is not set up; running without it");
            Telemetry::off()
        }
    }
}

fn otel_ids(ctx: &TraceContext) -> (opentelemetry::trace::TraceId, opentelemetry::trace::SpanId) {
    (
        opentelemetry::trace::TraceId::from_bytes(ctx.trace_id.to_bytes()),
        opentelemetry::trace::SpanId::from_bytes(ctx.span_id.to_bytes()),
    )
}

fn key_value(a: Attribute) -> KeyValue {
    match a {
        Attribute::Str(k, v) => KeyValue::new(k, v),
        Attribute::Static(k, v) => KeyValue::new(k, v),
        Attribute::Int(k, v) => KeyValue::new(k, v),
    }
}

/// The exported span of a hop with `context`'s ids below `remote_parent`, or `None` when export
/// is off.
pub(super) fn start_span(
    kind: SpanKind,
    context: &TraceContext,
    remote_parent: Option<TraceContext>,
    started_at: Option<std::time::SystemTime>,
    describe: impl FnOnce() -> (String, Vec<Attribute>),
) -> Option<Span> {
    let tracer = TRACER.get()?;
    let (name, attributes) = describe();
    let (trace_id, span_id) = otel_ids(context);
    let mut builder = tracer
        .span_builder(name)
        .with_kind(match kind {
            SpanKind::Server => opentelemetry::trace::SpanKind::Server,
            SpanKind::Consumer => opentelemetry::trace::SpanKind::Consumer,
            SpanKind::Producer => opentelemetry::trace::SpanKind::Producer,
        })
        .with_attributes(attributes.into_iter().map(key_value));
    if let Some(at) = started_at {
        builder = builder.with_start_time(at);
    }
    builder.trace_id = Some(trace_id);
    builder.span_id = Some(span_id);
    let parent = match remote_parent {
        Some(p) => {
            let (trace_id, span_id) = otel_ids(&p);
            let state = p
                .tracestate
                .as_deref()
                .and_then(|s| TraceState::from_str(s).ok())
                .unwrap_or_default();
            Context::new().with_remote_span_context(SpanContext::new(
                trace_id,
                span_id,
                TraceFlags::new(p.flags),
                true,
                state,
            ))
        }
        None => Context::new(),
    };
    Some(tracer.build_with_context(builder, &parent))
}

/// Whether the sampler records `span` (a root span's sampling is the sampler's decision).
pub(super) fn is_sampled(span: &Span) -> bool {
    span.span_context().is_sampled()
}

pub(super) fn set_attribute(span: &mut Span, attribute: Attribute) {
    span.set_attribute(key_value(attribute));
}

pub(super) fn end_span(mut span: Span, error: Option<String>) {
    if let Some(description) = error {
        span.set_status(Status::error(description));
    }
    span.end();
}

pub(super) fn end_span_at(mut span: Span, at: std::time::SystemTime, error: Option<String>) {
    if let Some(description) = error {
        span.set_status(Status::error(description));
    }
    span.end_with_timestamp(at);
}

/// Whether [`init`] set up export in this process.
pub(super) fn is_set_up() -> bool {
    TRACER.get().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_is_off_unless_an_endpoint_is_set_and_nothing_turns_it_off() {
        let table: &[(&[(&str, &str)], bool)] = &[
            (&[], false),
            (
                &[
                    ("OTEL_SERVICE_NAME", "x"),
                    ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                ],
                false,
            ),
            (&[(OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318")], true),
            (
                &[(
                    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
                    "http://c:4318/v1/traces",
                )],
                true,
            ),
            (
                &[
                    (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                    ("OTEL_SDK_DISABLED", "TRUE"),
                ],
                false,
            ),
            (
                &[
                    (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                    ("OTEL_SDK_DISABLED", "false"),
                ],
                true,
            ),
            (
                &[
                    (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                    ("OTEL_TRACES_EXPORTER", "none"),
                ],
                false,
            ),
        ];
        for (vars, expected) in table {
            let lookup = |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
                    .filter(|v| !v.trim().is_empty())
            };
            assert_eq!(enabled(lookup), *expected, "{vars:?}");
        }
    }

    #[test]
    fn without_set_up_no_span_is_built() {
        let ctx = TraceContext::new_root();
        let built = start_span(SpanKind::Server, &ctx, None, None, || {
            panic!("the span's description must not be built when export is off")
        });
        assert!(built.is_none());
    }
}
