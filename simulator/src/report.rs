//! What a run found: per group, per customer and per phase, what was sent and how it was
//! answered.

use std::fmt;
use std::time::Duration;

use tollgate::decision::DecisionSource;

use crate::scenario::Customer;

/// A phase of the timeline.
///
/// ```
/// use tollgate_simulator::Phase;
/// assert_eq!(Phase::ALL.map(Phase::name), ["normal", "outage", "recovery"]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before the outage: the store answers.
    Normal,
    /// The store fails.
    Outage,
    /// The store is back.
    Recovery,
}

impl Phase {
    /// The three phases, in order.
    pub const ALL: [Phase; 3] = [Phase::Normal, Phase::Outage, Phase::Recovery];

    /// The phase's name: `normal`, `outage` or `recovery`.
    ///
    /// ```
    /// use tollgate_simulator::Phase;
    /// assert_eq!(Phase::Recovery.name(), "recovery");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Phase::Normal => "normal",
            Phase::Outage => "outage",
            Phase::Recovery => "recovery",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Phase::Normal => 0,
            Phase::Outage => 1,
            Phase::Recovery => 2,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How one customer's requests of one phase were answered, and the most of them admitted
/// in any one window.
///
/// ```
/// use tollgate_simulator::{Counts, Phase, PolicyName, Scenario};
/// let counts = Counts::default();
/// let answered = counts.admitted + counts.soft_limited + counts.refused_429
///     + counts.refused_503 + counts.other;
/// assert_eq!(counts.sent, answered);
///
/// // The busiest second that ends in the outage holds at least its average second.
/// let report = Scenario::new()
///     .policies([PolicyName::LocalShare])
///     .normal_secs(2).outage_secs(2).recovery_secs(2)
///     .run_blocking()
///     .unwrap();
/// let outage = report.groups()[0].counts(0, Phase::Outage);
/// assert_eq!(report.window().as_secs(), 1);
/// assert!(outage.worst_window_admitted as f64 >= outage.admitted as f64 / 2.0, "{outage:?}");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Requests sent in the phase.
    pub sent: u64,
    /// Admitted by the layer: answered by the handler behind it, whatever the status the
    /// handler answered with ([`Customer::answers_status`](crate::Customer::answers_status)).
    pub admitted: u64,
    /// Let through to the handler by a soft limit
    /// ([`RateLimitLayer::soft_limit`](tollgate::RateLimitLayer::soft_limit)) although the
    /// policies refused them; not in [`admitted`](Self::admitted).
    pub soft_limited: u64,
    /// Answered 429 by the layer.
    pub refused_429: u64,
    /// Answered 503 by the layer.
    pub refused_503: u64,
    /// Answered otherwise, by something else than the handler: a key rejection (a
    /// missing or unknown key), a refusal whose status a layer of yours changed to
    /// another, a refusal of a layer in front of the rate limit
    /// ([`Scenario::in_front`](crate::Scenario::in_front)), an error instead of a response.
    /// Never with the simulator's own layer.
    pub other: u64,
    /// The most admitted requests sent within one window of the group's first policy
    /// that ends in this phase: the largest count of admitted requests sent in
    /// `[s, s + window)`, over every `s` with `s + window` after the phase's start and at
    /// its end at the latest. The window is the policy's own (a sliding window's, a
    /// token bucket's refill period): the scenario's
    /// [`window_secs`](crate::Scenario::window_secs) for a built-in group
    /// ([`Report::window`]), the limiter's first policy for callers without a tier for a
    /// group of your own; [`GroupReport::worst_windows`] has every policy's. It counts
    /// requests, whatever units each was charged.
    ///
    /// A request counts at the exact time the schedule sends it (a customer's request `k`
    /// at `k / rate` s, the [`Traced::sent_at`] of a traced one; the other fields put it in
    /// a phase by the same time), not by the second it falls in; on virtual time its
    /// instance decides it within the clock's millisecond of then. A window straddling a
    /// phase's start counts toward that phase, so the outage's row sees the normal
    /// phase's last admissions together with the outage's first, and the recovery's row
    /// the outage's last with the store's first; a window longer than the phase reaches
    /// back into the phases before it. It is at least the phase's admitted requests per
    /// window when the phase is a whole number of windows long.
    pub worst_window_admitted: u64,
}

/// The most requests admitted within one window of a policy's length that ends in a
/// phase ([`Counts::worst_window_admitted`], for any of the group's policies).
///
/// ```
/// use std::time::Duration;
/// use tollgate_simulator::{Phase, PolicyName, Scenario};
/// let report = Scenario::new()
///     .policies([PolicyName::Closed])
///     .normal_secs(1).outage_secs(1).recovery_secs(1)
///     .run_blocking()
///     .unwrap();
/// let worst = &report.groups()[0].worst_windows(1, Phase::Normal)[0];
/// assert_eq!((worst.policy.as_str(), worst.window), ("per-second", Duration::from_secs(1)));
/// assert_eq!(worst.admitted, 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorstWindow {
    /// The policy's name.
    pub policy: String,
    /// Its window: a sliding window's (or sliding log's), or a token bucket's refill
    /// period.
    pub window: Duration,
    /// The most admitted requests in one such window ending in the phase.
    pub admitted: u64,
}

/// What one group's customers got.
///
/// ```
/// use tollgate_simulator::{Phase, PolicyName, Scenario};
/// let report = Scenario::new()
///     .policies([PolicyName::Open])
///     .normal_secs(1).outage_secs(1).recovery_secs(1)
///     .run_blocking()
///     .unwrap();
/// let open = &report.groups()[0];
/// assert_eq!(open.name(), "open");
/// // Fail open: acme's 120 requests of the outage second pass, but for a few still
/// // answered 429 as the outage begins.
/// let outage = open.counts(0, Phase::Outage);
/// assert_eq!(outage.sent, 120);
/// assert!(outage.admitted > 100 && outage.refused_503 == 0);
/// assert_eq!(outage.admitted + outage.refused_429, 120);
/// assert_eq!(open.admitted_each_second(0).len(), 3);
/// assert!(open.all_breakers_closed_after().is_some());
/// ```
#[derive(Clone, Debug)]
pub struct GroupReport {
    pub(crate) name: String,
    /// Per customer, per phase.
    pub(crate) phases: Vec<[Counts; 3]>,
    /// Per customer, admitted requests sent in each second.
    pub(crate) per_second: Vec<Vec<u64>>,
    pub(crate) closed_after: Option<Duration>,
    /// The traced customer's requests, in the order they were sent.
    pub(crate) trace: Vec<Traced>,
    /// The group's policies, by name, and the windows they are measured in.
    pub(crate) windows: Vec<(String, Duration)>,
    /// Per customer, per policy of `windows`, per phase: the worst window.
    pub(crate) worst: Vec<Vec<[u64; 3]>>,
}

impl GroupReport {
    /// The group's name: the failure policy's, or the one given to
    /// [`Scenario::group`](super::Scenario::group).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the requests of the customer at index `customer` (in the scenario's traffic)
    /// sent in `phase` were answered; all zero for an index out of range.
    pub fn counts(&self, customer: usize, phase: Phase) -> Counts {
        self.phases
            .get(customer)
            .map(|p| p[phase.index()])
            .unwrap_or_default()
    }

    /// The customer's admitted requests by the second they were sent in, from the start
    /// of the run; empty for an index out of range.
    pub fn admitted_each_second(&self, customer: usize) -> &[u64] {
        self.per_second.get(customer).map_or(&[], Vec::as_slice)
    }

    /// How long after the store came back every breaker of the group was closed again
    /// (`None`: not within the recovery phase).
    pub fn all_breakers_closed_after(&self) -> Option<Duration> {
        self.closed_after
    }

    /// Every request of the customer named by [`Scenario::trace`](super::Scenario::trace),
    /// in the order they were sent; empty when the scenario traces no one.
    pub fn trace(&self) -> &[Traced] {
        &self.trace
    }

    /// For the customer at index `customer`, the most requests admitted within one window
    /// of each of the group's policies that ends in `phase`, each in its own window: the
    /// policies of callers without a tier in their order, then each tier's that are not
    /// among them (by name and window), as the group's limiter holds them. A built-in
    /// group has one, the scenario's quota. Empty for an index out of range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FailurePolicy, Policy, Quota};
    /// use tollgate_simulator::{Customer, Phase, Scenario};
    ///
    /// let report = Scenario::new()
    ///     .policies([])
    ///     .instances(2)
    ///     .traffic([Customer::new("acme", 5.0)])
    ///     .normal_secs(3).outage_secs(3).recovery_secs(3)
    ///     .group("mine", |instance| {
    ///         instance
    ///             .limiter_builder()
    ///             .policy(Policy::sliding_window("per-second", Quota::per_second(10)))
    ///             .policy(Policy::sliding_window("per-minute", Quota::per_minute(40)))
    ///             .on_store_failure(FailurePolicy::open())
    ///             .try_build()
    ///     })
    ///     .run_blocking()
    ///     .unwrap();
    /// let group = &report.groups()[0];
    /// let windows: Vec<(String, Duration)> = group
    ///     .worst_windows(0, Phase::Normal)
    ///     .into_iter()
    ///     .map(|w| (w.policy, w.window))
    ///     .collect();
    /// assert_eq!(windows, [
    ///     ("per-second".to_owned(), Duration::from_secs(1)),
    ///     ("per-minute".to_owned(), Duration::from_secs(60)),
    /// ]);
    /// // Every request is admitted, 5 a second, 15 a phase: a minute-long window ending in
    /// // the outage holds the normal phase's and the outage's, one ending in the recovery
    /// // all three phases'.
    /// assert_eq!(group.worst_window(0, Phase::Normal, "per-minute"), Some(15));
    /// assert_eq!(group.worst_window(0, Phase::Outage, "per-minute"), Some(30));
    /// assert_eq!(group.worst_window(0, Phase::Recovery, "per-minute"), Some(45));
    /// assert_eq!(group.worst_window(0, Phase::Outage, "per-second"), Some(5));
    /// ```
    pub fn worst_windows(&self, customer: usize, phase: Phase) -> Vec<WorstWindow> {
        let Some(worst) = self.worst.get(customer) else {
            return Vec::new();
        };
        self.windows
            .iter()
            .zip(worst)
            .map(|((policy, window), worst)| WorstWindow {
                policy: policy.clone(),
                window: *window,
                admitted: worst[phase.index()],
            })
            .collect()
    }

    /// The worst window of the group's policy named `policy` (the first of that name, as
    /// [`worst_windows`](Self::worst_windows) lists them) for the customer at index
    /// `customer` in `phase`; `None` when the group has no such policy or the index is out
    /// of range.
    ///
    /// ```
    /// use tollgate_simulator::{Phase, PolicyName, Scenario};
    /// let report = Scenario::new()
    ///     .policies([PolicyName::Open])
    ///     .normal_secs(1).outage_secs(1).recovery_secs(1)
    ///     .run_blocking()
    ///     .unwrap();
    /// let open = &report.groups()[0];
    /// let outage = open.counts(0, Phase::Outage);
    /// assert_eq!(open.worst_window(0, Phase::Outage, "per-second"), Some(outage.worst_window_admitted));
    /// assert_eq!(open.worst_window(0, Phase::Outage, "per-minute"), None);
    /// ```
    pub fn worst_window(&self, customer: usize, phase: Phase, policy: &str) -> Option<u64> {
        let index = self.windows.iter().position(|(name, _)| name == policy)?;
        Some(self.worst.get(customer)?.get(index)?[phase.index()])
    }
}

/// One request of the traced customer (see [`Scenario::trace`](super::Scenario::trace)):
/// when it went out, how it was answered, and the state of the first policy (the
/// scenario's quota in a built-in group) right after the decision, as the limiter that
/// decided reported it. That state is what the algorithm looks like from outside: a token
/// bucket's tokens left, a sliding window's quota minus its weighted count; after a
/// settlement, what the settlement left.
///
/// ```
/// use tollgate_simulator::{PolicyName, Scenario};
/// let report = Scenario::new()
///     .policies([PolicyName::Closed])
///     .normal_secs(1).outage_secs(1).recovery_secs(1)
///     .trace("globex")
///     .run_blocking()
///     .unwrap();
/// let trace = report.groups()[0].trace();
/// assert_eq!(trace.len(), 3 * 20);
/// // The first request of the run finds the whole quota: 49 of 50 left after it.
/// assert_eq!((trace[0].status, trace[0].quota, trace[0].remaining), (200, Some(50), Some(49)));
/// assert!(trace[0].handled && trace[0].cost == Some(1));
/// // Failing closed, the outage's requests are refused without a count.
/// let outage = &trace[20];
/// assert_eq!((outage.status, outage.remaining, outage.handled), (503, None, false));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Traced {
    /// When the request was sent, from the start of the run.
    pub sent_at: Duration,
    /// The instance it went to, from 0.
    pub instance: usize,
    /// The status it was answered with: 200 admitted, 429 or 503 refused.
    pub status: u16,
    /// Who decided: the shared store, the denial cache or this instance's local share;
    /// `None` when no counter took part (failing open or closed while the store is down).
    pub source: Option<DecisionSource>,
    /// The quota the decision enforced: the scenario's, or an instance's local share of
    /// it; `None` when no counter took part.
    pub quota: Option<u64>,
    /// What the quota had left after the decision; `None` when no counter took part.
    pub remaining: Option<u64>,
    /// Whether the request reached the handler: admitted, or let through by a soft limit.
    pub handled: bool,
    /// Whether a soft limit let it through over its limit.
    pub soft_limited: bool,
    /// The units the decision counted (or would have: a refusal's), before any
    /// settlement: 1 unless the layer gives a [`cost`](tollgate::RateLimitLayer::cost);
    /// `None` when no counter took part.
    pub cost: Option<u64>,
    /// What the request was settled at, when the layer
    /// [`settle`](tollgate::RateLimitLayer::settle)s what its response cost and the
    /// request had counted units to settle; `None` otherwise.
    pub settled: Option<u64>,
}

/// One line of the results: one group, one phase, one customer.
///
/// ```
/// use tollgate_simulator::{Phase, PolicyName, Scenario};
/// let report = Scenario::new()
///     .policies([PolicyName::Closed])
///     .normal_secs(1).outage_secs(1).recovery_secs(1)
///     .run_blocking()
///     .unwrap();
/// let row = report.row("closed", Phase::Outage, "globex").unwrap();
/// assert_eq!((row.sent_per_sec, row.admitted_per_sec, row.refused_503), (20.0, 0.0, 20));
/// // globex sends 20 a second (at 0, 50, 100 ms, ...), under the limit: every second of
/// // the normal phase admits all 20. The outage admits none, but its windows include those
/// // straddling its start: the one from 50 ms to 1.05 s holds 19 of the normal phase's.
/// let normal = report.row("closed", Phase::Normal, "globex").unwrap();
/// assert_eq!(normal.worst_window_admitted, 20);
/// assert_eq!(row.worst_window_admitted, 19);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Row {
    /// The group's name.
    pub policy: String,
    /// The phase.
    pub phase: Phase,
    /// The customer's name.
    pub customer: String,
    /// Requests sent per second (whole-phase average).
    pub sent_per_sec: f64,
    /// Requests admitted per second (whole-phase average).
    pub admitted_per_sec: f64,
    /// Requests answered 429 in the phase.
    pub refused_429: u64,
    /// Requests answered 503 in the phase.
    pub refused_503: u64,
    /// Let through by a soft limit over the limit in the phase:
    /// [`Counts::soft_limited`].
    pub soft_limited: u64,
    /// The most requests admitted within one window of the group's first policy that ends
    /// in the phase, straddling its start included: [`Counts::worst_window_admitted`].
    pub worst_window_admitted: u64,
    /// The same in each policy's own window: [`GroupReport::worst_windows`].
    pub worst_windows: Vec<WorstWindow>,
    /// On the recovery rows, how long after the store came back every breaker of the
    /// group was closed again; `None` on the other rows, and when they did not close
    /// within the phase.
    pub all_breakers_closed_after: Option<Duration>,
}

/// The results of a run, group by group in the order of
/// [`Scenario::group_names`](super::Scenario::group_names).
///
/// ```
/// use tollgate_simulator::{PolicyName, Scenario};
/// let report = Scenario::new()
///     .policies([PolicyName::LocalShare])
///     .normal_secs(1).outage_secs(1).recovery_secs(1)
///     .run_blocking()
///     .unwrap();
/// assert_eq!(report.rows().len(), 3 * 3);
/// assert_eq!(report.unexpected_statuses(), 0);
/// assert_eq!(report.window().as_secs(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct Report {
    pub(crate) customers: Vec<Customer>,
    pub(crate) phase_secs: [u64; 3],
    pub(crate) window: Duration,
    pub(crate) groups: Vec<GroupReport>,
}

impl Report {
    /// Each group's results.
    pub fn groups(&self) -> &[GroupReport] {
        &self.groups
    }

    /// The customers, in the order the counts use.
    pub fn customers(&self) -> &[Customer] {
        &self.customers
    }

    /// The scenario's window ([`Scenario::window_secs`](crate::Scenario::window_secs)):
    /// the length of the windows that [`Counts::worst_window_admitted`] counts in for the
    /// built-in groups. A group of your own is measured in its own policies' windows
    /// ([`GroupReport::worst_windows`]).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Every row: group by group, phase by phase, customer by customer.
    pub fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for group in &self.groups {
            for phase in Phase::ALL {
                let secs = self.phase_secs[phase.index()] as f64;
                for (c, customer) in self.customers.iter().enumerate() {
                    let counts = group.counts(c, phase);
                    rows.push(Row {
                        policy: group.name.clone(),
                        phase,
                        customer: customer.name().to_owned(),
                        sent_per_sec: counts.sent as f64 / secs,
                        admitted_per_sec: counts.admitted as f64 / secs,
                        refused_429: counts.refused_429,
                        refused_503: counts.refused_503,
                        soft_limited: counts.soft_limited,
                        worst_window_admitted: counts.worst_window_admitted,
                        worst_windows: group.worst_windows(c, phase),
                        all_breakers_closed_after: match phase {
                            Phase::Recovery => group.closed_after,
                            _ => None,
                        },
                    });
                }
            }
        }
        rows
    }

    /// The row of one group, phase and customer, if there is one.
    pub fn row(&self, policy: &str, phase: Phase, customer: &str) -> Option<Row> {
        self.rows()
            .into_iter()
            .find(|r| r.policy == policy && r.phase == phase && r.customer == customer)
    }

    /// Requests answered by something else than the handler, with a status other than
    /// 429 and 503 ([`Counts::other`]): never with the simulator's own layer.
    pub fn unexpected_statuses(&self) -> u64 {
        self.groups
            .iter()
            .flat_map(|g| g.phases.iter().flatten())
            .map(|c| c.other)
            .sum()
    }
}

/// The most of `sent` (a customer's admitted requests by send time, in nanoseconds from the
/// start, ascending) within one `window` that ends in each phase, the phases ending at
/// `ends` (the last one's windows may end after it: they hold nothing more).
///
/// A window's count only drops when its start passes a request, so the largest count among
/// the windows ending in a phase is that of a window starting at one of the requests, or of
/// the window ending where the phase does.
pub(crate) fn worst_windows(sent: &[u64], window: u64, ends: [u64; 3]) -> [u64; 3] {
    let phase_of_end = |end: u64| ends[..2].iter().take_while(|&&b| end > b).count();
    let mut worst = [0; 3];
    let mut past = 0;
    for (first, &start) in sent.iter().enumerate() {
        let end = start + window;
        while past < sent.len() && sent[past] < end {
            past += 1;
        }
        let phase = phase_of_end(end);
        worst[phase] = worst[phase].max((past - first) as u64);
    }
    for (phase, &end) in ends.iter().enumerate() {
        let before = |t: u64| sent.partition_point(|&s| s < t);
        let count = before(end) - before(end.saturating_sub(window));
        worst[phase] = worst[phase].max(count as u64);
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::worst_windows;

    /// The same, by brute force: every window start on a fine grid.
    fn brute(sent: &[u64], window: u64, ends: [u64; 3]) -> [u64; 3] {
        let mut worst = [0; 3];
        for end in 1..=ends[2] + window {
            let phase = ends[..2].iter().take_while(|&&b| end > b).count();
            let start = end.saturating_sub(window);
            let count = sent.iter().filter(|&&s| s >= start && s < end).count() as u64;
            worst[phase] = worst[phase].max(count);
        }
        worst
    }

    #[test]
    fn the_sweep_finds_what_every_window_finds() {
        let ends = [30, 60, 90];
        let cases: [&[u64]; 5] = [
            &[],
            &[0, 1, 2, 29, 30, 31],
            &[25, 26, 27, 28, 29, 30, 31, 32, 59, 60, 61, 89],
            &[0, 10, 20, 30, 40, 50, 60, 70, 80],
            &[29, 29, 30, 30, 59, 60],
        ];
        for sent in cases {
            for window in [1, 5, 10, 30, 45, 100] {
                assert_eq!(
                    worst_windows(sent, window, ends),
                    brute(sent, window, ends),
                    "{sent:?}, window {window}"
                );
            }
        }
        // Straddling the outage's start: 3 before it and 2 after, in one window of 10.
        assert_eq!(worst_windows(&[22, 24, 26, 31, 33], 10, ends), [3, 4, 0]);
    }
}
