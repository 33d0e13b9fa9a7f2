//! The outage simulator (the `tollgate-simulator` crate), run through its library API: the
//! defaults reproduce the table of the running example (docs/guide/simulator.md), the other
//! faults and the token bucket tell the same story, the scenario's settings change it, a
//! limiter of the caller's own replays the same outage, and bad numbers are typed errors. It
//! runs the library's default breaker unless the scenario overrides it, so its recovery is
//! what a user gets: every group back on the store within about a second. A few tests run
//! the command line (examples/simulate/) for what only it does: flags, tables and JSON.
//!
//! The simulator runs on virtual time, so even a debug build simulates the 90 s of the
//! defaults in seconds.

#[cfg(feature = "redis")]
use std::future::Future;
use std::path::{Path, PathBuf};
#[cfg(feature = "redis")]
use std::pin::Pin;
use std::process::{Command, Output};
#[cfg(feature = "redis")]
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::store::Algorithm;
use tollgate::{FailurePolicy, InstanceCount, Policy, Quota};
#[cfg(feature = "redis")]
use tollgate_simulator::FaultSwitch;
use tollgate_simulator::{
    AlgorithmKind, Customer, FaultKind, Phase, PolicyName, Regions, Report, Scenario,
    ScenarioError, SimulationError,
};
#[cfg(feature = "redis")]
use tollgate_testkit::proxy::{Fault, FaultProxy};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// Within 10% of the expected rate (exactly 0 when 0 is expected).
const TOLERANCE: f64 = 0.10;
/// The JSON keys of every row.
const KEYS: [&str; 8] = [
    "policy",
    "phase",
    "customer",
    "sent_per_sec",
    "admitted_per_sec",
    "refused_429",
    "refused_503",
    "worst_window_admitted",
];
/// On the recovery rows of the JSON only: when the policy's last breaker closed after the
/// store returned.
const CLOSED_AFTER: &str = "all_breakers_closed_after_ms";
/// Every instance is back on the store within this long of its return (the default
/// breaker's 1 s cap, plus a little).
const BACK_WITHIN_MS: f64 = 1_200.0;
const CUSTOMERS: [(&str, f64); 3] = [("acme", 120.0), ("globex", 20.0), ("initech", 5.0)];
const ALL_POLICIES: [&str; 9] = [
    "open",
    "closed",
    "local-share",
    "static",
    "static-then-local-share",
    "local-share-no-divisor",
    "local-share-stale-divisor",
    "local-share-pinned",
    "local-share-leased",
];

/// Runs the scenario on virtual time.
fn run(scenario: Scenario) -> Report {
    scenario
        .run_blocking()
        .unwrap_or_else(|e| panic!("the simulation failed: {e}"))
}

/// What one instance admits per second under a local share of `algorithm` over
/// `instances`, as the crate divides it.
fn share_per_sec(algorithm: Algorithm, instances: u64) -> f64 {
    match algorithm.divided_by(instances) {
        Algorithm::SlidingWindow { limit, window_ms } => limit as f64 * 1_000.0 / window_ms as f64,
        Algorithm::TokenBucket {
            rate, period_ms, ..
        } => rate as f64 * 1_000.0 / period_ms as f64,
        other => panic!("no rate known for {other:?}"),
    }
}

fn phase(name: &str) -> Phase {
    Phase::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .unwrap_or_else(|| panic!("no phase {name}"))
}

fn row(report: &Report, policy: &str, phase_name: &str, customer: &str) -> tollgate_simulator::Row {
    report
        .row(policy, phase(phase_name), customer)
        .unwrap_or_else(|| panic!("no row for {policy}/{phase_name}/{customer}"))
}

/// When the last breaker of `policy`'s instances closed after the store returned.
fn closed_after_ms(report: &Report, policy: &str) -> f64 {
    let row = row(report, policy, "recovery", CUSTOMERS[0].0);
    row.all_breakers_closed_after
        .map(|d| d.as_secs_f64() * 1_000.0)
        .unwrap_or_else(|| panic!("{policy}: the breakers did not close within the phase: {row:?}"))
}

fn admitted(report: &Report, policy: &str, phase: &str, customer: &str) -> f64 {
    row(report, policy, phase, customer).admitted_per_sec
}

fn assert_near(report: &Report, policy: &str, phase: &str, customer: &str, expected: f64) {
    let actual = admitted(report, policy, phase, customer);
    let slack = (expected * TOLERANCE).max(0.0);
    assert!(
        (actual - expected).abs() <= slack + 1e-9,
        "{policy}, {phase}, {customer}: {actual}/s admitted, expected {expected}/s within {:.0}%",
        TOLERANCE * 100.0
    );
}

/// Normal and recovery phases: every customer gets min(what it sends, the limit).
fn assert_fair_outside_the_outage(report: &Report, policy: &str, limit: f64) {
    for phase in ["normal", "recovery"] {
        for (customer, sends) in CUSTOMERS {
            assert_near(report, policy, phase, customer, sends.min(limit));
        }
    }
}

fn policies(names: &[&str]) -> Vec<PolicyName> {
    names
        .iter()
        .map(|name| name.parse().expect("a known policy"))
        .collect()
}

#[test]
fn the_defaults_reproduce_the_design_table() {
    let report = run(Scenario::default());
    assert_eq!(
        report.rows().len(),
        ALL_POLICIES.len() * 3 * CUSTOMERS.len()
    );
    assert_eq!(report.unexpected_statuses(), 0);
    for policy in ALL_POLICIES {
        for phase in ["normal", "outage", "recovery"] {
            for (customer, sends) in CUSTOMERS {
                let row = row(&report, policy, phase, customer);
                assert_eq!(row.sent_per_sec, sends, "{row:?}");
                if policy != "closed" || phase == "normal" {
                    assert_eq!(row.refused_503, 0, "{row:?}");
                }
            }
        }
        assert_fair_outside_the_outage(&report, policy, 50.0);
    }

    // The running example, during the outage, with each instance's share as the crate
    // computes it (12.5/s when it keeps the rate exact, 12 when it rounds down): about
    // 4 x share for the local share, 8 x share with the stale divisor, 1 x share pinned.
    let share = share_per_sec(Algorithm::sliding_window(50, Duration::from_secs(1)), 4);
    let outage = |policy: &str, acme: f64, others_too: bool| {
        assert_near(&report, policy, "outage", "acme", acme);
        let (globex, initech) = if others_too { (20.0, 5.0) } else { (0.0, 0.0) };
        assert_near(&report, policy, "outage", "globex", globex);
        assert_near(&report, policy, "outage", "initech", initech);
    };
    outage("open", 120.0, true);
    outage("closed", 0.0, false);
    outage("local-share", 4.0 * share, true);
    outage("local-share-no-divisor", 120.0, true);
    outage("local-share-stale-divisor", 8.0 * share, true);
    outage("local-share-pinned", share, true);
    // Leases first, then the local share: acme is held to about its limit all along.
    outage("local-share-leased", 4.0 * share, true);
    // A per-second limit's cached refusals expire within the second: fail static then
    // passes everything, and the chain falls through to its local share.
    outage("static", 120.0, true);
    outage("static-then-local-share", 4.0 * share, true);

    // On the library's default breaker, every instance is back on the store within about
    // a second of its return, so fail closed refuses only that second's share of requests.
    for policy in ALL_POLICIES {
        let closed = closed_after_ms(&report, policy);
        assert!(
            closed <= BACK_WITHIN_MS,
            "{policy}: closed after {closed} ms"
        );
    }
    let needless: u64 = CUSTOMERS
        .iter()
        .map(|(customer, _)| row(&report, "closed", "recovery", customer).refused_503)
        .sum();
    let per_second: f64 = CUSTOMERS.iter().map(|(_, sends)| sends).sum();
    assert!(
        needless as f64 <= per_second * BACK_WITHIN_MS / 1_000.0,
        "{needless} needless 503s after the store returned"
    );

    // Fail closed answers 503 (never 500) to every request of the outage.
    for (customer, sends) in CUSTOMERS {
        let row = row(&report, "closed", "outage", customer);
        assert_eq!(row.refused_503 as f64, sends * 30.0, "{row:?}");
        assert_eq!(row.refused_429, 0, "{row:?}");
    }
}

#[test]
fn back_on_the_store_within_a_second_of_a_10_minute_outage() {
    let report = run(Scenario::default()
        .outage_secs(600)
        .normal_secs(5)
        .recovery_secs(5)
        .policies(policies(&["open", "closed", "local-share"])));
    for policy in ["open", "closed", "local-share"] {
        let closed = closed_after_ms(&report, policy);
        assert!(
            closed <= BACK_WITHIN_MS,
            "{policy}: closed after {closed} ms"
        );
    }
}

#[test]
fn the_breaker_settings_override_the_library_defaults() {
    // The old defaults (1 s growing to 30 s): after 30 s of failed probes the instances
    // stay on their failure policy for seconds after the store returns.
    let slow = Scenario::default()
        .breaker_base_open_ms(1_000)
        .breaker_max_open_ms(30_000)
        .policies([PolicyName::Closed]);
    assert!(slow.breaker_overridden());
    let report = run(slow);
    let closed = closed_after_ms(&report, "closed");
    assert!(closed > 2_000.0, "closed after {closed} ms");
    let needless = row(&report, "closed", "recovery", "acme").refused_503;
    assert!(needless > 200, "{needless} 503s after the store returned");

    let default = Scenario::default()
        .policies([PolicyName::Closed])
        .outage_secs(2);
    assert!(!default.breaker_overridden());
    let breaker = default.breaker();
    assert_eq!(breaker.base_open_duration(), Duration::from_millis(500));
    assert_eq!(breaker.max_open_duration(), Duration::from_millis(1_000));
    let report = run(default);
    assert!(report.groups()[0].all_breakers_closed_after().is_some());
    let set = Scenario::default().breaker_max_open_ms(2_000);
    assert!(set.breaker_overridden());
    assert_eq!(
        set.breaker().max_open_duration(),
        Duration::from_millis(2_000)
    );
}

#[test]
fn a_blackholed_or_slow_store_gives_the_same_outage() {
    for fault in [FaultKind::Blackhole, FaultKind::Slow] {
        let report = run(Scenario::default().fault(fault).policies(policies(&[
            "open",
            "closed",
            "local-share",
        ])));
        assert_eq!(report.rows().len(), 3 * 3 * CUSTOMERS.len(), "{fault:?}");
        for policy in ["open", "closed", "local-share"] {
            assert_fair_outside_the_outage(&report, policy, 50.0);
        }
        assert_near(&report, "open", "outage", "acme", 120.0);
        assert_near(&report, "closed", "outage", "acme", 0.0);
        assert_near(&report, "closed", "outage", "globex", 0.0);
        let share = share_per_sec(Algorithm::sliding_window(50, Duration::from_secs(1)), 4);
        assert_near(&report, "local-share", "outage", "acme", 4.0 * share);
        assert_near(&report, "local-share", "outage", "globex", 20.0);
        assert_near(&report, "local-share", "outage", "initech", 5.0);
    }
}

#[test]
fn the_token_bucket_shares_the_same_way() {
    let report = run(Scenario::default()
        .algorithm(AlgorithmKind::TokenBucket)
        .burst(50)
        .policies(policies(&["local-share", "local-share-pinned"])));
    for policy in ["local-share", "local-share-pinned"] {
        assert_fair_outside_the_outage(&report, policy, 50.0);
    }
    let share = share_per_sec(Algorithm::token_bucket(50, Duration::from_secs(1), 50), 4);
    assert_near(&report, "local-share", "outage", "acme", 4.0 * share);
    assert_near(&report, "local-share-pinned", "outage", "acme", share);
    assert_near(&report, "local-share-pinned", "outage", "globex", 20.0);
}

#[test]
fn settings_change_the_scenario() {
    let report = run(Scenario::default()
        .limit(40)
        .window_secs(2)
        .instances(2)
        .traffic([Customer::new("big", 60.0), Customer::new("small", 2.0)])
        .normal_secs(10)
        .outage_secs(20)
        .recovery_secs(10)
        .policies([PolicyName::LocalShare, PolicyName::Closed]));
    // 2 policies x 3 phases x 2 customers, nobody else.
    let rows = report.rows();
    assert_eq!(rows.len(), 12);
    assert!(
        rows.iter()
            .all(|r| r.customer == "big" || r.customer == "small")
    );
    // 40 per 2 s is 20/s, 10/s for each of the 2 instances' shares.
    for policy in ["local-share", "closed"] {
        for phase in ["normal", "recovery"] {
            assert_near(&report, policy, phase, "big", 20.0);
            assert_near(&report, policy, phase, "small", 2.0);
        }
    }
    let share = share_per_sec(Algorithm::sliding_window(40, Duration::from_secs(2)), 2);
    assert_near(&report, "local-share", "outage", "big", 2.0 * share);
    assert_near(&report, "local-share", "outage", "small", 2.0);
    assert_near(&report, "closed", "outage", "big", 0.0);
    let row = row(&report, "closed", "outage", "small");
    assert_eq!(row.refused_503, 40, "{row:?}");
    // The chart's series: one per customer, a count per second of the run, adding up to
    // the phases' admitted requests.
    for group in report.groups() {
        for c in 0..2 {
            let seconds = group.admitted_each_second(c);
            assert_eq!(seconds.len(), 40);
            let admitted: u64 = Phase::ALL
                .iter()
                .map(|&p| group.counts(c, p).admitted)
                .sum();
            assert_eq!(seconds.iter().sum::<u64>(), admitted, "{}", group.name());
        }
    }
}

/// The most admitted requests in one window ending in `[start, end)`'s phase (its end after
/// `start`, at `end` at the latest), counted without the report's sweep: every start at
/// which a window's count can change (a request leaving it, a request entering it) and the
/// phase's own ends, each window counted request by request. All in nanoseconds.
fn sliding_max(sent: &[u64], window: u64, start: u64, end: u64) -> u64 {
    let starts = sent
        .iter()
        .flat_map(|&t| [t, (t + 1).saturating_sub(window)])
        .chain([
            end.saturating_sub(window),
            (start + 1).saturating_sub(window),
        ])
        .filter(|&s| s + window > start && s + window <= end);
    starts
        .map(|s| sent.iter().filter(|&&t| t >= s && t < s + window).count() as u64)
        .max()
        .unwrap_or(0)
}

/// The worst window per phase is the busiest window of the quota's length that ends in the
/// phase, by send time: the same as a sliding maximum over the traced requests' exact send
/// times, never below a phase's average window, and where a local share takes over from
/// the store (the outage's start) or hands back to it (the store's return), it holds both
/// sides of the edge.
#[test]
fn the_worst_window_is_the_sliding_maximum_of_the_trace() {
    for (window_secs, limit) in [(1, 50), (2, 100)] {
        let scenario = Scenario::default()
            .limit(limit)
            .window_secs(window_secs)
            .normal_secs(6)
            .outage_secs(6)
            .recovery_secs(6)
            .policies([PolicyName::LocalShare, PolicyName::Closed])
            .trace("acme");
        let report = run(scenario.clone());
        let window = Duration::from_secs(window_secs);
        // Each of the 4 local shares' windows is at least as long as the quota's here.
        let share = scenario.policy().algorithm().divided_by(4);
        assert!(share.window_ms() >= window_secs * 1_000, "{share:?}");
        let bound = limit + 4 * share.quota();
        assert_eq!(report.window(), window);
        let window_ns = window.as_nanos() as u64;
        let ends_ns: Vec<u64> = [6, 12, 18].map(|s| s * 1_000_000_000).to_vec();
        for group in report.groups() {
            let sent: Vec<u64> = group
                .trace()
                .iter()
                .filter(|t| t.status == 200)
                .map(|t| t.sent_at.as_nanos() as u64)
                .collect();
            assert!(sent.windows(2).all(|w| w[0] < w[1]), "in send order");
            let mut phase_start = 0;
            for (p, phase) in Phase::ALL.into_iter().enumerate() {
                let counts = group.counts(0, phase);
                let worst = counts.worst_window_admitted;
                // The windows that end in the phase; those of the recovery may end after
                // the run, holding nothing more.
                let phase_end = if p == 2 { u64::MAX / 2 } else { ends_ns[p] };
                let expected = sliding_max(&sent, window_ns, phase_start, phase_end);
                assert_eq!(
                    worst,
                    expected,
                    "{}, {phase}, window {window_secs} s",
                    group.name()
                );
                let row = report.row(group.name(), phase, "acme").expect("a row");
                assert_eq!(row.worst_window_admitted, worst);
                // A 6 s phase is a whole number of windows: one of them holds at least
                // their average.
                let average = row.admitted_per_sec * window_secs as f64;
                assert!(
                    worst as f64 >= average - 1e-9,
                    "{}, {phase}: worst {worst} below the average {average}",
                    group.name()
                );
                // Never more than the store's quota plus every instance's local share
                // in one window (the edges), nor more than was sent in one.
                assert!(
                    worst <= bound,
                    "{}, {phase}: {worst} over {bound}",
                    group.name()
                );
                assert!(worst as f64 <= 120.0 * window_secs as f64 + 1.0);
                phase_start = ends_ns[p];
            }
        }
        // The edges themselves: the windows straddling the outage's start and the store's
        // return hold what both sides admitted.
        let shared = &report.groups()[0];
        let sent: Vec<u64> = shared
            .trace()
            .iter()
            .filter(|t| t.status == 200)
            .map(|t| t.sent_at.as_nanos() as u64)
            .collect();
        for (phase, edge) in [(Phase::Outage, ends_ns[0]), (Phase::Recovery, ends_ns[1])] {
            let straddling = sliding_max(&sent, window_ns, edge, edge + window_ns - 1);
            let worst = shared.counts(0, phase).worst_window_admitted;
            assert!(worst >= straddling, "{phase}: {worst} < {straddling}");
        }
        // Failing closed admits nothing in the outage, yet its worst window is one
        // straddling its start: the normal phase's last admissions, which a window of the
        // normal phase (ending at its end) holds too.
        let closed = &report.groups()[1];
        assert_eq!(closed.counts(0, Phase::Outage).admitted, 0);
        let last_normal = closed.counts(0, Phase::Outage).worst_window_admitted;
        let normal = closed.counts(0, Phase::Normal).worst_window_admitted;
        assert!(
            last_normal > 0 && last_normal <= normal,
            "{last_normal}, {normal}"
        );
    }
}

/// The outage replayed against a limiter configured by the caller (a tiered token bucket
/// that falls back to a local share), awaited inside a test of the caller's own on a
/// paused clock, next to a built-in policy for comparison.
#[tokio::test(start_paused = true)]
async fn a_limiter_of_your_own_replays_the_outage() {
    let scenario = Scenario::default()
        .policies([PolicyName::Closed])
        .instances(2)
        .traffic([Customer::new("acme", 40.0), Customer::new("initech", 5.0)])
        .normal_secs(5)
        .outage_secs(5)
        .recovery_secs(5)
        .group("mine", |instance| {
            assert_eq!(instance.instances(), 2);
            assert!(instance.instance() < 2);
            assert_eq!(instance.group(), "mine");
            instance
                .limiter_builder()
                .policy(Policy::token_bucket(
                    "per-second",
                    Quota::per_second(20),
                    20,
                ))
                .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(2)))
                .store_timeout(Duration::from_millis(20))
                .try_build()
        });
    assert_eq!(scenario.group_names(), ["closed", "mine"]);
    let report = scenario.run().await.expect("the simulation runs");
    assert_eq!(report.unexpected_statuses(), 0);
    // On the store, 20 per second; while it is down, each of the 2 instances enforces
    // half of it: still about 20 per second in all, and never a 503.
    for phase in ["normal", "outage", "recovery"] {
        let acme = admitted(&report, "mine", phase, "acme");
        assert!(
            (17.0..=25.0).contains(&acme),
            "mine, {phase}: acme {acme}/s"
        );
        assert_near(&report, "mine", phase, "initech", 5.0);
        assert_eq!(row(&report, "mine", phase, "acme").refused_503, 0);
    }
    assert!(row(&report, "mine", "outage", "acme").refused_429 > 0);
    assert_eq!(admitted(&report, "closed", "outage", "acme"), 0.0);
    assert!(report.groups()[1].all_breakers_closed_after().is_some());

    // A configuration the factory refuses ends the run with a typed error.
    let refused = Scenario::default()
        .policies([])
        .group("broken", |instance| instance.limiter_builder().try_build())
        .run()
        .await;
    assert!(
        matches!(&refused, Err(SimulationError::Build { group, .. }) if group == "broken"),
        "{refused:?}"
    );
}

#[test]
fn bad_numbers_are_typed_errors_not_panics() {
    let out_of_range = |scenario: Scenario, setting: &str| match scenario.validate() {
        Err(ScenarioError::OutOfRange { setting: s, .. }) => assert_eq!(s, setting),
        other => panic!("{setting}: {other:?}"),
    };
    out_of_range(Scenario::new().limit(0), "limit");
    out_of_range(Scenario::new().instances(0), "instances");
    out_of_range(Scenario::new().window_secs(0), "window_secs");
    out_of_range(Scenario::new().outage_secs(0), "outage_secs");
    out_of_range(Scenario::new().store_timeout_ms(60_001), "store_timeout_ms");
    out_of_range(
        Scenario::new().breaker_base_open_ms(0),
        "breaker_base_open_ms",
    );
    assert_eq!(
        Scenario::new().burst(10).validate(),
        Err(ScenarioError::BurstNeedsTokenBucket)
    );
    assert_eq!(
        Scenario::new().breaker_max_open_ms(100).validate(),
        Err(ScenarioError::BreakerBaseAboveMax {
            base_ms: 500,
            max_ms: 100
        })
    );
    assert!(matches!(
        Scenario::new()
            .traffic([Customer::new("acme", -3.0)])
            .validate(),
        Err(ScenarioError::BadRate { .. })
    ));
    assert!(matches!(
        Scenario::new()
            .traffic([Customer::new("a b", 3.0)])
            .validate(),
        Err(ScenarioError::BadCustomerName(_))
    ));
    assert!(matches!(
        Scenario::new()
            .traffic([Customer::new("a", 1.0), Customer::new("a", 2.0)])
            .validate(),
        Err(ScenarioError::DuplicateCustomer(_))
    ));
    assert_eq!(
        Scenario::new().traffic([]).validate(),
        Err(ScenarioError::NoCustomers)
    );
    assert_eq!(
        Scenario::new().policies([]).validate(),
        Err(ScenarioError::NoGroups)
    );
    assert!(matches!(
        Scenario::new()
            .traffic([Customer::new("flood", 100_000.0)])
            .validate(),
        Err(ScenarioError::TooLarge { .. })
    ));
    assert!(matches!(
        Scenario::new()
            .limit(1_000_000_000)
            .window_secs(86_400)
            .validate(),
        Err(ScenarioError::QuotaTooLarge)
    ));
    assert!(matches!(
        "acme".parse::<Customer>(),
        Err(ScenarioError::NotNameRate(_))
    ));
    assert!(matches!(
        "fail-sideways".parse::<PolicyName>(),
        Err(ScenarioError::UnknownPolicy(_))
    ));
    assert!(matches!(
        "fire".parse::<FaultKind>(),
        Err(ScenarioError::UnknownFault(_))
    ));
    assert!(matches!(
        "leaky".parse::<AlgorithmKind>(),
        Err(ScenarioError::UnknownAlgorithm(_))
    ));
    // A run checks the scenario first.
    assert!(matches!(
        Scenario::new().limit(0).run_blocking(),
        Err(SimulationError::Scenario(ScenarioError::OutOfRange { .. }))
    ));
}

/// Switches the fault proxy in front of the real Redis.
#[cfg(feature = "redis")]
#[derive(Debug)]
struct ProxySwitch {
    proxy: Arc<FaultProxy>,
}

#[cfg(feature = "redis")]
impl FaultSwitch for ProxySwitch {
    fn set(
        &self,
        fault: Option<FaultKind>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SimulationError>> + Send + '_>> {
        let proxy = self.proxy.clone();
        let fault = match fault {
            None => Fault::Pass,
            Some(FaultKind::Refuse) => Fault::Refuse,
            Some(FaultKind::Blackhole) => Fault::Blackhole,
            // Slow: twice the default store timeout.
            Some(_) => Fault::Delay(Duration::from_millis(40)),
        };
        Box::pin(async move {
            tokio::task::spawn_blocking(move || proxy.set(fault))
                .await
                .map_err(|e| SimulationError::FaultSwitch(e.to_string()))
        })
    }
}

/// The same scenario in real time on a real redis-server, through the fault proxy; short
/// phases, so looser bounds than the virtual runs.
#[cfg(feature = "redis")]
#[test]
fn a_real_redis_behind_the_fault_proxy() {
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port()));
    let scenario = Scenario::default()
        .normal_secs(2)
        .outage_secs(5)
        .recovery_secs(3)
        .policies([PolicyName::LocalShare, PolicyName::Closed]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let report = runtime.block_on(async {
        let mut stores = Vec::new();
        for (name, instances) in scenario
            .group_names()
            .iter()
            .zip(scenario.group_instances())
        {
            let mut group = Vec::new();
            for _ in 0..instances {
                let store = RedisBackend::builder(proxy.url())
                    .prefix(format!("tollgate-sim-test-{}-{name}", std::process::id()))
                    .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
                    .build()
                    .expect("a valid URL");
                store.ping().await.expect("Redis answers through the proxy");
                group.push(store);
            }
            stores.push(group);
        }
        let switch = ProxySwitch {
            proxy: proxy.clone(),
        };
        scenario
            .run_against(|g, i| stores[g][i].clone(), &switch)
            .await
            .expect("the simulation runs")
    });
    assert_eq!(report.rows().len(), 2 * 3 * CUSTOMERS.len());
    for policy in ["local-share", "closed"] {
        for phase in ["normal", "recovery"] {
            // A cold window at the start of a short phase admits a burst: up to a window's
            // quota more than the limit.
            let acme = admitted(&report, policy, phase, "acme");
            assert!(
                (40.0..=80.0).contains(&acme),
                "{policy}, {phase}: acme {acme}/s"
            );
        }
        assert_near(&report, policy, "normal", "globex", 20.0);
        assert_near(&report, policy, "normal", "initech", 5.0);
    }
    for (customer, _) in CUSTOMERS {
        assert_eq!(
            admitted(&report, "closed", "outage", customer),
            0.0,
            "{customer}"
        );
    }
    // Over a 5 s outage, the local counters' first window (a whole window's quota per
    // instance, at once) is not amortized: allow it on top of the share's rate. Nor is its
    // start: each share starts from what the store last said acme had used, all of it at
    // 120/s, so acme's first outage second can admit nothing (measured here: 37.6 to 45.4
    // a second over 5 s, in real time on two cores).
    let per_second = Algorithm::sliding_window(50, Duration::from_secs(1));
    let share = 4.0 * share_per_sec(per_second, 4);
    let burst = 4.0 * per_second.divided_by(4).quota() as f64 / 5.0;
    let started = share * 4.0 / 5.0;
    let acme = admitted(&report, "local-share", "outage", "acme");
    assert!(
        (started * 0.9..=(share + burst) * 1.1).contains(&acme),
        "local-share, outage: acme {acme}/s, expected {started}/s to {share}/s plus at most {burst}/s"
    );
    assert_near(&report, "local-share", "outage", "globex", 20.0);
    assert_near(&report, "local-share", "outage", "initech", 5.0);
}

// ---------------------------------------------------------------------------------------
// The command line: examples/simulate/

/// Builds the example once, with this test's profile and features, and returns its path.
/// (`cargo test --test it simulate::` alone does not build examples.)
pub(crate) fn simulator() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let mut features = Vec::new();
        if cfg!(feature = "axum") {
            features.push("axum");
        }
        if cfg!(feature = "redis") {
            features.push("redis");
        }
        if cfg!(feature = "redis-tls") {
            features.push("redis-tls");
        }
        if cfg!(feature = "serde") {
            features.push("serde");
        }
        let mut command = Command::new(env!("CARGO"));
        command
            .args(["build", "--example", "simulate", "--message-format=json"])
            .args([
                "--manifest-path",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            ])
            .args(["--no-default-features", "--features", &features.join(",")]);
        if !cfg!(debug_assertions) {
            command.arg("--release");
        }
        let output = command.output().expect("run cargo build");
        assert!(
            output.status.success(),
            "cargo build --example simulate failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "simulate")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported no simulate executable")
    })
}

fn simulate(args: &[&str]) -> Output {
    Command::new(simulator())
        .args(args)
        .output()
        .expect("run the simulator")
}

/// `--json` prints the rows as a JSON array and nothing else on stdout, with exactly the
/// documented keys, the same numbers as the library's report, and a chart on request.
#[test]
fn the_command_line_prints_json_rows_and_a_chart() {
    let chart = std::env::temp_dir().join(format!("tollgate-simulate-{}.svg", std::process::id()));
    let args = [
        "--json",
        "--limit",
        "40",
        "--window-secs",
        "2",
        "--instances",
        "2",
        "--traffic",
        "big=60",
        "--traffic",
        "small=2",
        "--normal-secs",
        "10",
        "--outage-secs",
        "20",
        "--recovery-secs",
        "10",
        "--policy",
        "local-share",
        "--policy=closed",
        "--chart",
        chart.to_str().expect("a UTF-8 temp path"),
    ];
    let output = simulate(&args);
    assert!(
        output.status.success(),
        "simulate {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    let value: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout of simulate {args:?} is not one JSON document ({e}):\n{stdout}")
    });
    let rows = value.as_array().expect("a JSON array").clone();
    // 2 policies x 3 phases x 2 customers, in the canonical policy order.
    assert_eq!(rows.len(), 12);
    assert_eq!(rows[0]["policy"], "closed");
    for row in &rows {
        let object = row.as_object().expect("rows are objects");
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut expected = KEYS.to_vec();
        if row["phase"] == "recovery" {
            expected.push(CLOSED_AFTER);
            let closed = &row[CLOSED_AFTER];
            assert!(
                closed.is_null() || closed.is_f64() || closed.is_u64(),
                "{row}"
            );
        }
        expected.sort_unstable();
        assert_eq!(keys, expected, "keys of {row}");
        assert!(row["policy"].is_string() && row["phase"].is_string());
        assert!(row["customer"] == "big" || row["customer"] == "small");
        assert!(row["sent_per_sec"].is_f64() || row["sent_per_sec"].is_u64());
        assert!(row["admitted_per_sec"].is_f64() || row["admitted_per_sec"].is_u64());
        assert!(row["refused_429"].is_u64() && row["refused_503"].is_u64());
        assert!(row["worst_window_admitted"].is_u64());
    }
    // The same run through the library gives the same numbers (virtual time is exact).
    let report = run(Scenario::default()
        .limit(40)
        .window_secs(2)
        .instances(2)
        .traffic([Customer::new("big", 60.0), Customer::new("small", 2.0)])
        .normal_secs(10)
        .outage_secs(20)
        .recovery_secs(10)
        .policies([PolicyName::Closed, PolicyName::LocalShare]));
    for (json, row) in rows.iter().zip(report.rows()) {
        assert_eq!(json["policy"], row.policy.as_str());
        assert_eq!(json["phase"], row.phase.name());
        assert_eq!(json["customer"], row.customer.as_str());
        let rounded = (row.admitted_per_sec * 100.0).round() / 100.0;
        assert_eq!(json["admitted_per_sec"].as_f64(), Some(rounded), "{json}");
        assert_eq!(
            json["refused_503"].as_u64(),
            Some(row.refused_503),
            "{json}"
        );
        assert_eq!(
            json["worst_window_admitted"].as_u64(),
            Some(row.worst_window_admitted),
            "{json}"
        );
    }

    let svg = std::fs::read_to_string(&chart).expect("the chart was written");
    let _ = std::fs::remove_file(&chart);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    // One panel per policy, one line per customer in each.
    assert!(
        svg.contains(">local-share<") && svg.contains(">closed<"),
        "{svg}"
    );
    assert_eq!(svg.matches("<polyline").count(), 2 * 2);
}

#[test]
fn the_table_explains_itself() {
    let output = simulate(&[
        "--policy",
        "local-share",
        "--normal-secs",
        "2",
        "--outage-secs",
        "2",
        "--recovery-secs",
        "2",
    ]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    for phase in ["## normal", "## outage", "## recovery"] {
        assert!(text.contains(phase), "{text}");
    }
    assert!(text.contains("whole-phase averages"), "{text}");
    assert!(text.contains("| local-share "), "{text}");
    assert!(text.contains("all breakers closed after"), "{text}");
    // The worst window's column, labelled by the window's length: one count per customer.
    assert!(text.contains(" worst 1 s |"), "{text}");
    assert!(
        text.contains("window straddling the phase's start"),
        "{text}"
    );
    let outage = text
        .lines()
        .skip_while(|l| !l.starts_with("## outage"))
        .find(|l| l.starts_with("| local-share "))
        .expect("the outage's local-share row");
    assert_eq!(outage.split(" / ").count(), 3, "{outage}");
    assert!(
        text.contains("the breaker (the library's default)")
            && text.contains("250-500 ms at first")
            && text.contains("at most 1000 ms"),
        "{text}"
    );
    let output = simulate(&[
        "--policy",
        "closed",
        "--outage-secs",
        "2",
        "--breaker-max-open-ms",
        "2000",
    ]);
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    assert!(
        text.contains("the breaker (set by the flags)") && text.contains("at most 2000 ms"),
        "{text}"
    );
    let output = simulate(&[
        "--policy",
        "closed",
        "--limit",
        "3000",
        "--window-secs",
        "60",
        "--normal-secs",
        "2",
        "--outage-secs",
        "2",
        "--recovery-secs",
        "2",
    ]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    assert!(
        text.contains(" worst 60 s |") && !text.contains("worst 1 s"),
        "{text}"
    );
}

/// `--regions`: one table per customer, the two-tier store beside each region counting
/// alone by phase (the fault's named after it), the numbers of the library's run, and the
/// chart of acme's admissions by region.
#[test]
fn the_command_line_replays_one_limit_across_regions() {
    let chart = std::env::temp_dir().join(format!(
        "tollgate-simulate-regions-{}.svg",
        std::process::id()
    ));
    let args = [
        "--regions",
        "--normal-secs",
        "4",
        "--outage-secs",
        "4",
        "--recovery-secs",
        "4",
        "--chart",
        chart.to_str().expect("a UTF-8 temp path"),
    ];
    let output = simulate(&args);
    assert!(
        output.status.success(),
        "simulate {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    for heading in [
        "## acme: 120/s sent (us-east 96/s, eu-west 18/s, ap-south 6/s)",
        "## globex",
        "## initech: 5/s sent (ap-south 5/s)",
        "| us-east (96/s) |",
        "WAN calls/request",
        "us-east cut off from the global store, from 4 s to 8 s",
    ] {
        assert!(text.contains(heading), "{heading:?} not in\n{text}");
    }
    // The library's run, on the same virtual time: the same numbers in the table.
    let report = Regions::default()
        .normal_secs(4)
        .fault_secs(4)
        .recovery_secs(4)
        .run_blocking()
        .expect("the library's run");
    for (group, phase, label) in [
        ("two-tier", Phase::Normal, "normal"),
        ("two-tier", Phase::Outage, "partition"),
        ("per-region", Phase::Recovery, "recovery"),
    ] {
        let row = report.row(group, phase, "acme").expect("a row");
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("| {group:<10} | {label:<9} |")))
            .unwrap_or_else(|| panic!("no {group} {label} row in\n{text}"));
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells[3], format!("{:.1}", row.admitted_per_sec), "{line}");
        assert!(
            cells[4].starts_with(&format!("{} (", row.worst_window_admitted)),
            "{line}"
        );
        assert_eq!(
            cells[5],
            format!("{:.1}", row.regions[0].admitted_per_sec),
            "{line}"
        );
    }
    let svg = std::fs::read_to_string(&chart).expect("the chart was written");
    let _ = std::fs::remove_file(&chart);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains(">two-tier<") && svg.contains(">per-region<"),
        "{svg}"
    );
    // Per panel a line per region and one for all of them, and the limit in dashes of its
    // own colour.
    let lines = svg
        .lines()
        .filter(|l| l.starts_with("<polyline") && !l.contains("#C02020"))
        .count();
    assert_eq!(lines, 2 * 4);
    assert!(svg.contains("the limit (50/s)"), "{svg}");
}

#[test]
fn bad_flags_exit_with_2_and_say_why() {
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "--bogus"),
        (&["stray"], "unexpected argument"),
        (&["--limit"], "--limit"),
        (&["--limit", "many"], "--limit"),
        (&["--limit", "0"], "--limit"),
        (&["--instances", "0"], "--instances"),
        (&["--window-secs", "-1"], "--window-secs"),
        (&["--outage-secs", "0"], "--outage-secs"),
        (&["--policy", "fail-sideways"], "--policy"),
        (&["--fault", "fire"], "--fault"),
        (&["--algorithm", "leaky"], "--algorithm"),
        (&["--burst", "10"], "--burst needs --algorithm token-bucket"),
        (&["--traffic", "acme"], "--traffic"),
        (&["--traffic", "acme=-3"], "--traffic"),
        (&["--traffic", "a b=3"], "--traffic"),
        (&["--traffic", "a=1", "--traffic", "a=2"], "twice"),
        (&["--json=yes"], "--json"),
        (
            &["--breaker-max-open-ms", "100"],
            "--breaker-base-open-ms (500 ms)",
        ),
        (&["--breaker-base-open-ms", "0"], "--breaker-base-open-ms"),
        (&["--redis", "redis://10.1.2.3:6379/"], "--redis"),
        (&["--chart", ""], "--chart"),
        (&["--wan-rtt-ms", "50"], "--regions"),
        (&["--regions", "--policy", "closed"], "--policy"),
        (&["--regions", "--region-fault", "fire"], "--region-fault"),
        (
            &["--regions", "--region-fault", "partition:mars"],
            "--region-fault: no region is called \"mars\"",
        ),
        (&["--regions", "--share-by", "luck"], "--share-by"),
        (&["--regions", "--outage-secs", "0"], "--outage-secs"),
    ];
    for (args, says) in cases {
        let output = simulate(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "simulate {args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "simulate {args:?} says {stderr:?}, not {says:?}"
        );
        assert!(
            output.stdout.is_empty(),
            "simulate {args:?} printed to stdout"
        );
    }
}

#[test]
fn help_prints_the_flags() {
    let output = simulate(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let usage = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--limit",
        "--window-secs",
        "--instances",
        "--outage-secs",
        "--traffic",
        "--algorithm",
        "--burst",
        "--policy",
        "--fault",
        "--json",
        "--chart",
        "--redis",
        "--breaker-base-open-ms",
        "--breaker-max-open-ms",
        "--regions",
        "--wan-rtt-ms",
        "--region-fault",
        "--share-by",
    ] {
        assert!(usage.contains(flag), "--help does not mention {flag}");
    }
}
