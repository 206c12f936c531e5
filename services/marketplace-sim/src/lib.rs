//! A second-hand marketplace, simulated: it behaves like the platform the order service's
//! marketplace channel talks to, with the platform's faults on demand.
//!
//! - [`platform`]: trades and refunds, the push plan (copies, new `msg_id`s, drops,
//!   out-of-order refund snapshots), the query and ship APIs' answers, and the call log;
//! - [`http`]: the routes;
//! - [`config`]: flags, environment and run-time fault settings.

pub mod config;
pub mod http;
pub mod platform;

pub use http::router;
pub use platform::Platform;
