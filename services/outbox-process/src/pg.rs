//! PostgreSQL connection options, built one way for every binary: the libpq-style URL
//! (`sslmode` up to `verify-full`, `sslrootcert`, `sslcert` / `sslkey`; SCRAM passwords need
//! nothing more), plus the password from a file (`DATABASE_PASSWORD_FILE`) so that it need not
//! be written into the URL.
//!
//! The files a URL names are checked at start-up, naming the URL parameter: sqlx would only
//! find out at the first connection, which a lazily connecting process makes later, and then
//! it reports a bare "No such file or directory".

use std::path::{Path, PathBuf};

use sqlx::postgres::PgConnectOptions;

use crate::secret_file::{read_secret_file, SecretFileError};

/// The environment variable naming a file that holds the database password.
pub const PASSWORD_FILE_ENV: &str = "DATABASE_PASSWORD_FILE";

/// Why a database URL and its companions cannot be used. Never shows the password.
#[derive(Debug, thiserror::Error)]
pub enum PgConfigError {
    /// The URL does not parse (sqlx's message; the URL itself is not repeated).
    #[error("invalid database URL")]
    Url(#[source] sqlx::Error),
    /// A password in the URL and a password file: which one is meant is unclear.
    #[error("the database URL has a password and {PASSWORD_FILE_ENV} is set: use one")]
    PasswordTwice,
    /// A file named by the URL or by `DATABASE_PASSWORD_FILE` cannot be read.
    #[error("{setting}: cannot read {path}")]
    File {
        /// The URL parameter or environment variable.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The password file is empty.
    #[error("{PASSWORD_FILE_ENV}: {0} is empty")]
    EmptyPasswordFile(PathBuf),
    /// `sslrootcert`, `sslcert` or `sslkey` with an `sslmode` that does not use TLS.
    #[error("{param} is set but sslmode={mode} does not use TLS (use sslmode=verify-full)")]
    TlsOff {
        /// The URL parameter.
        param: &'static str,
        /// The mode in the URL.
        mode: String,
    },
}

impl From<PgConfigError> for sqlx::Error {
    fn from(e: PgConfigError) -> Self {
        match e {
            PgConfigError::Url(e) => e,
            other => sqlx::Error::Configuration(Box::new(other)),
        }
    }
}

/// [`connect_options_with`] with the password file named by `DATABASE_PASSWORD_FILE`, if set.
///
/// # Errors
/// See [`connect_options_with`].
pub fn connect_options(database_url: &str) -> Result<PgConnectOptions, PgConfigError> {
    let file = std::env::var_os(PASSWORD_FILE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    connect_options_with(database_url, file.as_deref())
}

/// The connection options of `database_url`, with the password read from `password_file`
/// when given (one trailing newline dropped).
///
/// # Errors
/// [`PgConfigError`]: the URL does not parse; a password both in the URL and in a file; a file
/// the URL names (`sslrootcert`, `sslcert`, `sslkey`) or the password file cannot be read;
/// certificate files with an `sslmode` that does not use TLS.
pub fn connect_options_with(
    database_url: &str,
    password_file: Option<&Path>,
) -> Result<PgConnectOptions, PgConfigError> {
    let mut options: PgConnectOptions = database_url.parse().map_err(PgConfigError::Url)?;
    let url = url::Url::parse(database_url)
        .map_err(|e| PgConfigError::Url(sqlx::Error::Configuration(Box::new(e))))?;
    let mode = url
        .query_pairs()
        .find(|(k, _)| k == "sslmode" || k == "ssl-mode")
        .map(|(_, v)| v.to_ascii_lowercase());
    for (key, value) in url.query_pairs() {
        let param = match key.as_ref() {
            "sslrootcert" | "ssl-root-cert" | "ssl-ca" => "sslrootcert",
            "sslcert" | "ssl-cert" => "sslcert",
            "sslkey" | "ssl-key" => "sslkey",
            _ => continue,
        };
        if let Some(mode) = mode.as_deref().filter(|m| *m == "disable") {
            return Err(PgConfigError::TlsOff {
                param,
                mode: mode.to_owned(),
            });
        }
        let path = Path::new(value.as_ref());
        std::fs::File::open(path).map_err(|source| PgConfigError::File {
            setting: param,
            path: path.to_owned(),
            source,
        })?;
    }
    if let Some(file) = password_file {
        if url.password().is_some() {
            return Err(PgConfigError::PasswordTwice);
        }
        let password = read_secret_file(file).map_err(|e| match e {
            SecretFileError::Io(source) => PgConfigError::File {
                setting: PASSWORD_FILE_ENV,
                path: file.to_owned(),
                source,
            },
            SecretFileError::Empty => PgConfigError::EmptyPasswordFile(file.to_owned()),
        })?;
        options = options.password(&password);
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "outbox-kit-pg-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn a_plain_url_is_taken_as_it_is() {
        let o = connect_options_with("postgres://app@db.example:5433/orders", None).unwrap();
        assert_eq!(o.get_host(), "db.example");
        assert_eq!(o.get_port(), 5433);
        assert_eq!(o.get_username(), "app");
    }

    #[test]
    fn verify_full_with_a_ca_that_exists() {
        let ca = temp_file("ca.pem", "x");
        let url = format!(
            "postgres://app@db.example/orders?sslmode=verify-full&sslrootcert={}",
            ca.display()
        );
        let o = connect_options_with(&url, None).unwrap();
        assert!(matches!(
            o.get_ssl_mode(),
            sqlx::postgres::PgSslMode::VerifyFull
        ));
    }

    #[test]
    fn a_missing_certificate_file_is_named_at_start_up() {
        let e = connect_options_with(
            "postgres://app@db/orders?sslmode=verify-full&sslrootcert=/nonexistent/root.crt",
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("sslrootcert"), "{e}");
        assert!(e.to_string().contains("/nonexistent/root.crt"), "{e}");
        let key = temp_file("k.pem", "x");
        let url = format!(
            "postgres://app@db/orders?sslmode=disable&sslkey={}",
            key.display()
        );
        let e = connect_options_with(&url, None).unwrap_err();
        assert!(e.to_string().contains("sslkey"), "{e}");
    }

    #[test]
    fn the_password_comes_from_a_file_but_not_twice() {
        let pw = temp_file("pw", "Sup3r-s3cret\n");
        connect_options_with("postgres://app@db/orders", Some(&pw)).unwrap();
        let e = connect_options_with("postgres://app:inline-pw@db/orders", Some(&pw)).unwrap_err();
        assert!(e.to_string().contains(PASSWORD_FILE_ENV), "{e}");
        assert!(!e.to_string().contains("inline-pw"), "{e}");
        let empty = temp_file("empty", "");
        let e = connect_options_with("postgres://app@db/orders", Some(&empty)).unwrap_err();
        assert!(matches!(e, PgConfigError::EmptyPasswordFile(_)), "{e}");
        let e = connect_options_with("postgres://app@db/orders", Some(Path::new("/nonexistent")))
            .unwrap_err();
        assert!(e.to_string().contains(PASSWORD_FILE_ENV), "{e}");
    }

    #[test]
    fn a_bad_url_is_an_error_that_converts_into_sqlx() {
        let e = connect_options_with("not a url", None).unwrap_err();
        let _: sqlx::Error = e.into();
    }
}
