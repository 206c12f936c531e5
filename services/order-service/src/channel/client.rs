//! The platform's query and ship APIs, as the compensation poller and the ship-back consumer
//! call them (`MARKETPLACE_URL`).

use std::time::Duration;

use serde_json::{json, Value};

/// Why a platform call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The platform could not be reached or answered 5xx / 429: try again later.
    #[error("platform unavailable: {0}")]
    Unavailable(String),
    /// The platform refused the request for good (4xx).
    #[error("platform refused the request ({status}): {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its answer.
        body: String,
    },
    /// The answer is not what the API promises.
    #[error("unexpected platform answer: {0}")]
    Unexpected(String),
    /// The answer is larger than [`MAX_ANSWER_BYTES`]; it was not read to its end.
    #[error("platform answer larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    /// The platform's `until` lies further in the future than clocks can disagree
    /// ([`MAX_CLOCK_SKEW`]): taken as it is, it would move the watermark past changes the
    /// platform has not made yet, and the next passes would never ask for them.
    #[error("platform watermark until={until_ms} is beyond now ({now_ms}) plus {skew_ms} ms of clock skew")]
    FutureWatermark {
        /// The answer's `until` (ms since the epoch).
        until_ms: i64,
        /// Our clock (ms since the epoch).
        now_ms: i64,
        /// The skew allowed.
        skew_ms: i64,
    },
}

/// The largest answer read from the platform: a page of changes is far smaller; a larger one
/// is refused before it fills the memory.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// How long a platform call may take in all (connect, send, answer read to its end).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connecting (TCP and TLS) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How far the platform's clock may be ahead of ours.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// What the ship API answered for a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShipAnswer {
    /// Recorded now.
    Shipped,
    /// The platform had this tracking number for the trade already (a retry of ours).
    AlreadyShipped,
}

impl ShipAnswer {
    /// As stored in `channel_shipbacks.result`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shipped => "shipped",
            Self::AlreadyShipped => "already_shipped",
        }
    }
}

/// Reads an answer's body, at most `limit` bytes (the `Content-Length` is checked first, the
/// bytes as they come for answers without one).
async fn read_bounded(mut r: reqwest::Response, limit: usize) -> Result<String, ClientError> {
    if r.content_length().is_some_and(|n| n > limit as u64) {
        return Err(ClientError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = r
        .chunk()
        .await
        .map_err(|e| ClientError::Unavailable(e.to_string()))?
    {
        if body.len() + chunk.len() > limit {
            return Err(ClientError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|e| ClientError::Unexpected(e.to_string()))
}

/// Refuses an `until` beyond `now_ms` plus [`MAX_CLOCK_SKEW`].
fn check_until(until_ms: i64, now_ms: i64) -> Result<(), ClientError> {
    let skew_ms = MAX_CLOCK_SKEW.as_millis() as i64;
    if until_ms > now_ms.saturating_add(skew_ms) {
        return Err(ClientError::FutureWatermark {
            until_ms,
            now_ms,
            skew_ms,
        });
    }
    Ok(())
}

/// A client of the platform's API.
#[derive(Debug, Clone)]
pub struct PlatformClient {
    base: String,
    http: reqwest::Client,
}

impl PlatformClient {
    /// A client of the platform at `base` (`http://host:port`).
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            // HTTPS through the system's OpenSSL and trust store (reqwest `native-tls`).
            http: reqwest::Client::builder()
                .timeout(CALL_TIMEOUT)
                .connect_timeout(CONNECT_TIMEOUT)
                .build()
                .unwrap_or_default(),
        }
    }

    async fn call(&self, req: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        let r = req
            .send()
            .await
            .map_err(|e| ClientError::Unavailable(e.to_string()))?;
        let status = r.status();
        let body = read_bounded(r, MAX_ANSWER_BYTES).await?;
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(ClientError::Unavailable(format!("HTTP {status}")));
        }
        if !status.is_success() {
            return Err(ClientError::Refused {
                status: status.as_u16(),
                body,
            });
        }
        serde_json::from_str(&body).map_err(|e| ClientError::Unexpected(e.to_string()))
    }

    /// The query API: messages changed after `since` (oldest first) and the newest
    /// `modified` among them.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn changes_since(&self, since: i64) -> Result<(Vec<Value>, i64), ClientError> {
        let v = self
            .call(
                self.http
                    .get(format!("{}/query/changes", self.base))
                    .query(&[("since", since)]),
            )
            .await?;
        let messages = v["messages"]
            .as_array()
            .cloned()
            .ok_or_else(|| ClientError::Unexpected("no messages".to_owned()))?;
        let until = v["until"].as_i64().unwrap_or(since);
        check_until(until, chrono::Utc::now().timestamp_millis())?;
        Ok((messages, until))
    }

    /// The ship API: reports `out_sid` for trade `tid`.
    ///
    /// # Errors
    /// [`ClientError`]; a 409 "shipped with another number" is [`ClientError::Refused`].
    pub async fn ship(
        &self,
        tid: &str,
        out_sid: &str,
        company: &str,
    ) -> Result<ShipAnswer, ClientError> {
        let v = self
            .call(
                self.http
                    .post(format!("{}/ship", self.base))
                    .json(&json!({"tid": tid, "out_sid": out_sid, "company": company})),
            )
            .await?;
        match v["result"].as_str() {
            Some("shipped") => Ok(ShipAnswer::Shipped),
            Some("already_shipped") => Ok(ShipAnswer::AlreadyShipped),
            other => Err(ClientError::Unexpected(format!("result {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-connection HTTP server that answers `answer` (status line, headers, body) to
    /// whatever it is asked.
    async fn serve_once(answer: Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let _ = sock.write_all(&answer).await;
            let _ = sock.shutdown().await;
        });
        format!("http://{addr}")
    }

    fn ok_json(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn a_watermark_in_the_future_is_refused() {
        let far = chrono::Utc::now().timestamp_millis() + 24 * 3_600_000;
        let base = serve_once(ok_json(&format!(r#"{{"messages":[],"until":{far}}}"#))).await;
        let e = PlatformClient::new(&base)
            .changes_since(0)
            .await
            .unwrap_err();
        assert!(
            matches!(e, ClientError::FutureWatermark { until_ms, .. } if until_ms == far),
            "{e:?}"
        );
        assert!(e.to_string().contains("clock skew"), "{e}");
    }

    #[tokio::test]
    async fn a_watermark_within_the_skew_is_taken() {
        let soon = chrono::Utc::now().timestamp_millis() + 5_000;
        let base = serve_once(ok_json(&format!(
            r#"{{"messages":[{{"x":1}}],"until":{soon}}}"#
        )))
        .await;
        let (messages, until) = PlatformClient::new(&base).changes_since(0).await.unwrap();
        assert_eq!(messages.len(), 1);
        assert_eq!(until, soon);
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused_with_or_without_a_length() {
        let big = format!(
            r#"{{"messages":[],"pad":"{}"}}"#,
            "x".repeat(MAX_ANSWER_BYTES)
        );
        let base = serve_once(ok_json(&big)).await;
        let e = PlatformClient::new(&base)
            .changes_since(0)
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::TooLarge), "{e:?}");
        // No content-length: the body ends when the connection closes.
        let mut answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
                .to_vec();
        answer.extend_from_slice(big.as_bytes());
        let base = serve_once(answer).await;
        let e = PlatformClient::new(&base)
            .changes_since(0)
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::TooLarge), "{e:?}");
    }

    #[test]
    fn the_skew_is_bounded_both_ways() {
        assert!(check_until(1_000, 1_000).is_ok());
        assert!(check_until(61_000, 1_000).is_ok());
        assert!(check_until(61_001, 1_000).is_err());
    }
}
