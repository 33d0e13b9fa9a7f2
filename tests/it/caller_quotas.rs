//! Quotas that come from the caller (`Caller::with_quota`): a caller's own quota for a
//! named policy, read at request time (a plan in a database, a JWT claim), on both stores
//! and a Redis Cluster. Raised, it grants the difference at once; lowered, it refuses until
//! the count falls under it; advertised in the fields, and divided by a local share.

use std::time::Duration;

use tollgate::store::ManualClock;
use tollgate::{
    Caller, Decision, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota,
};
use tollgate_testkit::remote::Remote;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// 100 a day by default: acme's plan changes during the test, within one day's window.
fn per_day() -> Policy {
    Policy::sliding_window("per-day", Quota::per_day(100))
}

fn quota_of(decision: &Decision) -> u64 {
    decision.info().unwrap().policies().next().unwrap().quota()
}

/// acme on a plan of 250, then 400, then 50: what it is admitted each time, against the
/// default's 100 for globex, on the same limiter.
async fn raised_and_lowered(limiter: &Limiter) {
    let admitted = |caller: Caller, n: usize| {
        let limiter = limiter.clone();
        async move {
            let mut admitted = 0;
            let mut last = None;
            for _ in 0..n {
                let decision = limiter.check(&caller).await;
                admitted += usize::from(decision.is_allowed());
                last = Some(decision);
            }
            (admitted, last.unwrap())
        }
    };
    let (n, last) = admitted(Caller::new("acme").with_quota("per-day", 250), 300).await;
    assert_eq!(n, 250, "acme on 250");
    assert_eq!(
        quota_of(&last),
        250,
        "the fields advertise acme's own quota"
    );
    let (n, last) = admitted(Caller::new("globex"), 120).await;
    assert_eq!(n, 100, "globex on the default");
    assert_eq!(quota_of(&last), 100);
    // Raised: the count is kept, the difference granted.
    let (n, _) = admitted(Caller::new("acme").with_quota("per-day", 400), 200).await;
    assert_eq!(n, 150, "acme raised to 400 gets the 150 it had not used");
    // Lowered: refused while the count is over, though nothing is consumed.
    let (n, last) = admitted(Caller::new("acme").with_quota("per-day", 50), 10).await;
    assert_eq!(n, 0, "acme lowered under its count");
    assert_eq!(last.info().unwrap().min_remaining(), Some(0));
    // Another policy name changes nothing.
    let (n, _) = admitted(Caller::new("initech").with_quota("per-hour", 5), 120).await;
    assert_eq!(n, 100);
}

#[tokio::test]
async fn raised_and_lowered_in_process() {
    let limiter = Limiter::builder()
        .name("plans")
        .backend(InMemoryBackend::new().clock(ManualClock::new(3_600_000)))
        .policy(per_day())
        .build();
    raised_and_lowered(&limiter).await;
}

/// A token bucket's own quota is its rate, its burst scaled alike.
#[tokio::test]
async fn a_bucket_takes_the_rate_and_scales_the_burst() {
    let limiter = Limiter::builder()
        .name("plans")
        .backend(InMemoryBackend::new().clock(ManualClock::new(0)))
        .policy(Policy::token_bucket(
            "per-second",
            Quota::per_second(10),
            20,
        ))
        .build();
    let acme = Caller::new("acme").with_quota("per-second", 50);
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += usize::from(limiter.check(&acme).await.is_allowed());
    }
    assert_eq!(admitted, 100, "a burst of 20 scaled by 50/10");
}

/// While the store is down, a local share divides the caller's own quota like any other:
/// 200 over 4 instances is 50 at this one.
#[tokio::test]
async fn a_local_share_divides_the_callers_quota() {
    let clock = ManualClock::new(3_600_000);
    let store = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    let limiter = Limiter::builder()
        .name("plans")
        .backend(store.clone())
        .clock(clock)
        .policy(per_day())
        .on_store_failure(FailurePolicy::local_share(
            InstanceCount::fixed(4).at_place(0),
        ))
        .build();
    store.set_down(true);
    let acme = Caller::new("acme").with_quota("per-day", 200);
    let mut admitted = 0;
    let mut advertised = 0;
    for _ in 0..100 {
        let decision = limiter.check(&acme).await;
        admitted += usize::from(decision.is_allowed());
        advertised = quota_of(&decision);
    }
    assert_eq!((admitted, advertised), (50, 50));
}

#[cfg(feature = "redis")]
mod on_redis {
    use tollgate::RedisBackend;
    use tollgate_testkit::redis::{RedisCluster, RedisServer};

    use super::*;

    fn on(store: RedisBackend) -> Limiter {
        Limiter::builder()
            .name("plans")
            .backend(store)
            .store_timeout(Duration::from_secs(5))
            .denial_cache(0)
            .policy(per_day())
            .build()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raised_and_lowered_on_redis() {
        let server = RedisServer::start();
        let store = crate::redis_backend::connected(RedisBackend::builder(server.url())).await;
        raised_and_lowered(&on(store)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raised_and_lowered_on_a_cluster() {
        let cluster = RedisCluster::start();
        let store =
            crate::redis_backend::connected(RedisBackend::cluster_builder(cluster.urls())).await;
        raised_and_lowered(&on(store)).await;
    }
}

/// With leases, a hot caller's own quota is what its leases are taken from: two instances
/// leasing for acme's 300 a day admit exactly 300 between them, where the default is 100.
#[tokio::test]
async fn leases_are_taken_from_the_callers_own_quota() {
    use tollgate::Leases;
    let clock = ManualClock::new(3_600_000);
    let shared = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    let instances: Vec<Limiter> = (0..2)
        .map(|_| {
            Limiter::builder()
                .name("plans")
                .backend(shared.clone())
                .clock(clock.clone())
                .policy(per_day())
                .leases(
                    Leases::new()
                        .threshold_per_sec(5)
                        .period(Duration::from_millis(500))
                        .instances(InstanceCount::fixed(2)),
                )
                .build()
        })
        .collect();
    let acme = Caller::new("acme").with_quota("per-day", 300);
    let mut admitted = 0;
    let mut leased = 0;
    for i in 0..1_000u64 {
        clock.advance(Duration::from_millis(7));
        let decision = instances[(i % 2) as usize].check(&acme).await;
        if let Decision::Allowed(info) = &decision {
            admitted += 1;
            leased += usize::from(info.source() == tollgate::decision::DecisionSource::Lease);
        }
    }
    assert_eq!(admitted, 300);
    assert!(leased > 0, "decided from leases too");
}
