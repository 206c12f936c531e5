//! The HTTP server every service runs, with the limits that keep an unauthenticated client
//! from exhausting it ([`HttpLimits`], flags in [`HttpLimitArgs`]):
//!
//! - a header read timeout (hyper's, per connection): a client that opens connections and
//!   sends its request head slowly, or never, is disconnected;
//! - a body read timeout and a body size limit, both checked while the body is read by the
//!   [`Body`](super::extract::Body) extractor (408 `body_timeout`, 413 `body_too_large`); the
//!   routes a service declares unauthenticated (signed callbacks and pushes, whose signature
//!   can only be checked once the body is read) get a small size limit;
//! - a bound on concurrent requests, and a smaller one for the unauthenticated routes, so
//!   slow uploads to a callback cannot take the slots of authenticated requests: beyond it, an
//!   immediate `503 overloaded` with `Retry-After: 1`.
//!
//! `/healthz` and `/metrics` are outside the bounds, so probes and scrapes still answer while
//! the API sheds load.
//!
//! A connection is closed with a *lingering close* ([`Lingering`]): a refusal (503, 408, 413)
//! is written before the client's body was read, and closing a socket with unread bytes makes
//! the kernel send a reset that can destroy the answer on its way, so the client sees
//! "connection reset" instead of the status. The server shuts its side down, then reads and
//! discards what the client still sends, for at most [`LINGER_TIME`] and [`LINGER_BYTES`].

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::ApiError;

/// Longest a closed connection keeps reading what the client still sends ([`Lingering`]).
pub const LINGER_TIME: Duration = Duration::from_secs(2);
/// Most bytes a closed connection reads and discards ([`Lingering`]).
pub const LINGER_BYTES: usize = 256 << 10;

/// Connections the kernel queues for a service's listener before it accepts them. The
/// standard library's and tokio's `bind` ask for 128: 500 clients connecting at once to a
/// service starved of CPU overflowed it here, and the kernel then reset connections whose
/// clients had already sent their requests (`ListenOverflows`), so they never saw the 503 the
/// server answers when it is overloaded. The kernel caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds a service's listener with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as tokio's `bind`):
/// the first of `addr`'s addresses that binds.
///
/// # Errors
/// When `addr` does not resolve, or no address binds.
pub async fn bind(addr: impl tokio::net::ToSocketAddrs) -> std::io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the address resolved to nothing",
        )
    }))
}

/// The body limit of authenticated routes (axum's default).
pub const DEFAULT_BODY_LIMIT_BYTES: usize = 2 << 20;

/// The limits of one service's HTTP server.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Longest wait for a request's head (request line and headers).
    pub header_read_timeout: Duration,
    /// Longest time to read a request's body.
    pub body_read_timeout: Duration,
    /// Largest body of an authenticated route.
    pub body_limit_bytes: usize,
    /// Largest body of an unauthenticated route.
    pub unauthenticated_body_limit_bytes: usize,
    /// Most requests in flight (probes and scrapes excepted).
    pub max_concurrent_requests: usize,
    /// Most requests in flight on the unauthenticated routes (counted in both bounds).
    pub max_concurrent_unauthenticated_requests: usize,
    /// Route templates without a bearer token (`/payments/callback`, ...).
    pub unauthenticated_routes: &'static [&'static str],
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            body_limit_bytes: DEFAULT_BODY_LIMIT_BYTES,
            unauthenticated_body_limit_bytes: 64 << 10,
            max_concurrent_requests: 256,
            max_concurrent_unauthenticated_requests: 32,
            unauthenticated_routes: &[],
        }
    }
}

/// The flags of [`HttpLimits`], the same in every service.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpLimitArgs {
    /// Longest wait for a request's head (request line and headers), in milliseconds; a
    /// connection that has not sent it by then is closed.
    #[arg(long, env = "HTTP_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_read_timeout_ms: u64,

    /// Longest time to read a request's body, in milliseconds (408 `body_timeout` after it).
    #[arg(long, env = "HTTP_BODY_READ_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_read_timeout_ms: u64,

    /// Largest body of the unauthenticated routes (signed callbacks and pushes), in bytes,
    /// checked while reading, before the signature (413 `body_too_large`).
    #[arg(long, env = "HTTP_UNAUTHENTICATED_BODY_LIMIT_BYTES", default_value_t = 64 << 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_unauthenticated_body_limit_bytes: u64,

    /// Most HTTP requests in flight (`/healthz` and `/metrics` excepted); beyond it requests
    /// are answered `503 overloaded` at once.
    #[arg(long, env = "HTTP_MAX_CONCURRENT_REQUESTS", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_concurrent_requests: u64,

    /// Most requests in flight on the unauthenticated routes (part of the bound above), so
    /// slow unauthenticated uploads cannot take every slot.
    #[arg(long, env = "HTTP_MAX_CONCURRENT_UNAUTHENTICATED_REQUESTS", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_concurrent_unauthenticated_requests: u64,
}

impl HttpLimitArgs {
    /// The limits these flags describe, for a service whose unauthenticated routes are
    /// `unauthenticated_routes`.
    pub fn limits(&self, unauthenticated_routes: &'static [&'static str]) -> HttpLimits {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        HttpLimits {
            header_read_timeout: Duration::from_millis(self.http_header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(self.http_body_read_timeout_ms),
            body_limit_bytes: DEFAULT_BODY_LIMIT_BYTES,
            unauthenticated_body_limit_bytes: size(self.http_unauthenticated_body_limit_bytes),
            max_concurrent_requests: size(self.http_max_concurrent_requests),
            max_concurrent_unauthenticated_requests: size(
                self.http_max_concurrent_unauthenticated_requests,
            ),
            unauthenticated_routes,
        }
    }
}

/// How the [`Body`](super::extract::Body) extractor reads a request's body: a request
/// extension set by the server for each request (defaults without one, e.g. in-process tests).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body.
    pub max_bytes: usize,
    /// Longest time to read it.
    pub read_timeout: Duration,
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_BODY_LIMIT_BYTES,
            read_timeout: HttpLimits::default().body_read_timeout,
        }
    }
}

/// The per-request state of the limits middleware.
#[derive(Debug, Clone)]
struct Gate {
    limits: Arc<HttpLimits>,
    all: Arc<Semaphore>,
    unauthenticated: Arc<Semaphore>,
}

/// The 503 beyond a concurrency bound.
fn overloaded(what: &str) -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        format!("too many {what} requests in flight; retry shortly"),
    )
    .into_response()
}

/// Takes the request's concurrency slots (or answers 503) and sets its [`BodyLimits`].
async fn gate(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    if matches!(route, Some("/healthz" | "/metrics")) {
        return next.run(req).await;
    }
    let unauthenticated = route.is_some_and(|r| gate.limits.unauthenticated_routes.contains(&r));
    let _own = if unauthenticated {
        match gate.unauthenticated.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => return overloaded("unauthenticated"),
        }
    } else {
        None
    };
    let Ok(_slot) = gate.all.clone().try_acquire_owned() else {
        return overloaded("HTTP");
    };
    req.extensions_mut().insert(BodyLimits {
        max_bytes: if unauthenticated {
            gate.limits.unauthenticated_body_limit_bytes
        } else {
            gate.limits.body_limit_bytes
        },
        read_timeout: gate.limits.body_read_timeout,
    });
    next.run(req).await
}

/// `router` with the concurrency bounds and body limits of `limits` (what [`serve`] installs;
/// exposed for in-process tests).
pub fn limit(router: Router, limits: &HttpLimits) -> Router {
    let gate_state = Gate {
        all: Arc::new(Semaphore::new(limits.max_concurrent_requests)),
        unauthenticated: Arc::new(Semaphore::new(
            limits.max_concurrent_unauthenticated_requests,
        )),
        limits: Arc::new(limits.clone()),
    };
    router.layer(axum::middleware::from_fn_with_state(gate_state, gate))
}

/// Serves `router` on `listener` with the default [`HttpLimits`] until `shutdown` is
/// cancelled, then lets requests in flight finish for at most `drain_timeout`.
///
/// # Errors
/// Never today (accept errors are logged and retried); kept for callers' `?`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    drain_timeout: Duration,
) -> std::io::Result<()> {
    serve_with_limits(
        listener,
        router,
        shutdown,
        drain_timeout,
        &HttpLimits::default(),
    )
    .await
}

/// Serves `router` on `listener` within `limits` (module docs) until `shutdown` is cancelled,
/// then lets requests in flight finish for at most `drain_timeout`.
///
/// # Errors
/// Never today (accept errors are logged and retried); kept for callers' `?`.
pub async fn serve_with_limits(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    drain_timeout: Duration,
    limits: &HttpLimits,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            addr = %addr,
            max_concurrent_requests = limits.max_concurrent_requests,
            "Serving HTTP"
        );
    }
    let router = limit(router, limits);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    // Every connection task holds a clone of `open`; `closed` yields None once all are gone.
    let (open, mut closed) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "Accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(
            router
                .clone()
                .map_request(|req: Request<hyper::body::Incoming>| req.map(axum::body::Body::new)),
        );
        let conn = http.serve_connection(TokioIo::new(Lingering(Some(stream))), service);
        let stop = shutdown.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let _open = open;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                    return;
                }
                () = stop.cancelled() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    drop(open);
    if tokio::time::timeout(drain_timeout, closed.recv())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_timeout_ms = u64::try_from(drain_timeout.as_millis()).unwrap_or(u64::MAX),
            "Requests still in flight at the drain deadline; stopping anyway"
        );
    }
    Ok(())
}

/// A connection's stream that, when dropped, closes with a lingering close: it shuts its
/// sending side down (the client reads the answer, then end of stream) and reads and discards
/// what the client still sends until the client closes, [`LINGER_TIME`] passes or
/// [`LINGER_BYTES`] arrive, so the kernel never resets a connection whose answer is in flight.
#[derive(Debug)]
struct Lingering(Option<tokio::net::TcpStream>);

impl Lingering {
    fn stream(&mut self) -> &mut tokio::net::TcpStream {
        self.0.as_mut().expect("a live connection's stream")
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let (Some(mut stream), Ok(runtime)) =
            (self.0.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = stream.shutdown().await;
            let mut buf = [0u8; 4096];
            let mut read = 0;
            let _ = tokio::time::timeout(LINGER_TIME, async {
                while read < LINGER_BYTES {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read += n,
                    }
                }
            })
            .await;
        });
    }
}

impl tokio::io::AsyncRead for Lingering {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(self.stream()).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Lingering {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(self.stream()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(self.stream()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(tokio::io::AsyncWrite::is_write_vectored)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(self.stream()).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(self.stream()).poll_shutdown(cx)
    }
}
