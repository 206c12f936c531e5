//! Secrets read from files (a mounted Kubernetes Secret, a Docker secret, `echo pw > file`), for
//! the Kafka and PostgreSQL passwords alike.

use std::path::Path;

/// Why a secret file gave no secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file cannot be read.
    #[error("cannot read the file")]
    Io(#[from] std::io::Error),
    /// The file is empty (or holds only a newline).
    #[error("the file is empty")]
    Empty,
}

/// Reads a secret from `path`: the whole file less one trailing newline (`\n` or `\r\n`), as
/// `echo secret > file` and Kubernetes Secrets write it.
///
/// # Errors
/// [`SecretFileError`]: unreadable or empty.
pub fn read_secret_file(path: &Path) -> Result<String, SecretFileError> {
    let mut text = std::fs::read_to_string(path)?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(SecretFileError::Empty);
    }
    Ok(text)
}
