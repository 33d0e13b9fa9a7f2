//! Configuring a limiter: the builder, which assembles the limiter's parts.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::limiter::Limiter;
use crate::limiter::breaker::{BreakerConfig, Jitter};
use crate::limiter::denial_cache::DenialCache;
use crate::limiter::domains::Domains;
use crate::limiter::failure::{FailurePolicy, Fallback};
use crate::limiter::lease::config::Leases;
use crate::limiter::lease::leasing::Leasing;
use crate::limiter::limits::{ActiveLimits, InForce, Limits};
use crate::limiter::mode::{Mode, ModeSwitch};
use crate::limiter::path::Path;
use crate::limiter::path::local::LocalPath;
use crate::limiter::path::remote::{RemoteParts, RemotePath};
use crate::limiter::store_call::StoreCall;
use crate::limiter::telemetry::LimiterMetrics;
use crate::store::backend::Backend;
use crate::store::build_error::BuildError;
use crate::store::clock::{Clock, SystemClock};
use crate::store::memory::InMemoryBackend;
use crate::store::policy::Policy;

const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(20);
/// Below any round trip to a store: every remote decision would time out.
pub(crate) const MIN_STORE_TIMEOUT: Duration = Duration::from_millis(1);
const DEFAULT_DENIAL_CACHE_CAPACITY: usize = 100_000;

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
    named: bool,
    backend: Option<Arc<dyn Backend>>,
    /// The backend again when it is the in-process one: decided by a direct call.
    memory: Option<InMemoryBackend>,
    limits: Limits,
    on_store_failure: FailurePolicy,
    store_timeout: Duration,
    breaker: BreakerConfig,
    jitter: Option<Jitter>,
    denial_cache: Option<usize>,
    clock: Arc<dyn Clock>,
    mode: ModeSwitch,
    counter_scope: Option<Arc<str>>,
    leases: Option<Leases>,
}

impl Default for LimiterBuilder {
    fn default() -> Self {
        Self {
            name: "default".into(),
            named: false,
            backend: None,
            memory: None,
            limits: Limits::new(),
            on_store_failure: FailurePolicy::default(),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            breaker: BreakerConfig::default(),
            jitter: None,
            denial_cache: Some(DEFAULT_DENIAL_CACHE_CAPACITY),
            clock: Arc::new(SystemClock),
            mode: ModeSwitch::default(),
            counter_scope: None,
            leases: None,
        }
    }
}

impl fmt::Debug for LimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("limits", &self.limits)
            .field("on_store_failure", &self.on_store_failure)
            .finish_non_exhaustive()
    }
}

impl LimiterBuilder {
    /// Names the limiter in metric labels and logs, and scopes its counters (unless a
    /// [`counter_scope`](Self::counter_scope) is given). Give every instance of a deployment
    /// the same name, so that they count together.
    ///
    /// Required with [`backend`](Self::backend): a store can be shared (clones of one
    /// `InMemoryBackend`, every limiter on one Redis), and two unnamed limiters on it would
    /// count in one counter. An unnamed limiter on its own private store is `"default"`.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self.named = true;
        self
    }

    /// Keeps counters in `backend` (default: a new [`InMemoryBackend`] of this limiter's
    /// own). The limiter then needs a [`name`](Self::name) or a
    /// [`counter_scope`](Self::counter_scope): without one, [`try_build`](Self::try_build)
    /// refuses it with [`BuildError::Unnamed`] (and [`build`](Self::build) panics).
    ///
    /// ```
    /// use tollgate::{BuildError, InMemoryBackend, Limiter, Policy, Quota};
    /// let store = InMemoryBackend::new();
    /// let per_minute = Policy::sliding_window("per-minute", Quota::per_minute(3));
    /// let unnamed = Limiter::builder().backend(store.clone()).policy(per_minute.clone()).try_build();
    /// assert!(matches!(unnamed, Err(BuildError::Unnamed)));
    /// let search = Limiter::builder().name("search").backend(store.clone()).policy(per_minute.clone()).build();
    /// let login = Limiter::builder().name("login").backend(store).policy(per_minute).build();
    /// assert_ne!(search.policies()[0].counter(), login.policies()[0].counter());
    /// ```
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.memory = (&backend as &dyn Any)
            .downcast_ref::<InMemoryBackend>()
            .cloned();
        self.backend = Some(Arc::new(backend));
        self
    }

    /// Adds a policy for callers without a tier. A request is admitted only if every
    /// policy admits it.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.limits = self.limits.policy(policy);
        self
    }

    /// Gives callers of plan tier `tier` (see [`Caller::with_tier`](crate::Caller::with_tier)) their own policies
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
        self.limits = self.limits.tier(tier, policies);
        self
    }

    /// Gives the budgets at `level` (a team, an organisation) their policies, for callers
    /// that are members of such budgets ([`Caller::within`](crate::Caller::within)): each
    /// request of a member is decided against its own policies and every one of its
    /// levels' at once, all or nothing, in one store call. The level's policies are named
    /// `<level>:<name>` in the RateLimit fields and refusals. Naming a level again replaces
    /// its policies.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .level("team", [Policy::sliding_window("per-second", Quota::per_second(120))])
    ///     .level("org", [Policy::sliding_window("per-second", Quota::per_second(200))])
    ///     .build();
    /// let alice = Caller::new("alice").within("team", "sync").within("org", "acme");
    /// # drop((limiter, alice));
    /// ```
    pub fn level(
        mut self,
        level: impl Into<Arc<str>>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.limits = self.limits.level(level, policies);
        self
    }

    /// Replaces the default policies and tiers given so far with `limits` (from a
    /// configuration file, say). [`Limiter::set_limits`] swaps them while the limiter
    /// runs.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Quota, reload::Limits};
    /// let limits = Limits::new().policy(Policy::sliding_window("per-second", Quota::per_second(50)));
    /// let limiter = Limiter::builder().limits(limits).build();
    /// assert_eq!(limiter.policies()[0].quota(), 50);
    /// ```
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// What to do when the store cannot decide (default: fail open).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// How long a decision may wait for the store before it falls back (default 20 ms, at
    /// least 1 ms: [`try_build`](Self::try_build) refuses less). Set it a little above the
    /// store's p99.9 latency as measured from this service.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// Configures the circuit breaker (one per part of the store: each master of a Redis
    /// Cluster has its own, configured alike).
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// Replaces the breaker's jitter source (numbers in `[0, 1)`), for tests. The default is
    /// the crate's own random source, seeded per limiter; a seeded one (or a constant, as
    /// below) repeats its sequence on every run.
    ///
    /// ```
    /// use tollgate::{InMemoryBackend, Limiter, Policy, Quota};
    ///
    /// let limiter = Limiter::builder()
    ///     .name("orders")
    ///     .backend(InMemoryBackend::new())
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .breaker_jitter(|| 0.5)
    ///     .build();
    /// # drop(limiter);
    /// ```
    pub fn breaker_jitter(mut self, jitter: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.jitter = Some(Arc::new(jitter));
        self
    }

    /// Caps the denial cache at `capacity` callers (default 100,000), or turns it off with
    /// 0. Fail static needs it. A store whose refusals do not hold until their reset
    /// ([`Backend::refusals_hold`](crate::store::Backend::refusals_hold)) gets none.
    pub fn denial_cache(mut self, capacity: usize) -> Self {
        self.denial_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// Reads time from `clock` (breaker, denial cache, local share), such as a
    /// [`ManualClock`](crate::store::ManualClock) in tests. A Redis store keeps its own clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Starts in `mode` (default [`Mode::Enforce`]); [`Limiter::set_mode`] switches it on
    /// the running service.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Quota, reload::Mode};
    ///
    /// // Rolled out in shadow: decided and counted, nothing refused.
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .mode(Mode::Shadow)
    ///     .build();
    /// assert_eq!(limiter.mode(), Mode::Shadow);
    /// ```
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = ModeSwitch::new(mode);
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

    /// Decides hot callers locally from leases of their quota taken from a remote store,
    /// instead of asking the store about each of their requests (default: every request
    /// asks). See [`Leases`] for what a lease holds and how long; an in-process store is
    /// never leased from, and a store that does not lease is asked about every request, as
    /// is a caller with a [sliding log](crate::store::Algorithm::SlidingLog) among its
    /// policies (exact only when every unit counts when it is spent).
    ///
    /// ```
    /// use tollgate::{InstanceCount, Leases, Limiter, Policy, Quota};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(10_000)))
    ///     .leases(Leases::new().threshold_per_sec(500).instances(InstanceCount::fixed(4)))
    ///     .build();
    /// # drop(limiter);
    /// ```
    pub fn leases(mut self, leases: Leases) -> Self {
        self.leases = Some(leases);
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
    /// policy, a tier has no policy, two policies of one set share a name, the store
    /// timeout is under 1 ms, or a limiter given a store has neither a name nor a counter
    /// scope.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{BuildError, Limiter, Policy, Quota};
    /// let error = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(60)))
    ///     .try_build()
    ///     .unwrap_err();
    /// assert!(matches!(error, BuildError::DuplicatePolicy { .. }));
    /// assert!(matches!(Limiter::builder().try_build(), Err(BuildError::NoPolicies { .. })));
    /// let instant = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .store_timeout(Duration::ZERO)
    ///     .try_build();
    /// assert!(matches!(instant, Err(BuildError::StoreTimeoutTooShort { .. })));
    /// ```
    pub fn try_build(self) -> Result<Limiter, BuildError> {
        if self.store_timeout < MIN_STORE_TIMEOUT {
            return Err(BuildError::StoreTimeoutTooShort {
                timeout: self.store_timeout,
            });
        }
        if self.backend.is_some() && !self.named && self.counter_scope.is_none() {
            return Err(BuildError::Unnamed);
        }
        let scope = self.counter_scope.unwrap_or_else(|| self.name.clone());
        let name = self.name;
        let metrics = Arc::new(LimiterMetrics::new(&name, self.limits.policy_names()));
        let active = ActiveLimits::new(self.limits, &scope, 0)?;
        let limits = Arc::new(InForce::new(active, scope, name.clone(), metrics.clone()));
        let (backend, memory) = match self.backend {
            Some(backend) => (backend, self.memory),
            None => {
                let memory = InMemoryBackend::new();
                (Arc::new(memory.clone()) as Arc<dyn Backend>, Some(memory))
            }
        };
        let remote = backend.is_remote();
        let refusals_hold = backend.refusals_hold();
        let store = StoreCall::new(backend, self.store_timeout, metrics.clone());
        let fallback = Fallback::new(self.on_store_failure, self.clock.clone());
        // Chosen once: an in-process store cannot be down, so it gets no breaker, denial
        // cache or lease.
        let path = if remote {
            let domains = Domains::new(
                self.breaker,
                self.clock.clone(),
                self.jitter,
                name.clone(),
                fallback.policy().as_str(),
                store.backend(),
            );
            Path::Remote(Arc::new(RemotePath::new(RemoteParts {
                name: name.clone(),
                store,
                clock: self.clock,
                domains,
                denials: self
                    .denial_cache
                    .filter(|_| refusals_hold)
                    .map(DenialCache::new),
                fallback,
                leases: self.leases.map(|leases| Leasing::new(leases, &name)),
                metrics: metrics.clone(),
            })))
        } else {
            Path::Local(Arc::new(LocalPath::new(store, memory, fallback, &name)))
        };
        Ok(Limiter::from_parts(name, self.mode, limits, metrics, path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::decision::Decision;
    use crate::store::policy::Quota;

    /// A store timeout of 0 (or under any round trip) sends every remote decision to the
    /// failure policy forever: `try_build` refuses one under a millisecond.
    #[test]
    fn regression_a_store_timeout_under_a_millisecond_is_refused() {
        let builder = |timeout| {
            Limiter::builder()
                .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
                .store_timeout(timeout)
        };
        for timeout in [Duration::ZERO, Duration::from_micros(999)] {
            let refused = builder(timeout).try_build();
            assert!(refused.is_err(), "{timeout:?} accepted: {refused:?}");
            assert_eq!(
                refused.unwrap_err().to_string(),
                format!(
                    "the store timeout ({timeout:?}) is under 1 ms: every remote decision would \
                     time out"
                )
            );
        }
        assert!(builder(Duration::from_millis(1)).try_build().is_ok());
    }

    /// Two limiters built without a name on clones of one store both counted under
    /// `default`: the second refused after the first had used the quota. A store given
    /// without a name or a scope is now refused, and named limiters keep their own counts.
    #[tokio::test]
    async fn regression_unnamed_limiters_on_one_store_do_not_share_counters() {
        use crate::store::caller::Caller;
        let store = InMemoryBackend::new();
        let per_minute = || Policy::sliding_window("per-minute", Quota::per_minute(3));
        let unnamed = || {
            Limiter::builder()
                .backend(store.clone())
                .policy(per_minute())
        };
        assert_eq!(unnamed().try_build().unwrap_err(), BuildError::Unnamed);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unnamed().build()))
            .unwrap_err();
        let message = panicked.downcast_ref::<String>().unwrap();
        assert!(message.contains("needs a name"), "{message}");
        // A scope alone is a choice of counter: accepted.
        assert!(unnamed().counter_scope("bulk").try_build().is_ok());
        // Unnamed on a store of its own: nothing to share.
        let private = Limiter::builder().policy(per_minute()).build();
        assert_eq!(private.name(), "default");

        let first = unnamed().name("search").build();
        let second = unnamed().name("login").build();
        let alice = Caller::new("alice");
        for _ in 0..3 {
            assert!(matches!(first.check(&alice).await, Decision::Allowed(_)));
        }
        assert!(matches!(first.check(&alice).await, Decision::Limited(_)));
        assert!(
            matches!(second.check(&alice).await, Decision::Allowed(_)),
            "the second limiter counted the first one's requests"
        );
    }
}
