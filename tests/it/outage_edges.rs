//! The edges of an outage: no window of the limit's length holds more than the limit
//! (within the sliding window counter's own error) when the store goes away or comes
//! back. On virtual time through the simulator (the real layer, limiter, breaker and
//! failure policies) for the long windows; over HTTP against orders_api processes on a
//! real redis-server behind the fault proxy for the running example.

use std::time::Duration;

use tollgate_simulator::{AlgorithmKind, Counts, Customer, Phase, PolicyName, Scenario};
use tollgate_testkit::rates::{rate_between, worst_window};

struct Edges {
    start: usize,
    back: usize,
    outage_rate: f64,
    in_outage: usize,
    /// Every customer's name, send rate, and counts in the outage and in the recovery
    /// (whose worst windows include those straddling the outage's start and its end).
    customers: Vec<(String, f64, Counts, Counts)>,
}

/// Runs `scenario` for acme's trace and measures the worst window around each edge (from
/// a window before it to two after) and the steady outage rate (its last half).
fn edges(scenario: Scenario, customer: &str) -> Edges {
    let normal = Duration::from_secs(scenario.phase_secs(Phase::Normal));
    let outage = Duration::from_secs(scenario.phase_secs(Phase::Outage));
    let window = Duration::from_secs(scenario.window_secs_value());
    let report = scenario
        .trace(customer)
        .run_blocking()
        .expect("the scenario runs");
    let group = &report.groups()[0];
    let customers = report
        .customers()
        .iter()
        .enumerate()
        .map(|(c, customer)| {
            (
                customer.name().to_owned(),
                customer.rate(),
                group.counts(c, Phase::Outage),
                group.counts(c, Phase::Recovery),
            )
        })
        .collect();
    let admitted: Vec<Duration> = group
        .trace()
        .iter()
        .filter(|t| t.status == 200)
        .map(|t| t.sent_at)
        .collect();
    let cut = normal;
    let back = normal + outage;
    let steady = rate_between(&admitted, cut + outage / 2, back);
    Edges {
        start: worst_window(
            &admitted,
            window,
            cut.saturating_sub(window),
            cut + 2 * window,
        ),
        back: worst_window(
            &admitted,
            window,
            back.saturating_sub(window),
            back + 2 * window,
        ),
        outage_rate: steady * window.as_secs_f64(),
        in_outage: admitted.iter().filter(|t| **t >= cut && **t < back).count(),
        customers,
    }
}

fn running_example(policy: PolicyName, algorithm: AlgorithmKind) -> Scenario {
    Scenario::new()
        .policies([policy])
        .algorithm(algorithm)
        .normal_secs(10)
        .outage_secs(20)
        .recovery_secs(10)
}

#[test]
fn the_running_example_holds_the_limit_at_both_edges() {
    let cases = [
        (PolicyName::LocalShare, AlgorithmKind::SlidingWindow),
        (PolicyName::LocalShare, AlgorithmKind::TokenBucket),
        (
            PolicyName::StaticThenLocalShare,
            AlgorithmKind::SlidingWindow,
        ),
        (PolicyName::LocalShareLeased, AlgorithmKind::SlidingWindow),
        (PolicyName::LocalShareLeased, AlgorithmKind::TokenBucket),
    ];
    let mut failures = Vec::new();
    for (policy, algorithm) in cases {
        let measured = edges(running_example(policy, algorithm), "acme");
        println!(
            "{} {algorithm:?}: worst 1 s at the start {}, at the return {}, outage {:.1}/s",
            policy.name(),
            measured.start,
            measured.back,
            measured.outage_rate
        );
        // On virtual time nothing drifts between a send and its decision: each edge holds
        // the limit, and a token bucket one more (the token it may hold as a second starts,
        // beside the 50 it refills in it). Each instance's breaker probe at the store's
        // return, admitted by the store alone, once made it 54.
        let edge_bound = match algorithm {
            AlgorithmKind::TokenBucket => 51,
            _ => 50,
        };
        if measured.start > edge_bound
            || measured.back > edge_bound
            || (measured.outage_rate - 50.0).abs() > 5.0
        {
            failures.push(format!(
                "{} {algorithm:?}: start {}, return {}, outage {:.1}/s",
                policy.name(),
                measured.start,
                measured.back,
                measured.outage_rate
            ));
        }
        // Every caller, not only the one over its quota: none gets more than the limit in
        // any second around either edge, and one under its share loses nothing to the
        // outage or to the store's return.
        for (name, rate, outage, recovery) in &measured.customers {
            println!(
                "  {name} at {rate}/s: worst second {} in the outage, {} in the recovery; \
                 admitted {} of {} in the outage, {} of {} in the recovery",
                outage.worst_window_admitted,
                recovery.worst_window_admitted,
                outage.admitted,
                outage.sent,
                recovery.admitted,
                recovery.sent
            );
            let worst = outage
                .worst_window_admitted
                .max(recovery.worst_window_admitted);
            // At half the quota or less, a caller stays under each instance's share (a
            // quarter of the quota) however its requests spread over the four instances.
            let under_share = *rate <= 50.0 / 2.0;
            if worst > 55
                || (under_share
                    && (outage.admitted, recovery.admitted) != (outage.sent, recovery.sent))
            {
                failures.push(format!(
                    "{} {algorithm:?}, {name}: worst second {worst}, admitted {}/{} and {}/{}",
                    policy.name(),
                    outage.admitted,
                    outage.sent,
                    recovery.admitted,
                    recovery.sent
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "an edge over the limit, a caller over 55 in a second, off 50/s by 10%, or a caller \
         under its share refused: {failures:?}"
    );
}

#[test]
fn a_quota_below_the_instance_count_takes_turns() {
    for algorithm in [AlgorithmKind::SlidingWindow, AlgorithmKind::TokenBucket] {
        let scenario = Scenario::new()
            .limit(1)
            .window_secs(60)
            .instances(10)
            .algorithm(algorithm)
            .traffic([Customer::new("attacker", 3.0)])
            .policies([PolicyName::LocalShare])
            .normal_secs(60)
            .outage_secs(1_200)
            .recovery_secs(120);
        let measured = edges(scenario, "attacker");
        println!(
            "1/min over 10 {algorithm:?}: {} in the 20-minute outage, worst minute {} at the start, {} at the return",
            measured.in_outage, measured.start, measured.back
        );
        assert!(
            measured.in_outage <= 21,
            "{algorithm:?}: {} in 20 minutes",
            measured.in_outage
        );
        assert!(
            measured.start <= 2 && measured.back <= 2,
            "{algorithm:?}: worst minutes {} and {}",
            measured.start,
            measured.back
        );
    }
}

/// A token bucket whose burst is below the instance count: each instance's part cannot
/// hold a token of the burst, so the instances take turns, and neither the outage nor its
/// start admits more than the bucket would (its burst plus what it refills in a second),
/// nor more than the burst at one instant.
#[test]
fn regression_a_bucket_burst_below_the_instance_count_holds_at_the_edges() {
    for (limit, burst, instances) in [(10, 1, 4), (100, 3, 8)] {
        let scenario = Scenario::new()
            .limit(limit)
            .burst(burst)
            .window_secs(1)
            .instances(instances)
            .algorithm(AlgorithmKind::TokenBucket)
            .traffic([Customer::new("acme", 3.0 * limit as f64)])
            .policies([PolicyName::LocalShare])
            .normal_secs(5)
            .outage_secs(10)
            .recovery_secs(5);
        let report = scenario
            .trace("acme")
            .run_blocking()
            .expect("the scenario runs");
        let admitted: Vec<Duration> = report.groups()[0]
            .trace()
            .iter()
            .filter(|t| t.status == 200)
            .map(|t| t.sent_at)
            .collect();
        let cut = Duration::from_secs(5);
        let back = Duration::from_secs(15);
        let second = Duration::from_secs(1);
        // From the last second before the store went away to the last one before its
        // return (which the return's own test measures).
        let outage_worst = worst_window(&admitted, second, cut - second, back - second);
        let at_once = admitted
            .chunk_by(|a, b| a == b)
            .filter(|same| same[0] >= cut && same[0] < back)
            .map(<[Duration]>::len)
            .max()
            .unwrap_or(0);
        let in_outage = admitted.iter().filter(|t| **t >= cut && **t < back).count();
        println!(
            "{limit}/s burst {burst} over {instances}: worst second {outage_worst}, \
             {at_once} at one instant, {in_outage} in the 10 s outage"
        );
        assert!(
            outage_worst as u64 <= limit + burst,
            "{limit}/s burst {burst} over {instances}: {outage_worst} in a second"
        );
        assert!(at_once as u64 <= burst, "{at_once} at one instant");
        assert!(
            in_outage as u64 >= limit * 10 / 2,
            "{in_outage} in the outage"
        );
    }
}
