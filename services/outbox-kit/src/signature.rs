//! Signed HTTP pushes (payment and refund callbacks, marketplace messages): `X-Signature` is
//! the lowercase hex HMAC-SHA256 of the raw request body under the shared secret. Receivers
//! verify before the body is even parsed, in constant time (`Mac::verify_slice`); senders
//! (the marketplace simulator, tests, tools) sign with the same type.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

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
        let Ok(expected) = hex::decode(signature.trim()) else {
            return false;
        };
        let mut mac = self.mac();
        mac.update(body);
        mac.verify_slice(&expected).is_ok()
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
    fn empty_secrets_are_refused_and_never_printed() {
        assert!(CallbackSecret::new("").is_err());
        let s = CallbackSecret::new("hunter2").unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
