//! The denial cache: refusals served locally until their exact retry time save store calls
//! without changing a single decision.

use std::time::Duration;

#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::store::ManualClock;
use tollgate::{Caller, Decision, InMemoryBackend, Limiter, Policy, Quota};
use tollgate_testkit::counting::Counting;
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::remote::Remote;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// acme at 2.4 times its limit (120 requests a second against 50) for 10 virtual seconds,
/// through `instances` limiters round-robin; returns (admitted, store calls, requests).
async fn acme_at_2_4x(instances: usize, cache: bool) -> (u64, u64, u64) {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Counting::new(Remote::new(InMemoryBackend::new().clock(clock.clone())));
    let limiters: Vec<Limiter> = (0..instances)
        .map(|_| {
            Limiter::builder()
                .name("denial-cache")
                .backend(store.clone())
                .clock(clock.clone())
                .denial_cache(if cache { 10_000 } else { 0 })
                .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
                .build()
        })
        .collect();
    let acme = Caller::new("acme");
    let (mut admitted, requests) = (0, 1_200u64);
    for i in 0..requests {
        // 120 a second: request i at i * 1000 / 120 ms.
        clock.set(1_800_000_000_000 + i * 1_000 / 120);
        if limiters[i as usize % instances]
            .check(&acme)
            .await
            .is_allowed()
        {
            admitted += 1;
        }
    }
    (admitted, store.calls(), requests)
}

#[tokio::test]
async fn one_instance_calls_the_store_for_little_more_than_its_admissions() {
    let (admitted, calls, requests) = acme_at_2_4x(1, true).await;
    let (admitted_without, calls_without, _) = acme_at_2_4x(1, false).await;
    assert_eq!(admitted, admitted_without, "the cache changed decisions");
    assert_eq!(calls_without, requests);
    let per_request = calls as f64 / requests as f64;
    assert!(
        per_request <= 0.45,
        "{per_request:.3} store calls per acme request"
    );
    println!(
        "1 instance: {admitted} admitted of {requests}, {per_request:.3} store calls per request"
    );
}

#[tokio::test]
async fn four_instances_decide_the_same_with_fewer_calls() {
    let (admitted, calls, requests) = acme_at_2_4x(4, true).await;
    let (admitted_without, _, _) = acme_at_2_4x(4, false).await;
    assert_eq!(admitted, admitted_without, "the cache changed decisions");
    let per_request = calls as f64 / requests as f64;
    // Each instance learns the next free slot only from its own calls, so four instances
    // save less than one does; they still save.
    assert!(
        per_request < 1.0,
        "{per_request:.3} store calls per acme request"
    );
    println!(
        "4 instances: {admitted} admitted of {requests}, {per_request:.3} store calls per request"
    );
}

#[tokio::test]
async fn a_cached_refusal_reports_the_time_left() {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Counting::new(Remote::new(InMemoryBackend::new().clock(clock.clone())));
    let limiter = Limiter::builder()
        .name("denial-cache")
        .backend(store.clone())
        .clock(clock.clone())
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(2)))
        .build();
    let acme = Caller::new("acme");
    assert!(limiter.check(&acme).await.is_allowed());
    // The second admission leaves r=0: the refusal it announces is cached.
    let Decision::Allowed(last) = limiter.check(&acme).await else {
        panic!("refused early")
    };
    let reset_ms = last.policy(0).expect("a policy").reset_ms();
    clock.advance(Duration::from_secs(20));
    let Decision::Limited(info) = limiter.check(&acme).await else {
        panic!("not refused")
    };
    assert_eq!(store.calls(), 2, "the refusal came from the store");
    assert_eq!(
        info.source(),
        tollgate::decision::DecisionSource::DenialCache
    );
    assert_eq!(
        info.violated().map(|p| p.name()).collect::<Vec<_>>(),
        ["per-minute"]
    );
    assert_eq!(info.retry_after_ms(), reset_ms - 20_000);
    // At the retry time the cache lets the request through to the store, which admits it.
    clock.advance(Duration::from_millis(reset_ms - 20_000));
    assert!(limiter.check(&acme).await.is_allowed());
    assert_eq!(store.calls(), 3);
}

// A refund drops the refusal the caller's next request would meet, cached under the
// limits in force when the unit comes back, even for a decision made under limits swapped
// out since.
#[tokio::test]
async fn a_refund_drops_the_refusal_cached_under_the_limits_in_force() {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Counting::new(Remote::new(InMemoryBackend::new().clock(clock.clone())));
    let per_minute = Policy::sliding_window("per-minute", Quota::per_minute(2));
    let limiter = Limiter::builder()
        .name("denial-cache-swap")
        .backend(store.clone())
        .clock(clock.clone())
        .policy(per_minute.clone())
        .build();
    let acme = Caller::new("acme");
    assert!(limiter.check(&acme).await.is_allowed());
    let before_swap = limiter.check(&acme).await;
    assert!(before_swap.is_allowed());
    // The same limits swapped in: a set of a new identity, over the same counters.
    limiter
        .set_limits(tollgate::reload::Limits::new().policy(per_minute))
        .expect("valid limits");
    let Decision::Limited(refused) = limiter.check(&acme).await else {
        panic!("not refused")
    };
    assert_eq!(
        refused.source(),
        tollgate::decision::DecisionSource::Store,
        "a refusal cached under the swapped-out limits is not read"
    );
    let Decision::Limited(cached) = limiter.check(&acme).await else {
        panic!("not refused")
    };
    assert_eq!(
        cached.source(),
        tollgate::decision::DecisionSource::DenialCache
    );
    let calls = store.calls();
    limiter
        .refund(&acme, &before_swap)
        .await
        .expect("given back");
    // The unit came back: the next request goes to the store, which admits it.
    let after = limiter.check(&acme).await;
    assert!(after.is_allowed(), "{after:?}");
    assert_eq!(store.calls(), calls + 1, "the decision was the store's");
}

// Two instances on one store, two callers, the limits swapped on both while both hold
// cached refusals: a unit given back after the swap is spent once, by the caller it was
// given back to, and no window admits more than the quota and that unit.
#[tokio::test]
async fn across_a_limits_swap_a_refund_lets_one_more_request_in_on_every_instance_together() {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Counting::new(Remote::new(InMemoryBackend::new().clock(clock.clone())));
    let per_minute = Policy::sliding_window("per-minute", Quota::per_minute(2));
    let instance = || {
        Limiter::builder()
            .name("denial-cache-swap-instances")
            .backend(store.clone())
            .clock(clock.clone())
            .policy(per_minute.clone())
            .build()
    };
    let instances = [instance(), instance()];
    let (acme, globex) = (Caller::new("acme"), Caller::new("globex"));
    let mut admitted = std::collections::HashMap::<&str, u64>::new();
    let mut first_of_acme = None;
    // Each caller uses its quota up and is refused, on each instance: refusals cached.
    for (name, caller) in [("acme", &acme), ("globex", &globex)] {
        for limiter in &instances {
            for _ in 0..2 {
                let decision = limiter.check(caller).await;
                if decision.is_allowed() {
                    *admitted.entry(name).or_default() += 1;
                    if name == "acme" {
                        first_of_acme.get_or_insert(decision);
                    }
                }
            }
        }
    }
    assert_eq!(admitted, [("acme", 2), ("globex", 2)].into());
    for limiter in &instances {
        limiter
            .set_limits(tollgate::reload::Limits::new().policy(per_minute.clone()))
            .expect("valid limits");
        // Refusals under the new limits, cached again.
        assert!(!limiter.check(&acme).await.is_allowed());
        assert!(!limiter.check(&globex).await.is_allowed());
    }
    let first_of_acme = first_of_acme.expect("acme was admitted");
    instances[0]
        .refund(&acme, &first_of_acme)
        .await
        .expect("given back");
    // Within the same minute, every instance asked in turn, many times.
    for _ in 0..5 {
        clock.advance(Duration::from_millis(100));
        for limiter in &instances {
            for (name, caller) in [("acme", &acme), ("globex", &globex)] {
                if limiter.check(caller).await.is_allowed() {
                    *admitted.entry(name).or_default() += 1;
                }
            }
        }
    }
    // The unit given back was spent once, by acme; globex's window stayed full.
    assert_eq!(admitted, [("acme", 3), ("globex", 2)].into());
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_cache_saves_calls_and_keeps_decisions() {
    let server = RedisServer::start();
    let mut results = Vec::new();
    for (prefix, cache) in [("with", 10_000), ("without", 0)] {
        let store = Counting::new(
            RedisBackend::builder(server.url())
                .prefix(prefix)
                .build()
                .unwrap(),
        );
        let limiter = Limiter::builder()
            .name("denial-cache")
            .backend(store.clone())
            .store_timeout(Duration::from_secs(5))
            .denial_cache(cache)
            // A minute-long window: real time passes while the test runs, so only a window
            // this long keeps the two runs' decisions comparable.
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(100)))
            .build();
        let acme = Caller::new("acme");
        let mut admitted = 0;
        for _ in 0..240 {
            if limiter.check(&acme).await.is_allowed() {
                admitted += 1;
            }
        }
        results.push((admitted, store.calls()));
    }
    let [(admitted, calls), (admitted_without, calls_without)] = results[..] else {
        unreachable!()
    };
    assert_eq!(admitted, 100);
    assert_eq!(admitted_without, 100);
    assert_eq!(calls_without, 240);
    assert!(
        calls as f64 / 240.0 <= 0.45,
        "{calls} store calls for 240 requests"
    );
}

/// A refusal cached for a request of 10 units says nothing of how long 40 units take: a
/// request of 40 gets the wait the store itself gives it, never the shorter one of 10.
#[tokio::test]
async fn regression_a_cached_refusal_never_advertises_the_wait_of_a_smaller_cost() {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    // One unit a second, 50 at most.
    let bucket = || Policy::token_bucket("credits", Quota::per_second(1), 50);
    let limiter = |cache: usize| {
        Limiter::builder()
            .name("credits")
            .backend(store.clone())
            .clock(clock.clone())
            .denial_cache(cache)
            .policy(bucket())
            .build()
    };
    let (cached, uncached) = (limiter(10_000), limiter(0));
    let acme = Caller::new("acme");
    assert!(cached.check_cost(&acme, 45).await.is_allowed());
    // 5 left: 10 units wait 5 s, and the refusal is cached.
    let Decision::Limited(ten) = cached.check_cost(&acme, 10).await else {
        panic!("10 units admitted with 5 left")
    };
    assert_eq!(ten.retry_after_secs(), 5);
    clock.advance(Duration::from_millis(100));
    let Decision::Limited(forty) = cached.check_cost(&acme, 40).await else {
        panic!("40 units admitted with 5 left")
    };
    let Decision::Limited(store_says) = uncached.check_cost(&acme, 40).await else {
        panic!("the store admitted 40 units with 5 left")
    };
    assert_eq!(
        forty.retry_after_secs(),
        store_says.retry_after_secs(),
        "Retry-After for 40 units (from {:?}) against the store's own answer",
        forty.source()
    );
}
