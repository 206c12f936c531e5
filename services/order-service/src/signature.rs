//! Callback and marketplace push signatures: the shared implementation
//! ([`outbox_http::signature`]), re-exported where this service's code and tests look for it.

pub use outbox_http::signature::{CallbackSecret, EmptySecret};
