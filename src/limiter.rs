//! The limiter: the request path of DESIGN.md section 2, below HTTP.
//!
//! denial cache -> breaker -> store under a timeout -> (on failure) the failure policy.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::algorithm::Limit;
use crate::backend::{Backend, CheckResult, InMemoryBackend, StoreError, StoreErrorKind};
use crate::breaker::{
    Admission, Breaker, BreakerConfig, BreakerState, Jitter, Permit, default_jitter,
};
use crate::caller::Caller;
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, DecisionSource, RateLimitInfo, UnlimitedReason, whole_seconds};
use crate::denial_cache::DenialCache;
use crate::failure::FailurePolicy;
use crate::mode::{Mode, ModeSwitch};
use crate::policy::Policy;
use crate::telemetry::LimiterMetrics;

/// A policy set, a divisor, and the set divided by it.
type Share = (Arc<[Limit]>, u64, Arc<[Limit]>);

const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(20);
const DEFAULT_DENIAL_CACHE_CAPACITY: usize = 100_000;

/// Why a decision fell back to the failure policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FallbackReason {
    /// The store did not answer within the store timeout.
    Timeout,
    /// The store refused or dropped the connection.
    Refused,
    /// The store answered with an error.
    OtherError,
    /// The breaker is open: the store was not asked.
    BreakerOpen,
}

impl FallbackReason {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            FallbackReason::Timeout => "timeout",
            FallbackReason::Refused => "refused",
            FallbackReason::OtherError => "other_error",
            FallbackReason::BreakerOpen => "breaker_open",
        }
    }

    fn of(error: &StoreError) -> Self {
        match error.kind() {
            StoreErrorKind::Timeout => FallbackReason::Timeout,
            StoreErrorKind::Unavailable => FallbackReason::Refused,
            _ => FallbackReason::OtherError,
        }
    }
}

/// Decides requests for a set of policies on one store. Cheap to clone; clones share the
/// store, the breaker, the denial cache and the configuration.
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
    name: Arc<str>,
    backend: Arc<dyn Backend>,
    remote: bool,
    default_limits: Arc<[Limit]>,
    tiers: HashMap<Arc<str>, Arc<[Limit]>>,
    on_store_failure: FailurePolicy,
    store_timeout: Duration,
    mode: ModeSwitch,
    clock: Arc<dyn Clock>,
    metrics: LimiterMetrics,
    breaker: Breaker,
    denials: Option<DenialCache>,
    /// Counters of the local share, kept apart from the store's.
    local: InMemoryBackend,
    /// Divided policy sets by (original set, divisor), so a share costs no allocation per
    /// request.
    shares: Mutex<Vec<Share>>,
}

impl Limiter {
    /// Starts configuring a limiter.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// Decides one request of `caller`.
    pub fn check(&self, caller: &Caller) -> DecisionFuture {
        let inner = &self.inner;
        let mode = inner.mode.get();
        if mode == Mode::Off {
            return DecisionFuture::ready(Decision::Unlimited(UnlimitedReason::Off));
        }
        let limits = inner.limits_for(caller);
        if !inner.remote {
            // An in-process store cannot be down: no breaker, timeout or denial cache.
            let mut check = inner.backend.check(caller.key(), limits);
            if let Some(result) = check.try_take_ready() {
                return DecisionFuture::ready(
                    inner.conclude(inner.decided(caller, limits, result), mode),
                );
            }
        }
        let now = inner.clock.now_millis();
        if let Some(denials) = &inner.denials
            && let Some(info) = denials.get(caller.key(), now)
        {
            inner.metrics.denial_cache_hit();
            return DecisionFuture::ready(inner.conclude(Decision::Limited(info), mode));
        }
        let permit = match inner.breaker.admit() {
            Admission::Call(permit) => permit,
            Admission::Reject => {
                let decision = inner.fall_back(caller, limits, FallbackReason::BreakerOpen);
                return DecisionFuture::ready(inner.conclude(decision, mode));
            }
        };
        let started = Instant::now();
        let mut check = inner.backend.check(caller.key(), limits);
        if let Some(result) = check.try_take_ready() {
            inner.metrics.store_latency(started.elapsed());
            let decision = inner.finish(caller, limits, result, permit);
            return DecisionFuture::ready(inner.conclude(decision, mode));
        }
        let inner = self.inner.clone();
        let caller = caller.clone();
        let limits = limits.clone();
        DecisionFuture::boxed(async move {
            let result = match tokio::time::timeout(inner.store_timeout, check).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!(
                        "no answer within the store timeout of {:?}",
                        inner.store_timeout
                    ),
                )),
            };
            inner.metrics.store_latency(started.elapsed());
            let decision = inner.finish(&caller, &limits, result, permit);
            inner.conclude(decision, mode)
        })
    }

    /// The switch that moves this limiter between enforce, shadow and off.
    pub fn mode_switch(&self) -> &ModeSwitch {
        &self.inner.mode
    }

    /// The policies applied to callers without a tier, in order.
    pub fn policies(&self) -> &[Limit] {
        &self.inner.default_limits
    }

    /// The limiter's name, used in metric labels and logs.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Where the circuit breaker stands.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }
}

impl Inner {
    /// Counts the decision, and in shadow mode lets it through whatever it says.
    fn conclude(&self, decision: Decision, mode: Mode) -> Decision {
        let decision = match mode {
            Mode::Shadow => Decision::Shadowed(Box::new(decision)),
            _ => decision,
        };
        self.metrics.decision(&decision);
        if let Decision::Limited(info) = &decision {
            tracing::debug!(
                layer = %self.name,
                policy = info.violated().next().map(|p| p.name()).unwrap_or_default(),
                retry_after_secs = info.retry_after_secs(),
                "request refused"
            );
        }
        decision
    }

    fn limits_for(&self, caller: &Caller) -> &Arc<[Limit]> {
        caller
            .tier()
            .and_then(|tier| self.tiers.get(tier))
            .unwrap_or(&self.default_limits)
    }

    /// A store answered (or failed): tell the breaker, cache a refusal, or fall back.
    fn finish(
        &self,
        caller: &Caller,
        limits: &Arc<[Limit]>,
        result: CheckResult,
        permit: Permit,
    ) -> Decision {
        match result {
            Ok(outcome) => {
                permit.success();
                self.decided(caller, limits, Ok(outcome))
            }
            Err(error) => {
                permit.failure();
                tracing::debug!(layer = %self.name, %error, "store call failed");
                self.fall_back(caller, limits, FallbackReason::of(&error))
            }
        }
    }

    fn decided(&self, caller: &Caller, limits: &Arc<[Limit]>, result: CheckResult) -> Decision {
        match result {
            Ok(outcome) => {
                let info =
                    RateLimitInfo::from_outcomes(limits, outcome.limits(), DecisionSource::Store);
                if let Some(denials) = &self.denials {
                    // A refusal holds until its retry time; so does the refusal that an
                    // admission leaving a policy at r=0 announces for the next request.
                    // Other instances can only make the caller's state stricter in the
                    // meantime, so a cached refusal never refuses what the store would admit.
                    let refusal = if outcome.admitted() {
                        info.next_refusal()
                    } else {
                        Some(info.clone())
                    };
                    if let Some(refusal) = refusal {
                        let retry_ms = refusal.retry_after_ms();
                        denials.insert(caller.key(), &refusal, self.clock.now_millis(), retry_ms);
                    }
                }
                if outcome.admitted() {
                    Decision::Allowed(info)
                } else {
                    Decision::Limited(info)
                }
            }
            // Only an in-process store's answer comes here unguarded; it does not fail, but
            // if a custom one does, it gets the failure policy too.
            Err(error) => self.fall_back(caller, limits, FallbackReason::of(&error)),
        }
    }

    fn fall_back(
        &self,
        caller: &Caller,
        limits: &Arc<[Limit]>,
        reason: FallbackReason,
    ) -> Decision {
        self.metrics.fallback(reason);
        self.apply(&self.on_store_failure, caller, limits)
    }

    fn apply(&self, policy: &FailurePolicy, caller: &Caller, limits: &Arc<[Limit]>) -> Decision {
        match policy {
            FailurePolicy::Open => Decision::Unlimited(UnlimitedReason::StoreFailedOpen),
            FailurePolicy::Closed { status } => Decision::Unavailable {
                status: *status,
                retry_after_secs: whole_seconds(self.breaker.open_for_ms()),
            },
            FailurePolicy::LocalShare(instances) => {
                let share = self.share(limits, instances.get());
                let mut check = self.local.check(caller.key(), &share);
                match check.try_take_ready() {
                    Some(Ok(outcome)) => {
                        let info = RateLimitInfo::from_outcomes(
                            &share,
                            outcome.limits(),
                            DecisionSource::LocalShare,
                        );
                        if outcome.admitted() {
                            Decision::Allowed(info)
                        } else {
                            Decision::Limited(info)
                        }
                    }
                    // The in-process store always answers at once.
                    _ => Decision::Unlimited(UnlimitedReason::StoreFailedOpen),
                }
            }
            FailurePolicy::Static => self
                .cached_refusal(caller)
                .unwrap_or(Decision::Unlimited(UnlimitedReason::StoreFailedOpen)),
            FailurePolicy::StaticThen(rest) => self
                .cached_refusal(caller)
                .unwrap_or_else(|| self.apply(rest, caller, limits)),
        }
    }

    fn cached_refusal(&self, caller: &Caller) -> Option<Decision> {
        let denials = self.denials.as_ref()?;
        denials
            .get(caller.key(), self.clock.now_millis())
            .map(Decision::Limited)
    }

    fn share(&self, limits: &Arc<[Limit]>, divisor: u64) -> Arc<[Limit]> {
        let mut shares = self
            .shares
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, _, share)) = shares
            .iter()
            .find(|(original, n, _)| Arc::ptr_eq(original, limits) && *n == divisor)
        {
            return share.clone();
        }
        let share: Arc<[Limit]> = limits
            .iter()
            .map(|limit| limit.with_algorithm(limit.algorithm().divided_by(divisor)))
            .collect();
        // A handful of sets times the divisors seen; keep the newest few.
        if shares.len() >= 64 {
            shares.remove(0);
        }
        shares.push((limits.clone(), divisor, share.clone()));
        share
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.inner.name)
            .field("backend", &self.inner.backend)
            .field("policies", &self.inner.default_limits)
            .field("tiers", &self.inner.tiers)
            .field("on_store_failure", &self.inner.on_store_failure)
            .field("store_timeout", &self.inner.store_timeout)
            .field("breaker", &self.inner.breaker)
            .finish_non_exhaustive()
    }
}

/// Configures a [`Limiter`].
///
/// ```
/// use std::time::{Duration, Instant};
/// use tollgate::{BreakerConfig, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota};
///
/// let limiter = Limiter::builder()
///     .name("orders")
///     .backend(InMemoryBackend::new())
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .policy(Policy::sliding_window("per-day", Quota::per_day(1_000_000)))
///     // Callers on the enterprise plan get more.
///     .tier("enterprise", [
///         Policy::sliding_window("per-second", Quota::per_second(500)),
///         Policy::sliding_window("per-day", Quota::per_day(50_000_000)),
///     ])
///     .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(4)))
///     .store_timeout(Duration::from_millis(20))
///     .breaker(BreakerConfig::default().failure_threshold(5))
///     .build();
/// assert_eq!(limiter.policies().len(), 2);
/// ```
pub struct LimiterBuilder {
    name: Arc<str>,
    backend: Option<Arc<dyn Backend>>,
    policies: Vec<Limit>,
    tiers: Vec<(Arc<str>, Vec<Limit>)>,
    on_store_failure: FailurePolicy,
    store_timeout: Duration,
    breaker: BreakerConfig,
    jitter: Option<Jitter>,
    denial_cache: Option<usize>,
    clock: Arc<dyn Clock>,
    mode: ModeSwitch,
}

impl Default for LimiterBuilder {
    fn default() -> Self {
        Self {
            name: "default".into(),
            backend: None,
            policies: Vec::new(),
            tiers: Vec::new(),
            on_store_failure: FailurePolicy::default(),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            breaker: BreakerConfig::default(),
            jitter: None,
            denial_cache: Some(DEFAULT_DENIAL_CACHE_CAPACITY),
            clock: Arc::new(SystemClock),
            mode: ModeSwitch::default(),
        }
    }
}

impl fmt::Debug for LimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("policies", &self.policies)
            .field("on_store_failure", &self.on_store_failure)
            .finish_non_exhaustive()
    }
}

impl LimiterBuilder {
    /// Names the limiter in metric labels and logs (default `"default"`). Name each layer.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

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

    /// How long a decision may wait for the store before it falls back (default 20 ms).
    /// Set it a little above the store's p99.9 latency as measured from this service.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// Configures the circuit breaker.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// Replaces the breaker's jitter source (numbers in `[0, 1)`), for tests.
    pub fn breaker_jitter(mut self, jitter: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.jitter = Some(Arc::new(jitter));
        self
    }

    /// Caps the denial cache at `capacity` callers (default 100,000), or turns it off with
    /// 0. Fail static needs it.
    pub fn denial_cache(mut self, capacity: usize) -> Self {
        self.denial_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// Reads time from `clock` (breaker, denial cache, local share), such as a
    /// [`ManualClock`](crate::ManualClock) in tests. A Redis store keeps its own clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Starts in the mode of `switch`, and follows it when it is switched (default: a
    /// switch of its own, in [`Mode::Enforce`]). Share one switch between limiters to
    /// switch them together.
    pub fn mode(mut self, switch: ModeSwitch) -> Self {
        self.mode = switch;
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
        let metrics = LimiterMetrics::new(
            &self.name,
            self.policies
                .iter()
                .chain(self.tiers.iter().flat_map(|(_, limits)| limits.iter()))
                .map(Limit::name_arc),
            self.on_store_failure.as_str(),
        );
        let tiers = self
            .tiers
            .into_iter()
            .map(|(tier, limits)| {
                check_policy_set(&format!("tier {tier:?}"), &limits);
                (tier, limits.into())
            })
            .collect();
        let backend = self
            .backend
            .unwrap_or_else(|| Arc::new(InMemoryBackend::new()));
        let breaker = Breaker::new(
            self.breaker,
            self.clock.clone(),
            self.jitter.unwrap_or_else(default_jitter),
            self.name.clone(),
        );
        let local = InMemoryBackend::builder()
            .clock(SharedClock(self.clock.clone()))
            .build();
        Limiter {
            inner: Arc::new(Inner {
                name: self.name,
                remote: backend.is_remote(),
                backend,
                default_limits: self.policies.into(),
                tiers,
                on_store_failure: self.on_store_failure,
                store_timeout: self.store_timeout,
                mode: self.mode,
                metrics,
                breaker,
                denials: self.denial_cache.map(DenialCache::new),
                clock: self.clock,
                local,
                shares: Mutex::new(Vec::new()),
            }),
        }
    }
}

#[derive(Debug)]
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_millis(&self) -> u64 {
        self.0.now_millis()
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

/// Resolves to the [`Decision`] for one request: at once for an in-process store or a
/// cached refusal, after the store's answer (or its timeout) otherwise.
pub struct DecisionFuture {
    state: DecisionState,
}

enum DecisionState {
    Ready(Option<Decision>),
    Pending(Pin<Box<dyn Future<Output = Decision> + Send>>),
}

impl DecisionFuture {
    fn ready(decision: Decision) -> Self {
        Self {
            state: DecisionState::Ready(Some(decision)),
        }
    }

    fn boxed(future: impl Future<Output = Decision> + Send + 'static) -> Self {
        Self {
            state: DecisionState::Pending(Box::pin(future)),
        }
    }
}

impl fmt::Debug for DecisionFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            DecisionState::Ready(decision) => f.debug_tuple("Ready").field(decision).finish(),
            DecisionState::Pending(_) => f.write_str("Pending"),
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
            DecisionState::Pending(future) => future.as_mut().poll(cx),
        }
    }
}
