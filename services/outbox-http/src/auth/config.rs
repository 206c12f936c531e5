//! The bearer-token settings of a service: the JWT flags ([`AuthArgs`]), the checks that keep a
//! server from starting open or ambiguous, and the verification key they name.

use std::path::PathBuf;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey};

use super::verify::Authenticator;

/// The JWT flags every service with a protected HTTP API takes (flatten into its
/// `clap::Parser`). All are optional at parse time so operator subcommands (`dlq ...`) run
/// without them; [`AuthArgs::authenticator`] refuses to start a server without a key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AuthArgs {
    /// HS256 secret bearer tokens are signed with (at least 32 bytes). Exactly one of this and
    /// `--jwt-public-key-file` is required to serve. Prefer the environment variable: flags
    /// show up in process listings.
    #[arg(long, env = "JWT_HS256_SECRET", hide_env_values = true)]
    pub jwt_hs256_secret: Option<String>,

    /// PEM file with the public key bearer tokens are signed with: an RSA key (RS256) or a
    /// P-256 EC key (ES256).
    #[arg(long, env = "JWT_PUBLIC_KEY_FILE")]
    pub jwt_public_key_file: Option<PathBuf>,

    /// Required `iss` of bearer tokens.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// Required `aud` of bearer tokens (one of the token's audiences must equal it).
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// Clock skew tolerated on `exp`, in seconds.
    #[arg(long, env = "JWT_LEEWAY_SECS", default_value_t = 30)]
    pub jwt_leeway_secs: u64,
}

/// Why the JWT configuration cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// Neither key is set: the API would be open.
    #[error(
        "no bearer-token key configured: set JWT_HS256_SECRET (--jwt-hs256-secret) or \
         JWT_PUBLIC_KEY_FILE (--jwt-public-key-file); the API does not run unauthenticated"
    )]
    NoKey,
    /// Both keys are set.
    #[error("set only one of JWT_HS256_SECRET and JWT_PUBLIC_KEY_FILE")]
    TwoKeys,
    /// The HS256 secret is too short to resist guessing.
    #[error("JWT_HS256_SECRET must be at least {MIN_SECRET_LEN} bytes")]
    ShortSecret,
    /// `--jwt-issuer` or `--jwt-audience` is missing.
    #[error("{0} must be set: tokens are only accepted for a configured issuer and audience")]
    Missing(&'static str),
    /// The key file cannot be read.
    #[error("reading JWT_PUBLIC_KEY_FILE {path}")]
    ReadKey {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The key file holds no RSA or EC public key in PEM.
    #[error("JWT_PUBLIC_KEY_FILE {0} is not an RSA or EC public key in PEM")]
    BadKey(PathBuf),
}

/// Shortest accepted HS256 secret (RFC 7518 §3.2: at least the hash size).
pub const MIN_SECRET_LEN: usize = 32;

impl AuthArgs {
    /// The secret among these settings, for the weak-secret check ([`outbox_process::secrets`]).
    pub fn secrets(&self) -> [outbox_process::secrets::Secret<'_>; 1] {
        [outbox_process::secrets::Secret::signing_key(
            "JWT_HS256_SECRET (--jwt-hs256-secret)",
            self.jwt_hs256_secret.as_deref().filter(|s| !s.is_empty()),
        )]
    }

    /// The verifier these flags describe.
    ///
    /// # Errors
    /// [`AuthConfigError`]: no key (the service must not start open), two keys, a short
    /// secret, no issuer or audience, an unreadable or unparsable key file.
    pub fn authenticator(&self) -> Result<Authenticator, AuthConfigError> {
        let issuer = self
            .jwt_issuer
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(AuthConfigError::Missing("JWT_ISSUER (--jwt-issuer)"))?;
        let audience = self
            .jwt_audience
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(AuthConfigError::Missing("JWT_AUDIENCE (--jwt-audience)"))?;
        let secret = self.jwt_hs256_secret.as_deref().filter(|s| !s.is_empty());
        let (key, algorithm) = match (secret, &self.jwt_public_key_file) {
            (None, None) => return Err(AuthConfigError::NoKey),
            (Some(_), Some(_)) => return Err(AuthConfigError::TwoKeys),
            (Some(secret), None) => {
                if secret.len() < MIN_SECRET_LEN {
                    return Err(AuthConfigError::ShortSecret);
                }
                (
                    DecodingKey::from_secret(secret.as_bytes()),
                    Algorithm::HS256,
                )
            }
            (None, Some(path)) => {
                let pem = std::fs::read(path).map_err(|source| AuthConfigError::ReadKey {
                    path: path.clone(),
                    source,
                })?;
                public_key(&pem).ok_or_else(|| AuthConfigError::BadKey(path.clone()))?
            }
        };
        Ok(Authenticator::new(
            key,
            algorithm,
            issuer,
            audience,
            Duration::from_secs(self.jwt_leeway_secs),
        ))
    }
}

/// An RSA (RS256) or EC (ES256) public key from PEM.
fn public_key(pem: &[u8]) -> Option<(DecodingKey, Algorithm)> {
    if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
        return Some((k, Algorithm::RS256));
    }
    DecodingKey::from_ec_pem(pem)
        .ok()
        .map(|k| (k, Algorithm::ES256))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Minter;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn rs256_and_es256_public_keys_verify_their_tokens_only() {
        let dir = std::env::temp_dir().join(format!("outbox-kit-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = [
            (include_str!("test-rsa.pem"), include_str!("test-rsa.pub")),
            (include_str!("test-ec.pem"), include_str!("test-ec.pub")),
        ];
        for (i, (private, public)) in keys.iter().enumerate() {
            let path = dir.join(format!("key-{i}.pub"));
            std::fs::write(&path, public).unwrap();
            let args = AuthArgs {
                jwt_public_key_file: Some(path),
                jwt_issuer: Some("iss".into()),
                jwt_audience: Some("aud".into()),
                ..AuthArgs::default()
            };
            let a = args.authenticator().unwrap();
            let m = Minter::from_private_pem(private.as_bytes(), "iss", "aud").unwrap();
            assert_eq!(a.verify(&m.customer("bob")).unwrap().subject, "bob");
            // An HS256 token must not pass as the other algorithm (algorithm confusion).
            let hs = Minter::hs256(public.as_bytes(), "iss", "aud").customer("bob");
            assert!(a.verify(&hs).is_err());
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn configuration_refuses_to_run_open_or_ambiguous() {
        let base = AuthArgs {
            jwt_issuer: Some("iss".into()),
            jwt_audience: Some("aud".into()),
            ..AuthArgs::default()
        };
        assert!(matches!(base.authenticator(), Err(AuthConfigError::NoKey)));
        let short = AuthArgs {
            jwt_hs256_secret: Some("short".into()),
            ..base.clone()
        };
        assert!(matches!(
            short.authenticator(),
            Err(AuthConfigError::ShortSecret)
        ));
        let both = AuthArgs {
            jwt_hs256_secret: Some(String::from_utf8(SECRET.to_vec()).unwrap()),
            jwt_public_key_file: Some("/nonexistent".into()),
            ..base.clone()
        };
        assert!(matches!(
            both.authenticator(),
            Err(AuthConfigError::TwoKeys)
        ));
        let no_aud = AuthArgs {
            jwt_hs256_secret: Some(String::from_utf8(SECRET.to_vec()).unwrap()),
            jwt_audience: None,
            ..base.clone()
        };
        assert!(matches!(
            no_aud.authenticator(),
            Err(AuthConfigError::Missing(_))
        ));
        let ok = AuthArgs {
            jwt_hs256_secret: Some(String::from_utf8(SECRET.to_vec()).unwrap()),
            ..base
        };
        assert!(ok.authenticator().is_ok());
        assert!(!format!("{:?}", ok.authenticator().unwrap()).contains("0123456789"));
    }
}
