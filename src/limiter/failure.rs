//! What a limiter does when its store cannot decide: data the limiter reads, chosen per
//! route.

use crate::limiter::instances::InstanceCount;

/// The choice made for a route when the store is slow or down.
///
/// | policy | during an outage | for |
/// |---|---|---|
/// | [`open`](Self::open) | everything passes, uncounted | routes where availability beats the limit |
/// | [`closed`](Self::closed) | 503 + Retry-After (never 500) | credentials, one-time codes, password-reset mails, hard spend limits |
/// | [`local_share`](Self::local_share) | each instance enforces the limit divided by the live instance count | most API routes: fairness between customers |
/// | [`fail_static`](Self::fail_static) | cached refusals keep refusing until they expire, the rest passes | long quotas (per day) |
/// | [`static_then`](Self::static_then) | cached refusals first, then another policy for the rest | long quotas with a local share |
///
/// ```
/// use tollgate::{FailurePolicy, InstanceCount};
///
/// let orders = FailurePolicy::local_share(InstanceCount::fixed(4));
/// let login = FailurePolicy::closed();
/// let daily = FailurePolicy::static_then(FailurePolicy::local_share(InstanceCount::fixed(4)));
/// # drop((orders, login, daily));
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through uncounted.
    #[default]
    Open,
    /// Refuse (503 by default, never 500; see
    /// [`RateLimitLayer::unavailable_status`](crate::RateLimitLayer::unavailable_status))
    /// with a Retry-After of the breaker's remaining open time (at least 1 s).
    Closed,
    /// Enforce every policy's quota divided by the live instance count, with an in-process
    /// counter of the same algorithm; the headers advertise the share.
    LocalShare(InstanceCount),
    /// Keep refusing callers whose refusal is cached until it expires; let the rest pass.
    Static,
    /// Cached refusals first, then the inner policy for everybody else.
    StaticThen(Box<FailurePolicy>),
}

impl FailurePolicy {
    /// Fail open: allow.
    pub fn open() -> Self {
        FailurePolicy::Open
    }

    /// Fail closed: refuse with 503 and Retry-After. The layer answers with the status
    /// of [`RateLimitLayer::unavailable_status`](crate::RateLimitLayer::unavailable_status)
    /// (503 unless set).
    pub fn closed() -> Self {
        FailurePolicy::Closed
    }

    /// Enforce a local share of the limit: quota / `instances`. The shares together never
    /// exceed the limit, whatever the quota and the count; a quota smaller than the count
    /// stretches each share's window (see [`Algorithm::divided_by`](crate::store::Algorithm::divided_by)).
    pub fn local_share(instances: InstanceCount) -> Self {
        FailurePolicy::LocalShare(instances)
    }

    /// Fail static: cached refusals keep refusing, everything else passes.
    pub fn fail_static() -> Self {
        FailurePolicy::Static
    }

    /// Cached refusals first, then `rest` for everybody else.
    pub fn static_then(rest: FailurePolicy) -> Self {
        FailurePolicy::StaticThen(Box::new(rest))
    }

    /// A short, stable name for logs and metric labels.
    ///
    /// ```
    /// assert_eq!(tollgate::FailurePolicy::closed().as_str(), "closed");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::LocalShare(_) => "local_share",
            FailurePolicy::Static => "static",
            FailurePolicy::StaticThen(rest) => match **rest {
                FailurePolicy::Open => "static_then_open",
                FailurePolicy::Closed => "static_then_closed",
                FailurePolicy::LocalShare(_) => "static_then_local_share",
                _ => "static_then_static",
            },
        }
    }
}
