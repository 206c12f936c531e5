//! `mint-token`: prints a signed bearer token for the services' APIs, for the demo, tests and
//! local use. It signs with the same settings the services verify with (`JWT_HS256_SECRET`,
//! `JWT_ISSUER`, `JWT_AUDIENCE`), or with a private key for RS256 / ES256 deployments. In
//! production tokens come from the identity provider, not from this tool.
//!
//! ```text
//! mint-token --sub alice                    # a customer
//! mint-token --sub ops-1 --role operator    # an operator
//! ```

use anyhow::{bail, Context};
use clap::Parser;
use outbox_http::auth::{Minter, MIN_SECRET_LEN};

/// Prints a signed bearer token (JWT) for the order, WMS and stock APIs.
#[derive(Debug, Parser)]
#[command(name = "mint-token", version, about, long_about = None)]
struct Args {
    /// The subject (`sub`): a customer's user id, or an operator's name.
    #[arg(long)]
    sub: String,

    /// A role to grant (`operator`); repeat for several.
    #[arg(long = "role")]
    roles: Vec<String>,

    /// Lifetime in seconds (negative: an already expired token, for tests).
    #[arg(long, default_value_t = 3_600, allow_hyphen_values = true)]
    ttl_secs: i64,

    /// HS256 secret (what the services have as JWT_HS256_SECRET).
    #[arg(long, env = "JWT_HS256_SECRET", hide_env_values = true)]
    jwt_hs256_secret: Option<String>,

    /// PEM private key (RSA: RS256, EC P-256 PKCS#8: ES256) instead of the HS256 secret.
    #[arg(long, env = "JWT_PRIVATE_KEY_FILE")]
    jwt_private_key_file: Option<std::path::PathBuf>,

    /// `iss` of the token.
    #[arg(long, env = "JWT_ISSUER")]
    jwt_issuer: String,

    /// `aud` of the token.
    #[arg(long, env = "JWT_AUDIENCE")]
    jwt_audience: String,

    /// The development switch of the weak-secret check (`JWT_HS256_SECRET`).
    #[command(flatten)]
    secrets: outbox_process::secrets::SecretArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.secrets
        .check(&[outbox_process::secrets::Secret::signing_key(
            "JWT_HS256_SECRET (--jwt-hs256-secret)",
            args.jwt_hs256_secret.as_deref(),
        )])?;
    let (iss, aud) = (args.jwt_issuer.as_str(), args.jwt_audience.as_str());
    let minter = match (&args.jwt_hs256_secret, &args.jwt_private_key_file) {
        (Some(secret), None) => {
            if secret.len() < MIN_SECRET_LEN {
                bail!("JWT_HS256_SECRET must be at least {MIN_SECRET_LEN} bytes");
            }
            Minter::hs256(secret.as_bytes(), iss, aud)
        }
        (None, Some(path)) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Minter::from_private_pem(&pem, iss, aud)
                .with_context(|| format!("JWT_PRIVATE_KEY_FILE {}", path.display()))?
        }
        _ => bail!("set exactly one of JWT_HS256_SECRET and JWT_PRIVATE_KEY_FILE"),
    };
    let roles: Vec<&str> = args.roles.iter().map(String::as_str).collect();
    println!("{}", minter.token(&args.sub, &roles, args.ttl_secs));
    Ok(())
}
