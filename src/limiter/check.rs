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

use crate::limiter::breaker::{
    Admission, Breaker, BreakerConfig, BreakerState, Jitter, Permit, default_jitter,
};
use crate::limiter::decision::{
    Decision, DecisionSource, RateLimitInfo, UnlimitedReason, whole_seconds,
};
use crate::limiter::denial_cache::DenialCache;
use crate::limiter::failure::FailurePolicy;
use crate::limiter::fallback::FallbackReason;
use crate::limiter::mode::{Mode, ModeSwitch};
use crate::limiter::policy::Policy;
use crate::limiter::telemetry::LimiterMetrics;
use crate::store::algorithm::Limit;
use crate::store::backend::{Backend, CheckResult, StoreError, StoreErrorKind};
use crate::store::caller::Caller;
use crate::store::clock::{Clock, SystemClock};
use crate::store::memory::InMemoryBackend;

/// A policy set, a divisor, and the set divided by it.
type Share = (Arc<[Limit]>, u64, Arc<[Limit]>);

const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(20);
const DEFAULT_DENIAL_CACHE_CAPACITY: usize = 100_000;

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
    default_limits: PolicySet,
    tiers: HashMap<Arc<str>, PolicySet>,
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
        let set = inner.limits_for(caller);
        let limits = &set.limits;
        if !inner.remote {
            // An in-process store cannot be down: no breaker, timeout or denial cache.
            let mut check = inner.backend.check(caller.key(), limits);
            if let Some(result) = check.try_take_ready() {
                let now = inner.clock.now_millis();
                return DecisionFuture::ready(
                    inner.conclude(inner.decided(caller, set, result, now), mode),
                );
            }
        }
        let now = inner.clock.now_millis();
        if let Some(denials) = &inner.denials
            && let Some(info) = denials.get(caller.key(), set.id, now)
        {
            inner.metrics.denial_cache_hit();
            return DecisionFuture::ready(inner.conclude(Decision::Limited(info), mode));
        }
        let permit = match inner.breaker.admit() {
            Admission::Call(permit) => permit,
            Admission::Reject => {
                let decision = inner.fall_back(caller, set, FallbackReason::BreakerOpen);
                return DecisionFuture::ready(inner.conclude(decision, mode));
            }
        };
        let started = Instant::now();
        let mut check = inner.backend.check(caller.key(), limits);
        if let Some(result) = check.try_take_ready() {
            inner.metrics.store_latency(started.elapsed());
            let decision = inner.finish(caller, set, result, permit, now);
            return DecisionFuture::ready(inner.conclude(decision, mode));
        }
        let inner = self.inner.clone();
        let caller = caller.clone();
        let set = set.clone();
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
            let decision = inner.finish(&caller, &set, result, permit, now);
            inner.conclude(decision, mode)
        })
    }

    /// The switch that moves this limiter between enforce, shadow and off.
    pub fn mode_switch(&self) -> &ModeSwitch {
        &self.inner.mode
    }

    /// The policies applied to callers without a tier, in order.
    pub fn policies(&self) -> &[Limit] {
        &self.inner.default_limits.limits
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

    fn limits_for(&self, caller: &Caller) -> &PolicySet {
        caller
            .tier()
            .and_then(|tier| self.tiers.get(tier))
            .unwrap_or(&self.default_limits)
    }

    /// A store answered (or failed): tell the breaker, cache a refusal, or fall back.
    /// `asked_ms` is when the store was asked.
    fn finish(
        &self,
        caller: &Caller,
        set: &PolicySet,
        result: CheckResult,
        permit: Permit,
        asked_ms: u64,
    ) -> Decision {
        match result {
            Ok(outcome) => {
                permit.success();
                self.decided(caller, set, Ok(outcome), asked_ms)
            }
            Err(error) => {
                permit.failure();
                tracing::debug!(layer = %self.name, %error, "store call failed");
                self.fall_back(caller, set, FallbackReason::of(&error))
            }
        }
    }

    /// The store's answer as a decision. A refusal is cached until its retry time counted
    /// from `asked_ms`: the store decided at some instant between the question and the
    /// answer, so counting from the question never outlives the store's own refusal.
    fn decided(
        &self,
        caller: &Caller,
        set: &PolicySet,
        result: CheckResult,
        asked_ms: u64,
    ) -> Decision {
        let limits = &set.limits;
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
                        denials.insert(caller.key(), set.id, &refusal, asked_ms, retry_ms);
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
            Err(error) => self.fall_back(caller, set, FallbackReason::of(&error)),
        }
    }

    fn fall_back(&self, caller: &Caller, set: &PolicySet, reason: FallbackReason) -> Decision {
        self.metrics.fallback(reason);
        self.apply(&self.on_store_failure, caller, set)
    }

    fn apply(&self, policy: &FailurePolicy, caller: &Caller, set: &PolicySet) -> Decision {
        let limits = &set.limits;
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
                .cached_refusal(caller, set)
                .unwrap_or(Decision::Unlimited(UnlimitedReason::StoreFailedOpen)),
            FailurePolicy::StaticThen(rest) => self
                .cached_refusal(caller, set)
                .unwrap_or_else(|| self.apply(rest, caller, set)),
        }
    }

    fn cached_refusal(&self, caller: &Caller, set: &PolicySet) -> Option<Decision> {
        let denials = self.denials.as_ref()?;
        denials
            .get(caller.key(), set.id, self.clock.now_millis())
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
    counter_scope: Option<Arc<str>>,
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
            counter_scope: None,
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
    ///
    /// A caller moved to another tier keeps its count for each policy of the same name and
    /// unit (the same window, or the same refill period): the new quota applies to what it
    /// already used. A policy whose name, algorithm or unit differs is a counter of its
    /// own, started afresh. Refusals cached for the old tier do not follow the caller.
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

    /// Keeps this limiter's counters under `scope` instead of its name. Counters are
    /// scoped by the limiter's name by default, so two limiters on one store never share a
    /// count even when their policies have the same names; give two limiters the same
    /// scope to make them count together on purpose.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Quota};
    /// let per_ip = Policy::sliding_window("per-minute", Quota::per_minute(100));
    /// let search = Limiter::builder().name("search").policy(per_ip.clone()).build();
    /// let login = Limiter::builder().name("login").policy(per_ip.clone()).build();
    /// assert_ne!(search.policies()[0].counter(), login.policies()[0].counter());
    /// // Two routes that must draw from one budget:
    /// let export = Limiter::builder().name("export").counter_scope("bulk").policy(per_ip.clone()).build();
    /// let import = Limiter::builder().name("import").counter_scope("bulk").policy(per_ip).build();
    /// assert_eq!(export.policies()[0].counter(), import.policies()[0].counter());
    /// ```
    pub fn counter_scope(mut self, scope: impl Into<Arc<str>>) -> Self {
        self.counter_scope = Some(scope.into());
        self
    }

    /// Builds the limiter from a configuration written in the code.
    ///
    /// # Panics
    ///
    /// On the configurations [`try_build`](Self::try_build) refuses. Use `try_build` for
    /// configurations read at run time.
    pub fn build(self) -> Limiter {
        self.try_build().unwrap_or_else(|error| panic!("{error}"))
    }

    /// Builds the limiter, or says why the configuration cannot work: there is no default
    /// policy, a tier has no policy, or two policies of one set share a name.
    ///
    /// ```
    /// use tollgate::{BuildError, Limiter, Policy, Quota};
    /// let error = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(60)))
    ///     .try_build()
    ///     .unwrap_err();
    /// assert!(matches!(error, BuildError::DuplicatePolicy { .. }));
    /// assert!(matches!(Limiter::builder().try_build(), Err(BuildError::NoPolicies { .. })));
    /// ```
    pub fn try_build(self) -> Result<Limiter, BuildError> {
        let scope = self.counter_scope.unwrap_or_else(|| self.name.clone());
        let default_limits = PolicySet::new(None, &self.policies, &scope)?;
        let mut tiers = HashMap::with_capacity(self.tiers.len());
        for (tier, limits) in &self.tiers {
            tiers.insert(tier.clone(), PolicySet::new(Some(tier), limits, &scope)?);
        }
        let metrics = LimiterMetrics::new(
            &self.name,
            self.policies
                .iter()
                .chain(self.tiers.iter().flat_map(|(_, limits)| limits.iter()))
                .map(Limit::name_arc),
            self.on_store_failure.as_str(),
        );
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
        Ok(Limiter {
            inner: Arc::new(Inner {
                name: self.name,
                remote: backend.is_remote(),
                backend,
                default_limits,
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
        })
    }
}

/// Why [`LimiterBuilder::try_build`] refused a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The default set (`tier` is `None`) or a tier has no policy.
    NoPolicies {
        /// The tier without a policy, or `None` for the default policies.
        tier: Option<String>,
    },
    /// Two policies of one set share a name (clients could not tell them apart).
    DuplicatePolicy {
        /// The tier, or `None` for the default policies.
        tier: Option<String>,
        /// The repeated name.
        name: String,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |tier: &Option<String>| match tier {
            Some(tier) => format!("tier {tier:?}"),
            None => "the default policies".to_owned(),
        };
        match self {
            BuildError::NoPolicies { tier } => {
                write!(f, "{} need at least one policy", set(tier))
            }
            BuildError::DuplicatePolicy { tier, name } => {
                write!(f, "{} name policy {name:?} twice", set(tier))
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// One set of policies a caller is decided against (the defaults, or a tier's), with an
/// identity that changes whenever any of its policies does: a refusal is remembered for
/// the set that refused, so a caller moved to another tier is asked about afresh.
#[derive(Clone, Debug)]
struct PolicySet {
    limits: Arc<[Limit]>,
    id: u64,
}

impl PolicySet {
    fn new(
        tier: Option<&Arc<str>>,
        limits: &[Limit],
        scope: &Arc<str>,
    ) -> Result<Self, BuildError> {
        let tier_name = || tier.map(|t| t.to_string());
        if limits.is_empty() {
            return Err(BuildError::NoPolicies { tier: tier_name() });
        }
        for (i, limit) in limits.iter().enumerate() {
            if limits[..i].iter().any(|other| other.name() == limit.name()) {
                return Err(BuildError::DuplicatePolicy {
                    tier: tier_name(),
                    name: limit.name().to_owned(),
                });
            }
        }
        let limits: Arc<[Limit]> = limits.iter().map(|limit| limit.scoped(scope)).collect();
        // Within one process only: the cache that reads it is local.
        let id = std::hash::BuildHasher::hash_one(
            &std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default(),
            &*limits,
        );
        Ok(Self { limits, id })
    }
}

#[derive(Debug)]
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_millis(&self) -> u64 {
        self.0.now_millis()
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
