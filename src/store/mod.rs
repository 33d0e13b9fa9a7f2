//! The store floor: where counters live and how they count, knowing nothing above it.
//!
//! The [`backend`] trait, the counting arithmetic in [`algorithm`], the caller's key, the
//! clock, the in-process [`memory`] store, and with the `redis` feature the Redis store
//! with its Lua and its instance registry.

pub(crate) mod algorithm;
pub(crate) mod backend;
pub(crate) mod caller;
pub(crate) mod clock;
pub(crate) mod instances;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
