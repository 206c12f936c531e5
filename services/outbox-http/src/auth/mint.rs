//! Signing tokens ([`Minter`]): for tests, the demo and the `mint-token` tool.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};

use super::verify::{Claims, OPERATOR_ROLE};

/// Signs tokens (tests, the demo, the `mint-token` tool).
#[derive(Clone)]
pub struct Minter {
    key: EncodingKey,
    algorithm: Algorithm,
    issuer: String,
    audience: String,
}

impl fmt::Debug for Minter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Minter")
            .field("algorithm", &self.algorithm)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// The private key cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("not an RSA or EC private key in PEM (PKCS#8 for EC)")]
pub struct BadPrivateKey;

impl Minter {
    /// Signs HS256 tokens with `secret` for `issuer` and `audience`.
    pub fn hs256(secret: &[u8], issuer: &str, audience: &str) -> Self {
        Self {
            key: EncodingKey::from_secret(secret),
            algorithm: Algorithm::HS256,
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
        }
    }

    /// Signs RS256 (RSA key) or ES256 (EC key) tokens with a private key in PEM.
    ///
    /// # Errors
    /// [`BadPrivateKey`].
    pub fn from_private_pem(
        pem: &[u8],
        issuer: &str,
        audience: &str,
    ) -> Result<Self, BadPrivateKey> {
        let (key, algorithm) = if let Ok(k) = EncodingKey::from_rsa_pem(pem) {
            (k, Algorithm::RS256)
        } else if let Ok(k) = EncodingKey::from_ec_pem(pem) {
            (k, Algorithm::ES256)
        } else {
            return Err(BadPrivateKey);
        };
        Ok(Self {
            key,
            algorithm,
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
        })
    }

    /// The same key and issuer for another audience (tests of a wrong audience).
    #[must_use]
    pub fn for_audience(&self, audience: &str) -> Self {
        Self {
            audience: audience.to_owned(),
            ..self.clone()
        }
    }

    /// The claims of a token for `sub` with `roles`, valid for `ttl` from now (a negative
    /// `ttl_secs` gives an already expired token).
    pub fn claims(&self, sub: &str, roles: &[&str], ttl_secs: i64) -> Claims {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let exp = now.saturating_add_signed(ttl_secs);
        Claims {
            sub: sub.to_owned(),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            exp,
            iat: now,
        }
    }

    /// Signs `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        // Serializing a struct of strings and integers with a valid key cannot fail.
        jsonwebtoken::encode(&Header::new(self.algorithm), claims, &self.key).unwrap_or_default()
    }

    /// A token for `sub` with `roles`, valid for `ttl_secs` seconds.
    pub fn token(&self, sub: &str, roles: &[&str], ttl_secs: i64) -> String {
        self.sign(&self.claims(sub, roles, ttl_secs))
    }

    /// A one-hour customer token for `user_id`.
    pub fn customer(&self, user_id: &str) -> String {
        self.token(user_id, &[], 3_600)
    }

    /// A one-hour operator token.
    pub fn operator(&self, name: &str) -> String {
        self.token(name, &[OPERATOR_ROLE], 3_600)
    }
}
