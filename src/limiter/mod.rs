//! The decision floor: the limiter that runs the request path below HTTP, knowing no HTTP
//! or Redis type.
//!
//! In request-path order: the [`mode`] (enforce, shadow, off), the [`denial_cache`], the
//! [`breaker`], the store call and its timeout in [`check`], and on failure the
//! [`failure`] policy, with its divisor from [`instances`]. [`decision`] is what comes
//! out; [`telemetry`] counts it; [`policy`] names the quotas going in.

pub(crate) mod breaker;
pub(crate) mod check;
pub(crate) mod decision;
pub(crate) mod denial_cache;
pub(crate) mod failure;
pub(crate) mod fallback;
pub(crate) mod instances;
pub(crate) mod mode;
pub(crate) mod policy;
pub(crate) mod telemetry;
