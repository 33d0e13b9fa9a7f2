#![doc = include_str!("../README.md")]
//!
//! # The request path
//!
//! A request meets, in this order: the [key extractor](KeyExtractor) (who is calling), the
//! [`Limiter`] (which runs the caller's [policies](Policy) on a [store](Backend)), then
//! either the inner service, whose response gains the `RateLimit-Policy` and `RateLimit`
//! fields, or a refusal: 429 with `Retry-After` and an RFC 9457 problem body, or 503 when
//! the store is down and the route fails closed.
//!
//! The crate is built in three floors, each importing only from those below it:
//!
//! - HTTP: [`RateLimitLayer`], [`RateLimit`], [`ResponseFuture`], key extraction,
//!   headers and responses.
//! - Decision: [`Policy`] and [`Quota`], [`Limiter`], [`Decision`], [`FailurePolicy`].
//! - Store: the [`Backend`] trait, [`InMemoryBackend`], the [`Algorithm`] arithmetic,
//!   [`CallerKey`] and the [`Clock`].

mod algorithm;
mod backend;
mod body;
mod breaker;
mod caller;
mod clock;
mod decision;
mod denial_cache;
mod failure;
mod future;
mod headers;
mod instances;
mod key;
mod layer;
mod limiter;
mod mode;
mod policy;
mod response;
mod service;
mod shed;
mod telemetry;

pub use algorithm::{Algorithm, Evaluation, Limit, LimitOutcome, LimitState};
pub use backend::{
    Backend, CheckFuture, CheckOutcome, CheckResult, InMemoryBackend, InMemoryBackendBuilder,
    StoreError, StoreErrorKind,
};
#[cfg(feature = "redis")]
pub use backend::{InstanceRegistry, InstanceRegistryBuilder, RedisBackend, RedisBackendBuilder};
pub use body::ResponseBody;
pub use breaker::{BreakerConfig, BreakerState};
pub use caller::{Caller, CallerKey, MAX_KEY_BYTES};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, DecisionSource, PolicyReport, RateLimitInfo, UnlimitedReason};
pub use failure::FailurePolicy;
pub use future::ResponseFuture;
pub use headers::HeaderMode;
pub use instances::{InstanceCount, LiveInstances};
pub use key::{
    AsyncFnKey, ClientIp, ExtensionKey, FnKey, ForwardedHeader, GlobalKey, HeaderKey, InvalidCidr,
    KeyExtractor, KeyRejection, KeyResult, MissingKey, TrustedProxies,
};
pub use layer::RateLimitLayer;
pub use limiter::{DecisionFuture, FallbackReason, Limiter, LimiterBuilder};
pub use mode::{Mode, ModeSwitch};
pub use policy::{Policy, Quota};
pub use response::{QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY, TEMPORARY_REDUCED_CAPACITY};
pub use service::RateLimit;
pub use shed::{ConcurrencyShed, ConcurrencyShedLayer, ShedFuture};
