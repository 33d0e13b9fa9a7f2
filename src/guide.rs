//! Guides for a first service: what to install and in which order, then recipes for the
//! setups people ask about. Each page is documentation only; every Rust example in it is
//! compiled (and most are run) as a test of the crate.
//!
//! - [`getting_started`]: the dependencies (the metrics exporter that pairs with the
//!   crate's `metrics` version, a `tracing` subscriber), the order of setup (the recorder
//!   first), and a first limited route.
//! - [`recipes`]: authentication middleware with [`ExtensionKey`](crate::key::ExtensionKey)
//!   and the layer order it needs (and the `NewError` inference error on the way), one
//!   Redis store for many limiters, a 15-minute login limit.

#[doc = include_str!("../docs/guide/getting_started.md")]
pub mod getting_started {}

#[doc = include_str!("../docs/guide/recipes.md")]
pub mod recipes {}
