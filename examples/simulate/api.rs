//! The page's JSON: the scenario it posts, checked against bounds that keep one run to
//! about a second, and the answer it draws (the `--json` rows, the admitted rate per
//! second, and the traced caller's requests).

use serde::{Deserialize, Serialize};
use tollgate_simulator::{
    AlgorithmKind, Customer, FaultKind, Phase, PolicyName, Report, Scenario, ScenarioError, Traced,
};

use crate::output::{JsonRow, json_rows, policy_note, rate_text, share_text, worst_heading};

/// The most simulated requests one run may send (the rates' sum x the seconds x the
/// policies), so that no request ties up the server: a release build simulates about
/// 150,000 requests a second on one loaded core (0.8 s for this many, 1.1 s on 64
/// instances). The running example, all eight policies, is 104,400; a 2-minute outage
/// compared under two policies, 52,200.
const MAX_REQUESTS: f64 = 150_000.0;
/// The most callers (the chart has as many colours).
const MAX_CALLERS: usize = 8;
/// The most instances configured (the stale-divisor policy runs twice as many).
const MAX_INSTANCES: u64 = 64;
/// The longest phase.
const MAX_PHASE_SECS: u64 = 600;
/// The highest rate of one caller.
const MAX_RATE: f64 = 5_000.0;
/// The longest store timeout.
const MAX_STORE_TIMEOUT_MS: u64 = 10_000;
/// The most traced requests one answer carries (about 35 bytes of JSON each).
const MAX_TRACE_POINTS: usize = 20_000;
/// The stretch of the run one answer traces; the page asks again for another.
const TRACE_SECS: u64 = 60;

/// The scenario as the page posts it; a field left out keeps the command line's default.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ScenarioJson {
    /// `sliding-window` or `token-bucket`.
    algorithm: String,
    limit: u64,
    window_secs: u64,
    /// The token bucket's capacity (null: the limit).
    burst: Option<u64>,
    instances: u64,
    traffic: Vec<CallerJson>,
    normal_secs: u64,
    outage_secs: u64,
    recovery_secs: u64,
    /// `refuse`, `blackhole` or `slow`.
    fault: String,
    store_timeout_ms: u64,
    breaker_base_open_ms: Option<u64>,
    breaker_max_open_ms: Option<u64>,
    /// The failure policies to compare, by the names the tables print.
    policies: Vec<String>,
    /// Whose requests to trace, under which policy.
    trace: Option<TraceJson>,
}

/// One caller and its steady rate.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallerJson {
    name: String,
    rate: f64,
}

/// The single-caller view: one caller's requests under one policy, from `from_secs` on
/// (a minute of them, at most [`MAX_TRACE_POINTS`]).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TraceJson {
    customer: String,
    policy: String,
    #[serde(default)]
    from_secs: u64,
}

impl Default for ScenarioJson {
    fn default() -> Self {
        Self::from(&Scenario::default())
    }
}

impl From<&Scenario> for ScenarioJson {
    fn from(scenario: &Scenario) -> Self {
        let token_bucket = scenario.algorithm_value() == AlgorithmKind::TokenBucket;
        Self {
            algorithm: algorithm_name(scenario.algorithm_value()).to_owned(),
            limit: scenario.limit_value(),
            window_secs: scenario.window_secs_value(),
            burst: token_bucket.then(|| scenario.burst_value()),
            instances: scenario.instances_value() as u64,
            traffic: scenario
                .traffic_value()
                .iter()
                .map(|c| CallerJson {
                    name: c.name().to_owned(),
                    rate: c.rate(),
                })
                .collect(),
            normal_secs: scenario.phase_secs(Phase::Normal),
            outage_secs: scenario.phase_secs(Phase::Outage),
            recovery_secs: scenario.phase_secs(Phase::Recovery),
            fault: scenario.fault_value().name().to_owned(),
            store_timeout_ms: scenario.store_timeout_ms_value(),
            breaker_base_open_ms: scenario
                .breaker_overridden()
                .then(|| scenario.breaker().base_open_duration().as_millis() as u64),
            breaker_max_open_ms: scenario
                .breaker_overridden()
                .then(|| scenario.breaker().max_open_duration().as_millis() as u64),
            policies: scenario
                .policies_value()
                .iter()
                .map(|p| p.name().to_owned())
                .collect(),
            trace: None,
        }
    }
}

fn algorithm_name(algorithm: AlgorithmKind) -> &'static str {
    match algorithm {
        AlgorithmKind::TokenBucket => "token-bucket",
        _ => "sliding-window",
    }
}

/// Why a posted scenario is not run: the field at fault, and what is wrong with it.
#[derive(Debug, Serialize)]
pub(crate) struct BadScenario {
    pub(crate) field: String,
    pub(crate) error: String,
}

impl BadScenario {
    fn new(field: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            error: error.into(),
        }
    }
}

/// Reads the posted body: malformed JSON, an unknown field or a value of the wrong type
/// is refused, naming where it is.
pub(crate) fn parse(body: &[u8]) -> Result<ScenarioJson, BadScenario> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| BadScenario::new("body", e.to_string()))?;
    if !value.is_object() {
        return Err(BadScenario::new(
            "body",
            "the scenario must be a JSON object",
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        BadScenario::new(field, e.into_inner().to_string())
    })
}

fn within(field: &str, value: u64, min: u64, max: u64) -> Result<(), BadScenario> {
    if value < min || value > max {
        return Err(BadScenario::new(
            field,
            format!("{value} is out of range ({min} to {max})"),
        ));
    }
    Ok(())
}

impl ScenarioJson {
    /// The library's scenario, within the page's bounds, with the trace it asks for.
    pub(crate) fn scenario(&self) -> Result<Scenario, BadScenario> {
        let algorithm: AlgorithmKind = self
            .algorithm
            .parse()
            .map_err(|e: ScenarioError| BadScenario::new("algorithm", e.to_string()))?;
        let fault: FaultKind = self
            .fault
            .parse()
            .map_err(|e: ScenarioError| BadScenario::new("fault", e.to_string()))?;
        within("instances", self.instances, 1, MAX_INSTANCES)?;
        within("normal_secs", self.normal_secs, 1, MAX_PHASE_SECS)?;
        within("outage_secs", self.outage_secs, 1, MAX_PHASE_SECS)?;
        within("recovery_secs", self.recovery_secs, 1, MAX_PHASE_SECS)?;
        within(
            "store_timeout_ms",
            self.store_timeout_ms,
            1,
            MAX_STORE_TIMEOUT_MS,
        )?;
        if self.traffic.is_empty() || self.traffic.len() > MAX_CALLERS {
            return Err(BadScenario::new(
                "traffic",
                format!("{} callers: give 1 to {MAX_CALLERS}", self.traffic.len()),
            ));
        }
        for (i, caller) in self.traffic.iter().enumerate() {
            if !(caller.rate > 0.0 && caller.rate <= MAX_RATE) {
                return Err(BadScenario::new(
                    format!("traffic[{i}].rate"),
                    format!(
                        "{} requests per second: give more than 0 and at most {MAX_RATE}",
                        caller.rate
                    ),
                ));
            }
        }
        let mut policies = Vec::new();
        for (i, name) in self.policies.iter().enumerate() {
            let policy: PolicyName = name.parse().map_err(|e: ScenarioError| {
                BadScenario::new(format!("policies[{i}]"), e.to_string())
            })?;
            if policies.contains(&policy) {
                return Err(BadScenario::new(
                    format!("policies[{i}]"),
                    format!("{name} is given twice"),
                ));
            }
            policies.push(policy);
        }
        if policies.is_empty() {
            return Err(BadScenario::new("policies", "pick at least one policy"));
        }
        let total_secs = self.normal_secs + self.outage_secs + self.recovery_secs;
        let requests = self.traffic.iter().map(|c| c.rate).sum::<f64>()
            * total_secs as f64
            * policies.len() as f64;
        if requests > MAX_REQUESTS {
            return Err(BadScenario::new(
                "traffic",
                format!(
                    "{} req/s for {total_secs} s under {} {} is {requests:.0} requests \
                     to simulate, more than {MAX_REQUESTS:.0}: lower the rates, the phases or \
                     the policies",
                    rate_text(self.traffic.iter().map(|c| c.rate).sum()),
                    policies.len(),
                    if policies.len() == 1 {
                        "policy"
                    } else {
                        "policies"
                    },
                ),
            ));
        }

        let mut scenario = Scenario::new()
            .algorithm(algorithm)
            .limit(self.limit)
            .window_secs(self.window_secs)
            .instances(self.instances as usize)
            .traffic(self.traffic.iter().map(|c| Customer::new(&c.name, c.rate)))
            .normal_secs(self.normal_secs)
            .outage_secs(self.outage_secs)
            .recovery_secs(self.recovery_secs)
            .fault(fault)
            .store_timeout_ms(self.store_timeout_ms)
            // In the canonical order, as the command line runs them.
            .policies(PolicyName::ALL.into_iter().filter(|p| policies.contains(p)));
        if let Some(burst) = self.burst {
            scenario = scenario.burst(burst);
        }
        if let Some(ms) = self.breaker_base_open_ms {
            scenario = scenario.breaker_base_open_ms(ms);
        }
        if let Some(ms) = self.breaker_max_open_ms {
            scenario = scenario.breaker_max_open_ms(ms);
        }
        if let Some(trace) = &self.trace {
            if !self.policies.contains(&trace.policy) {
                return Err(BadScenario::new(
                    "trace.policy",
                    format!("{:?} is not one of the policies compared", trace.policy),
                ));
            }
            within("trace.from_secs", trace.from_secs, 0, total_secs - 1)?;
            scenario = scenario.trace(&trace.customer);
        }
        scenario.validate().map_err(|e| self.field_error(&e))?;
        Ok(scenario)
    }

    /// The library's complaint about the scenario, with the field it is about.
    fn field_error(&self, error: &ScenarioError) -> BadScenario {
        let caller = |name: &str| {
            self.traffic
                .iter()
                .position(|c| c.name == name)
                .map_or("traffic".to_owned(), |i| format!("traffic[{i}].name"))
        };
        let field = match error {
            ScenarioError::OutOfRange { setting, .. } => (*setting).to_owned(),
            ScenarioError::BurstNeedsTokenBucket => "burst".to_owned(),
            ScenarioError::BreakerBaseAboveMax { .. } => "breaker_base_open_ms".to_owned(),
            ScenarioError::QuotaTooLarge => "limit".to_owned(),
            ScenarioError::BadCustomerName(name) => caller(name),
            ScenarioError::DuplicateCustomer(name) => {
                let i = self.traffic.iter().rposition(|c| &c.name == name);
                i.map_or("traffic".to_owned(), |i| format!("traffic[{i}].name"))
            }
            ScenarioError::UnknownTraced(_) => "trace.customer".to_owned(),
            ScenarioError::NoGroups | ScenarioError::DuplicateGroup(_) => "policies".to_owned(),
            _ => "traffic".to_owned(),
        };
        BadScenario::new(field, error.to_string())
    }

    /// The traced policy and the second to trace from, if the page asked for a trace.
    pub(crate) fn traced(&self) -> Option<(&str, u64)> {
        self.trace
            .as_ref()
            .map(|t| (t.policy.as_str(), t.from_secs))
    }
}

/// What the page draws from one run.
#[derive(Debug, Serialize)]
pub(crate) struct Answer {
    /// The scenario in a sentence, as the command line's table starts.
    summary: String,
    /// What a local share is in this scenario.
    share: String,
    /// The phases in order, with their length and what the store does.
    phases: Vec<PhaseJson>,
    /// The callers in the order the series use.
    customers: Vec<CallerJson>,
    /// The quota per second, for the chart's scale.
    limit_per_sec: f64,
    /// The heading of the tables' worst-window column, `worst 1 s` for a 1 s window: the
    /// rows' `worst_window_admitted` counts in windows of the quota's length.
    worst_heading: String,
    /// Exactly the rows `--json` prints for the same scenario.
    rows: Vec<JsonRow>,
    groups: Vec<GroupJson>,
    trace: Option<TraceAnswer>,
}

#[derive(Debug, Serialize)]
struct PhaseJson {
    name: &'static str,
    secs: u64,
    store: String,
}

/// One policy's admitted requests in each second, per caller.
#[derive(Debug, Serialize)]
struct GroupJson {
    policy: String,
    note: Option<String>,
    admitted_each_second: Vec<Vec<u64>>,
    all_breakers_closed_after_ms: Option<f64>,
}

/// The traced caller's requests under one policy sent from `from_ms` until `to_ms`:
/// `[sent at ms, instance, status, quota, remaining, deciding source]` each, in the order
/// they were sent.
#[derive(Debug, Serialize)]
struct TraceAnswer {
    customer: String,
    policy: String,
    algorithm: &'static str,
    from_ms: f64,
    to_ms: f64,
    /// Whether [`MAX_TRACE_POINTS`] ended the stretch before its minute was over.
    truncated: bool,
    points: Vec<TracePoint>,
}

type TracePoint = (
    f64,
    usize,
    u16,
    Option<u64>,
    Option<u64>,
    Option<&'static str>,
);

impl Answer {
    pub(crate) fn new(scenario: &Scenario, report: &Report, traced: Option<(&str, u64)>) -> Self {
        let n = scenario.instances_value();
        let algorithm = match scenario.algorithm_value() {
            AlgorithmKind::TokenBucket => {
                format!("token bucket, burst {}", scenario.burst_value())
            }
            _ => "sliding window".to_owned(),
        };
        let phases = Phase::ALL
            .into_iter()
            .map(|phase| PhaseJson {
                name: phase.name(),
                secs: scenario.phase_secs(phase),
                store: match phase {
                    Phase::Outage => scenario
                        .fault_value()
                        .describe(scenario.store_timeout_ms_value()),
                    _ => "the store answers".to_owned(),
                },
            })
            .collect();
        let customers = report.customers().len();
        let groups = scenario
            .policies_value()
            .iter()
            .zip(report.groups())
            .map(|(policy, group)| GroupJson {
                policy: group.name().to_owned(),
                note: policy_note(scenario, *policy),
                admitted_each_second: (0..customers)
                    .map(|c| group.admitted_each_second(c).to_vec())
                    .collect(),
                all_breakers_closed_after_ms: group
                    .all_breakers_closed_after()
                    .map(|d| (d.as_secs_f64() * 1_000.0).round()),
            })
            .collect();
        let trace = scenario.traced_value().and_then(|customer| {
            let (policy, from_secs) = traced?;
            let group = report.groups().iter().find(|g| g.name() == policy)?;
            let from_ms = (from_secs * 1_000) as f64;
            let end_ms = ((from_secs + TRACE_SECS).min(scenario.total_secs()) * 1_000) as f64;
            let ms = |t: &Traced| (t.sent_at.as_secs_f64() * 1_000.0 * 100.0).round() / 100.0;
            let stretch: Vec<&Traced> = group
                .trace()
                .iter()
                .filter(|t| (from_ms..end_ms).contains(&ms(t)))
                .collect();
            let truncated = stretch.len() > MAX_TRACE_POINTS;
            let points: Vec<TracePoint> = stretch
                .into_iter()
                .take(MAX_TRACE_POINTS)
                .map(|t| {
                    (
                        ms(t),
                        t.instance,
                        t.status,
                        t.quota,
                        t.remaining,
                        t.source.map(|s| s.as_str()),
                    )
                })
                .collect();
            let to_ms = match points.last() {
                Some(last) if truncated => last.0,
                _ => end_ms,
            };
            Some(TraceAnswer {
                customer: customer.to_owned(),
                policy: policy.to_owned(),
                algorithm: algorithm_name(scenario.algorithm_value()),
                from_ms,
                to_ms,
                truncated,
                points,
            })
        });
        Self {
            summary: format!(
                "{n} instances, round robin; limit {} per {} s per caller ({algorithm})",
                scenario.limit_value(),
                scenario.window_secs_value(),
            ),
            share: format!(
                "a local share is the quota divided by the {n} configured instances: {}",
                share_text(scenario.policy().algorithm(), n as u64)
            ),
            phases,
            customers: scenario
                .traffic_value()
                .iter()
                .map(|c| CallerJson {
                    name: c.name().to_owned(),
                    rate: c.rate(),
                })
                .collect(),
            limit_per_sec: scenario.limit_value() as f64 / scenario.window_secs_value() as f64,
            worst_heading: worst_heading(scenario),
            rows: json_rows(report),
            groups,
            trace,
        }
    }
}
