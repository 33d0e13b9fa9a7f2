//! Leased quota: hot callers decided locally from units taken from the shared store in
//! advance. Under virtual time on a shared in-process store, no interleaving of instances,
//! lease periods, rates and costs admits more than a limit allows; on a real redis-server,
//! a burst over 4 instances admits exactly the limit, a caller at 2.4x its limit is held
//! within the accuracy target, and an outage behind the fault proxy serves the lease
//! already held, then the failure policy.

#[cfg(feature = "redis")]
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
#[cfg(feature = "redis")]
use std::time::Instant;

use proptest::prelude::*;
#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::decision::DecisionSource;
use tollgate::{Caller, Decision, FailurePolicy, InstanceCount, Leases, Limiter, Policy, Quota};
use tollgate::{
    InMemoryBackend,
    store::{Algorithm, Clock, ManualClock},
};
use tollgate_simulator::{Phase, Scenario};
#[cfg(feature = "redis")]
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::recorder::{counter, histogram_len, with_recorder};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::remote::Remote;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

const WINDOW_MS: u64 = 1_000;

fn policies(kind: u8, limit: u64) -> Vec<Policy> {
    let window = || {
        Policy::new(
            "window",
            Algorithm::sliding_window(limit, Duration::from_secs(1)),
        )
    };
    let bucket = || {
        Policy::new(
            "bucket",
            Algorithm::token_bucket(limit, Duration::from_secs(1), limit),
        )
    };
    match kind {
        0 => vec![window()],
        1 => vec![bucket()],
        _ => vec![window(), bucket()],
    }
}

/// Every admission (time, cost) against a sliding window of `limit` per second: the
/// previous window's admissions weighed by the part of it still in view, plus this
/// window's so far, never above the limit.
fn check_sliding_window(admitted: &[(u64, u64)], limit: u64) -> Result<(), TestCaseError> {
    let worst = worst_sliding_window(admitted, limit);
    prop_assert!(
        worst <= 1.0,
        "{:.1}% of a limit of {limit} in one window",
        worst * 100.0
    );
    Ok(())
}

/// A token bucket of `limit` per second and burst `limit`: over any span [a, b], at most
/// the burst plus the refill of the span and of one lease period (leased tokens are taken
/// up to one period before they are spent).
fn check_token_bucket(
    admitted: &[(u64, u64)],
    limit: u64,
    period_ms: u64,
) -> Result<(), TestCaseError> {
    for (i, &(a, _)) in admitted.iter().enumerate() {
        let mut total = 0;
        for &(b, cost) in &admitted[i..] {
            total += cost;
            let bound = limit + ((b - a + period_ms) * limit).div_ceil(WINDOW_MS);
            prop_assert!(total <= bound, "{total} tokens in [{a}, {b}] over {bound}");
        }
    }
    Ok(())
}

/// The worst weighed count of a sliding window of `limit` per second over `admitted`
/// (time, cost), as a share of the limit: above 1.0 is over the limit.
fn worst_sliding_window(admitted: &[(u64, u64)], limit: u64) -> f64 {
    let mut worst = 0.0f64;
    for (j, &(t, _)) in admitted.iter().enumerate() {
        let start = t - t % WINDOW_MS;
        let previous: u64 = admitted
            .iter()
            .filter(|(u, _)| (start.saturating_sub(WINDOW_MS)..start).contains(u) && start > 0)
            .map(|(_, c)| c)
            .sum();
        let current: u64 = admitted[..=j]
            .iter()
            .filter(|(u, _)| *u >= start)
            .map(|(_, c)| c)
            .sum();
        let weighed = previous * (WINDOW_MS - (t - start)) + current * WINDOW_MS;
        worst = worst.max(weighed as f64 / (limit * WINDOW_MS) as f64);
    }
    worst
}

/// More callers than a lease table has shards (16), so that some always share one.
const CALLERS_SHARING_SHARDS: usize = 17;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Callers that share lease shards on every instance, a few of them hot, with random
    /// lease periods, rates, costs and silences (leases expire with units left, sweeps
    /// end other callers' leases): each caller is held to its own limits in every window.
    #[test]
    fn no_interleaving_of_leased_instances_exceeds_a_limit(
        instances in 1usize..=4,
        period_ms in 1u64..=400,
        limit in 3u64..=40,
        threshold in 1u64..=20,
        kind in 0u8..3,
        callers in CALLERS_SHARING_SHARDS..=20,
        steps in proptest::collection::vec(
            (
                0usize..4,
                // Mostly the first three callers, the hot ones.
                prop_oneof![7 => 0usize..3, 3 => 0usize..20],
                // Mostly close together; now and then a silence that outlives leases and
                // lets a sweep run.
                prop_oneof![9 => 0u64..=40, 1 => 100u64..=1_500],
                1u64..=3,
            ),
            1..600,
        ),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let clock = ManualClock::new(1_000_000);
        let shared = Remote::new(InMemoryBackend::new().clock(clock.clone()));
        let limiters: Vec<Limiter> = (0..instances)
            .map(|_| {
                let mut builder = Limiter::builder()
                    .name("leased")
                    .backend(shared.clone())
                    .clock(clock.clone())
                    .leases(
                        Leases::new()
                            .threshold_per_sec(threshold)
                            .period(Duration::from_millis(period_ms))
                            .instances(InstanceCount::fixed(instances as u64)),
                    );
                for policy in policies(kind, limit) {
                    builder = builder.policy(policy);
                }
                builder.build()
            })
            .collect();
        let names: Vec<Caller> = (0..callers).map(|c| Caller::new(format!("customer-{c}"))).collect();
        let mut admitted = vec![Vec::new(); callers];
        runtime.block_on(async {
            for &(instance, caller, advance, cost) in &steps {
                clock.advance(Duration::from_millis(advance));
                let caller = caller % callers;
                let decision = limiters[instance % instances].check_cost(&names[caller], cost).await;
                if decision.is_allowed() {
                    admitted[caller].push((clock.now_millis(), cost));
                }
            }
        });
        for (caller, admitted) in admitted.iter().enumerate() {
            if kind != 1 {
                check_sliding_window(admitted, limit)
                    .map_err(|e| TestCaseError::fail(format!("customer-{caller}: {e}")))?;
            }
            if kind != 0 {
                check_token_bucket(admitted, limit, period_ms)
                    .map_err(|e| TestCaseError::fail(format!("customer-{caller}: {e}")))?;
            }
        }
    }
}

/// Hot callers over four leased instances on one shared store, more of them than a lease
/// table has shards, so that some share one on every instance. Each caller, in turn, sends
/// at twice its limit for 800 ms, then a short burst under it whose last leases keep
/// units; while it is silent a sweep set off by another caller of its shard ends them.
/// Each caller stays within its own limit in every window; prints the worst window of each.
#[test]
fn regression_hot_callers_sharing_lease_shards_each_stay_within_their_limit() {
    const LIMIT: u64 = 100;
    const INSTANCES: usize = 4;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let start = 1_800_000_000_000;
    let clock = ManualClock::new(start);
    let shared = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    let limiters: Vec<Limiter> = (0..INSTANCES)
        .map(|_| {
            Limiter::builder()
                .name("leased")
                .backend(shared.clone())
                .clock(clock.clone())
                .policy(Policy::new(
                    "window",
                    Algorithm::sliding_window(LIMIT, Duration::from_secs(1)),
                ))
                .leases(
                    Leases::new()
                        .threshold_per_sec(20)
                        .period(Duration::from_millis(100))
                        .instances(InstanceCount::fixed(INSTANCES as u64)),
                )
                .build()
        })
        .collect();
    let callers: Vec<Caller> = (0..CALLERS_SHARING_SHARDS)
        .map(|c| Caller::new(format!("customer-{c}")))
        .collect();
    // Whether caller `c` sends at `t`: in a cycle of 2 s (each caller's shifted), one
    // request every 5 ms (twice the limit) for 800 ms, then one every 2 ms for 60 ms.
    let sends = |c: usize, t: u64| {
        let at = (t + c as u64 * 2_000 / CALLERS_SHARING_SHARDS as u64) % 2_000;
        (at < 800 && at.is_multiple_of(5)) || ((1_000..1_060).contains(&at) && at.is_multiple_of(2))
    };
    let mut admitted = vec![Vec::new(); callers.len()];
    runtime.block_on(async {
        for t in 0..20_000u64 {
            clock.set(start + t);
            for (c, caller) in callers.iter().enumerate() {
                if !sends(c, t) {
                    continue;
                }
                let instance = (t as usize + c) % INSTANCES;
                if limiters[instance].check(caller).await.is_allowed() {
                    admitted[c].push((clock.now_millis(), 1));
                }
            }
        }
    });
    let worst: Vec<f64> = admitted
        .iter()
        .map(|admitted| worst_sliding_window(admitted, LIMIT))
        .collect();
    eprintln!(
        "worst window per caller, as a share of the limit: {:?}",
        worst
            .iter()
            .map(|w| format!("{:.3}", w))
            .collect::<Vec<_>>()
    );
    for (c, worst) in worst.iter().enumerate() {
        assert!(
            *worst <= 1.0,
            "customer-{c}: {:.1}% of its limit in one window",
            worst * 100.0
        );
    }
}

#[test]
fn a_hot_caller_is_served_from_leases_with_truthful_remaining() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let clock = ManualClock::new(5_000);
    let shared = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    let limiter = Limiter::builder()
        .name("leases")
        .backend(shared.clone())
        .clock(clock.clone())
        .policy(Policy::new(
            "window",
            Algorithm::sliding_window(1_000, Duration::from_secs(60)),
        ))
        .leases(
            Leases::new()
                .threshold_per_sec(10)
                .period(Duration::from_secs(1)),
        )
        .build();
    let acme = Caller::new("acme");
    runtime.block_on(async {
        let mut sources = Vec::new();
        for i in 0..200u64 {
            clock.advance(Duration::from_millis(5));
            let Decision::Allowed(info) = limiter.check(&acme).await else {
                panic!("request {i} refused")
            };
            // What the shared counter plus the lease allows: nothing else was counted.
            assert_eq!(info.min_remaining(), Some(1_000 - (i + 1)), "request {i}");
            sources.push(info.source());
        }
        let leased = sources
            .iter()
            .filter(|s| **s == DecisionSource::Lease)
            .count();
        assert!(
            leased > 150,
            "only {leased} of 200 decisions came from a lease"
        );
        // Taken down, the store no longer answers: the lease held is still spent.
        shared.set_down(true);
        let held = limiter.check(&acme).await;
        assert_eq!(held.info().map(|i| i.source()), Some(DecisionSource::Lease));
    });
}

#[cfg(feature = "redis")]
fn redis_limiter(url: &str, limit: u64, window: Duration, leases: Leases) -> Limiter {
    Limiter::builder()
        .name("leased")
        .backend(
            RedisBackend::builder(url)
                .response_timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
        )
        .store_timeout(Duration::from_secs(2))
        .policy(Policy::new(
            "window",
            Algorithm::sliding_window(limit, window),
        ))
        .leases(leases)
        .build()
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_four_leased_instances_admits_exactly_the_limit() {
    let server = RedisServer::start();
    const LIMIT: u64 = 40;
    let limiters: Vec<Limiter> = (0..4)
        .map(|_| {
            redis_limiter(
                &server.url(),
                LIMIT,
                Duration::from_secs(60),
                Leases::new()
                    .threshold_per_sec(1)
                    .instances(InstanceCount::fixed(4)),
            )
        })
        .collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let leased = Arc::new(AtomicU64::new(0));
    // 200 requests at once: 4 instances, each with 50 in flight one after another.
    let tasks: Vec<_> = limiters
        .into_iter()
        .map(|limiter| {
            let (admitted, leased) = (admitted.clone(), leased.clone());
            tokio::spawn(async move {
                let acme = Caller::new("acme");
                for _ in 0..50 {
                    if let Decision::Allowed(info) = limiter.check(&acme).await {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        if info.source() == DecisionSource::Lease {
                            leased.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::SeqCst), LIMIT);
    assert!(leased.load(Ordering::SeqCst) > 0, "no lease was taken");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_at_2_4x_its_limit_over_four_leased_instances_stays_within_accuracy() {
    let server = RedisServer::start();
    const LIMIT: u64 = 250;
    const SECONDS: u64 = 10;
    let limiters: Vec<Limiter> = (0..4)
        .map(|_| {
            redis_limiter(
                &server.url(),
                LIMIT,
                Duration::from_secs(1),
                Leases::new()
                    .threshold_per_sec(20)
                    .instances(InstanceCount::fixed(4)),
            )
        })
        .collect();
    // 2.4 x 250/s over 4 instances: 150/s each, one every 6.67 ms.
    let interval = Duration::from_micros(1_000_000 * 4 * 10 / (LIMIT * 24));
    let started = Instant::now();
    let tasks: Vec<_> = limiters
        .into_iter()
        .map(|limiter| {
            tokio::spawn(async move {
                let acme = Caller::new("acme");
                let mut counted = Vec::new();
                let mut leased = 0u64;
                let mut ticks = tokio::time::interval(interval);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while started.elapsed() < Duration::from_secs(SECONDS) {
                    ticks.tick().await;
                    if let Decision::Allowed(info) = limiter.check(&acme).await {
                        counted.push(info.counted_at_ms().expect("admitted by the store"));
                        leased += u64::from(info.source() == DecisionSource::Lease);
                    }
                }
                (counted, leased)
            })
        })
        .collect();
    let mut counted = Vec::new();
    let mut leased = 0;
    for task in tasks {
        let (admitted, from_lease) = task.await.unwrap();
        counted.extend(admitted);
        leased += from_lease;
    }
    assert!(
        leased * 2 > counted.len() as u64,
        "only {leased} of {} admissions came from a lease",
        counted.len()
    );
    let first = counted.iter().min().unwrap() / WINDOW_MS + 1;
    let last = counted.iter().max().unwrap() / WINDOW_MS;
    let mut worst = 0.0f64;
    for window in first..last {
        let admitted = counted.iter().filter(|t| **t / WINDOW_MS == window).count() as u64;
        assert!(
            admitted <= LIMIT,
            "{admitted} admitted in one window over {LIMIT}"
        );
        let error = (LIMIT - admitted) as f64 / LIMIT as f64;
        worst = worst.max(error);
        assert!(
            error <= 0.037,
            "{admitted} admitted in a window, {:.1}% under the limit of {LIMIT}",
            error * 100.0
        );
    }
    assert!(last > first + 5, "too few whole windows measured");
    eprintln!("worst window {:.2}% under the limit", worst * 100.0);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_an_outage_the_lease_held_is_spent_then_the_failure_policy_applies() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let limiter = Limiter::builder()
        .name("leased")
        .backend(
            RedisBackend::builder(proxy.url())
                .response_timeout(Duration::from_millis(200))
                .build()
                .unwrap(),
        )
        .store_timeout(Duration::from_millis(200))
        .on_store_failure(FailurePolicy::closed())
        .policy(Policy::new(
            "window",
            Algorithm::sliding_window(10_000, Duration::from_secs(60)),
        ))
        .leases(
            Leases::new()
                .threshold_per_sec(10)
                .period(Duration::from_secs(20)),
        )
        .build();
    let acme = Caller::new("acme");
    // Hot enough to lease: the lease holds 20 s x the caller's rate.
    let mut left = 0;
    for _ in 0..200 {
        if let Decision::Allowed(info) = limiter.check(&acme).await
            && info.source() == DecisionSource::Lease
        {
            left = info.min_remaining().unwrap();
        }
    }
    assert!(left > 0, "no lease was taken");
    proxy.set(Fault::Refuse);
    let mut from_lease = 0;
    let mut unavailable = 0;
    for _ in 0..5_000 {
        match limiter.check(&acme).await {
            Decision::Allowed(info) => {
                assert_eq!(info.source(), DecisionSource::Lease);
                assert_eq!(
                    unavailable, 0,
                    "served from a lease after the failure policy"
                );
                from_lease += 1;
            }
            Decision::Unavailable { .. } => unavailable += 1,
            other => panic!("unexpected decision in the outage: {other:?}"),
        }
        if unavailable > 20 {
            break;
        }
    }
    assert!(from_lease > 0, "the lease held was not spent in the outage");
    assert!(unavailable > 0, "the failure policy never applied");
}

#[test]
fn leases_taken_spent_expired_and_returned_are_counted() {
    let (served, snapshot) = with_recorder(|_| async move {
        let clock = ManualClock::new(5_000);
        let shared = Remote::new(InMemoryBackend::new().clock(clock.clone()));
        let limiter = Limiter::builder()
            .name("leased")
            .backend(shared.clone())
            .clock(clock.clone())
            .policy(Policy::new(
                "window",
                Algorithm::sliding_window(1_000, Duration::from_secs(60)),
            ))
            .leases(
                Leases::new()
                    .threshold_per_sec(10)
                    .period(Duration::from_secs(1)),
            )
            .build();
        let acme = Caller::new("acme");
        let mut served = 0;
        for _ in 0..200 {
            clock.advance(Duration::from_millis(5));
            let decision = limiter.check(&acme).await;
            served += u64::from(decision.info().map(|i| i.source()) == Some(DecisionSource::Lease));
        }
        // The lease outlives its period with units left: they go back to the store, and
        // the caller's remaining says so.
        clock.advance(Duration::from_secs(2));
        let after = limiter.check(&acme).await;
        assert_eq!(
            after.info().and_then(|i| i.min_remaining()),
            Some(1_000 - 201)
        );
        served
    });
    let leases = |event| {
        counter(
            &snapshot,
            "tollgate_leases_total",
            &[("layer", "leased"), ("event", event)],
        )
    };
    assert!(leases("taken") >= 2, "taken: {}", leases("taken"));
    assert!(leases("spent") >= 1, "spent: {}", leases("spent"));
    assert_eq!(leases("expired"), 1);
    assert_eq!(leases("returned"), 1);
    assert_eq!(
        counter(
            &snapshot,
            "tollgate_leased_decisions_total",
            &[("layer", "leased")]
        ),
        served
    );
    assert!(served > 150, "{served} decisions from a lease");
}

/// The simulator's running example (4 instances, 50 a second per customer; acme sends
/// 120/s, globex 20/s, initech 5/s; the store down for the middle phase) on leases, with a
/// local share as the failure policy: every phase holds acme to its limit, the others get
/// what they send, and nothing is ever a 503.
#[tokio::test(start_paused = true)]
async fn the_running_example_on_leases_in_every_phase() {
    let scenario = Scenario::default()
        .policies([])
        .normal_secs(10)
        .outage_secs(10)
        .recovery_secs(10)
        .group("leased", |instance| {
            instance
                .limiter_builder()
                .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
                .on_store_failure(FailurePolicy::local_share(
                    InstanceCount::fixed(4).at_place(instance.instance() as u64),
                ))
                .leases(
                    Leases::new()
                        .threshold_per_sec(20)
                        .instances(InstanceCount::fixed(4)),
                )
                .try_build()
        });
    let report = scenario.run().await.expect("the simulation runs");
    assert_eq!(report.unexpected_statuses(), 0);
    for phase in [Phase::Normal, Phase::Outage, Phase::Recovery] {
        let row = |customer| report.row("leased", phase, customer).expect("a row");
        let acme = row("acme");
        // Up to 5% over in a phase: the second in which the store comes back counts both
        // the local share's admissions and the store's (its window was empty).
        assert!(
            (45.0..=52.5).contains(&acme.admitted_per_sec),
            "{phase:?}: acme {acme:?}"
        );
        assert_eq!(acme.refused_503, 0, "{phase:?}: {acme:?}");
        for (customer, rate) in [("globex", 20.0), ("initech", 5.0)] {
            let row = row(customer);
            assert!(
                (row.admitted_per_sec - rate).abs() <= rate * 0.1,
                "{phase:?}: {row:?}"
            );
            assert_eq!(row.refused_503, 0);
        }
    }
}

/// The lease script and the in-process lease grant the same: the most every policy admits
/// at once, all or nothing, and a refusal writes nothing.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_the_in_process_store_grant_the_same_leases() {
    use tollgate::store::{Backend, CallerKey};
    let server = RedisServer::start();
    let redis = RedisBackend::builder(server.url()).build().unwrap();
    let memory = InMemoryBackend::new();
    let limits: Arc<[Policy]> = vec![
        Policy::new(
            "window",
            Algorithm::sliding_window(10, Duration::from_secs(60)),
        ),
        Policy::new(
            "bucket",
            Algorithm::token_bucket(1, Duration::from_secs(60), 6),
        ),
    ]
    .into();
    let acme = CallerKey::new("acme");
    for store in [&redis as &dyn Backend, &memory as &dyn Backend] {
        let grant = |cost, units| store.lease(&acme, &limits, cost, units).expect("leases");
        let first = grant(2, 100).await.unwrap();
        assert_eq!(
            first.granted(),
            6,
            "{store:?}: the bucket's burst is the smaller room"
        );
        let remaining: Vec<u64> = first
            .outcome()
            .limits()
            .iter()
            .map(|l| l.remaining)
            .collect();
        assert_eq!(remaining, [4, 0], "{store:?}");
        let refused = grant(1, 100).await.unwrap();
        assert_eq!(refused.granted(), 0, "{store:?}");
        assert!(!refused.outcome().admitted(), "{store:?}");
        // The refusal consumed nothing: a peek still sees 4 in the window.
        let peek = store.check(&acme, &limits, 0).await.unwrap();
        assert_eq!(peek.limits()[0].remaining, 4, "{store:?}");
    }
}

/// Leases answered by a real redis-server after the store timeout (the fault proxy delays
/// every reply past it): Redis ran the lease and consumed the units all the same. They
/// come back, and the store's count ends at what was spent: nothing, the requests having
/// met the failure policy.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_lease_answered_after_the_timeout_on_redis_gives_its_units_back() {
    use tollgate::store::{Backend, CallerKey};
    const QUOTA: u64 = 1_000;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let policy = Policy::new(
        "window",
        Algorithm::sliding_window(QUOTA, Duration::from_secs(60)),
    );
    let store = RedisBackend::builder(proxy.url())
        .response_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    store.ping().await.unwrap();
    let limiter = Limiter::builder()
        .name("leased")
        .backend(store)
        .store_timeout(Duration::from_millis(100))
        .on_store_failure(FailurePolicy::closed())
        .policy(policy)
        .leases(
            Leases::new()
                .threshold_per_sec(1)
                .period(Duration::from_secs(20)),
        )
        .build();
    let acme = Caller::new("acme");
    // The lease script loaded (a lease, of another caller) before the proxy delays: a
    // script not loaded yet would not run when its call is dropped.
    assert!(limiter.check(&Caller::new("warm-up")).await.is_allowed());
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        outcomes.push(match limiter.check(&acme).await {
            Decision::Unavailable { .. } => "unavailable",
            decision if decision.is_allowed() => "admitted",
            _ => "refused",
        });
    }
    assert!(
        outcomes.iter().all(|o| *o == "unavailable"),
        "every request meets the failure policy: {outcomes:?}"
    );
    proxy.set(Fault::Pass);
    // The late grants land, and what they granted goes back.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let direct = RedisBackend::builder(server.url()).build().unwrap();
    let peek = direct
        .check(&CallerKey::new("acme"), &limiter.policies(), 0)
        .await
        .unwrap();
    assert_eq!(
        QUOTA - peek.limits()[0].remaining,
        0,
        "units the store counted for acme, none of them spent"
    );
}

/// `tollgate_store_latency_seconds` records every call made to the store: each decision
/// the store made, each lease taken, and the unused units of an ended lease given back
/// (that last call went unrecorded).
#[test]
fn regression_store_latency_records_lease_give_backs() {
    let (from_store, snapshot) = with_recorder(|_| async move {
        let clock = ManualClock::new(5_000);
        let shared = Remote::new(InMemoryBackend::new().clock(clock.clone()));
        let limiter = Limiter::builder()
            .name("leased")
            .backend(shared)
            .clock(clock.clone())
            .policy(Policy::sliding_window(
                "per-minute",
                Quota::per_minute(1_000),
            ))
            .leases(
                Leases::new()
                    .threshold_per_sec(10)
                    .period(Duration::from_secs(1)),
            )
            .build();
        let acme = Caller::new("acme");
        let mut from_store = 0;
        for _ in 0..200 {
            clock.advance(Duration::from_millis(5));
            let decision = limiter.check(&acme).await;
            from_store +=
                usize::from(decision.info().map(|i| i.source()) == Some(DecisionSource::Store));
        }
        // The lease ends with units left: the next decision gives them back.
        clock.advance(Duration::from_secs(2));
        let after = limiter.check(&acme).await;
        from_store += usize::from(after.info().map(|i| i.source()) == Some(DecisionSource::Store));
        from_store
    });
    let leases = |event| {
        counter(
            &snapshot,
            "tollgate_leases_total",
            &[("layer", "leased"), ("event", event)],
        ) as usize
    };
    assert_eq!(leases("returned"), 1);
    let recorded = histogram_len(
        &snapshot,
        "tollgate_store_latency_seconds",
        &[("layer", "leased")],
    );
    assert_eq!(
        recorded,
        from_store + leases("taken") + leases("returned"),
        "{from_store} decisions from the store, {} leases taken, {} given back",
        leases("taken"),
        leases("returned")
    );
}

/// A caller with a sliding log among its policies is never leased, however hot: a leased
/// unit spent after it was counted would count in a window that never saw it. Every
/// request asks the store, and the log admits exactly its limit in any window.
#[test]
fn a_caller_with_a_sliding_log_is_never_leased() {
    let (admitted, snapshot) = with_recorder(|_| async move {
        let clock = ManualClock::new(5_000);
        let shared = Remote::new(InMemoryBackend::new().clock(clock.clone()));
        let limiter = Limiter::builder()
            .name("leased")
            .backend(shared.clone())
            .clock(clock.clone())
            .policy(Policy::sliding_window("window", Quota::per_minute(1_000)))
            .policy(Policy::sliding_log("log", Quota::per_second(100)))
            .leases(Leases::new().threshold_per_sec(10))
            .build();
        let acme = Caller::new("acme");
        let mut admitted = Vec::new();
        // 400 a second for 3 s.
        for _ in 0..1_200 {
            clock.advance(Duration::from_micros(2_500));
            let decision = limiter.check(&acme).await;
            if let Some(info) = decision.info() {
                assert_ne!(info.source(), DecisionSource::Lease);
            }
            if decision.is_allowed() {
                admitted.push(clock.now_millis());
            }
        }
        admitted
    });
    let taken = counter(
        &snapshot,
        "tollgate_leases_total",
        &[("layer", "leased"), ("event", "taken")],
    );
    assert_eq!(taken, 0, "a lease was taken for a sliding log");
    // 100 in each second, never more in any second.
    assert_eq!(admitted.len(), 300);
    for (i, &start) in admitted.iter().enumerate() {
        let in_a_second = admitted[i..]
            .iter()
            .take_while(|&&t| t < start + 1_000)
            .count();
        assert!(in_a_second <= 100, "{in_a_second} from {start} ms");
    }
}

/// The lease script grants a sliding log what the in-process store grants: the most every
/// policy admits at once, one member per leased unit.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_the_in_process_store_lease_a_sliding_log_alike() {
    use tollgate::store::{Backend, CallerKey};
    let server = RedisServer::start();
    let redis = RedisBackend::builder(server.url()).build().unwrap();
    let memory = InMemoryBackend::new();
    let limits: Arc<[Policy]> = vec![
        Policy::sliding_log("log", Quota::per_minute(10)),
        Policy::sliding_window("window", Quota::per_minute(100)),
    ]
    .into();
    let acme = CallerKey::new("acme");
    for store in [&redis as &dyn Backend, &memory as &dyn Backend] {
        let grant = |cost, units| store.lease(&acme, &limits, cost, units).expect("leases");
        let first = grant(2, 7).await.unwrap();
        assert_eq!(first.granted(), 7, "{store:?}");
        let second = grant(1, 100).await.unwrap();
        assert_eq!(second.granted(), 3, "{store:?}: the log's room");
        let remaining: Vec<u64> = second
            .outcome()
            .limits()
            .iter()
            .map(|l| l.remaining)
            .collect();
        assert_eq!(remaining, [0, 90], "{store:?}");
        assert_eq!(grant(1, 100).await.unwrap().granted(), 0, "{store:?}");
    }
    let key = redis.key(&acme, &limits[0]);
    assert_eq!(
        server
            .must(&["ZCARD", std::str::from_utf8(&key).unwrap()])
            .trim(),
        "10"
    );
}
