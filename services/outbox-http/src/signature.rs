//! Signed HTTP pushes (payment and refund callbacks, marketplace messages): `X-Signature` is
//! the lowercase hex HMAC-SHA256 under the shared secret. Receivers verify before the body is
//! even parsed, in constant time (`Mac::verify_slice`); senders (the marketplace simulator,
//! tests, tools) sign with the same type.
//!
//! Two schemes:
//! - **timestamped** (payment and refund callbacks): `X-Signature-Timestamp` carries the Unix
//!   time in seconds at signing, and the signature covers `"<timestamp>.<body>"`; a receiver
//!   refuses a timestamp further than its replay window from its clock, so a captured
//!   callback cannot be replayed later ([`CallbackSecret::sign_at`],
//!   [`CallbackSecret::verify_at`]).
//! - **body only** (marketplace pushes, whose platform signs the message and nothing else):
//!   the signature covers the body ([`CallbackSecret::sign`], [`CallbackSecret::verify`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Header with the signing time of a timestamped signature (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-signature-timestamp";

/// The default replay window of timestamped signatures.
pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(300);

/// Why a timestamped signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `X-Signature` header, or a signature that does not match.
    #[error("missing or invalid signature")]
    Invalid,
    /// No `X-Signature-Timestamp` header, or not an integer.
    #[error("missing or malformed X-Signature-Timestamp (Unix seconds)")]
    BadTimestamp,
    /// Correctly signed, but the timestamp is outside the replay window.
    #[error(
        "signature timestamp is {skew_secs} s from now, outside the {window_secs} s replay window"
    )]
    Stale {
        /// How far the timestamp is from the receiver's clock.
        skew_secs: u64,
        /// The window.
        window_secs: u64,
    },
}

/// A shared signing secret (`PAYMENT_CALLBACK_SECRET`, `MARKETPLACE_SECRET`). Its `Debug`
/// output hides the value.
#[derive(Clone)]
pub struct CallbackSecret(Arc<[u8]>);

impl fmt::Debug for CallbackSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CallbackSecret(<redacted>)")
    }
}

/// The secret is empty.
#[derive(Debug, thiserror::Error)]
#[error("the callback secret must not be empty")]
pub struct EmptySecret;

impl CallbackSecret {
    /// Wraps a secret.
    ///
    /// # Errors
    /// [`EmptySecret`] when it is empty: every signature would be forgeable.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, EmptySecret> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err(EmptySecret);
        }
        Ok(Self(Arc::from(secret)))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length.
        HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length")
    }

    /// The signature of `body`: lowercase hex HMAC-SHA256. What the provider sends, and what
    /// tests and tools use to sign.
    pub fn sign(&self, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `signature` (hex) is the signature of `body`. The comparison takes the same
    /// time wherever the first differing byte is.
    pub fn verify(&self, body: &[u8], signature: &str) -> bool {
        self.verify_parts(&[body], signature)
    }

    fn verify_parts(&self, parts: &[&[u8]], signature: &str) -> bool {
        let Ok(expected) = hex::decode(signature.trim()) else {
            return false;
        };
        let mut mac = self.mac();
        for p in parts {
            mac.update(p);
        }
        mac.verify_slice(&expected).is_ok()
    }

    /// The timestamped signature of `body` signed at `timestamp` (Unix seconds): the hex
    /// HMAC-SHA256 of `"<timestamp>.<body>"`. Send it as `X-Signature` with
    /// `X-Signature-Timestamp: <timestamp>`.
    pub fn sign_at(&self, timestamp: i64, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Checks a timestamped signature: `signature` must be [`Self::sign_at`] of `timestamp`
    /// and `body` (constant-time), and `timestamp` within `window` of `now` (either side).
    ///
    /// # Errors
    /// [`SignatureError`].
    pub fn verify_at(
        &self,
        body: &[u8],
        timestamp: Option<&str>,
        signature: Option<&str>,
        now: i64,
        window: Duration,
    ) -> Result<(), SignatureError> {
        let signature = signature.ok_or(SignatureError::Invalid)?;
        let raw = timestamp
            .map(str::trim)
            .ok_or(SignatureError::BadTimestamp)?;
        let ts: i64 = raw.parse().map_err(|_| SignatureError::BadTimestamp)?;
        if !self.verify_parts(&[raw.as_bytes(), b".", body], signature) {
            return Err(SignatureError::Invalid);
        }
        let skew_secs = now.abs_diff(ts);
        if skew_secs > window.as_secs() {
            return Err(SignatureError::Stale {
                skew_secs,
                window_secs: window.as_secs(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_known_hmac_sha256_vector() {
        // RFC 4231, test case 2.
        let s = CallbackSecret::new("Jefe").unwrap();
        let sig = s.sign(b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(s.verify(b"what do ya want for nothing?", &sig));
    }

    #[test]
    fn rejects_wrong_truncated_and_garbage_signatures() {
        let s = CallbackSecret::new("secret").unwrap();
        let body = br#"{"order_id":"x"}"#;
        let good = s.sign(body);
        assert!(s.verify(body, &good));
        assert!(!s.verify(b"other body", &good));
        assert!(!s.verify(body, &good[..62]));
        assert!(!s.verify(body, "not hex"));
        assert!(!s.verify(body, ""));
        assert!(!CallbackSecret::new("other").unwrap().verify(body, &good));
    }

    #[test]
    fn timestamped_signatures_hold_only_inside_the_window() {
        let s = CallbackSecret::new("secret").unwrap();
        let body = br#"{"refund_no":"R-1"}"#;
        let w = DEFAULT_REPLAY_WINDOW;
        let now = 1_800_000_000;
        let sig = s.sign_at(now, body);
        let ts = now.to_string();
        assert_eq!(
            s.verify_at(body, Some(&ts), Some(&sig), now + 300, w),
            Ok(())
        );
        assert_eq!(
            s.verify_at(body, Some(&ts), Some(&sig), now - 300, w),
            Ok(())
        );
        assert_eq!(
            s.verify_at(body, Some(&ts), Some(&sig), now + 301, w),
            Err(SignatureError::Stale {
                skew_secs: 301,
                window_secs: 300
            })
        );
        // The timestamp is signed: moving it forward breaks the signature.
        let later = (now + 300).to_string();
        assert_eq!(
            s.verify_at(body, Some(&later), Some(&sig), now + 301, w),
            Err(SignatureError::Invalid)
        );
        // A body-only signature is not a timestamped one.
        let plain = s.sign(body);
        assert_eq!(
            s.verify_at(body, Some(&ts), Some(&plain), now, w),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            s.verify_at(body, None, Some(&sig), now, w),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            s.verify_at(body, Some("soon"), Some(&sig), now, w),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            s.verify_at(body, Some(&ts), None, now, w),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn empty_secrets_are_refused_and_never_printed() {
        assert!(CallbackSecret::new("").is_err());
        let s = CallbackSecret::new("hunter2").unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
