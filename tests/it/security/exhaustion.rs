//! No unauthenticated way to exhaust a service, on the order service as a process: 50 000
//! requests with made-up HTTP methods add no `order_http_requests_total` series (the method
//! label is bounded) and leave RSS bounded; 500 slow uploads to the unsigned callback route
//! hold at most the unauthenticated bound of slots (the rest are `503 overloaded` at once, the
//! held ones `408` at the body timeout), an authenticated request is served meanwhile, and RSS
//! stays bounded; bodies over the callback limit are 413 before the signature is checked,
//! whether declared or streamed.
//!
//! The RSS bounds are generous on purpose (figures are printed; they are not timing claims).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use e2e::proc::ServiceProcess;
use futures::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CALLBACK_SECRET: &str = "e2e-callback-secret";

/// Resident set size of process `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

struct Service {
    process: ServiceProcess,
    addr: String,
    http: reqwest::Client,
}

impl Service {
    async fn start(name: &str, env: &[(&str, &str)]) -> Self {
        let db = e2e::db::fresh_database().await;
        let addr = format!("127.0.0.1:{}", e2e::free_port());
        let mut envs = vec![("PAYMENT_CALLBACK_SECRET", CALLBACK_SECRET)];
        envs.extend_from_slice(env);
        let process = ServiceProcess::start(
            "order-service",
            name,
            &["--listen", &addr, "--database-url", &db.url],
            &envs,
        );
        let http = reqwest::Client::new();
        crate::common::wait_serving(&http, &format!("http://{addr}")).await;
        Self {
            process,
            addr,
            http,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// `order_http_requests_total` series and the size of the page.
    async fn http_series(&self) -> (usize, usize) {
        let text = self.metrics().await;
        let n = text
            .lines()
            .filter(|l| l.starts_with("order_http_requests_total{"))
            .count();
        (n, text.len())
    }

    /// An authenticated request: the operator puts a SKU.
    async fn put_sku(&self) -> reqwest::StatusCode {
        self.http
            .put(self.url("/skus/sku-1"))
            .bearer_auth(e2e::auth::operator())
            .json(&json!({"name": "Lamp", "price_cents": 2500}))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap()
            .status()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_thousand_made_up_methods_add_no_metric_series_and_leave_rss_bounded() {
    let svc = Service::start("order-service-methods", &[]).await;
    assert!(svc.put_sku().await.is_success());
    // One made-up method first, so that its `other` series exists before counting.
    let first = reqwest::Method::from_bytes(b"WARMUP").unwrap();
    svc.http.request(first, svc.url("/x")).send().await.unwrap();
    // And a scrape, whose own series appears from the next one on.
    svc.metrics().await;
    let (series_before, page_before) = svc.http_series().await;
    let rss_before = rss_kib(svc.process.pid());
    let sent = futures::stream::iter(0..50_000u32)
        .map(|i| {
            let method = reqwest::Method::from_bytes(format!("M{i:06X}").as_bytes()).unwrap();
            let req = svc.http.request(method, svc.url("/x"));
            async move { req.send().await.map(|r| r.status().as_u16()) }
        })
        .buffer_unordered(16)
        .fold(0usize, |n, r| async move {
            assert!(r.is_ok(), "a request failed: {r:?}");
            n + 1
        })
        .await;
    assert_eq!(sent, 50_000);
    let (series_after, page_after) = svc.http_series().await;
    let rss_after = rss_kib(svc.process.pid());
    eprintln!(
        "made-up methods: order_http_requests_total series {series_before} -> {series_after}, \
         /metrics {page_before} -> {page_after} bytes, RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert_eq!(series_after, series_before, "made-up methods added series");
    assert!(
        svc.metrics().await.contains("method=\"other\""),
        "made-up methods are counted as other"
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
}

/// Starts a request to `/payments/callback` declaring a 60 000-byte body and sends one byte
/// every 200 ms; the status and text of the answer (`None` if the connection closed without
/// one).
async fn slow_upload(addr: String, started: Arc<AtomicUsize>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(&addr).await.ok()?;
    s.write_all(
        b"POST /payments/callback HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 60000\r\nX-Signature-Timestamp: 0\r\nX-Signature: 00\r\n\r\n{",
    )
    .await
    .ok()?;
    started.fetch_add(1, Ordering::SeqCst);
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        tokio::select! {
            n = s.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    // The whole envelope: `{"error": {...}}`.
                    if answer.ends_with(b"}}") { break; }
                }
            },
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                // The slow client's pace, not a wait for a condition.
                if s.write_all(b" ").await.is_err() {
                    let _ = s.read_to_end(&mut answer).await;
                    break;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.get(9..12)?.parse().ok()?;
    Some((status, text))
}

/// Sends a request head declaring `content_length` (or chunked when `None`) to the callback
/// route, then body bytes until the server answers; the status.
async fn oversized_upload(addr: &str, content_length: Option<usize>) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let framing = match content_length {
        Some(n) => format!("Content-Length: {n}"),
        None => "Transfer-Encoding: chunked".to_owned(),
    };
    s.write_all(
        format!(
            "POST /payments/callback HTTP/1.1\r\nHost: x\r\n{framing}\r\n\
             X-Signature-Timestamp: 0\r\nX-Signature: 00\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let chunk = vec![b'a'; 8192];
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    let (mut rd, mut wr) = s.split();
    for _ in 0..128 {
        // 1 MiB at most; the server answers long before.
        tokio::select! {
            n = rd.read(&mut buf) => {
                if let Ok(n) = n { answer.extend_from_slice(&buf[..n]); }
                break;
            }
            w = async {
                if content_length.is_some() {
                    wr.write_all(&chunk).await
                } else {
                    wr.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await?;
                    wr.write_all(&chunk).await?;
                    wr.write_all(b"\r\n").await
                }
            } => if w.is_err() { break; },
        }
    }
    if answer.len() < 12 {
        let _ = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut answer)).await;
    }
    std::str::from_utf8(&answer[9..12])
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_uploads_to_the_callback_leave_an_authenticated_request_served_and_rss_bounded() {
    let svc = Service::start(
        "order-service-slow",
        &[
            ("HTTP_BODY_READ_TIMEOUT_MS", "4000"),
            ("HTTP_HEADER_READ_TIMEOUT_MS", "2000"),
        ],
    )
    .await;
    assert!(svc.put_sku().await.is_success());
    // A request head that never ends: the connection is closed at the header read timeout.
    let mut slow_head = TcpStream::connect(&svc.addr).await.unwrap();
    slow_head
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), slow_head.read_to_end(&mut rest))
        .await
        .expect("the server closes a connection whose head never ends")
        .ok();
    // So is one that sends nothing at all, and one left idle after a request (keep-alive).
    let mut silent = TcpStream::connect(&svc.addr).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), silent.read_to_end(&mut rest))
        .await
        .expect("the server closes a connection that sends nothing")
        .ok();
    let mut idle = TcpStream::connect(&svc.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), idle.read_to_end(&mut rest))
        .await
        .expect("the server closes a kept-alive connection left idle")
        .ok();
    // Over the callback limit (64 KiB): refused before reading it, and while reading it.
    assert_eq!(oversized_upload(&svc.addr, Some(1 << 20)).await, 413);
    assert_eq!(oversized_upload(&svc.addr, None).await, 413);
    let rss_before = rss_kib(svc.process.pid());

    let started = Arc::new(AtomicUsize::new(0));
    let uploads: Vec<_> = (0..500)
        .map(|_| tokio::spawn(slow_upload(svc.addr.clone(), started.clone())))
        .collect();
    e2e::wait_for(
        "500 slow uploads to have sent their heads",
        Duration::from_secs(60),
        || std::future::ready((started.load(Ordering::SeqCst) == 500).then_some(())),
    )
    .await;
    let status = svc.put_sku().await;
    let rss_during = rss_kib(svc.process.pid());
    assert!(
        status.is_success(),
        "an authenticated request during the slow uploads: {status}"
    );

    let mut by_status = std::collections::BTreeMap::<Option<u16>, usize>::new();
    let mut an_overloaded_answer = None;
    for u in uploads {
        let s = tokio::time::timeout(Duration::from_secs(60), u)
            .await
            .expect("every slow upload answered within a minute")
            .unwrap();
        if let Some((503, text)) = &s {
            an_overloaded_answer.get_or_insert_with(|| text.clone());
        }
        *by_status.entry(s.map(|(code, _)| code)).or_default() += 1;
    }
    let answer = an_overloaded_answer.expect("some uploads were refused as overloaded");
    assert!(
        answer.contains("application/json") && answer.contains("\"code\":\"overloaded\""),
        "the 503 is the JSON envelope: {answer}"
    );
    let rss_after = rss_kib(svc.process.pid());
    eprintln!(
        "500 slow uploads: answers {by_status:?}; RSS {rss_before} KiB before, \
         {rss_during} KiB during, {rss_after} KiB after"
    );
    let overloaded = by_status.get(&Some(503)).copied().unwrap_or(0);
    let timed_out = by_status.get(&Some(408)).copied().unwrap_or(0);
    assert_eq!(
        overloaded + timed_out,
        500,
        "every slow upload is refused: {by_status:?}"
    );
    assert!(
        overloaded >= 500 - 2 * 32,
        "beyond the unauthenticated bound (32) uploads are 503 at once: {by_status:?}"
    );
    assert!(
        rss_during < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_during} KiB"
    );
    // The service still serves.
    assert!(svc.put_sku().await.is_success());
}
