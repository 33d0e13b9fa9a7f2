//! Replaying an outage through a layer of the user's own (`Scenario::layer`), as a user of
//! `tollgate-simulator` writes it in a test: its key extractor (an API key mapped to a
//! customer and its plan), plan tiers, a cost, `count_only`, `settle`, a soft limit and a
//! byte quota, the customers sending the headers that layer reads and the handler
//! answering with the headers and bodies it settles from. The report measures each policy
//! in its own window.
//!
//! Virtual time is exact: the numbers asserted are the ones measured, and each test prints
//! them (`-- --nocapture`).

use std::time::Duration;

use tollgate::key::{FnKey, HeaderKey, KeyRejection};
use tollgate::{Caller, FailurePolicy, Policy, Quota, RateLimitLayer};
use tollgate_simulator::{Customer, GroupReport, Phase, Report, Scenario};

/// The customers' API keys, as the service's key store knows them: the customer each one
/// belongs to, and its plan.
const KEYS: [(&str, &str, Option<&str>); 3] = [
    ("sk_acme", "acme", Some("gold")),
    ("sk_globex", "globex", None),
    ("sk_initech", "initech", None),
];

/// The service's key extractor: the API key names the customer and its plan tier; a key
/// it does not know is refused with 401.
fn by_api_key() -> FnKey<impl Fn(&http::Request<()>) -> Result<Caller, KeyRejection> + Clone> {
    FnKey::new(|request: &http::Request<()>| {
        let unknown = || KeyRejection::new(http::StatusCode::UNAUTHORIZED, "unknown API key");
        let key = request.headers().get("x-api-key").ok_or_else(unknown)?;
        let (_, customer, plan) = KEYS
            .iter()
            .find(|(known, _, _)| key.as_bytes() == known.as_bytes())
            .ok_or_else(unknown)?;
        Ok(match plan {
            Some(plan) => Caller::new(*customer).with_tier(*plan),
            None => Caller::new(*customer),
        })
    })
}

/// The service's orders route: per caller, a batch costs its `x-batch` items, and an
/// answer served from the cache (`x-cache: hit`) does not count.
fn orders_layer(
    limiter: tollgate::Limiter,
) -> RateLimitLayer<impl tollgate::key::AsyncKeyExtractor> {
    RateLimitLayer::new(limiter)
        .key(by_api_key())
        .cost(|request| {
            request
                .headers
                .get("x-batch")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .count_only(|response| {
            response
                .headers
                .get("x-cache")
                .is_none_or(|v| v.as_bytes() != b"hit")
        })
}

/// The index of the customer called `customer` in the report's counts.
fn index(report: &Report, customer: &str) -> usize {
    report
        .customers()
        .iter()
        .position(|c| c.name() == customer)
        .unwrap_or_else(|| panic!("no customer {customer}"))
}

/// The worst window of the group's policy called `policy`.
fn worst(group: &GroupReport, c: usize, phase: Phase, policy: &str) -> u64 {
    group
        .worst_window(c, phase, policy)
        .unwrap_or_else(|| panic!("no policy {policy}"))
}

/// The orders route's limiter: 20 a second and 600 a minute per caller, 100 and 3,000 on
/// the gold plan, a local share over the instances when the store is down.
fn orders_limiter(
    instance: &tollgate_simulator::InstanceContext,
) -> Result<tollgate::Limiter, tollgate::BuildError> {
    instance
        .limiter_builder()
        .name("orders")
        .policy(Policy::sliding_window("per-second", Quota::per_second(20)))
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(600)))
        .tier(
            "gold",
            [
                Policy::sliding_window("per-second", Quota::per_second(100)),
                Policy::sliding_window("per-minute", Quota::per_minute(3_000)),
            ],
        )
        .on_store_failure(FailurePolicy::local_share(instance.instance_count()))
        .store_timeout(Duration::from_millis(20))
        .try_build()
}

/// Prints every customer's counts and worst windows, phase by phase.
fn print(report: &Report) {
    for group in report.groups() {
        for (c, customer) in report.customers().iter().enumerate() {
            for phase in Phase::ALL {
                let counts = group.counts(c, phase);
                let windows: Vec<String> = group
                    .worst_windows(c, phase)
                    .iter()
                    .map(|w| format!("{} {} in {:?}", w.admitted, w.policy, w.window))
                    .collect();
                println!(
                    "{} {phase}: sent {}, admitted {}, soft-limited {}, 429 {}, 503 {}, \
                     other {}; worst windows: {}",
                    customer.name(),
                    counts.sent,
                    counts.admitted,
                    counts.soft_limited,
                    counts.refused_429,
                    counts.refused_503,
                    counts.other,
                    windows.join(", ")
                );
            }
        }
    }
}

/// The service's own key extractor, tiers, cost and `count_only`, replayed through a
/// 60 s outage on 4 instances that share the limit locally. Each policy is measured in
/// its own window: the per-minute policy over 60 s windows, not the scenario's 1 s.
#[test]
fn a_layer_of_your_own_replays_the_outage_in_each_policys_window() {
    let scenario = Scenario::new()
        .policies([])
        .instances(4)
        .traffic([
            // Gold plan, batches of 2: 80 units a second.
            Customer::new("acme", 40.0)
                .header("x-api-key", "sk_acme")
                .header("x-batch", "2"),
            Customer::new("globex", 30.0).header("x-api-key", "sk_globex"),
            // Answered from the cache: never counted.
            Customer::new("initech", 60.0)
                .header("x-api-key", "sk_initech")
                .answers_header("x-cache", "hit"),
            Customer::new("mallory", 2.0).header("x-api-key", "sk_guessed"),
        ])
        .normal_secs(60)
        .outage_secs(60)
        .recovery_secs(60)
        .group("orders", orders_limiter)
        .layer(orders_layer)
        .trace("acme");
    let report = scenario.run_blocking().expect("the scenario runs");
    print(&report);
    let group = &report.groups()[0];
    let [acme, globex, initech, mallory] =
        ["acme", "globex", "initech", "mallory"].map(|name| index(&report, name));

    // Each policy in its own window, the tiers' policies (the same names and windows)
    // not listed twice; the first policy's is the counts' worst window.
    assert_eq!(report.window(), Duration::from_secs(1));
    for c in 0..4 {
        for phase in Phase::ALL {
            let windows: Vec<(String, Duration)> = group
                .worst_windows(c, phase)
                .into_iter()
                .map(|w| (w.policy, w.window))
                .collect();
            assert_eq!(
                windows,
                [
                    ("per-second".to_owned(), Duration::from_secs(1)),
                    ("per-minute".to_owned(), Duration::from_secs(60)),
                ]
            );
            assert_eq!(
                group.counts(c, phase).worst_window_admitted,
                worst(group, c, phase, "per-second")
            );
            let row = report
                .row("orders", phase, report.customers()[c].name())
                .expect("a row");
            assert_eq!(row.worst_windows, group.worst_windows(c, phase));
        }
    }

    // On the store: the gold plan's 3,000 units a minute are 1,500 batches of 2, sent at
    // 40 a second (the plan's 100 units a second would take 50); globex's plan holds it
    // to 20 a second until its 600 a minute are used, at 30 s.
    let normal = group.counts(acme, Phase::Normal);
    assert_eq!(normal.admitted, 1_500, "{normal:?}");
    assert_eq!(worst(group, acme, Phase::Normal, "per-minute"), 1_500);
    assert_eq!(worst(group, acme, Phase::Normal, "per-second"), 40);
    let normal = group.counts(globex, Phase::Normal);
    assert_eq!(normal.admitted, 600, "{normal:?}");
    assert_eq!(worst(group, globex, Phase::Normal, "per-minute"), 600);
    assert_eq!(worst(group, globex, Phase::Normal, "per-second"), 20);
    // The trace shows the plan's quota and the batch's cost.
    let first = group.trace()[0];
    assert_eq!(
        (first.status, first.quota, first.cost),
        (200, Some(100), Some(2)),
        "{first:?}"
    );

    // While the store is down the 4 shares, and after its return the store with them, hold
    // each policy in its own window, the windows straddling both edges included, and admit
    // about what the store did (measured, outage and recovery: acme 1,496 admitted, worst
    // minutes 1,499 and 1,500; globex 596, 599 and 600).
    for phase in [Phase::Outage, Phase::Recovery] {
        for (c, per_second, per_minute) in [(acme, 50, 1_500), (globex, 20, 600)] {
            let counts = group.counts(c, phase);
            assert!(
                worst(group, c, phase, "per-minute") <= per_minute
                    && worst(group, c, phase, "per-second") <= per_second,
                "{phase}, {c}: {:?}",
                group.worst_windows(c, phase)
            );
            assert!(
                counts.admitted as f64 >= per_minute as f64 * 0.95,
                "{phase}, {c}: {counts:?}"
            );
            assert_eq!(counts.refused_503, 0);
        }
    }

    // count_only: initech's answers never count, so it is never refused, on the store or
    // by the shares, at three times its plan's 20 a second. (After the store's return it
    // is: the ignored test below.)
    for phase in [Phase::Normal, Phase::Outage] {
        let counts = group.counts(initech, phase);
        assert_eq!(counts.admitted, counts.sent, "{phase}: {counts:?}");
        assert_eq!(worst(group, initech, phase, "per-second"), 60);
    }

    // The key extractor refuses a key it does not know: 401, never counted.
    for phase in Phase::ALL {
        let counts = group.counts(mallory, phase);
        assert_eq!(
            (counts.other, counts.admitted),
            (counts.sent, 0),
            "{counts:?}"
        );
    }
    assert_eq!(report.unexpected_statuses(), 3 * 120);
}

/// The store's return: a request decided while what a local share counted still weighs
/// is counted by the store and by the share, so a count_only refund, a settlement or the
/// bytes of a body counted after it go to both. Before, they reached the store only: the
/// share kept units that were given back and missed units that were charged. initech,
/// whose answers never count, admitted 622 of its 3,600 requests in the 60 s after the
/// store's return (every one before), refused by the share (quota 5) while the store said
/// 19 remained; a byte quota of 1,000,000 a minute had 18 answers of 100,000 in one minute
/// across the return.
#[test]
fn regression_what_is_given_back_or_charged_after_the_stores_return_reaches_the_share() {
    let report = Scenario::new()
        .policies([])
        .instances(4)
        .traffic([Customer::new("initech", 60.0)
            .header("x-api-key", "sk_initech")
            .answers_header("x-cache", "hit")])
        .normal_secs(60)
        .outage_secs(60)
        .recovery_secs(60)
        .group("orders", orders_limiter)
        .layer(orders_layer)
        .run_blocking()
        .expect("the scenario runs");
    print(&report);
    let recovery = report.groups()[0].counts(0, Phase::Recovery);
    assert_eq!(recovery.admitted, recovery.sent, "{recovery:?}");

    let bytes = Scenario::new()
        .policies([])
        .instances(2)
        .traffic([Customer::new("acme", 1.0).answers_bytes(100_000)])
        .normal_secs(60)
        .outage_secs(60)
        .recovery_secs(60)
        .group("egress", |instance| {
            instance
                .limiter_builder()
                .policy(
                    Policy::sliding_window("egress", Quota::per_minute(1_000_000)).content_bytes(),
                )
                .on_store_failure(FailurePolicy::local_share(instance.instance_count()))
                .try_build()
        })
        .layer(|limiter| {
            RateLimitLayer::new(limiter)
                .key(HeaderKey::new("x-customer-id"))
                .count_response_bytes()
        })
        .run_blocking()
        .expect("the scenario runs");
    print(&bytes);
    let recovery = bytes.groups()[0].counts(0, Phase::Recovery);
    // A body in progress is never cut: one answer past the quota at most.
    assert!(recovery.worst_window_admitted <= 11, "{recovery:?}");
}

/// A token budget: each completion is reserved at the `x-max-tokens` it asks for and
/// settled at the `x-tokens-used` it is answered with, 10,000 tokens a minute per API key,
/// on 4 instances that share the budget locally while the store is down for 2 minutes.
#[test]
fn a_token_budget_reserved_and_settled_through_an_outage() {
    let completion = |name: &str, rate: f64, max_tokens: &str, used: &str| {
        Customer::new(name, rate)
            .request("POST", "/v1/completions")
            .header("x-api-key", format!("sk_{name}"))
            .header("x-max-tokens", max_tokens)
            .answers_header("x-tokens-used", used)
    };
    let scenario = Scenario::new()
        .policies([])
        .instances(4)
        .traffic([
            completion("acme", 1.0, "2000", "500"),
            // Asks for more than an instance's share, 2,500.
            completion("globex", 0.5, "3000", "1000"),
        ])
        .normal_secs(120)
        .outage_secs(120)
        .recovery_secs(120)
        .group("completions", |instance| {
            instance
                .limiter_builder()
                .name("completions")
                .policy(Policy::sliding_window("tokens", Quota::per_minute(10_000)))
                .on_store_failure(FailurePolicy::local_share(instance.instance_count()))
                .try_build()
        })
        .layer(|limiter| {
            RateLimitLayer::new(limiter)
                .key(HeaderKey::new("x-api-key"))
                .cost(|request| {
                    request
                        .headers
                        .get("x-max-tokens")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1_000)
                })
                .settle(|response| {
                    response
                        .headers
                        .get("x-tokens-used")?
                        .to_str()
                        .ok()?
                        .parse()
                        .ok()
                })
        })
        .trace("acme");
    let report = scenario.run_blocking().expect("the scenario runs");
    print(&report);
    let group = &report.groups()[0];
    let windows = group.worst_windows(0, Phase::Normal);
    assert_eq!(
        (windows[0].policy.as_str(), windows[0].window),
        ("tokens", Duration::from_secs(60))
    );

    // On the store, a request needs 2,000 tokens free and is then charged 500: 17 in the
    // first minute (the 17th leaves 1,500), 16 in the second, where the first minute's
    // weigh too. 8,500 tokens used of 10,000 at most.
    let acme = group.counts(0, Phase::Normal);
    assert_eq!((acme.sent, acme.admitted), (120, 33), "{acme:?}");
    assert_eq!(acme.worst_window_admitted, 17);
    let settled: Vec<_> = group
        .trace()
        .iter()
        .filter(|t| t.handled && t.sent_at < Duration::from_secs(120))
        .collect();
    assert_eq!(settled.len(), 33);
    for t in &settled {
        assert_eq!((t.cost, t.settled), (Some(2_000), Some(500)), "{t:?}");
    }
    assert_eq!(settled[16].remaining, Some(1_500));

    // While the store is down, each instance has 2,500 tokens a minute: one reservation of
    // 2,000 a minute fits, and its 500 weigh on the next minute's (the sliding window), so
    // the 4 shares admit 4 a minute, 2,000 tokens of the 10,000: 8 in the 2 minutes.
    let acme = group.counts(0, Phase::Outage);
    assert_eq!((acme.admitted, acme.refused_503), (8, 0), "{acme:?}");
    let shared: Vec<_> = group
        .trace()
        .iter()
        .filter(|t| {
            t.handled
                && t.sent_at >= Duration::from_secs(120)
                && t.sent_at < Duration::from_secs(240)
        })
        .collect();
    assert!(
        shared
            .iter()
            .all(|t| t.quota == Some(2_500) && t.settled == Some(500)),
        "{shared:?}"
    );
    // globex asks for 3,000 tokens, more than a share holds: refused all along, where the
    // store admitted 15 in 2 minutes.
    let globex = group.counts(1, Phase::Outage);
    assert_eq!((globex.sent, globex.admitted), (60, 0), "{globex:?}");
    assert_eq!(group.counts(1, Phase::Normal).admitted, 15);

    // Never more than the budget's worth of requests in any minute, at either edge.
    for phase in Phase::ALL {
        assert!(group.counts(0, phase).worst_window_admitted <= 20);
        assert!(group.counts(1, phase).worst_window_admitted <= 10);
    }
}

/// A soft limit lets the refused requests through to the handler, counted apart from the
/// admitted ones, and a byte quota charges the answers' bodies, which the simulated client
/// reads to the end.
#[test]
fn a_soft_limit_and_a_byte_quota_replay_too() {
    let phases = |scenario: Scenario| scenario.normal_secs(60).outage_secs(60).recovery_secs(60);
    let limiter = |policy: Policy| {
        move |instance: &tollgate_simulator::InstanceContext| {
            instance
                .limiter_builder()
                .policy(policy.clone())
                .on_store_failure(FailurePolicy::local_share(instance.instance_count()))
                .try_build()
        }
    };

    let soft = phases(Scenario::new())
        .policies([])
        .instances(2)
        .traffic([Customer::new("acme", 20.0)])
        .group(
            "soft",
            limiter(Policy::sliding_window("per-second", Quota::per_second(10))),
        )
        .layer(|limiter| {
            RateLimitLayer::new(limiter)
                .key(HeaderKey::new("x-customer-id"))
                .soft_limit(true)
        })
        .run_blocking()
        .expect("the scenario runs");
    print(&soft);
    for phase in Phase::ALL {
        let counts = soft.groups()[0].counts(0, phase);
        assert_eq!(counts.refused_429 + counts.refused_503, 0, "{counts:?}");
        assert_eq!(
            counts.admitted + counts.soft_limited,
            counts.sent,
            "{counts:?}"
        );
        assert!(counts.worst_window_admitted <= 10, "{phase}: {counts:?}");
        assert!(
            counts.soft_limited >= counts.sent / 2,
            "{phase}: {counts:?}"
        );
    }

    let bytes = phases(Scenario::new())
        .policies([])
        .instances(2)
        .traffic([Customer::new("acme", 1.0).answers_bytes(100_000)])
        .group(
            "egress",
            limiter(Policy::sliding_window("egress", Quota::per_minute(1_000_000)).content_bytes()),
        )
        .layer(|limiter| {
            RateLimitLayer::new(limiter)
                .key(HeaderKey::new("x-customer-id"))
                .count_response_bytes()
        })
        .run_blocking()
        .expect("the scenario runs");
    print(&bytes);
    // 1,000,000 bytes a minute: ten answers of 100,000 on the store, and five on each of
    // the two shares while it is down. (The store's return is the ignored test below.)
    for phase in [Phase::Normal, Phase::Outage] {
        let counts = bytes.groups()[0].counts(0, phase);
        assert_eq!(counts.admitted, 10, "{phase}: {counts:?}");
        assert_eq!(counts.worst_window_admitted, 10, "{phase}: {counts:?}");
    }
}
