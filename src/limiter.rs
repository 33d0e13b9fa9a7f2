//! The limiter: runs a caller's request through its policies on a store.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::algorithm::Limit;
use crate::backend::{Backend, CheckFuture, CheckResult, InMemoryBackend};
use crate::caller::Caller;
use crate::decision::{Decision, RateLimitInfo, UnlimitedReason, whole_seconds};
use crate::failure::FailurePolicy;
use crate::policy::Policy;

/// Decides requests for a set of policies on one store. Cheap to clone; clones share the
/// store and configuration.
///
/// ```
/// use tollgate::{Caller, Limiter, Policy, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(2)))
///     .build();
/// let acme = Caller::new("acme");
/// assert!(limiter.check(&acme).await.is_allowed());
/// assert!(limiter.check(&acme).await.is_allowed());
/// assert!(!limiter.check(&acme).await.is_allowed());
/// # }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    default_limits: Arc<[Limit]>,
    tiers: HashMap<Arc<str>, Arc<[Limit]>>,
    on_store_failure: FailurePolicy,
}

impl Limiter {
    /// Starts configuring a limiter.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// Decides one request of `caller`.
    pub fn check(&self, caller: &Caller) -> DecisionFuture {
        let limits = caller
            .tier()
            .and_then(|tier| self.inner.tiers.get(tier))
            .unwrap_or(&self.inner.default_limits);
        let mut check = self.inner.backend.check(caller.key(), limits);
        if let Some(result) = check.try_take_ready() {
            return DecisionFuture::ready(self.inner.decide(limits, result));
        }
        DecisionFuture {
            state: DecisionState::Pending {
                check,
                inner: self.inner.clone(),
                limits: limits.clone(),
            },
        }
    }

    /// The policies applied to callers without a tier, in order.
    pub fn policies(&self) -> &[Limit] {
        &self.inner.default_limits
    }
}

impl Inner {
    fn decide(&self, limits: &[Limit], result: CheckResult) -> Decision {
        match result {
            Ok(outcome) => {
                let info = RateLimitInfo::from_outcomes(limits, outcome.limits());
                if outcome.admitted() {
                    Decision::Allowed(info)
                } else {
                    Decision::Limited(info)
                }
            }
            Err(_) => match self.on_store_failure {
                FailurePolicy::Open => Decision::Unlimited(UnlimitedReason::StoreFailedOpen),
                FailurePolicy::Closed {
                    status,
                    retry_after,
                } => Decision::Unavailable {
                    status,
                    retry_after_secs: whole_seconds(
                        u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                    ),
                },
            },
        }
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("backend", &self.inner.backend)
            .field("policies", &self.inner.default_limits)
            .field("tiers", &self.inner.tiers)
            .field("on_store_failure", &self.inner.on_store_failure)
            .finish()
    }
}

/// Configures a [`Limiter`].
///
/// ```
/// use tollgate::{FailurePolicy, InMemoryBackend, Limiter, Policy, Quota};
///
/// let limiter = Limiter::builder()
///     .backend(InMemoryBackend::new())
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .policy(Policy::sliding_window("per-day", Quota::per_day(1_000_000)))
///     // Callers on the enterprise plan get more.
///     .tier("enterprise", [
///         Policy::sliding_window("per-second", Quota::per_second(500)),
///         Policy::sliding_window("per-day", Quota::per_day(50_000_000)),
///     ])
///     .on_store_failure(FailurePolicy::Open)
///     .build();
/// assert_eq!(limiter.policies().len(), 2);
/// ```
#[derive(Debug, Default)]
pub struct LimiterBuilder {
    backend: Option<Arc<dyn Backend>>,
    policies: Vec<Limit>,
    tiers: Vec<(Arc<str>, Vec<Limit>)>,
    on_store_failure: FailurePolicy,
}

impl LimiterBuilder {
    /// Keeps counters in `backend` (default: a new [`InMemoryBackend`]).
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.backend = Some(Arc::new(backend));
        self
    }

    /// Adds a policy for callers without a tier. A request is admitted only if every
    /// policy admits it.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy.into());
        self
    }

    /// Gives callers of plan tier `tier` (see [`Caller::with_tier`]) their own policies
    /// instead of the default ones. Callers naming an unknown tier get the defaults.
    pub fn tier(
        mut self,
        tier: impl Into<Arc<str>>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.tiers
            .push((tier.into(), policies.into_iter().map(Limit::from).collect()));
        self
    }

    /// What to do when the store cannot decide (default: fail open).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// Builds the limiter.
    ///
    /// # Panics
    ///
    /// When there is no default policy, a tier has no policy, two policies of one set share
    /// a name, or one name is counted with different algorithms in different tiers (they
    /// would share counters of different shapes).
    pub fn build(self) -> Limiter {
        check_policy_set("the default policies", &self.policies);
        let mut algorithms = HashMap::new();
        let all = self
            .policies
            .iter()
            .chain(self.tiers.iter().flat_map(|(_, limits)| limits.iter()));
        for limit in all {
            let kind = std::mem::discriminant(limit.algorithm());
            let seen = *algorithms.entry(limit.name().to_owned()).or_insert(kind);
            assert!(
                seen == kind,
                "policy {:?} is counted with two different algorithms across tiers",
                limit.name()
            );
        }
        let tiers = self
            .tiers
            .into_iter()
            .map(|(tier, limits)| {
                check_policy_set(&format!("tier {tier:?}"), &limits);
                (tier, limits.into())
            })
            .collect();
        Limiter {
            inner: Arc::new(Inner {
                backend: self
                    .backend
                    .unwrap_or_else(|| Arc::new(InMemoryBackend::new())),
                default_limits: self.policies.into(),
                tiers,
                on_store_failure: self.on_store_failure,
            }),
        }
    }
}

fn check_policy_set(what: &str, limits: &[Limit]) {
    assert!(!limits.is_empty(), "{what} need at least one policy");
    for (i, limit) in limits.iter().enumerate() {
        assert!(
            limits[..i].iter().all(|other| other.name() != limit.name()),
            "{what} name policy {:?} twice",
            limit.name()
        );
    }
}

/// Resolves to the [`Decision`] for one request.
pub struct DecisionFuture {
    state: DecisionState,
}

enum DecisionState {
    Ready(Option<Decision>),
    Pending {
        check: CheckFuture,
        inner: Arc<Inner>,
        limits: Arc<[Limit]>,
    },
}

impl DecisionFuture {
    fn ready(decision: Decision) -> Self {
        Self {
            state: DecisionState::Ready(Some(decision)),
        }
    }
}

impl fmt::Debug for DecisionFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            DecisionState::Ready(decision) => f.debug_tuple("Ready").field(decision).finish(),
            DecisionState::Pending { check, .. } => f.debug_tuple("Pending").field(check).finish(),
        }
    }
}

impl Future for DecisionFuture {
    type Output = Decision;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match &mut self.state {
            DecisionState::Ready(decision) => Poll::Ready(
                decision
                    .take()
                    .expect("DecisionFuture polled after it completed"),
            ),
            DecisionState::Pending {
                check,
                inner,
                limits,
            } => {
                let result = std::task::ready!(Pin::new(check).poll(cx));
                Poll::Ready(inner.decide(limits, result))
            }
        }
    }
}
