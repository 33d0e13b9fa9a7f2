//! The decision floor: the limiter that runs the request path below HTTP, knowing no HTTP
//! or Redis type.
//!
//! In request-path order: [`check`] runs the path (the [`mode`], the [`denial_cache`], the
//! [`breaker`] of the caller's part of the store from [`domains`], the store call under its
//! timeout) and resolves a [`future`]; when the store
//! cannot decide, [`fallback`] executes the route's [`failure`] policy, with the divisor
//! of a local share from [`instances`]. [`cost`] refuses requests that cost more than a
//! quota, and [`refund`] gives back what a request that did not count consumed.
//! [`decision`] is what comes out and [`telemetry`] counts it. [`builder`] assembles a
//! limiter from [`limits`], checked into [`policy_set`]s, which a
//! [`limits::LimitsHandle`] can swap while the limiter runs. A hot caller's decisions can
//! be made locally from a [`lease`] of its quota.

pub(crate) mod breaker;
pub(crate) mod builder;
pub(crate) mod check;
pub(crate) mod cost;
pub(crate) mod decision;
pub(crate) mod denial_cache;
pub(crate) mod domains;
pub(crate) mod failure;
pub(crate) mod fallback;
pub(crate) mod instances;
pub(crate) mod lease;
pub(crate) mod limits;
pub(crate) mod mode;
pub(crate) mod policy_set;
pub(crate) mod refund;
pub(crate) mod telemetry;
