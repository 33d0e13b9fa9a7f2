//! One limit across regions: a deployment whose instances run in several regions, each
//! region with a store of its own, replayed on virtual time through tollgate's real layer,
//! limiter, breaker and failure policies, with a region cut off from the global store or a
//! region's own store lost.
//!
//! Two ways of counting run side by side ([`Counting`]): the two-tier store, where each
//! region's store leases each caller's *global* quota from a global store one WAN round
//! trip away and decides locally against what it leased (the regions together keep one
//! limit), and each region counting alone, as a Redis per region does today (the limit is
//! enforced once per region). The model of the two-tier store is in `regional.rs` (a
//! region's store, a tollgate `Backend`) and `global.rs` (the global store); the guide page
//! on regions in tollgate's docs explains it.

use std::fmt;
use std::str::FromStr;

use crate::scenario::{Customer, MAX_REQUESTS, ScenarioError, range};

mod global;
mod regional;
mod report;
mod run;
mod window;

pub use report::{GlobalRow, RegionRow, RegionsGroup, RegionsReport};

/// How a region's share of the global limit is sized, for when it is cut off from the
/// global store.
///
/// ```
/// use tollgate_simulator::ShareBy;
/// assert_eq!("weight".parse::<ShareBy>().unwrap(), ShareBy::Weight);
/// assert_eq!(ShareBy::Demand.name(), "demand");
/// assert!("luck".parse::<ShareBy>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShareBy {
    /// Each region's part of the demand for the caller that the regions last reported to
    /// the global store: a region that sees 80% of a caller's requests falls back to 80%
    /// of its limit. A region that never asked for a caller has no share of it.
    #[default]
    Demand,
    /// Each region's [`weight`](Region::weight) among the regions' weights, whatever the
    /// caller's traffic: the global store keeps each region's share in reserve for every
    /// caller the region has not asked for yet.
    Weight,
}

impl ShareBy {
    /// The name [`FromStr`] reads.
    pub fn name(self) -> &'static str {
        match self {
            ShareBy::Demand => "demand",
            ShareBy::Weight => "weight",
        }
    }
}

impl FromStr for ShareBy {
    type Err = ScenarioError;

    fn from_str(name: &str) -> Result<Self, ScenarioError> {
        match name {
            "demand" => Ok(ShareBy::Demand),
            "weight" => Ok(ShareBy::Weight),
            other => Err(ScenarioError::UnknownShareBy(other.to_owned())),
        }
    }
}

/// How the regions count, one group of instances each.
///
/// ```
/// use tollgate_simulator::Counting;
/// assert_eq!(Counting::TwoTier.name(), "two-tier");
/// assert_eq!(Counting::ALL.map(Counting::name), ["two-tier", "per-region"]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Counting {
    /// Each region's store leases the caller's global quota from the global store and
    /// decides against what it leased: one limit across the regions.
    TwoTier,
    /// Each region's store counts alone, the global limit enforced in each region: what a
    /// Redis per region does without a global store.
    PerRegion,
}

impl Counting {
    /// Both, in the order the tables list them.
    pub const ALL: [Counting; 2] = [Counting::TwoTier, Counting::PerRegion];

    /// The group's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Counting::TwoTier => "two-tier",
            Counting::PerRegion => "per-region",
        }
    }
}

/// What fails during the fault phase.
///
/// ```
/// use tollgate_simulator::RegionFault;
/// let fault = RegionFault::Partition("us-east".to_owned());
/// assert_eq!(fault.to_string(), "us-east cut off from the global store");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RegionFault {
    /// The region cannot reach the global store (its calls and their answers are lost;
    /// the region waits out its WAN timeout); its own store and the other regions are fine.
    Partition(String),
    /// No region can reach the global store.
    GlobalLost,
    /// The region's own store is lost: its instances' limiters fall back to their failure
    /// policy, as they do today when their store fails.
    StoreLost(String),
}

impl RegionFault {
    fn region(&self) -> Option<&str> {
        match self {
            RegionFault::Partition(region) | RegionFault::StoreLost(region) => Some(region),
            RegionFault::GlobalLost => None,
        }
    }
}

impl fmt::Display for RegionFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionFault::Partition(region) => {
                write!(f, "{region} cut off from the global store")
            }
            RegionFault::GlobalLost => f.write_str("the global store lost"),
            RegionFault::StoreLost(region) => write!(f, "{region}'s own store lost"),
        }
    }
}

/// One region: its name, its limiter instances, and its weight (for shares by weight).
///
/// ```
/// use tollgate_simulator::Region;
/// let region = Region::new("eu-west", 4);
/// assert_eq!((region.name(), region.instances(), region.weight_value()), ("eu-west", 4, 4));
/// assert_eq!(region.weight(1).weight_value(), 1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    name: String,
    instances: usize,
    weight: u64,
}

impl Region {
    /// A region called `name` running `instances` limiter instances, weighing as many.
    pub fn new(name: impl Into<String>, instances: usize) -> Self {
        Self {
            name: name.into(),
            instances,
            weight: instances as u64,
        }
    }

    /// The region's weight among the regions' weights, for [`ShareBy::Weight`] (default:
    /// its instance count).
    pub fn weight(mut self, weight: u64) -> Self {
        self.weight = weight;
        self
    }

    /// The region's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its limiter instances.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// Its weight.
    pub fn weight_value(&self) -> u64 {
        self.weight
    }
}

/// A customer sending `rate` requests per second in all, spread over the regions: a
/// fraction of its requests in each, in the order of the scenario's regions.
///
/// ```
/// use tollgate_simulator::RegionalCustomer;
/// let acme = RegionalCustomer::new("acme", 120.0, [0.80, 0.15, 0.05]);
/// assert_eq!(acme.rate_in(0), 96.0);
/// assert_eq!(acme.spread(), [0.80, 0.15, 0.05]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RegionalCustomer {
    name: String,
    rate: f64,
    spread: Vec<f64>,
}

impl RegionalCustomer {
    /// `name` sending `rate` requests per second, `spread[i]` of them in region `i`.
    pub fn new(name: impl Into<String>, rate: f64, spread: impl IntoIterator<Item = f64>) -> Self {
        Self {
            name: name.into(),
            rate,
            spread: spread.into_iter().collect(),
        }
    }

    /// Its name (its key).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its requests per second, all regions together.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The fraction of its requests sent in each region.
    pub fn spread(&self) -> &[f64] {
        &self.spread
    }

    /// Its requests per second in region `region` (0 for a region out of range).
    pub fn rate_in(&self, region: usize) -> f64 {
        self.rate * self.spread.get(region).copied().unwrap_or(0.0)
    }

    fn check(&self, regions: usize) -> Result<(), ScenarioError> {
        Customer::new(self.name.clone(), self.rate).check()?;
        let sum: f64 = self.spread.iter().sum();
        let fractions = self
            .spread
            .iter()
            .all(|f| f.is_finite() && (0.0..=1.0).contains(f));
        if self.spread.len() != regions || !fractions || (sum - 1.0).abs() > 1e-9 {
            return Err(ScenarioError::BadSpread {
                customer: self.name.clone(),
                spread: self.spread.clone(),
            });
        }
        Ok(())
    }
}

/// A deployment across regions with one limit per customer, and a fault: the running
/// example (50 requests per second per customer, acme sending 120, globex 20, initech 5)
/// on three regions of 4 instances each, acme's requests spread 80/15/5 over them, and
/// `us-east`, the busiest, cut off from the global store for 30 s between 30 s of normal
/// traffic and 30 s of recovery. The global store is a WAN round trip of 100 ms away.
///
/// Each [`Counting`] runs its own instances through the same timeline; every instance is
/// tollgate's real `RateLimitLayer` (keyed on `x-customer-id`) around a handler, its
/// limiter on its region's store with a local share as its failure policy (the limit
/// divided among all regions' instances for the two-tier store, among the region's own
/// instances when each region counts alone). The two-tier store's limiters have no denial
/// cache: the regional store sees every request, the refused ones too, and sizes leases
/// and shares by that demand.
///
/// ```
/// use tollgate_simulator::{Phase, Regions};
///
/// let report = Regions::default().normal_secs(4).fault_secs(4).recovery_secs(4).run_blocking()?;
/// // Counting alone, each region enforces the whole limit: acme gets 50 in us-east and
/// // all it sends elsewhere.
/// let alone = report.row("per-region", Phase::Normal, "acme").unwrap();
/// assert!(alone.worst_window_admitted > 70, "{alone:?}");
/// // The two-tier store keeps the regions together at the limit, through the partition.
/// for phase in Phase::ALL {
///     let global = report.row("two-tier", phase, "acme").unwrap();
///     assert!(global.worst_window_admitted <= 52, "{global:?}");
/// }
/// # Ok::<(), tollgate_simulator::SimulationError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Regions {
    pub(crate) limit: u64,
    pub(crate) window_secs: u64,
    pub(crate) regions: Vec<Region>,
    pub(crate) traffic: Vec<RegionalCustomer>,
    pub(crate) wan_rtt_ms: u64,
    pub(crate) wan_timeout_ms: u64,
    pub(crate) lease_horizon_ms: u64,
    pub(crate) probe_ms: u64,
    pub(crate) share_by: ShareBy,
    pub(crate) fault: RegionFault,
    pub(crate) normal_secs: u64,
    pub(crate) fault_secs: u64,
    pub(crate) recovery_secs: u64,
    pub(crate) counting: Vec<Counting>,
    pub(crate) store_timeout_ms: u64,
}

impl Default for Regions {
    fn default() -> Self {
        Self {
            limit: 50,
            window_secs: 1,
            regions: vec![
                Region::new("us-east", 4),
                Region::new("eu-west", 4),
                Region::new("ap-south", 4),
            ],
            traffic: vec![
                RegionalCustomer::new("acme", 120.0, [0.80, 0.15, 0.05]),
                RegionalCustomer::new("globex", 20.0, [0.25, 0.50, 0.25]),
                RegionalCustomer::new("initech", 5.0, [0.0, 0.0, 1.0]),
            ],
            wan_rtt_ms: 100,
            wan_timeout_ms: 300,
            lease_horizon_ms: 200,
            probe_ms: 1_000,
            share_by: ShareBy::Demand,
            fault: RegionFault::Partition("us-east".to_owned()),
            normal_secs: 30,
            fault_secs: 30,
            recovery_secs: 30,
            counting: Counting::ALL.to_vec(),
            store_timeout_ms: 20,
        }
    }
}

impl Regions {
    /// The running example across regions; the same as [`Regions::default`].
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().regions_value().len(), 3);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests per window per customer, all regions together (1 to 10^9; default 50).
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().limit(40).limit_value(), 40);
    /// ```
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// The window of the limit, in whole seconds (1 to 86400; default 1).
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().window_secs(60).window_secs_value(), 60);
    /// ```
    pub fn window_secs(mut self, secs: u64) -> Self {
        self.window_secs = secs;
        self
    }

    /// The regions, in order (default: `us-east`, `eu-west` and `ap-south`, 4 instances
    /// each). Each customer's spread has one fraction per region.
    ///
    /// ```
    /// use tollgate_simulator::{Region, Regions, RegionalCustomer, RegionFault};
    /// let scenario = Regions::new()
    ///     .regions([Region::new("a", 2), Region::new("b", 2)])
    ///     .traffic([RegionalCustomer::new("acme", 60.0, [0.5, 0.5])])
    ///     .fault(RegionFault::Partition("a".to_owned()));
    /// assert!(scenario.validate().is_ok());
    /// ```
    pub fn regions(mut self, regions: impl IntoIterator<Item = Region>) -> Self {
        self.regions = regions.into_iter().collect();
        self
    }

    /// The customers and their spread over the regions (default: acme 120/s spread
    /// 80/15/5, globex 20/s spread 25/50/25, initech 5/s all in the third region).
    ///
    /// ```
    /// use tollgate_simulator::{Regions, RegionalCustomer};
    /// let scenario = Regions::new().traffic([RegionalCustomer::new("big", 200.0, [1.0, 0.0, 0.0])]);
    /// assert_eq!(scenario.traffic_value()[0].name(), "big");
    /// ```
    pub fn traffic(mut self, customers: impl IntoIterator<Item = RegionalCustomer>) -> Self {
        self.traffic = customers.into_iter().collect();
        self
    }

    /// The WAN round trip between a region and the global store, in milliseconds (1 to
    /// 10000; default 100).
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().wan_rtt_ms(150).wan_rtt_ms_value(), 150);
    /// ```
    pub fn wan_rtt_ms(mut self, ms: u64) -> Self {
        self.wan_rtt_ms = ms;
        self
    }

    /// How long a region waits for the global store's answer before it takes itself as
    /// cut off, in milliseconds (at least the round trip, at most 60000; default 300).
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert!(Regions::new().wan_timeout_ms(50).validate().is_err());
    /// ```
    pub fn wan_timeout_ms(mut self, ms: u64) -> Self {
        self.wan_timeout_ms = ms;
        self
    }

    /// How much of a region's demand a lease covers beyond the round trip it takes to
    /// get it, in milliseconds (0 to 60000; default 200). Longer leases mean fewer WAN
    /// calls, and units held longer by one region that another could have used.
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().lease_horizon_ms(500).lease_horizon_ms_value(), 500);
    /// ```
    pub fn lease_horizon_ms(mut self, ms: u64) -> Self {
        self.lease_horizon_ms = ms;
        self
    }

    /// How often a region cut off tries the global store again, in milliseconds (1 to
    /// 60000; default 1000).
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().probe_ms(250).probe_ms_value(), 250);
    /// ```
    pub fn probe_ms(mut self, ms: u64) -> Self {
        self.probe_ms = ms;
        self
    }

    /// How a region's share is sized (default: by demand).
    ///
    /// ```
    /// use tollgate_simulator::{Regions, ShareBy};
    /// assert_eq!(Regions::new().share_by(ShareBy::Weight).share_by_value(), ShareBy::Weight);
    /// ```
    pub fn share_by(mut self, share_by: ShareBy) -> Self {
        self.share_by = share_by;
        self
    }

    /// What fails during the fault phase (default: the first region cut off from the
    /// global store).
    ///
    /// ```
    /// use tollgate_simulator::{Regions, RegionFault};
    /// let scenario = Regions::new().fault(RegionFault::StoreLost("eu-west".to_owned()));
    /// assert!(scenario.validate().is_ok());
    /// assert!(Regions::new().fault(RegionFault::StoreLost("mars".to_owned())).validate().is_err());
    /// ```
    pub fn fault(mut self, fault: RegionFault) -> Self {
        self.fault = fault;
        self
    }

    /// The length of the phase before the fault, in seconds (1 to 86400; default 30).
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Regions};
    /// assert_eq!(Regions::new().normal_secs(5).phase_secs(Phase::Normal), 5);
    /// ```
    pub fn normal_secs(mut self, secs: u64) -> Self {
        self.normal_secs = secs;
        self
    }

    /// The length of the fault, in seconds (1 to 86400; default 30). It is the report's
    /// [`Phase::Outage`](crate::Phase::Outage).
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Regions};
    /// assert_eq!(Regions::new().fault_secs(10).phase_secs(Phase::Outage), 10);
    /// ```
    pub fn fault_secs(mut self, secs: u64) -> Self {
        self.fault_secs = secs;
        self
    }

    /// The length of the phase after the fault, in seconds (1 to 86400; default 30).
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Regions};
    /// assert_eq!(Regions::new().recovery_secs(5).phase_secs(Phase::Recovery), 5);
    /// ```
    pub fn recovery_secs(mut self, secs: u64) -> Self {
        self.recovery_secs = secs;
        self
    }

    /// The ways of counting to compare, one group each (default: both).
    ///
    /// ```
    /// use tollgate_simulator::{Counting, Regions};
    /// let scenario = Regions::new().counting([Counting::TwoTier]);
    /// assert_eq!(scenario.counting_value(), [Counting::TwoTier]);
    /// ```
    pub fn counting(mut self, counting: impl IntoIterator<Item = Counting>) -> Self {
        self.counting = counting.into_iter().collect();
        self
    }

    /// The limiters' timeout on their regional store, in milliseconds (1 to 60000;
    /// default 20).
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().store_timeout_ms(50).store_timeout_ms_value(), 50);
    /// ```
    pub fn store_timeout_ms(mut self, ms: u64) -> Self {
        self.store_timeout_ms = ms;
        self
    }

    /// The limit per window.
    pub fn limit_value(&self) -> u64 {
        self.limit
    }

    /// The window in seconds.
    pub fn window_secs_value(&self) -> u64 {
        self.window_secs
    }

    /// The regions.
    pub fn regions_value(&self) -> &[Region] {
        &self.regions
    }

    /// The customers.
    pub fn traffic_value(&self) -> &[RegionalCustomer] {
        &self.traffic
    }

    /// The WAN round trip in milliseconds.
    pub fn wan_rtt_ms_value(&self) -> u64 {
        self.wan_rtt_ms
    }

    /// The WAN timeout in milliseconds.
    pub fn wan_timeout_ms_value(&self) -> u64 {
        self.wan_timeout_ms
    }

    /// The lease horizon in milliseconds.
    pub fn lease_horizon_ms_value(&self) -> u64 {
        self.lease_horizon_ms
    }

    /// The probe interval in milliseconds.
    pub fn probe_ms_value(&self) -> u64 {
        self.probe_ms
    }

    /// How shares are sized.
    pub fn share_by_value(&self) -> ShareBy {
        self.share_by
    }

    /// The fault.
    pub fn fault_value(&self) -> &RegionFault {
        &self.fault
    }

    /// The ways of counting compared.
    pub fn counting_value(&self) -> &[Counting] {
        &self.counting
    }

    /// The limiters' store timeout in milliseconds.
    pub fn store_timeout_ms_value(&self) -> u64 {
        self.store_timeout_ms
    }

    /// The length of a phase in seconds (the fault's is [`Phase::Outage`](crate::Phase)'s).
    pub fn phase_secs(&self, phase: crate::Phase) -> u64 {
        match phase {
            crate::Phase::Normal => self.normal_secs,
            crate::Phase::Outage => self.fault_secs,
            crate::Phase::Recovery => self.recovery_secs,
        }
    }

    /// The whole run in seconds.
    ///
    /// ```
    /// use tollgate_simulator::Regions;
    /// assert_eq!(Regions::new().total_secs(), 90);
    /// ```
    pub fn total_secs(&self) -> u64 {
        self.normal_secs + self.fault_secs + self.recovery_secs
    }

    /// Checks the numbers: each setting in its range, regions with distinct valid names,
    /// valid customers each spread over every region, a fault in one of the regions, and
    /// not too many requests to simulate.
    ///
    /// ```
    /// use tollgate_simulator::{Regions, RegionalCustomer, ScenarioError};
    /// let error = Regions::new()
    ///     .traffic([RegionalCustomer::new("acme", 120.0, [0.5, 0.5])])
    ///     .validate()
    ///     .unwrap_err();
    /// assert!(matches!(error, ScenarioError::BadSpread { .. }));
    /// ```
    pub fn validate(&self) -> Result<(), ScenarioError> {
        range("limit", self.limit, 1, 1_000_000_000)?;
        range("window_secs", self.window_secs, 1, 86_400)?;
        range("wan_rtt_ms", self.wan_rtt_ms, 1, 10_000)?;
        range(
            "wan_timeout_ms",
            self.wan_timeout_ms,
            self.wan_rtt_ms,
            60_000,
        )?;
        range("lease_horizon_ms", self.lease_horizon_ms, 0, 60_000)?;
        range("probe_ms", self.probe_ms, 1, 60_000)?;
        range("normal_secs", self.normal_secs, 1, 86_400)?;
        range("fault_secs", self.fault_secs, 1, 86_400)?;
        range("recovery_secs", self.recovery_secs, 1, 86_400)?;
        range("store_timeout_ms", self.store_timeout_ms, 1, 60_000)?;
        if self.regions.is_empty() {
            return Err(ScenarioError::NoRegions);
        }
        for (i, region) in self.regions.iter().enumerate() {
            let name = &region.name;
            let valid = !name.is_empty()
                && name.len() <= 32
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !valid {
                return Err(ScenarioError::BadRegionName(name.clone()));
            }
            if self.regions[..i].iter().any(|r| &r.name == name) {
                return Err(ScenarioError::DuplicateRegion(name.clone()));
            }
            range("instances", region.instances as u64, 1, 1_000)?;
            range("weight", region.weight, 1, 1_000_000)?;
        }
        if let Some(region) = self.fault.region()
            && !self.regions.iter().any(|r| r.name == region)
        {
            return Err(ScenarioError::UnknownRegion(region.to_owned()));
        }
        if self.traffic.is_empty() {
            return Err(ScenarioError::NoCustomers);
        }
        for (i, customer) in self.traffic.iter().enumerate() {
            customer.check(self.regions.len())?;
            if self.traffic[..i].iter().any(|c| c.name == customer.name) {
                return Err(ScenarioError::DuplicateCustomer(customer.name.clone()));
            }
        }
        if self.counting.is_empty() {
            return Err(ScenarioError::NoGroups);
        }
        for (i, counting) in self.counting.iter().enumerate() {
            if self.counting[..i].contains(counting) {
                return Err(ScenarioError::DuplicateGroup(counting.name().to_owned()));
            }
        }
        let period_ms = u128::from(self.window_secs) * 1_000;
        if u128::from(self.limit) * period_ms >= 1 << 53 {
            return Err(ScenarioError::QuotaTooLarge);
        }
        let instances: usize = self.regions.iter().map(|r| r.instances).sum();
        let requests = self.traffic.iter().map(|c| c.rate).sum::<f64>()
            * self.total_secs() as f64
            * self.counting.len() as f64;
        if requests > MAX_REQUESTS || instances > 2_000 {
            return Err(ScenarioError::TooLarge {
                requests: requests as u64,
                instances,
            });
        }
        Ok(())
    }
}
