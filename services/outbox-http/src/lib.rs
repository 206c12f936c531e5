#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! - [`service`]: HTTP serving with limits and a drain deadline, `/healthz` / `/metrics`, the
//!   JSON error envelope, extractors, OpenAPI.
//! - [`auth`]: bearer-token (JWT) verification, the `Customer` / `Operator` extractors and their
//!   401/403 answers, token minting for tests and tools.
//! - [`validate`]: the one validator of client text and integers, and the OpenAPI schemas built
//!   from the same rules.
//! - [`signature`]: HMAC-SHA256 signatures of pushed request bodies.

pub mod auth;
pub mod service;
pub mod signature;
pub mod validate;

/// For [`text_newtype!`]'s expansion in other crates.
#[doc(hidden)]
pub use utoipa as __utoipa;
