//! The start-up connection check. librdkafka retries a refused login or an untrusted
//! certificate forever, like a broker that is down, so a process with a wrong password would
//! sit there publishing nothing. [`check_connection`] asks the brokers for metadata once, with
//! the process's own settings, and sorts what happened: answered, refused (a setting is wrong:
//! stop and say which), or unreachable (the broker may come later: carry on).
//!
//! Files: `check` (the one-shot check, [`check_connection`]), `start` (what a long-running
//! process makes of it at start-up: [`check_at_start`] stops on a refusal and carries on
//! without a broker, [`StartCheck::stop_on_refusal`] goes on checking in the background until
//! a broker answers, [`RefusalWatch`] keeps the refusal it stopped the process for).

mod check;
mod start;

pub use check::{check_connection, check_connection_blocking, refusal_kind, ProbeError};
pub use start::{check_at_start, RefusalWatch, StartCheck, START_CHECK_TIMEOUT};
