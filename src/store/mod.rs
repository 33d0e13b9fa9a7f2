//! For backend authors: where counters live and how they count.
//!
//! A store decides one request against all of a caller's policies at once through the
//! [`Backend`] trait. [`PolicyState::evaluate`] runs the all-or-nothing decision over the
//! per-policy arithmetic of [`Algorithm`], so a backend only keeps [`PolicyState`]s under
//! one lock or transaction, keyed by the caller's [`CallerKey`] and each policy's
//! [`counter`](crate::Policy::counter). The in-process [`InMemoryBackend`](crate::InMemoryBackend) and, with the
//! `redis` feature, `RedisBackend` (with its Lua and its `InstanceRegistry`) are built
//! this way.
//!
//! What a custom [`Backend`] uses (tests/it/custom_backend.rs is one):
//!
//! - the trait and what it answers: [`Backend`], [`CheckOutcome`] of [`PolicyOutcome`]s,
//!   [`LeaseGrant`], [`StoreError`] (a timeout, an unavailable or unconnected store, or
//!   another failure), [`FailureDomain`], and the [`StoreFuture`](crate::future::StoreFuture)
//!   that carries them;
//! - what it is asked: the [`CallerKey`], the [`Policy`](crate::Policy)s, a [`Refund`];
//! - the arithmetic, so that it decides as the crate's stores do:
//!   [`PolicyState::evaluate`] over the [`PolicyState`]s it keeps, and
//!   [`Algorithm::refund`] to give units back; the time from a [`Clock`] (the system's, or
//!   a [`ManualClock`] in tests).
//!
//! A backend that leases finds the grant with [`PolicyState::evaluate`] too: a cost of 0
//! consumes nothing and reports each policy's `remaining`; the smallest of them, up to the
//! units wanted, is the grant, which it then counts as one request of that cost. A backend
//! that keeps states out of process stores each [`PolicyState`] as its
//! [`to_bytes`](PolicyState::to_bytes). The builders belong to the crate's own stores.
//!
//! This floor knows nothing above it: no limiter, no HTTP type. It holds
//! [`BuildError`](crate::BuildError), the crate's one configuration error, which the policy
//! and registry constructors here return and the floors above return too.

pub(crate) mod algorithm;

pub(crate) mod backend;
pub(crate) mod build_error;
pub(crate) mod caller;
pub(crate) mod clock;
pub(crate) mod digest;
pub(crate) mod domain;
pub(crate) mod evaluate;
pub(crate) mod future;
pub(crate) mod held_slot;
pub(crate) mod inline_bytes;
pub(crate) mod lease;
pub(crate) mod lockout;
pub(crate) mod memory;
pub(crate) mod policy;
pub(crate) mod random;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod slot_release;
pub(crate) mod slots;
pub(crate) mod state;

pub use algorithm::{Algorithm, PolicyOutcome};
pub use backend::{Backend, CheckOutcome, LeaseGrant, Refund, StoreError};
pub use caller::CallerKey;
pub use clock::{Clock, ManualClock};
pub use domain::FailureDomain;
#[cfg(feature = "redis")]
pub use redis::backend::RedisBackendBuilder;
#[cfg(feature = "redis")]
pub use redis::two_tier::{TwoTierBackend, TwoTierBuilder};
pub use slots::{Slot, SlotStore};
pub use state::PolicyState;
