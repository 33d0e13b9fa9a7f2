//! Helpers shared by the integration tests. Each test file uses a part of them.
#![allow(dead_code, unreachable_pub)]

pub mod counting;
pub mod http;
pub mod proxy;
pub mod rates;
pub mod recorder;
pub mod redis;
