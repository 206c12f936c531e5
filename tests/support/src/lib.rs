#![doc = include_str!("../README.md")]

pub mod db;
pub mod metrics;
pub mod process;
pub mod relay;
