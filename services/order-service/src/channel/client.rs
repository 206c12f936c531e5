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
}

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
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
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
        let body = r
            .text()
            .await
            .map_err(|e| ClientError::Unavailable(e.to_string()))?;
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
