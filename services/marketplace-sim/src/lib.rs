#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! A second-hand marketplace, simulated: it behaves like the platform the order service's
//! marketplace channel talks to, with the platform's faults on demand.
//!
//! - [`platform`]: trades and refunds, the query and ship APIs' answers, and the call log; its
//!   `push` part sends each change per the push plan (copies, new `msg_id`s, drops, refund
//!   snapshots out of order);
//! - [`http`]: the routes;
//! - [`config`]: flags, environment and run-time fault settings.

pub mod config;
pub mod http;
pub mod platform;

pub use http::router;
pub use platform::Platform;
