//! What a run across regions found: per way of counting, per customer and per phase, the
//! most admitted in one window by all regions together, and per region what was offered,
//! admitted and refused, and the WAN calls made.

use std::time::Duration;

use crate::report::{Counts, Phase};

use super::{Counting, RegionalCustomer};

/// What one way of counting's instances did, in every region.
///
/// ```
/// use tollgate_simulator::{Counting, Phase, Regions};
/// let report = Regions::new()
///     .counting([Counting::PerRegion])
///     .normal_secs(2).fault_secs(2).recovery_secs(2)
///     .run_blocking()
///     .unwrap();
/// let alone = &report.groups()[0];
/// assert_eq!((alone.name(), alone.counting()), ("per-region", Counting::PerRegion));
/// // acme sends 18 a second in eu-west (15% of 120), all admitted there.
/// let eu = alone.region(0, 1, Phase::Normal);
/// assert_eq!((eu.sent, eu.admitted), (36, 36));
/// // Counting alone makes no WAN call.
/// assert_eq!(alone.wan_calls(0, 1, Phase::Normal), 0);
/// assert_eq!(alone.admitted_each_second(0, 1), [18, 18, 18, 18, 18, 18]);
/// ```
#[derive(Clone, Debug)]
pub struct RegionsGroup {
    pub(crate) counting: Counting,
    /// Per customer, per region, per phase; each region's worst window in its own.
    pub(crate) counts: Vec<Vec<[Counts; 3]>>,
    /// Per customer, per phase: the worst window of all regions' admissions together.
    pub(crate) global_worst: Vec<[u64; 3]>,
    /// Per customer, per region, per phase: the WAN calls sent.
    pub(crate) wan_calls: Vec<Vec<[u64; 3]>>,
    /// Per customer, per region: the admitted requests sent in each second.
    pub(crate) per_second: Vec<Vec<Vec<u64>>>,
}

impl RegionsGroup {
    /// The group's name: its [`Counting`]'s.
    pub fn name(&self) -> &str {
        self.counting.name()
    }

    /// How it counts.
    pub fn counting(&self) -> Counting {
        self.counting
    }

    /// How the requests of the customer at index `customer` sent in region `region` in
    /// `phase` were answered; its `worst_window_admitted` is that region's alone. All zero
    /// for an index out of range.
    pub fn region(&self, customer: usize, region: usize, phase: Phase) -> Counts {
        self.counts
            .get(customer)
            .and_then(|regions| regions.get(region))
            .map(|phases| phases[phase.index()])
            .unwrap_or_default()
    }

    /// The same for all regions together: the counts added up, and as
    /// `worst_window_admitted` the most requests admitted within one window of the
    /// limit's length, every region's admissions together, that ends in the phase (the
    /// edges included, as [`Counts::worst_window_admitted`] says). This is the number the
    /// global limit is about.
    pub fn global(&self, customer: usize, phase: Phase) -> Counts {
        let mut total = Counts::default();
        for phases in self.counts.get(customer).into_iter().flatten() {
            let counts = phases[phase.index()];
            total.sent += counts.sent;
            total.admitted += counts.admitted;
            total.soft_limited += counts.soft_limited;
            total.refused_429 += counts.refused_429;
            total.refused_503 += counts.refused_503;
            total.other += counts.other;
        }
        total.worst_window_admitted = self
            .global_worst
            .get(customer)
            .map_or(0, |worst| worst[phase.index()]);
        total
    }

    /// The WAN calls the region's store sent for the customer in `phase` (leases, probes,
    /// and units going back, one call each whatever it carried; none when counting alone).
    pub fn wan_calls(&self, customer: usize, region: usize, phase: Phase) -> u64 {
        self.wan_calls
            .get(customer)
            .and_then(|regions| regions.get(region))
            .map_or(0, |phases| phases[phase.index()])
    }

    /// The customer's admitted requests in the region by the second they were sent in,
    /// from the start of the run; empty for an index out of range.
    pub fn admitted_each_second(&self, customer: usize, region: usize) -> &[u64] {
        self.per_second
            .get(customer)
            .and_then(|regions| regions.get(region))
            .map_or(&[], Vec::as_slice)
    }
}

/// One region's line of a [`GlobalRow`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RegionRow {
    /// The region's name.
    pub region: String,
    /// Requests sent in the region per second (whole-phase average).
    pub sent_per_sec: f64,
    /// Requests admitted in the region per second (whole-phase average).
    pub admitted_per_sec: f64,
    /// Requests answered 429 in the phase.
    pub refused_429: u64,
    /// Requests answered 503 in the phase.
    pub refused_503: u64,
    /// The most admitted within one window in the region alone.
    pub worst_window_admitted: u64,
    /// The WAN calls its store sent for the customer in the phase.
    pub wan_calls: u64,
}

/// One way of counting, one phase, one customer: all regions together, then each.
///
/// ```
/// use tollgate_simulator::{Phase, Regions};
/// let report = Regions::new().normal_secs(3).fault_secs(3).recovery_secs(3).run_blocking().unwrap();
/// let row = report.row("two-tier", Phase::Normal, "globex").unwrap();
/// assert_eq!(row.sent_per_sec, 20.0);
/// assert_eq!(row.regions.len(), 3);
/// assert_eq!(row.regions[1].region, "eu-west");
/// assert!(row.wan_calls_per_request > 0.0);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GlobalRow {
    /// The group's name.
    pub group: String,
    /// The phase (the fault is [`Phase::Outage`]).
    pub phase: Phase,
    /// The customer's name.
    pub customer: String,
    /// Requests sent per second, all regions (whole-phase average).
    pub sent_per_sec: f64,
    /// Requests admitted per second, all regions (whole-phase average).
    pub admitted_per_sec: f64,
    /// The most admitted within one window, all regions together, ending in the phase:
    /// [`RegionsGroup::global`].
    pub worst_window_admitted: u64,
    /// WAN calls made for the customer in the phase, all regions, per request it sent.
    pub wan_calls_per_request: f64,
    /// Each region's part, in the scenario's order.
    pub regions: Vec<RegionRow>,
}

/// The results of a run across regions, one group per [`Counting`] in the scenario's
/// order.
///
/// ```
/// use tollgate_simulator::Regions;
/// let report = Regions::new().normal_secs(1).fault_secs(1).recovery_secs(1).run_blocking().unwrap();
/// assert_eq!(report.regions(), ["us-east", "eu-west", "ap-south"]);
/// assert_eq!(report.rows().len(), 2 * 3 * 3);
/// assert_eq!(report.limit(), 50);
/// assert_eq!(report.window().as_secs(), 1);
/// assert!(report.group("two-tier").is_some());
/// ```
#[derive(Clone, Debug)]
pub struct RegionsReport {
    pub(crate) customers: Vec<RegionalCustomer>,
    pub(crate) regions: Vec<String>,
    pub(crate) phase_secs: [u64; 3],
    pub(crate) limit: u64,
    pub(crate) window: Duration,
    pub(crate) groups: Vec<RegionsGroup>,
}

impl RegionsReport {
    /// Each group's results.
    pub fn groups(&self) -> &[RegionsGroup] {
        &self.groups
    }

    /// The group called `name` (`"two-tier"`, `"per-region"`).
    pub fn group(&self, name: &str) -> Option<&RegionsGroup> {
        self.groups.iter().find(|g| g.name() == name)
    }

    /// The customers, in the order the counts use.
    pub fn customers(&self) -> &[RegionalCustomer] {
        &self.customers
    }

    /// The regions' names, in the order the counts use.
    pub fn regions(&self) -> &[String] {
        &self.regions
    }

    /// The limit per window, all regions together.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The limit's window: the length of the windows the worst windows count in.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Every row: group by group, phase by phase, customer by customer.
    pub fn rows(&self) -> Vec<GlobalRow> {
        let mut rows = Vec::new();
        for group in &self.groups {
            for phase in Phase::ALL {
                let secs = self.phase_secs[phase.index()] as f64;
                for (c, customer) in self.customers.iter().enumerate() {
                    let global = group.global(c, phase);
                    let regions: Vec<RegionRow> = self
                        .regions
                        .iter()
                        .enumerate()
                        .map(|(r, name)| {
                            let counts = group.region(c, r, phase);
                            RegionRow {
                                region: name.clone(),
                                sent_per_sec: counts.sent as f64 / secs,
                                admitted_per_sec: counts.admitted as f64 / secs,
                                refused_429: counts.refused_429,
                                refused_503: counts.refused_503,
                                worst_window_admitted: counts.worst_window_admitted,
                                wan_calls: group.wan_calls(c, r, phase),
                            }
                        })
                        .collect();
                    let calls: u64 = regions.iter().map(|r| r.wan_calls).sum();
                    rows.push(GlobalRow {
                        group: group.name().to_owned(),
                        phase,
                        customer: customer.name().to_owned(),
                        sent_per_sec: global.sent as f64 / secs,
                        admitted_per_sec: global.admitted as f64 / secs,
                        worst_window_admitted: global.worst_window_admitted,
                        wan_calls_per_request: if global.sent == 0 {
                            0.0
                        } else {
                            calls as f64 / global.sent as f64
                        },
                        regions,
                    });
                }
            }
        }
        rows
    }

    /// The row of one group, phase and customer, if there is one.
    pub fn row(&self, group: &str, phase: Phase, customer: &str) -> Option<GlobalRow> {
        self.rows()
            .into_iter()
            .find(|r| r.group == group && r.phase == phase && r.customer == customer)
    }

    /// Requests answered by something else than the handler, with a status other than 429
    /// and 503: never with the simulator's layer.
    pub fn unexpected_statuses(&self) -> u64 {
        self.groups
            .iter()
            .flat_map(|g| g.counts.iter().flatten().flatten())
            .map(|c| c.other)
            .sum()
    }
}
