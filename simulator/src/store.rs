//! The simulated store, how it fails and its clock, and what each instance's limiter is built
//! from.

use std::future::Future;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use tollgate::InMemoryBackend;
use tollgate::InstanceCount;
use tollgate::Limiter;
use tollgate::LimiterBuilder;
use tollgate::Policy;
use tollgate::future::StoreFuture;
use tollgate::store::CallerKey;
use tollgate::store::Clock;
use tollgate::store::{Backend, CheckOutcome, FailureDomain, LeaseGrant, Refund, StoreError};

/// How the store fails during the outage.
///
/// ```
/// use tollgate_simulator::FaultKind;
/// assert_eq!("blackhole".parse::<FaultKind>().unwrap(), FaultKind::Blackhole);
/// assert!("fire".parse::<FaultKind>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// The store refuses every call at once.
    Refuse,
    /// Calls never return; the limiter's store timeout ends them.
    Blackhole,
    /// The store answers after twice the store timeout.
    Slow,
}

impl FaultKind {
    /// The name its [`FromStr`](std::str::FromStr) reads.
    ///
    /// ```
    /// use tollgate_simulator::FaultKind;
    /// assert_eq!(FaultKind::Slow.name(), "slow");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Refuse => "refuse",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Slow => "slow",
        }
    }

    /// The fault in words, for a store timeout of `timeout_ms`.
    ///
    /// ```
    /// use tollgate_simulator::FaultKind;
    /// assert_eq!(FaultKind::Refuse.describe(20), "the store refuses every call");
    /// ```
    pub fn describe(self, timeout_ms: u64) -> String {
        match self {
            FaultKind::Refuse => "the store refuses every call".to_owned(),
            FaultKind::Blackhole => format!(
                "the store is blackholed: calls never return, the {timeout_ms} ms store timeout ends them"
            ),
            FaultKind::Slow => format!(
                "the store is slow: it answers after {} ms, twice the store timeout",
                timeout_ms * 2
            ),
        }
    }
}

/// Where the virtual clock starts: 2026-01-01T00:00:00Z (rounded down to the window, so
/// that the phases start on window boundaries).
pub(crate) const VIRTUAL_EPOCH_MS: u64 = 1_767_225_600_000;

/// The clock of a run: on virtual time, milliseconds since the Unix epoch on tokio's
/// (paused) clock, so the limiters, the breakers and the store all read the simulated
/// time; in real time, Unix time read once and advanced by a monotonic clock, as
/// tollgate's own default clock is.
///
/// ```
/// use tollgate_simulator::SimClock;
/// use tollgate::store::Clock;
/// assert!(SimClock::system().now_millis() > 1_700_000_000_000);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SimClock {
    virtual_start: Option<(u64, Instant)>,
}

impl SimClock {
    /// The real clock, as a real-time run uses.
    ///
    /// ```
    /// use tollgate_simulator::SimClock;
    /// let _ = SimClock::system();
    /// ```
    pub fn system() -> Self {
        Self {
            virtual_start: None,
        }
    }

    pub(crate) fn virtual_time(epoch_ms: u64, start: Instant) -> Self {
        Self {
            virtual_start: Some((epoch_ms, start)),
        }
    }
}

impl Clock for SimClock {
    fn now_millis(&self) -> u64 {
        match self.virtual_start {
            Some((epoch_ms, start)) => {
                let elapsed = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                epoch_ms.saturating_add(elapsed)
            }
            None => {
                // A wall-clock step (NTP) must not move a window backwards: the `Clock`
                // contract is that time never runs back.
                static ORIGIN: LazyLock<(u64, std::time::Instant)> = LazyLock::new(|| {
                    let unix = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or(Duration::ZERO);
                    let unix_ms = u64::try_from(unix.as_millis()).unwrap_or(u64::MAX);
                    (unix_ms, std::time::Instant::now())
                });
                let (unix_ms, origin) = *ORIGIN;
                let elapsed = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
                unix_ms.saturating_add(elapsed)
            }
        }
    }
}

/// The fault in force, shared by every simulated store (0: none).
#[derive(Clone, Debug, Default)]
pub(crate) struct FaultCell(Arc<AtomicU8>);

impl FaultCell {
    fn get(&self) -> Option<FaultKind> {
        match self.0.load(Ordering::SeqCst) {
            1 => Some(FaultKind::Refuse),
            2 => Some(FaultKind::Blackhole),
            3 => Some(FaultKind::Slow),
            _ => None,
        }
    }

    pub(crate) fn set(&self, fault: Option<FaultKind>) {
        let value = match fault {
            None => 0,
            Some(FaultKind::Refuse) => 1,
            Some(FaultKind::Blackhole) => 2,
            Some(FaultKind::Slow) => 3,
        };
        self.0.store(value, Ordering::SeqCst);
    }
}

/// Stands in for Redis: one in-process store shared by every instance of a group,
/// reporting itself remote (so the limiter puts the breaker, the store timeout and the
/// denial cache in front of it) and failing on command.
#[derive(Clone, Debug)]
pub(crate) struct FaultyStore {
    pub(crate) counters: InMemoryBackend,
    pub(crate) fault: FaultCell,
    pub(crate) slow_by: Duration,
}

impl FaultyStore {
    /// Runs `call` on the counters when the command reaches the store, `slow_by` late,
    /// whether or not anyone still waits for the answer, as a slow Redis would.
    fn late<T, F, Fut>(
        &self,
        call: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + use<T, F, Fut>
    where
        T: Send + 'static,
        F: FnOnce(InMemoryBackend) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let counters = self.counters.clone();
        let delay = self.slow_by;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = answer.send(call(counters).await);
        });
        async move { answered.await.unwrap_or_else(|_| Err(store_gone())) }
    }
}

/// The answer to a call whose store went away before answering.
fn store_gone() -> StoreError {
    StoreError::unavailable("store gone")
}

impl Backend for FaultyStore {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        match self.fault.get() {
            None => self.counters.check(caller, limits, cost),
            Some(FaultKind::Refuse) => StoreFuture::ready(Err(StoreError::unavailable(
                "connection refused (simulated)",
            ))),
            Some(FaultKind::Blackhole) => StoreFuture::boxed(std::future::pending()),
            Some(FaultKind::Slow) => {
                let (caller, limits) = (caller.clone(), limits.clone());
                StoreFuture::boxed(self.late(move |counters| async move {
                    counters.check(&caller, &limits, cost).await
                }))
            }
        }
    }

    fn lease(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        Some(match self.fault.get() {
            None => self.counters.lease(caller, limits, cost, units)?,
            Some(FaultKind::Refuse) => StoreFuture::ready(Err(StoreError::unavailable(
                "connection refused (simulated)",
            ))),
            Some(FaultKind::Blackhole) => StoreFuture::boxed(std::future::pending()),
            Some(FaultKind::Slow) => {
                let (caller, limits) = (caller.clone(), limits.clone());
                StoreFuture::boxed(self.late(move |counters| async move {
                    match counters.lease(&caller, &limits, cost, units) {
                        Some(lease) => lease.await,
                        None => Err(store_gone()),
                    }
                }))
            }
        })
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        match self.fault.get() {
            None => self.counters.refund(caller, limits, refund),
            Some(_) => StoreFuture::ready(Err(StoreError::unavailable("store down (simulated)"))),
        }
    }

    fn charge(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        match self.fault.get() {
            None => self.counters.charge(caller, limits, units),
            Some(_) => StoreFuture::ready(Err(StoreError::unavailable("store down (simulated)"))),
        }
    }

    fn is_remote(&self) -> bool {
        true
    }
}

/// The store of one instance: on virtual time the in-process store shared by the
/// instances of its group (remote as far as the limiter can tell, and failing during the
/// outage); in real time the store the caller passed.
///
/// ```
/// use tollgate_simulator::SharedStore;
/// use tollgate::InMemoryBackend;
/// use tollgate::store::Backend;
/// let store = SharedStore::new(InMemoryBackend::new());
/// assert!(!store.is_remote());
/// ```
#[derive(Clone, Debug)]
pub struct SharedStore(Arc<dyn Backend>);

impl SharedStore {
    /// Wraps any store.
    ///
    /// ```
    /// use tollgate_simulator::SharedStore;
    /// let _ = SharedStore::new(tollgate::InMemoryBackend::new());
    /// ```
    pub fn new(store: impl Backend) -> Self {
        Self(Arc::new(store))
    }
}

impl Backend for SharedStore {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        self.0.check(caller, limits, cost)
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        self.0.refund(caller, limits, refund)
    }

    fn charge(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        self.0.charge(caller, limits, units)
    }

    fn lease(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        self.0.lease(caller, limits, cost, units)
    }

    fn is_remote(&self) -> bool {
        self.0.is_remote()
    }

    fn failure_domain(&self, caller: &CallerKey) -> FailureDomain {
        self.0.failure_domain(caller)
    }

    fn failure_domain_label(&self, id: u32) -> Option<String> {
        self.0.failure_domain_label(id)
    }
}

/// What one instance's [`Limiter`] is built from: its group, its place in the group, the
/// store its group shares and the clock of the run. A factory given to
/// [`Scenario::group`](super::Scenario::group) receives one per instance.
///
/// [`limiter_builder`](Self::limiter_builder) starts a builder wired to both (and to a
/// reproducible breaker jitter); add your policies, failure policy, store timeout and
/// breaker. A limiter built without this store and clock does not take part in the
/// outage.
///
/// ```
/// use tollgate_simulator::{Customer, Scenario};
/// use tollgate::{FailurePolicy, Policy, Quota};
///
/// let report = Scenario::new()
///     .policies([])
///     .instances(3)
///     .traffic([Customer::new("acme", 10.0)])
///     .normal_secs(1).outage_secs(1).recovery_secs(1)
///     .group("mine", |instance| {
///         assert_eq!((instance.group(), instance.instances()), ("mine", 3));
///         assert!(instance.instance() < 3);
///         let jitter = instance.jitter();
///         assert!((0.0..1.0).contains(&jitter()));
///         // By hand, what `limiter_builder` does for you:
///         tollgate::Limiter::builder()
///             .name(instance.group())
///             .backend(instance.store())
///             .clock(instance.clock())
///             .breaker_jitter(jitter)
///             .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
///             .on_store_failure(FailurePolicy::open())
///             .try_build()
///     })
///     .run_blocking()
///     .unwrap();
/// assert_eq!(report.groups()[0].name(), "mine");
/// ```
#[derive(Clone, Debug)]
pub struct InstanceContext {
    pub(crate) group: String,
    pub(crate) group_index: usize,
    pub(crate) instance: usize,
    pub(crate) instances: usize,
    pub(crate) store: SharedStore,
    pub(crate) clock: SimClock,
}

impl InstanceContext {
    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// This instance's index in its group, from 0.
    pub fn instance(&self) -> usize {
        self.instance
    }

    /// How many instances the group runs.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// The store the group's instances share.
    pub fn store(&self) -> SharedStore {
        self.store.clone()
    }

    /// The clock of the run.
    pub fn clock(&self) -> SimClock {
        self.clock
    }

    /// A reproducible breaker jitter for this instance, so that runs print the same
    /// table.
    pub fn jitter(&self) -> impl Fn() -> f64 + Send + Sync + 'static {
        jitter((self.group_index * 1_000 + self.instance + 1) as u64)
    }

    /// The instance count of this instance's group, for a local share or leases to divide
    /// by: [`InstanceCount::fixed`] at the group's [`instances`](Self::instances), at this
    /// instance's place ([`InstanceCount::at_place`]), so the shares add up to the quota
    /// exactly, as the built-in groups' do.
    ///
    /// It stands in for a count the deployment keeps in its store, the Redis instance
    /// registry's (`InstanceCount::registry`), which cannot run on the simulated store: the
    /// registry counts the instances that send heartbeats and gives each a place, and in
    /// a replay every instance of the group is live from start to end, so the two agree.
    /// Give your limiter's configuration the count as an argument (production passes the
    /// registry's, the replay this one), and leave the rest of it as it is.
    ///
    /// ```
    /// use tollgate::{FailurePolicy, LimiterBuilder, InstanceCount, Policy, Quota};
    /// use tollgate_simulator::{Customer, Scenario};
    ///
    /// /// The service's configuration, shared by `main` and the replay test.
    /// fn orders(builder: LimiterBuilder, instances: InstanceCount) -> LimiterBuilder {
    ///     builder
    ///         .name("orders")
    ///         .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///         .on_store_failure(FailurePolicy::local_share(instances))
    /// }
    ///
    /// let scenario = Scenario::new().policies([]).group("orders", |instance| {
    ///     assert_eq!(instance.instance_count().get(), 4);
    ///     orders(instance.limiter_builder(), instance.instance_count()).try_build()
    /// });
    /// assert!(scenario.validate().is_ok());
    /// ```
    pub fn instance_count(&self) -> InstanceCount {
        InstanceCount::fixed(self.instances as u64).at_place(self.instance as u64)
    }

    /// A [`Limiter`] builder named after the group, on the group's store, the run's
    /// clock and this instance's jitter.
    pub fn limiter_builder(&self) -> LimiterBuilder {
        Limiter::builder()
            .name(self.group.clone())
            .breaker_jitter(self.jitter())
            .backend(self.store())
            .clock(self.clock)
    }
}

/// A reproducible jitter source seeded with `seed`: numbers in `[0, 1)` from a xorshift64
/// generator, the small seeds spread over the state space by the 64-bit golden ratio (and
/// the state made odd, since xorshift never leaves 0).
pub(crate) fn jitter(seed: u64) -> impl Fn() -> f64 + Send + Sync + 'static {
    let state = AtomicU64::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    move || {
        let mut x = state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.store(x, Ordering::Relaxed);
        // The top 53 bits, as many as an f64 holds exactly.
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}
