//! A minimal OTLP/HTTP trace receiver inside the test process: `POST /v1/traces` with a
//! protobuf `ExportTraceServiceRequest`, as the services' exporter sends it. It keeps every span
//! it was sent, with the `service.name` of its resource.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;

/// OTLP's span kinds (`opentelemetry.proto.trace.v1.Span.SpanKind`).
pub mod kind {
    /// `SPAN_KIND_SERVER`.
    pub const SERVER: i32 = 2;
    /// `SPAN_KIND_PRODUCER`.
    pub const PRODUCER: i32 = 4;
    /// `SPAN_KIND_CONSUMER`.
    pub const CONSUMER: i32 = 5;
}

/// One received span; ids in lowercase hex (an absent parent is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The resource's `service.name`.
    pub service: String,
    /// Span name.
    pub name: String,
    /// OTLP span kind ([`kind`]).
    pub kind: i32,
    /// Trace id.
    pub trace_id: String,
    /// Span id.
    pub span_id: String,
    /// Parent span id, empty for a root.
    pub parent_span_id: String,
    /// Start, nanoseconds since the Unix epoch.
    pub start_unix_nano: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_unix_nano: u64,
}

#[derive(Debug, Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    undecodable: usize,
}

/// The running receiver; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    /// `http://127.0.0.1:port`: the value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    received: Arc<Mutex<Received>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Receiver {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Received::default()));
        let app = Router::new()
            .route("/v1/traces", post(collect))
            .with_state(received.clone());
        let server = tokio::spawn(axum::serve(listener, app).into_future());
        Self {
            endpoint,
            received,
            server,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().unwrap().spans.clone()
    }

    /// Requests whose body was not an `ExportTraceServiceRequest`.
    pub fn undecodable(&self) -> usize {
        self.received.lock().unwrap().undecodable
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn collect(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> Response {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        received.lock().unwrap().undecodable += 1;
        return (StatusCode::BAD_REQUEST, "not an ExportTraceServiceRequest").into_response();
    };
    let mut got = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .and_then(|v| match v {
                AnyValue::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                got.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex::encode(span.trace_id),
                    span_id: hex::encode(span.span_id),
                    parent_span_id: hex::encode(span.parent_span_id),
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                });
            }
        }
    }
    received.lock().unwrap().spans.extend(got);
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}
