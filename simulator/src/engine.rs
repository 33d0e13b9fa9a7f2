//! The engine: builds each group's instances (the real layer around a tiny service),
//! sends every customer's requests on schedule, switches the fault at the phase
//! boundaries and tallies the answers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Request;
use http::StatusCode;
use tokio::task::JoinSet;
use tokio::time::Instant;

use tollgate::BuildError;
use tollgate::Decision;
use tollgate::InMemoryBackend;
use tollgate::Limiter;
use tollgate::decision::{BreakerState, Settlement};
use tollgate::store::{Algorithm, Backend};

use crate::report::{Counts, GroupReport, Report, Traced, worst_windows};
use crate::scenario::{CUSTOMER_HEADER, GroupKind, Prepared, Scenario, ScenarioError};
use crate::service::{Answer, Endpoint, SimBody, UserLayer, endpoint};
use crate::store::{
    FaultCell, FaultKind, FaultyStore, InstanceContext, SharedStore, SimClock, VIRTUAL_EPOCH_MS,
};

/// Why a run failed.
///
/// ```
/// use tollgate_simulator::{Scenario, SimulationError};
/// let error = Scenario::new().instances(0).run_blocking().unwrap_err();
/// assert!(matches!(error, SimulationError::Scenario(_)));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum SimulationError {
    /// The scenario's numbers cannot run.
    Scenario(ScenarioError),
    /// A group's factory refused its configuration.
    Build {
        /// The group.
        group: String,
        /// Why.
        error: BuildError,
    },
    /// The fault switch of a real-time run failed.
    FaultSwitch(String),
    /// A request task failed, or no runtime could be started.
    Runtime(String),
}

impl fmt::Display for SimulationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimulationError::Scenario(e) => write!(f, "{e}"),
            SimulationError::Build { group, error } => write!(f, "group {group}: {error}"),
            SimulationError::FaultSwitch(m) => write!(f, "the fault switch failed: {m}"),
            SimulationError::Runtime(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SimulationError {}

impl From<ScenarioError> for SimulationError {
    fn from(error: ScenarioError) -> Self {
        SimulationError::Scenario(error)
    }
}

/// Turns the real store's fault on and off in a real-time run
/// ([`Scenario::run_against`]): `Some(fault)` at the start of the outage, `None` at its end.
///
/// ```
/// use std::future::Future;
/// use std::pin::Pin;
/// use tollgate_simulator::{FaultKind, FaultSwitch, SimulationError};
///
/// #[derive(Debug)]
/// struct Log;
///
/// impl FaultSwitch for Log {
///     fn set(
///         &self,
///         fault: Option<FaultKind>,
///     ) -> Pin<Box<dyn Future<Output = Result<(), SimulationError>> + Send + '_>> {
///         Box::pin(async move {
///             eprintln!("fault now {fault:?}");
///             Ok(())
///         })
///     }
/// }
/// # let _ = Log;
/// ```
pub trait FaultSwitch: Send + Sync + fmt::Debug {
    /// Puts `fault` in force (`None`: the store answers again).
    fn set(
        &self,
        fault: Option<FaultKind>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SimulationError>> + Send + '_>>;
}

impl FaultSwitch for FaultCell {
    fn set(
        &self,
        fault: Option<FaultKind>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SimulationError>> + Send + '_>> {
        FaultCell::set(self, fault);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What the requests of one group's customers found, while the run goes on.
struct Tally {
    report: GroupReport,
    /// Per customer, bit `k` set when its request `k` was admitted: `k` gives its send
    /// time exactly, and a bit a request keeps the longest runs small.
    admitted: Vec<Vec<u64>>,
}

/// One group's deployment.
struct Group {
    pin_first: bool,
    instances: Vec<Endpoint>,
    /// The limiter each instance's layer decides with.
    limiters: Vec<Limiter>,
    /// The policies the worst windows are measured in, by name.
    windows: Vec<(String, Duration)>,
}

impl Scenario {
    /// Runs the scenario on virtual time on a runtime of its own (current-thread, clock
    /// paused), so the whole timeline takes seconds, not its length. For tests and
    /// programs that are not inside a tokio runtime; inside one, `.await`
    /// [`run`](Self::run) on a paused clock instead.
    ///
    /// ```
    /// use tollgate_simulator::{Phase, PolicyName, Scenario};
    /// let report = Scenario::new()
    ///     .policies([PolicyName::Closed])
    ///     .normal_secs(2).outage_secs(2).recovery_secs(2)
    ///     .run_blocking()
    ///     .unwrap();
    /// assert_eq!(report.row("closed", Phase::Outage, "acme").unwrap().admitted_per_sec, 0.0);
    /// ```
    pub fn run_blocking(&self) -> Result<Report, SimulationError> {
        self.validate()?;
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(SimulationError::Runtime(
                "run_blocking inside a tokio runtime: await Scenario::run instead".to_owned(),
            ));
        }
        // Virtual time: the clock stands still while anything can run and jumps to the next
        // timer when nothing can, so the store timeout and the breaker run as they would.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .map_err(|e| SimulationError::Runtime(format!("cannot start a tokio runtime: {e}")))?;
        runtime.block_on(self.run())
    }

    /// Runs the scenario on the in-process store shared by each group's instances, on
    /// tokio's clock. Await it on a runtime whose clock is paused
    /// (`#[tokio::test(start_paused = true)]`, or a current-thread runtime built with
    /// `start_paused(true)`) and the timeline is virtual; on a running clock it takes the
    /// scenario's length in real time.
    ///
    /// ```
    /// use tollgate_simulator::{PolicyName, Scenario};
    /// let runtime = tokio::runtime::Builder::new_current_thread()
    ///     .enable_time()
    ///     .start_paused(true)
    ///     .build()
    ///     .unwrap();
    /// let scenario = Scenario::new()
    ///     .policies([PolicyName::Open])
    ///     .normal_secs(1).outage_secs(1).recovery_secs(1);
    /// let report = runtime.block_on(scenario.run()).unwrap();
    /// assert_eq!(report.groups().len(), 1);
    /// ```
    pub async fn run(&self) -> Result<Report, SimulationError> {
        self.validate()?;
        let start = Instant::now();
        let window_ms = self.window_secs * 1_000;
        let clock = SimClock::virtual_time(VIRTUAL_EPOCH_MS - VIRTUAL_EPOCH_MS % window_ms, start);
        let slow_by = Duration::from_millis(self.store_timeout_ms * 2);
        let fault = FaultCell::default();
        let mut counters: Option<(usize, InMemoryBackend)> = None;
        let groups = self.build_groups(clock, |g, _| {
            // Each group has its own counters: the groups never share a store.
            let shared = match &counters {
                Some((group, shared)) if *group == g => shared.clone(),
                _ => {
                    let shared = InMemoryBackend::new().clock(clock);
                    counters = Some((g, shared.clone()));
                    shared
                }
            };
            SharedStore::new(FaultyStore {
                counters: shared,
                fault: fault.clone(),
                slow_by,
            })
        })?;
        self.drive(groups, &fault, start).await
    }

    /// Runs the scenario in real time against stores of the caller's own: `stores(g, i)`
    /// gives the store of instance `i` of group `g` (the groups in the order of
    /// [`group_names`](Self::group_names), each with the instances of
    /// [`group_instances`](Self::group_instances); a group's instances should share their
    /// counters, and the groups should not), and `switch` makes them fail during the
    /// outage. The limiters run on the system clock.
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::Pin;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use tollgate_simulator::{
    ///     FaultKind, FaultSwitch, Phase, PolicyName, Scenario, SimulationError,
    /// };
    /// use tollgate::future::StoreFuture;
    /// use tollgate::store::{Backend, CallerKey, CheckOutcome, StoreError};
    /// use tollgate::{InMemoryBackend, Policy};
    ///
    /// /// A store that fails while its switch is on.
    /// #[derive(Clone, Debug)]
    /// struct Switchable(InMemoryBackend, Arc<AtomicBool>);
    ///
    /// impl Backend for Switchable {
    ///     fn check(
    ///         &self,
    ///         caller: &CallerKey,
    ///         limits: &Arc<[Policy]>,
    ///         cost: u64,
    ///     ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
    ///         if self.1.load(Ordering::SeqCst) {
    ///             let down = StoreError::unavailable("down");
    ///             return StoreFuture::ready(Err(down));
    ///         }
    ///         self.0.check(caller, limits, cost)
    ///     }
    /// }
    ///
    /// #[derive(Debug)]
    /// struct Switch(Arc<AtomicBool>);
    ///
    /// impl FaultSwitch for Switch {
    ///     fn set(
    ///         &self,
    ///         fault: Option<FaultKind>,
    ///     ) -> Pin<Box<dyn Future<Output = Result<(), SimulationError>> + Send + '_>> {
    ///         self.0.store(fault.is_some(), Ordering::SeqCst);
    ///         Box::pin(async { Ok(()) })
    ///     }
    /// }
    ///
    /// let down = Arc::new(AtomicBool::new(false));
    /// let store = Switchable(InMemoryBackend::new(), down.clone());
    /// let scenario = Scenario::new()
    ///     .policies([PolicyName::Closed])
    ///     .normal_secs(1).outage_secs(1).recovery_secs(1);
    /// let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// let report = runtime
    ///     .block_on(scenario.run_against(|_, _| store.clone(), &Switch(down)))
    ///     .unwrap();
    /// assert_eq!(report.row("closed", Phase::Outage, "initech").unwrap().admitted_per_sec, 0.0);
    /// ```
    pub async fn run_against<B: Backend>(
        &self,
        mut stores: impl FnMut(usize, usize) -> B,
        switch: &dyn FaultSwitch,
    ) -> Result<Report, SimulationError> {
        self.validate()?;
        let groups =
            self.build_groups(SimClock::system(), |g, i| SharedStore::new(stores(g, i)))?;
        self.drive(groups, switch, Instant::now()).await
    }

    fn build_groups(
        &self,
        clock: SimClock,
        mut store: impl FnMut(usize, usize) -> SharedStore,
    ) -> Result<Vec<Group>, SimulationError> {
        let own_layer = UserLayer::keyed_on(CUSTOMER_HEADER);
        let layer = self.layer.as_ref().unwrap_or(&own_layer);
        let mut groups = Vec::new();
        for (g, (name, kind)) in self.groups().enumerate() {
            let running = self.running(&kind);
            let mut instances = Vec::with_capacity(running);
            let mut limiters = Vec::with_capacity(running);
            for i in 0..running {
                let context = InstanceContext {
                    group: name.clone(),
                    group_index: g,
                    instance: i,
                    instances: running,
                    store: store(g, i),
                    clock,
                };
                let built = match &kind {
                    GroupKind::Builtin(policy) => {
                        let builder = context
                            .limiter_builder()
                            .policy(self.policy())
                            .on_store_failure(
                                policy.failure_policy_at(self.instances as u64, i as u64),
                            )
                            .store_timeout(Duration::from_millis(self.store_timeout_ms))
                            .breaker(self.breaker());
                        match policy.leases(self.instances as u64) {
                            Some(leases) => builder.leases(leases),
                            None => builder,
                        }
                        .try_build()
                    }
                    GroupKind::Custom(custom) => (custom.factory)(&context),
                };
                let limiter = built.map_err(|error| SimulationError::Build {
                    group: name.clone(),
                    error,
                })?;
                let (limited, deciding) = layer.build(limiter);
                instances.push(match &self.front {
                    Some(front) => front.wrap(limited),
                    None => endpoint(limited),
                });
                limiters.push(deciding);
            }
            groups.push(Group {
                pin_first: matches!(kind, GroupKind::Builtin(p) if p.pins_first_customer()),
                windows: limiters.first().map(policy_windows).unwrap_or_default(),
                instances,
                limiters,
            });
        }
        Ok(groups)
    }

    /// The ends of the normal and outage phases, in milliseconds from the start.
    fn boundaries_ms(&self) -> [f64; 2] {
        [
            (self.normal_secs * 1_000) as f64,
            ((self.normal_secs + self.outage_secs) * 1_000) as f64,
        ]
    }

    /// Sends every customer's requests on schedule (request `k` of a customer sending
    /// `rate` per second at `k / rate` s) to the instances in turn, switches the fault at
    /// the phase boundaries, and tallies the answers by the phase and second each request
    /// was sent in.
    async fn drive(
        &self,
        groups: Vec<Group>,
        fault: &dyn FaultSwitch,
        start: Instant,
    ) -> Result<Report, SimulationError> {
        let customers = &self.traffic;
        let prepared = customers
            .iter()
            .map(|customer| customer.prepare().map(Arc::new))
            .collect::<Result<Vec<_>, ScenarioError>>()?;
        let total_ms = (self.total_secs() * 1_000) as f64;
        let boundaries = self.boundaries_ms();
        let names = self.group_names();
        let tallies = Arc::new(Mutex::new(
            names
                .iter()
                .map(|name| Tally {
                    report: GroupReport {
                        name: name.clone(),
                        phases: vec![[Counts::default(); 3]; customers.len()],
                        per_second: vec![vec![0; self.total_secs() as usize]; customers.len()],
                        closed_after: None,
                        trace: Vec::new(),
                        windows: Vec::new(),
                        worst: Vec::new(),
                    },
                    admitted: customers
                        .iter()
                        .map(|c| {
                            let requests = (total_ms * c.rate() / 1_000.0).ceil() as usize + 1;
                            vec![0; requests.div_ceil(64)]
                        })
                        .collect(),
                })
                .collect::<Vec<_>>(),
        ));
        let traced = self
            .traced
            .as_ref()
            .and_then(|name| customers.iter().position(|c| c.name() == name));
        let groups = Arc::new(groups);
        let mut next = vec![vec![0u64; customers.len()]; groups.len()];
        let mut back_on_store: Vec<Option<Duration>> = vec![None; groups.len()];
        let mut restored_at: Option<Instant> = None;
        let mut boundary = 0;
        let mut tasks = JoinSet::new();

        // Sends every request due by `until_ms`; returns when the next one is due.
        let mut dispatch = |until_ms: f64, inclusive: bool, tasks: &mut JoinSet<()>| -> f64 {
            let mut next_due = f64::INFINITY;
            for (g, group) in groups.iter().enumerate() {
                for (c, customer) in customers.iter().enumerate() {
                    loop {
                        let k = next[g][c];
                        let t_ms = sent_at_ms(k, customer.rate());
                        let due = if inclusive {
                            t_ms <= until_ms
                        } else {
                            t_ms < until_ms
                        };
                        if t_ms >= total_ms {
                            break;
                        }
                        if !due {
                            next_due = next_due.min(t_ms);
                            break;
                        }
                        next[g][c] += 1;
                        let instance = if c == 0 && group.pin_first {
                            0
                        } else {
                            (k % group.instances.len() as u64) as usize
                        };
                        let phase = phase_of(t_ms, boundaries);
                        let second = (t_ms / 1_000.0) as usize;
                        lock(&tallies)[g].report.phases[c][phase].sent += 1;
                        let call = (group.instances[instance])(request_of(&prepared[c]));
                        let tallies = tallies.clone();
                        let is_traced = traced == Some(c);
                        tasks.spawn(async move {
                            let answer = call.await;
                            let mut tallies = lock(&tallies);
                            let Tally {
                                report: tally,
                                admitted,
                            } = &mut tallies[g];
                            if is_traced {
                                tally.trace.push(traced_request(t_ms, instance, &answer));
                            }
                            let counts = &mut tally.phases[c][phase];
                            match answer.handled {
                                Some(handled) if handled.soft_limited => counts.soft_limited += 1,
                                Some(_) => {
                                    counts.admitted += 1;
                                    if let Some(slot) = tally.per_second[c].get_mut(second) {
                                        *slot += 1;
                                    }
                                    if let Some(word) = admitted[c].get_mut((k / 64) as usize) {
                                        *word |= 1u64 << (k % 64);
                                    }
                                }
                                None if answer.failed => counts.other += 1,
                                None => match answer.status {
                                    StatusCode::TOO_MANY_REQUESTS => counts.refused_429 += 1,
                                    StatusCode::SERVICE_UNAVAILABLE => counts.refused_503 += 1,
                                    _ => counts.other += 1,
                                },
                            }
                        });
                    }
                }
            }
            next_due
        };

        // Wake up when the next request or phase boundary is due: on virtual time the clock
        // jumps straight there (through any timer that fires first, such as a store
        // timeout). (Nothing is due before 0 ms: this only finds the first request.)
        let mut next_due = dispatch(-1.0, false, &mut tasks);
        loop {
            let wake_ms = match boundaries.get(boundary) {
                Some(&b) => next_due.min(b),
                None => next_due,
            };
            if wake_ms.is_infinite() {
                break;
            }
            tokio::time::sleep_until(start + Duration::from_secs_f64(wake_ms / 1_000.0)).await;
            // Never behind the time slept to (a timer may round its deadline to the
            // millisecond).
            let now_ms = (start.elapsed().as_secs_f64() * 1_000.0).max(wake_ms);
            while boundary < 2 && boundaries[boundary] <= now_ms {
                // Everything sent before the boundary goes out before the fault changes.
                dispatch(boundaries[boundary], false, &mut tasks);
                if boundary == 0 {
                    fault.set(Some(self.fault)).await?;
                } else {
                    fault.set(None).await?;
                    restored_at = Some(Instant::now());
                }
                boundary += 1;
            }
            next_due = dispatch(now_ms, true, &mut tasks);
            if let Some(restored_at) = restored_at {
                for (g, group) in groups.iter().enumerate() {
                    if back_on_store[g].is_none()
                        && group
                            .limiters
                            .iter()
                            .all(|l| l.breaker_state() == BreakerState::Closed)
                    {
                        back_on_store[g] = Some(restored_at.elapsed());
                    }
                }
            }
            while let Some(done) = tasks.try_join_next() {
                done.map_err(|e| SimulationError::Runtime(format!("a request task failed: {e}")))?;
            }
        }
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| SimulationError::Runtime(format!("a request task failed: {e}")))?;
        }
        let tallies = std::mem::take(&mut *lock(&tallies));
        let ends_ns = [
            self.normal_secs * 1_000_000_000,
            (self.normal_secs + self.outage_secs) * 1_000_000_000,
            self.total_secs() * 1_000_000_000,
        ];
        let mut reports = Vec::with_capacity(tallies.len());
        for ((tally, closed_after), deployed) in
            tallies.into_iter().zip(back_on_store).zip(groups.iter())
        {
            let mut group = tally.report;
            group.closed_after = closed_after;
            group.windows = deployed.windows.clone();
            // The answers came in the order they were decided; a blackholed or slow store
            // decides late.
            group.trace.sort_by_key(|t| t.sent_at);
            for (c, bits) in tally.admitted.iter().enumerate() {
                let rate = customers[c].rate();
                let sent: Vec<u64> = admitted_requests(bits)
                    .map(|k| sent_at(sent_at_ms(k, rate)).as_nanos() as u64)
                    .collect();
                let worst: Vec<[u64; 3]> = group
                    .windows
                    .iter()
                    .map(|(_, window)| worst_windows(&sent, window.as_nanos() as u64, ends_ns))
                    .collect();
                if let Some(first) = worst.first() {
                    for (counts, worst) in group.phases[c].iter_mut().zip(first) {
                        counts.worst_window_admitted = *worst;
                    }
                }
                group.worst.push(worst);
            }
            reports.push(group);
        }
        Ok(Report {
            customers: customers.clone(),
            phase_secs: [self.normal_secs, self.outage_secs, self.recovery_secs],
            window: Duration::from_secs(self.window_secs),
            groups: reports,
        })
    }
}

/// What the layer decided for one request of the traced customer, from the decision it
/// leaves in the response's extensions.
fn traced_request(t_ms: f64, instance: usize, answer: &Answer) -> Traced {
    let info = answer.decision.as_ref().and_then(Decision::info);
    let policy = info.and_then(|info| info.policy(0));
    let settled = answer.settlement.as_ref().filter(|s| s.counted());
    Traced {
        sent_at: sent_at(t_ms),
        instance,
        status: answer.status.as_u16(),
        source: info.map(|info| info.source()),
        quota: policy.map(|p| p.quota()),
        remaining: policy.map(|p| p.remaining()),
        handled: answer.handled.is_some(),
        soft_limited: answer.handled.is_some_and(|h| h.soft_limited),
        // A settled decision reports what it was settled at: the reservation is the
        // settlement's.
        cost: settled
            .map(Settlement::reserved)
            .or(info.map(|info| info.cost())),
        settled: settled.map(Settlement::actual),
    }
}

/// One request of a customer, from its template.
pub(crate) fn request_of(prepared: &Prepared) -> Request<SimBody> {
    let mut request = Request::new(SimBody::from_bytes(prepared.body.clone()));
    *request.method_mut() = prepared.method.clone();
    *request.uri_mut() = prepared.uri.clone();
    *request.headers_mut() = prepared.headers.clone();
    request.extensions_mut().insert(prepared.answering.clone());
    request
}

/// The policies of `limiter` whose windows the report measures, by name: the defaults,
/// then each tier's not among them yet, each with its window (a token bucket's refill
/// period).
fn policy_windows(limiter: &Limiter) -> Vec<(String, Duration)> {
    let limits = limiter.limits();
    let mut windows: Vec<(String, Duration)> = Vec::new();
    let tiers = limits.tiers().flat_map(|(_, policies)| policies.iter());
    for policy in limits.policies().iter().chain(tiers) {
        let window_ms = match *policy.algorithm() {
            Algorithm::TokenBucket { period_ms, .. } => period_ms,
            ref other => other.window_ms(),
        };
        let entry = (policy.name().to_owned(), Duration::from_millis(window_ms));
        if !windows.contains(&entry) {
            windows.push(entry);
        }
    }
    windows
}

/// When request `k` of a customer sending `rate` per second goes out, in milliseconds from
/// the start.
pub(crate) fn sent_at_ms(k: u64, rate: f64) -> f64 {
    k as f64 * 1_000.0 / rate
}

/// A send time as the report gives it: the trace's and the worst windows' are the same.
pub(crate) fn sent_at(t_ms: f64) -> Duration {
    Duration::from_secs_f64(t_ms / 1_000.0)
}

/// The numbers of a customer's admitted requests, in the order they were sent, from a set
/// with bit `k` for its request `k`.
pub(crate) fn admitted_requests(bits: &[u64]) -> impl Iterator<Item = u64> + '_ {
    bits.iter().enumerate().flat_map(|(i, &word)| {
        (0..64u64)
            .filter(move |b| word & (1u64 << b) != 0)
            .map(move |b| i as u64 * 64 + b)
    })
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn phase_of(t_ms: f64, boundaries: [f64; 2]) -> usize {
    boundaries.iter().take_while(|&&b| t_ms >= b).count()
}
