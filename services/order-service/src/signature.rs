//! Callback and marketplace push signatures: the shared implementation
//! ([`outbox_kit::signature`]), re-exported where this service's code and tests look for it.

pub use outbox_kit::signature::{CallbackSecret, EmptySecret};
