//! For backend authors: where counters live and how they count.
//!
//! A store decides one request against all of a caller's policies at once through the
//! [`Backend`] trait. [`evaluate`] runs the all-or-nothing decision over the per-policy
//! arithmetic of [`Algorithm`], so a backend only keeps [`PolicyState`]s under one lock or
//! transaction, keyed by the caller's [`CallerKey`] and each policy's
//! [`counter`](crate::Policy::counter). The in-process [`InMemoryBackend`](crate::InMemoryBackend) and, with the
//! `redis` feature, `RedisBackend` (with its Lua and its `InstanceRegistry`) are built
//! this way.
//!
//! This floor knows nothing above it: no limiter, no HTTP type.

pub(crate) mod algorithm;
pub(crate) mod backend;
pub(crate) mod caller;
pub(crate) mod clock;
pub(crate) mod digest;
pub(crate) mod domain;
pub(crate) mod evaluate;
pub(crate) mod future;
pub(crate) mod inline_bytes;
pub(crate) mod instances;
pub(crate) mod invalid_policy;
pub(crate) mod lease;
pub(crate) mod lockout;
pub(crate) mod memory;
pub(crate) mod policy;
pub(crate) mod random;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod slots;

pub use algorithm::{AdmissionLog, Algorithm, Evaluation, PolicyOutcome, PolicyState};
pub use backend::{Backend, CheckOutcome, LeaseGrant, Refund, StoreError, StoreErrorKind};
pub use caller::CallerKey;
pub use clock::{Clock, ManualClock, SystemClock};
pub use domain::FailureDomain;
pub use evaluate::{Evaluated, evaluate};
pub use instances::LiveInstances;
pub use invalid_policy::InvalidPolicy;
pub use memory::InMemoryBackendBuilder;
#[cfg(feature = "redis")]
pub use redis::backend::RedisBackendBuilder;
#[cfg(feature = "redis")]
pub use redis::registry::{InstanceRegistryBuilder, RegistryError};
pub use slots::SlotStore;
