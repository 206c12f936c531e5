//! Flags with environment fallbacks, and the fault settings a test can change at run time
//! (`PUT /admin/faults`).

use clap::Parser;
use serde::{Deserialize, Serialize};

/// The marketplace simulator.
#[derive(Debug, Clone, Parser)]
#[command(name = "marketplace-sim", version, about, long_about = None)]
pub struct Config {
    /// Address to listen on (`host:port`).
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8090")]
    pub listen: String,

    /// Shared secret the pushes are signed with (hex HMAC-SHA256 of the body).
    #[arg(long, env = "MARKETPLACE_SECRET", hide_env_values = true)]
    pub secret: String,

    /// Fault settings at start-up.
    #[command(flatten)]
    pub faults: Faults,
}

/// How the platform misbehaves. Every field has a flag, an environment fallback and can be
/// replaced at run time with `PUT /admin/faults`.
#[derive(Debug, Clone, Parser, Serialize, Deserialize, Default)]
pub struct Faults {
    /// Where pushes go (the order service's `/channels/marketplace/push`); unset: nothing is
    /// pushed (changes are only queryable).
    #[arg(long, env = "SIM_PUSH_URL")]
    #[serde(default)]
    pub push_url: Option<String>,

    /// How many times each push is sent with the same `msg_id` (at least once).
    #[arg(long, env = "SIM_PUSH_COPIES", default_value_t = 1)]
    #[serde(default = "one")]
    pub push_copies: u32,

    /// Share of pushes sent once more under a new `msg_id` (0.0–1.0).
    #[arg(long, env = "SIM_NEW_MSG_ID_RATIO", default_value_t = 0.0)]
    #[serde(default)]
    pub new_msg_id_ratio: f64,

    /// Share of pushes never sent (0.0–1.0): only the query API knows those changes.
    #[arg(long, env = "SIM_DROP_RATIO", default_value_t = 0.0)]
    #[serde(default)]
    pub drop_ratio: f64,

    /// Push the snapshots of one refund call newest first.
    #[arg(long, env = "SIM_REFUNDS_OUT_OF_ORDER", default_value_t = false)]
    #[serde(default)]
    pub refunds_out_of_order: bool,

    /// The ship API fails (503) this many times per trade before it answers.
    #[arg(long, env = "SIM_SHIP_FAIL_TIMES", default_value_t = 0)]
    #[serde(default)]
    pub ship_fail_times: u32,

    /// The ship API refuses every call for good (422).
    #[arg(long, env = "SIM_SHIP_REFUSE", default_value_t = false)]
    #[serde(default)]
    pub ship_refuse: bool,

    /// The ship API answers this many milliseconds after it recorded the call.
    #[arg(long, env = "SIM_SHIP_DELAY_MS", default_value_t = 0)]
    #[serde(default)]
    pub ship_delay_ms: u64,
}

fn one() -> u32 {
    1
}
