//! Runs a [`Regions`] scenario: builds each way of counting's instances in every region
//! (the real layer and limiter on the region's store), sends every customer's requests in
//! each region on schedule, switches the fault at the phase boundaries, and tallies the
//! answers per region.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tokio::task::JoinSet;
use tokio::time::Instant;

use tollgate::store::CallerKey;
use tollgate::{FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota};

use super::global::GlobalStore;
use super::regional::{Link, RegionalStore};
use super::report::{RegionsGroup, RegionsReport};
use super::{Counting, RegionFault, Regions};
use crate::engine::{
    SimulationError, admitted_requests, lock, phase_of, request_of, sent_at, sent_at_ms,
};
use crate::report::{Counts, worst_windows};
use crate::scenario::{CUSTOMER_HEADER, Customer, Prepared};
use crate::service::{Endpoint, UserLayer, endpoint};
use crate::store::{
    FaultCell, FaultKind, FaultyStore, SharedStore, SimClock, VIRTUAL_EPOCH_MS, jitter,
};

/// One way of counting's deployment.
struct Deployed {
    counting: Counting,
    /// Per region, its instances behind a round robin.
    instances: Vec<Vec<Endpoint>>,
    /// The two-tier group's regional stores, for their WAN calls.
    regional: Vec<RegionalStore>,
}

/// The fault switches: the two-tier group's links and regional stores, and each region's
/// store when the regions count alone.
struct Switches {
    cut: Vec<Arc<AtomicBool>>,
    lost: Vec<Arc<AtomicBool>>,
    cells: Vec<FaultCell>,
}

/// What one group's requests found, while the run goes on.
struct Tally {
    /// Per customer, per region, per phase.
    counts: Vec<Vec<[Counts; 3]>>,
    /// Per customer, per region, per second.
    per_second: Vec<Vec<Vec<u64>>>,
    /// Per customer, per region: bit `k` set when request `k` was admitted.
    admitted: Vec<Vec<Vec<u64>>>,
}

impl Regions {
    /// Runs the scenario on virtual time on a runtime of its own (current-thread, clock
    /// paused); inside a tokio runtime, `.await` [`run`](Self::run) on a paused clock
    /// instead.
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Regions};
    /// let report = Regions::new().normal_secs(2).fault_secs(2).recovery_secs(2).run_blocking().unwrap();
    /// assert_eq!(report.groups().len(), 2);
    /// ```
    pub fn run_blocking(&self) -> Result<RegionsReport, SimulationError> {
        self.validate()?;
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(SimulationError::Runtime(
                "run_blocking inside a tokio runtime: await Regions::run instead".to_owned(),
            ));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .map_err(|e| SimulationError::Runtime(format!("cannot start a tokio runtime: {e}")))?;
        runtime.block_on(self.run())
    }

    /// Runs the scenario on tokio's clock: await it on a runtime whose clock is paused
    /// (`#[tokio::test(start_paused = true)]`) and the timeline is virtual.
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// let runtime = tokio::runtime::Builder::new_current_thread()
    ///     .enable_time()
    ///     .start_paused(true)
    ///     .build()
    ///     .unwrap();
    /// let scenario = Regions::new().normal_secs(1).fault_secs(1).recovery_secs(1);
    /// assert!(runtime.block_on(scenario.run()).is_ok());
    /// ```
    pub async fn run(&self) -> Result<RegionsReport, SimulationError> {
        self.validate()?;
        let start = Instant::now();
        let window_ms = self.window_secs * 1_000;
        let epoch_ms = VIRTUAL_EPOCH_MS - VIRTUAL_EPOCH_MS % window_ms;
        let clock = SimClock::virtual_time(epoch_ms, start);
        let regions = self.regions.len();
        let switches = Switches {
            cut: (0..regions).map(|_| Arc::default()).collect(),
            lost: (0..regions).map(|_| Arc::default()).collect(),
            cells: (0..regions).map(|_| FaultCell::default()).collect(),
        };
        let deployed = self.deploy(clock, &switches)?;
        let prepared = self
            .traffic
            .iter()
            .map(|c| Customer::new(c.name(), c.rate()).prepare().map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let tallies = self.drive(&deployed, &prepared, &switches, start).await?;
        for group in &deployed {
            for store in &group.regional {
                store.abort_calls();
            }
        }
        Ok(self.report(&deployed, tallies, epoch_ms))
    }

    /// The quota as a policy, named after its window as the outage scenario names it.
    fn quota_policy(&self) -> Policy {
        let name = match self.window_secs {
            1 => "per-second".to_owned(),
            60 => "per-minute".to_owned(),
            n => format!("per-{n}s"),
        };
        Policy::sliding_window(
            name,
            Quota::new(self.limit, Duration::from_secs(self.window_secs)),
        )
    }

    fn deploy(
        &self,
        clock: SimClock,
        switches: &Switches,
    ) -> Result<Vec<Deployed>, SimulationError> {
        let total: usize = self.regions.iter().map(|r| r.instances()).sum();
        let weights: Vec<u64> = self.regions.iter().map(|r| r.weight_value()).collect();
        let all_weights: u64 = weights.iter().sum();
        let layer = UserLayer::keyed_on(CUSTOMER_HEADER);
        let mut deployed = Vec::new();
        for (g, &counting) in self.counting.iter().enumerate() {
            let global = GlobalStore::new(clock, self.share_by, weights.clone());
            let mut instances = Vec::new();
            let mut regional = Vec::new();
            let mut place = 0;
            for (r, region) in self.regions.iter().enumerate() {
                let store = match counting {
                    Counting::TwoTier => {
                        let store = RegionalStore::new(
                            r,
                            global.clone(),
                            clock,
                            Link {
                                rtt_ms: self.wan_rtt_ms,
                                timeout_ms: self.wan_timeout_ms,
                                horizon_ms: self.lease_horizon_ms,
                                probe_ms: self.probe_ms,
                                cut: switches.cut[r].clone(),
                            },
                            switches.lost[r].clone(),
                            self.share_by,
                            (weights[r], all_weights),
                        );
                        regional.push(store.clone());
                        SharedStore::new(store)
                    }
                    Counting::PerRegion => SharedStore::new(FaultyStore {
                        counters: InMemoryBackend::new().clock(clock),
                        fault: switches.cells[r].clone(),
                        slow_by: Duration::from_millis(self.store_timeout_ms * 2),
                    }),
                };
                let mut endpoints = Vec::with_capacity(region.instances());
                for i in 0..region.instances() {
                    let builder = Limiter::builder()
                        .name(counting.name())
                        .breaker_jitter(jitter((g * 10_000 + place + 1) as u64))
                        .backend(store.clone())
                        .clock(clock)
                        .policy(self.quota_policy())
                        .store_timeout(Duration::from_millis(self.store_timeout_ms));
                    let builder = match counting {
                        // The regional store sees every request, refused ones too: it
                        // sizes leases and shares by the demand. The failure policy, when
                        // the regional store itself is lost: a share of the limit divided
                        // among all regions' instances, so that no region's instances
                        // admit more than their part of the one limit.
                        Counting::TwoTier => {
                            builder
                                .denial_cache(0)
                                .on_store_failure(FailurePolicy::local_share(
                                    InstanceCount::fixed(total as u64).at_place(place as u64),
                                ))
                        }
                        // Today's deployment: the region is a deployment of its own.
                        Counting::PerRegion => {
                            builder.on_store_failure(FailurePolicy::local_share(
                                InstanceCount::fixed(region.instances() as u64).at_place(i as u64),
                            ))
                        }
                    };
                    let limiter = builder
                        .try_build()
                        .map_err(|error| SimulationError::Build {
                            group: counting.name().to_owned(),
                            error,
                        })?;
                    let (limited, _) = layer.build(limiter);
                    endpoints.push(endpoint(limited));
                    place += 1;
                }
                instances.push(endpoints);
            }
            deployed.push(Deployed {
                counting,
                instances,
                regional,
            });
        }
        Ok(deployed)
    }

    /// Puts the fault in force, or ends it.
    fn switch(&self, switches: &Switches, on: bool) {
        let index = |name: &str| self.regions.iter().position(|r| r.name() == name);
        match &self.fault {
            RegionFault::Partition(name) => {
                if let Some(r) = index(name) {
                    switches.cut[r].store(on, Ordering::SeqCst);
                }
            }
            RegionFault::GlobalLost => {
                for cut in &switches.cut {
                    cut.store(on, Ordering::SeqCst);
                }
            }
            RegionFault::StoreLost(name) => {
                if let Some(r) = index(name) {
                    switches.lost[r].store(on, Ordering::SeqCst);
                    switches.cells[r].set(on.then_some(FaultKind::Refuse));
                }
            }
        }
    }

    fn boundaries_ms(&self) -> [f64; 2] {
        [
            (self.normal_secs * 1_000) as f64,
            ((self.normal_secs + self.fault_secs) * 1_000) as f64,
        ]
    }

    /// Sends each customer's requests in each region on schedule (its request `k` there at
    /// `k / rate` s, `rate` its requests per second in the region) to the region's
    /// instances in turn, and switches the fault at the phase boundaries.
    async fn drive(
        &self,
        deployed: &[Deployed],
        prepared: &[Arc<Prepared>],
        switches: &Switches,
        start: Instant,
    ) -> Result<Vec<Tally>, SimulationError> {
        let customers = &self.traffic;
        let regions = self.regions.len();
        let total_ms = (self.total_secs() * 1_000) as f64;
        let boundaries = self.boundaries_ms();
        let seconds = self.total_secs() as usize;
        let tallies = Arc::new(Mutex::new(
            deployed
                .iter()
                .map(|_| Tally {
                    counts: vec![vec![[Counts::default(); 3]; regions]; customers.len()],
                    per_second: vec![vec![vec![0; seconds]; regions]; customers.len()],
                    admitted: customers
                        .iter()
                        .map(|c| {
                            (0..regions)
                                .map(|r| {
                                    let requests =
                                        (total_ms * c.rate_in(r) / 1_000.0).ceil() as usize + 1;
                                    vec![0; requests.div_ceil(64)]
                                })
                                .collect()
                        })
                        .collect(),
                })
                .collect::<Vec<_>>(),
        ));
        let mut next = vec![vec![vec![0u64; regions]; customers.len()]; deployed.len()];
        let mut tasks = JoinSet::new();
        let mut dispatch = |until_ms: f64, inclusive: bool, tasks: &mut JoinSet<()>| -> f64 {
            let mut next_due = f64::INFINITY;
            for (g, group) in deployed.iter().enumerate() {
                for (c, customer) in customers.iter().enumerate() {
                    for (r, instances) in group.instances.iter().enumerate() {
                        let rate = customer.rate_in(r);
                        if rate <= 0.0 {
                            continue;
                        }
                        loop {
                            let k = next[g][c][r];
                            let t_ms = sent_at_ms(k, rate);
                            if t_ms >= total_ms {
                                break;
                            }
                            let due = if inclusive {
                                t_ms <= until_ms
                            } else {
                                t_ms < until_ms
                            };
                            if !due {
                                next_due = next_due.min(t_ms);
                                break;
                            }
                            next[g][c][r] += 1;
                            let instance = (k % instances.len() as u64) as usize;
                            let phase = phase_of(t_ms, boundaries);
                            let second = (t_ms / 1_000.0) as usize;
                            lock(&tallies)[g].counts[c][r][phase].sent += 1;
                            let call = (instances[instance])(request_of(&prepared[c]));
                            let tallies = tallies.clone();
                            tasks.spawn(async move {
                                let answer = call.await;
                                let mut tallies = lock(&tallies);
                                let tally = &mut tallies[g];
                                let counts = &mut tally.counts[c][r][phase];
                                match answer.handled {
                                    Some(_) => {
                                        counts.admitted += 1;
                                        if let Some(slot) = tally.per_second[c][r].get_mut(second) {
                                            *slot += 1;
                                        }
                                        if let Some(word) =
                                            tally.admitted[c][r].get_mut((k / 64) as usize)
                                        {
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
            }
            next_due
        };

        let mut next_due = dispatch(-1.0, false, &mut tasks);
        let mut boundary = 0;
        loop {
            let wake_ms = match boundaries.get(boundary) {
                Some(&b) => next_due.min(b),
                None => next_due,
            };
            if wake_ms.is_infinite() {
                break;
            }
            tokio::time::sleep_until(start + Duration::from_secs_f64(wake_ms / 1_000.0)).await;
            let now_ms = (start.elapsed().as_secs_f64() * 1_000.0).max(wake_ms);
            while boundary < 2 && boundaries[boundary] <= now_ms {
                // Everything sent before the boundary goes out before the fault changes.
                dispatch(boundaries[boundary], false, &mut tasks);
                self.switch(switches, boundary == 0);
                boundary += 1;
            }
            next_due = dispatch(now_ms, true, &mut tasks);
            while let Some(done) = tasks.try_join_next() {
                done.map_err(|e| SimulationError::Runtime(format!("a request task failed: {e}")))?;
            }
        }
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| SimulationError::Runtime(format!("a request task failed: {e}")))?;
        }
        Ok(std::mem::take(&mut *lock(&tallies)))
    }

    fn report(&self, deployed: &[Deployed], tallies: Vec<Tally>, epoch_ms: u64) -> RegionsReport {
        let window_ns = self.window_secs * 1_000_000_000;
        let ends_ns = [
            self.normal_secs * 1_000_000_000,
            (self.normal_secs + self.fault_secs) * 1_000_000_000,
            self.total_secs() * 1_000_000_000,
        ];
        let boundaries = self.boundaries_ms();
        let mut groups = Vec::new();
        for (group, mut tally) in deployed.iter().zip(tallies) {
            let mut global_worst = Vec::new();
            let mut wan_calls = Vec::new();
            for (c, customer) in self.traffic.iter().enumerate() {
                let mut all = Vec::new();
                for r in 0..self.regions.len() {
                    let rate = customer.rate_in(r);
                    let sent: Vec<u64> = admitted_requests(&tally.admitted[c][r])
                        .map(|k| sent_at(sent_at_ms(k, rate)).as_nanos() as u64)
                        .collect();
                    let worst = worst_windows(&sent, window_ns, ends_ns);
                    for (counts, worst) in tally.counts[c][r].iter_mut().zip(worst) {
                        counts.worst_window_admitted = worst;
                    }
                    all.extend(sent);
                }
                all.sort_unstable();
                global_worst.push(worst_windows(&all, window_ns, ends_ns));
                let key = CallerKey::new(customer.name());
                wan_calls.push(
                    (0..self.regions.len())
                        .map(|r| {
                            let mut phases = [0; 3];
                            if let Some(store) = group.regional.get(r) {
                                for at_ms in store.calls(&key) {
                                    let t_ms = at_ms.saturating_sub(epoch_ms) as f64;
                                    phases[phase_of(t_ms, boundaries)] += 1;
                                }
                            }
                            phases
                        })
                        .collect(),
                );
            }
            groups.push(RegionsGroup {
                counting: group.counting,
                counts: tally.counts,
                global_worst,
                wan_calls,
                per_second: tally.per_second,
            });
        }
        RegionsReport {
            customers: self.traffic.clone(),
            regions: self.regions.iter().map(|r| r.name().to_owned()).collect(),
            phase_secs: [self.normal_secs, self.fault_secs, self.recovery_secs],
            limit: self.limit,
            window: Duration::from_secs(self.window_secs),
            groups,
        }
    }
}
