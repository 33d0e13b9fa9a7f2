//! Every count in its own place: local shares that never sum past the limit, refusals
//! cached per policy set, counters named by limiter, policy and unit, digested caller keys
//! in Redis, cached refusals that expire when the store's do, and configurations refused
//! with a typed error.

#[cfg(feature = "redis")]
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::decision::DecisionSource;
use tollgate::future::StoreFuture;
use tollgate::store::{
    Algorithm, Backend, CallerKey, CheckOutcome, ManualClock, PolicyOutcome, StoreError,
};
use tollgate::{
    BuildError, Caller, Decision, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy,
    Quota,
};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::remote::Remote;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

const EPOCH_MS: u64 = 1_800_000_000_000;

/// A remote-looking in-process store on `clock`, which the test can take down.
fn flaky(clock: &ManualClock) -> Remote {
    Remote::new(InMemoryBackend::new().clock(clock.clone()))
}

// ---------------------------------------------------------------------------------------
// A local share never sums past the limit.

/// `instances` shares of `original` admit, together, at most the original's rate:
/// n * q' / w' <= q / w, with a share of at least one request. (A bucket's advertised
/// window is its burst over its rate, so for buckets the rate is that same ratio.)
fn assert_shares_within(original: Algorithm, instances: u64) {
    let share = original.divided_by(instances);
    let n = u128::from(instances);
    match (original, share) {
        (
            Algorithm::SlidingWindow { limit, window_ms },
            Algorithm::SlidingWindow {
                limit: share_limit,
                window_ms: share_window,
            },
        )
        | (
            Algorithm::SlidingLog { limit, window_ms },
            Algorithm::SlidingLog {
                limit: share_limit,
                window_ms: share_window,
            },
        ) => {
            assert!(
                share_limit >= 1,
                "{original:?} / {instances} admits nothing"
            );
            assert!(
                n * u128::from(share_limit) * u128::from(window_ms)
                    <= u128::from(limit) * u128::from(share_window),
                "{instances} x {share:?} exceeds {original:?}"
            );
            assert!(u128::from(share_limit) * u128::from(share_window) < 1 << 53);
        }
        (
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            },
            Algorithm::TokenBucket {
                rate: share_rate,
                period_ms: share_period,
                burst: share_burst,
            },
        ) => {
            assert!(share_rate >= 1 && share_burst >= 1);
            assert!(
                n * u128::from(share_rate) * u128::from(period_ms)
                    <= u128::from(rate) * u128::from(share_period),
                "{instances} x {share:?} refills faster than {original:?}"
            );
            if burst >= instances {
                assert!(n * u128::from(share_burst) <= u128::from(burst));
            }
        }
        _ => panic!("a share changed its algorithm"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn local_shares_never_sum_past_the_limit(
        quota in 1u64..=10_000,
        instances in 1u64..=256,
        window_secs in prop::sample::select(vec![1u64, 2, 10, 60, 3_600, 86_400]),
        burst_extra in 0u64..=1_000,
    ) {
        assert_shares_within(
            Algorithm::sliding_window(quota, Duration::from_secs(window_secs)),
            instances,
        );
        assert_shares_within(
            Algorithm::sliding_log(quota, Duration::from_secs(window_secs)),
            instances,
        );
        assert_shares_within(
            Algorithm::token_bucket(quota, Duration::from_secs(window_secs), quota + burst_extra),
            instances,
        );
        assert_shares_within(
            Algorithm::token_bucket(quota, Duration::from_secs(window_secs), 1 + burst_extra % quota),
            instances,
        );
    }
}

/// 1 login a minute shared by 10 instances during a 20-minute outage, with an attacker
/// knocking twice a second on every instance: the instances together admit at most the 20
/// the limit allows, and each advertises its real share (1 per 600 s).
#[tokio::test]
async fn one_a_minute_over_ten_instances_admits_at_most_the_limit() {
    for policy in [
        Policy::sliding_window("per-minute", Quota::per_minute(1)),
        Policy::token_bucket("per-minute", Quota::per_minute(1), 1),
    ] {
        let clock = ManualClock::new(EPOCH_MS);
        let store = flaky(&clock);
        store.set_down(true);
        // Each instance at its own place: the turns never meet.
        let instances: Vec<Limiter> = (0..10)
            .map(|place| {
                Limiter::builder()
                    .name("login")
                    .backend(store.clone())
                    .clock(clock.clone())
                    .policy(policy.clone())
                    .on_store_failure(FailurePolicy::local_share(
                        InstanceCount::fixed(10).at_place(place),
                    ))
                    .build()
            })
            .collect();
        let attacker = Caller::new("attacker");
        let mut admitted_at = Vec::new();
        for step in 0..(20 * 60 * 2) {
            clock.set(EPOCH_MS + step * 500);
            for limiter in &instances {
                let decision = limiter.check(&attacker).await;
                let info = decision.info().expect("a share reports its state");
                assert_eq!(info.source(), DecisionSource::LocalShare);
                if decision.is_allowed() {
                    admitted_at.push(step * 500);
                    let report = &info.policy(0).expect("a policy");
                    assert_eq!(report.quota(), 1);
                    assert_eq!(report.window_secs(), 60, "{policy:?}");
                } else {
                    // Out of turn, the wait is for the next turn: at most 10 minutes.
                    let retry = info.retry_after_ms();
                    assert!(retry <= 600_000, "{policy:?}: retry after {retry} ms");
                }
            }
        }
        let admitted = admitted_at.len();
        assert!(
            admitted <= 20,
            "{policy:?}: {admitted} admitted in 20 minutes against 1 a minute"
        );
        assert!(
            admitted >= 19,
            "{policy:?}: each instance admits in its turns"
        );
        // Any 60 s holds at most 2 (two turns' edges), every clock minute at most 1.
        for (i, at) in admitted_at.iter().enumerate() {
            let within = admitted_at[i..]
                .iter()
                .take_while(|t| **t < at + 60_000)
                .count();
            assert!(
                within <= 2,
                "{policy:?}: {within} in the minute from {at} ms"
            );
        }
        let mut minutes: Vec<u64> = admitted_at
            .iter()
            .map(|t| (EPOCH_MS + t) / 60_000)
            .collect();
        minutes.dedup();
        assert_eq!(
            minutes.len(),
            admitted,
            "{policy:?}: two in one clock minute"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The denial cache remembers which policy set refused.

#[tokio::test]
async fn a_refusal_cached_for_one_tier_does_not_follow_the_caller_into_another() {
    let clock = ManualClock::new(EPOCH_MS);
    let store = flaky(&clock);
    let limiter = Limiter::builder()
        .name("counts")
        .backend(store.clone())
        .clock(clock.clone())
        .policy(Policy::sliding_window("per-day", Quota::per_day(3)))
        .tier(
            "pro",
            [Policy::sliding_window("per-day", Quota::per_day(1_000))],
        )
        .on_store_failure(FailurePolicy::fail_static())
        .build();
    let free = Caller::new("acme");
    for _ in 0..3 {
        assert!(limiter.check(&free).await.is_allowed());
    }
    assert!(!limiter.check(&free).await.is_allowed());

    // Upgraded: the same per-day count (3 used), now against 1,000.
    let pro = Caller::new("acme").with_tier("pro");
    let Decision::Allowed(info) = limiter.check(&pro).await else {
        panic!("the free tier's cached refusal followed acme into pro")
    };
    assert_eq!(info.policy(0).expect("a policy").quota(), 1_000);
    assert_eq!(info.policy(0).expect("a policy").remaining(), 1_000 - 4);

    // During an outage fail static replays refusals only to the set that earned them.
    store.set_down(true);
    assert!(!limiter.check(&free).await.is_allowed());
    assert!(limiter.check(&pro).await.is_allowed());
}

// ---------------------------------------------------------------------------------------
// A counter's identity: limiter, policy name and unit.

#[tokio::test]
async fn tiers_reusing_a_name_in_other_units_keep_their_own_counts() {
    let store = InMemoryBackend::new();
    let limiter = Limiter::builder()
        .name("counts")
        .backend(store)
        .policy(Policy::token_bucket("burst", Quota::per_second(10), 20))
        .tier(
            "big",
            [Policy::token_bucket("burst", Quota::per_minute(600), 200)],
        )
        .build();
    let small = Caller::new("acme");
    for _ in 0..20 {
        assert!(limiter.check(&small).await.is_allowed());
    }
    assert!(!limiter.check(&small).await.is_allowed());
    let big = Caller::new("acme").with_tier("big");
    let Decision::Allowed(info) = limiter.check(&big).await else {
        panic!("the big tier read the small tier's bucket in the wrong units")
    };
    assert_eq!(info.policy(0).expect("a policy").remaining(), 199);

    // Sliding windows of different lengths under one name.
    let limiter = Limiter::builder()
        .policy(Policy::sliding_window("window", Quota::per_second(5)))
        .tier(
            "long",
            [Policy::sliding_window("window", Quota::per_minute(100))],
        )
        .build();
    for _ in 0..5 {
        assert!(limiter.check(&Caller::new("acme")).await.is_allowed());
    }
    let Decision::Allowed(info) = limiter.check(&Caller::new("acme").with_tier("long")).await
    else {
        panic!("the per-minute window read the per-second count")
    };
    assert_eq!(info.policy(0).expect("a policy").remaining(), 99);
}

#[tokio::test]
async fn a_tier_change_keeps_the_count_of_a_policy_in_the_same_units() {
    let limiter = Limiter::builder()
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(10)))
        .tier(
            "pro",
            [Policy::sliding_window("per-hour", Quota::per_hour(100))],
        )
        .build();
    let pro = Caller::new("acme").with_tier("pro");
    for _ in 0..30 {
        assert!(limiter.check(&pro).await.is_allowed());
    }
    // Moved down to the default tier: 30 used of 10, refused.
    assert!(!limiter.check(&Caller::new("acme")).await.is_allowed());
}

#[tokio::test]
async fn two_limiters_on_one_in_process_store_never_share_counts() {
    let store = InMemoryBackend::new();
    let per_minute = Policy::sliding_window("per-minute", Quota::per_minute(3));
    let build = |name: &str| {
        Limiter::builder()
            .name(name)
            .backend(store.clone())
            .policy(per_minute.clone())
            .build()
    };
    let (search, login) = (build("search"), build("login"));
    let ip = Caller::new("203.0.113.7");
    for _ in 0..3 {
        assert!(search.check(&ip).await.is_allowed());
    }
    assert!(!search.check(&ip).await.is_allowed());
    for _ in 0..3 {
        assert!(
            login.check(&ip).await.is_allowed(),
            "login counted search's"
        );
    }
}

#[cfg(feature = "redis")]
fn redis_limiter(store: RedisBackend, name: &str, scope: Option<&str>, policy: Policy) -> Limiter {
    let builder = Limiter::builder()
        .name(name)
        .backend(store)
        .store_timeout(Duration::from_secs(2))
        .policy(policy);
    match scope {
        Some(scope) => builder.counter_scope(scope),
        None => builder,
    }
    .build()
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn two_limiters_on_one_redis_never_share_counts_unless_asked() {
    let server = RedisServer::start();
    let store = RedisBackend::builder(server.url()).build().unwrap();
    let per_minute = Policy::sliding_window("per-minute", Quota::per_minute(3));
    let search = redis_limiter(store.clone(), "search", None, per_minute.clone());
    let login = redis_limiter(store.clone(), "login", None, per_minute.clone());
    let ip = Caller::new("203.0.113.7");
    for _ in 0..3 {
        assert!(search.check(&ip).await.is_allowed());
    }
    assert!(!search.check(&ip).await.is_allowed());
    for _ in 0..3 {
        assert!(
            login.check(&ip).await.is_allowed(),
            "login counted search's"
        );
    }
    assert!(!login.check(&ip).await.is_allowed());

    // Asked for: one scope, one count.
    let export = redis_limiter(store.clone(), "export", Some("bulk"), per_minute.clone());
    let import = redis_limiter(store, "import", Some("bulk"), per_minute);
    for _ in 0..2 {
        assert!(export.check(&ip).await.is_allowed());
    }
    assert!(import.check(&ip).await.is_allowed());
    assert!(!import.check(&ip).await.is_allowed());
    assert!(!export.check(&ip).await.is_allowed());

    let keys = server.must(&["KEYS", "*"]);
    let keys: HashSet<&str> = keys.lines().collect();
    assert_eq!(
        keys,
        HashSet::from([
            "rl:{203.0.113.7}:search:per-minute:w60000",
            "rl:{203.0.113.7}:login:per-minute:w60000",
            "rl:{203.0.113.7}:bulk:per-minute:w60000",
        ])
    );
}

// ---------------------------------------------------------------------------------------
// Caller keys digested in Redis key names.

#[cfg(feature = "redis")]
#[tokio::test]
async fn hashed_callers_keep_api_keys_out_of_redis_and_agree_across_instances() {
    let server = RedisServer::start();
    let secret = b"shared by every instance";
    let instance = |secret: &[u8]| {
        RedisBackend::builder(server.url())
            .hash_callers(secret)
            .build()
            .unwrap()
    };
    let policy = Policy::sliding_window("per-hour", Quota::per_hour(4));
    let a = redis_limiter(instance(secret), "api", None, policy.clone());
    let b = redis_limiter(instance(secret), "api", None, policy.clone());
    let api_key = Caller::new("sk_live_4eC39HqLyjWDarjtT1zdp7dc");
    for limiter in [&a, &b, &a, &b] {
        assert!(limiter.check(&api_key).await.is_allowed());
    }
    // The same digest on both instances: one count.
    assert!(!a.check(&api_key).await.is_allowed());
    assert!(!b.check(&api_key).await.is_allowed());

    let keys = server.must(&["KEYS", "*"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
    assert!(!keys.contains("sk_live"), "the API key is readable: {keys}");
    assert!(keys.starts_with("rl:{~"), "{keys}");
    let monitor_free = server.must(&["SLOWLOG", "GET", "128"]);
    assert!(!monitor_free.contains("sk_live"));

    // Another secret names another counter; digests of distinct keys stay distinct.
    let other = redis_limiter(instance(b"another secret"), "api", None, policy);
    assert!(other.check(&api_key).await.is_allowed());
    assert!(a.check(&Caller::new("sk_live_other")).await.is_allowed());
    assert!(a.check(&Caller::new(vec![b'k'; 500])).await.is_allowed());
    assert!(
        a.check(&Caller::from(CallerKey::anonymous()))
            .await
            .is_allowed()
    );
}

// ---------------------------------------------------------------------------------------
// A cached refusal expires when the store's does, not later by the reply's latency.

/// Refuses every request with a retry time of 1 s, and takes 300 ms (of the manual
/// clock) to answer.
#[derive(Clone, Debug)]
struct SlowRefusal {
    clock: ManualClock,
    calls: Arc<AtomicU64>,
}

impl Backend for SlowRefusal {
    fn check(
        &self,
        _: &CallerKey,
        limits: &Arc<[Policy]>,
        _cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.clock.advance(Duration::from_millis(300));
        let outcomes = limits
            .iter()
            .map(|_| PolicyOutcome {
                admitted: false,
                remaining: 0,
                reset_ms: 1_000,
            })
            .collect();
        StoreFuture::ready(Ok(CheckOutcome::new(outcomes)))
    }
}

#[tokio::test]
async fn a_cached_refusal_expires_when_the_stores_does() {
    let clock = ManualClock::new(EPOCH_MS);
    let calls = Arc::new(AtomicU64::new(0));
    let limiter = Limiter::builder()
        .name("counts")
        .backend(SlowRefusal {
            clock: clock.clone(),
            calls: calls.clone(),
        })
        .clock(clock.clone())
        .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
        .build();
    let acme = Caller::new("acme");
    assert!(!limiter.check(&acme).await.is_allowed());
    // Asked at 0, answered at 300: the store's refusal holds until 1,000 at the latest.
    clock.set(EPOCH_MS + 900);
    assert!(!limiter.check(&acme).await.is_allowed());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "served from the cache");
    clock.set(EPOCH_MS + 1_050);
    assert!(!limiter.check(&acme).await.is_allowed());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the cached refusal outlived the store's"
    );
}

// ---------------------------------------------------------------------------------------
// Construction fails clearly.

#[cfg(feature = "redis")]
#[test]
fn a_redis_backend_built_outside_a_runtime_is_an_error() {
    let error = RedisBackend::builder("redis://127.0.0.1:1/")
        .build()
        .expect_err("no runtime to run the connection on");
    assert!(error.message().contains("Tokio runtime"), "{error}");
}

#[test]
fn try_build_refuses_what_build_would_panic_on() {
    let per_second = || Policy::sliding_window("per-second", Quota::per_second(5));
    assert_eq!(
        Limiter::builder().try_build().unwrap_err(),
        BuildError::NoPolicies { tier: None }
    );
    assert_eq!(
        Limiter::builder()
            .policy(per_second())
            .tier("pro", [])
            .try_build()
            .unwrap_err(),
        BuildError::NoPolicies {
            tier: Some("pro".to_owned())
        }
    );
    let error = Limiter::builder()
        .policy(per_second())
        .tier("pro", [per_second(), per_second()])
        .try_build()
        .unwrap_err();
    assert_eq!(
        error,
        BuildError::DuplicatePolicy {
            tier: Some("pro".to_owned()),
            name: "per-second".to_owned()
        }
    );
    assert_eq!(
        error.to_string(),
        "tier \"pro\" name policy \"per-second\" twice"
    );
    // One name with different algorithms in two tiers is fine now: separate counters.
    assert!(
        Limiter::builder()
            .policy(per_second())
            .tier(
                "smooth",
                [Policy::token_bucket("per-second", Quota::per_second(5), 5)]
            )
            .try_build()
            .is_ok()
    );
}
