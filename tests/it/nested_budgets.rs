//! Nested budgets (`Caller::within`, `LimiterBuilder::level`): the users of one
//! organisation, each with a quota of its own, share the organisation's, all decided
//! together in one store call. 200 concurrent requests of 4 users over two instances, then
//! of 2 more: each user is admitted exactly its quota while the organisation has room, the
//! organisation exactly its own, and a refusal by either consumes nothing at the other; in
//! process, on a redis-server and on a Redis Cluster (the organisation's key is the hash
//! tag of every counter of its budget).

use std::collections::HashMap;

use tollgate::store::ManualClock;
use tollgate::{Caller, Decision, InMemoryBackend, Limiter, Policy, Quota};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

const USER: u64 = 20;
const ORG: u64 = 100;

fn limiter(builder: tollgate::LimiterBuilder) -> Limiter {
    builder
        .name("nested")
        .policy(Policy::sliding_window("per-day", Quota::per_day(USER)))
        .level(
            "org",
            [Policy::sliding_window("per-day", Quota::per_day(ORG))],
        )
        .build()
}

fn member(user: &str) -> Caller {
    Caller::new(user).within("org", "acme")
}

/// 50 requests of each of `users` at once, spread over `instances`: how many each got.
async fn burst(instances: &[Limiter], users: &[&str]) -> HashMap<String, u64> {
    let mut tasks = Vec::new();
    for user in users {
        for i in 0..50 {
            let limiter = instances[i % instances.len()].clone();
            let user = (*user).to_owned();
            tasks.push(tokio::spawn(async move {
                let decision = limiter.check(&member(&user)).await;
                (user, decision)
            }));
        }
    }
    let mut admitted: HashMap<String, u64> = HashMap::new();
    for task in tasks {
        let (user, decision) = task.await.unwrap();
        let entry = admitted.entry(user).or_default();
        match decision {
            Decision::Allowed(_) => *entry += 1,
            Decision::Limited(info) => {
                let refusing: Vec<&str> = info.violated().map(|p| p.name()).collect();
                assert!(
                    refusing == ["per-day"]
                        || refusing == ["org:per-day"]
                        || refusing == ["per-day", "org:per-day"],
                    "{refusing:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    admitted
}

/// What `user`'s own quota and the organisation's have left, asked without counting.
async fn left(limiter: &Limiter, user: &str) -> (u64, u64) {
    let decision = limiter.check_cost(&member(user), 0).await;
    let info = decision.info().expect("a decision on the store");
    let of = |name: &str| {
        info.policies()
            .find(|p| p.name() == name)
            .unwrap()
            .remaining()
    };
    (of("per-day"), of("org:per-day"))
}

async fn two_bursts(instances: &[Limiter]) {
    // 4 users of 20 each: their own quotas bind, 80 of the organisation's 100 used.
    let first = burst(instances, &["alice", "bob", "carol", "dave"]).await;
    for (user, admitted) in &first {
        assert_eq!(*admitted, USER, "{user}");
        assert_eq!(left(&instances[0], user).await, (0, ORG - 4 * USER));
    }
    // 2 more: the organisation's 20 left bind, whoever gets them.
    let second = burst(instances, &["erin", "frank"]).await;
    let total: u64 = second.values().sum();
    assert_eq!(total, ORG - 4 * USER, "{second:?}");
    for (user, admitted) in &second {
        assert!(*admitted <= USER, "{user}: {admitted}");
        // What the organisation refused consumed nothing of the user's own quota.
        assert_eq!(left(&instances[1], user).await, (USER - admitted, 0));
    }
    // A user of another organisation is untouched.
    let other = Caller::new("alice").within("org", "globex");
    assert!(instances[0].check(&other).await.is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_requests_of_four_users_in_process() {
    let shared = limiter(
        Limiter::builder().backend(InMemoryBackend::new().clock(ManualClock::new(3_600_000))),
    );
    two_bursts(&[shared.clone(), shared]).await;
}

#[cfg(feature = "redis")]
mod on_redis {
    use std::time::Duration;

    use tollgate::RedisBackend;
    use tollgate_testkit::redis::{RedisCluster, RedisServer};

    use super::*;

    fn instance(store: RedisBackend) -> Limiter {
        limiter(
            Limiter::builder()
                .backend(store)
                .store_timeout(Duration::from_secs(5))
                .denial_cache(0),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hundred_requests_of_four_users_over_two_instances_on_redis() {
        let server = RedisServer::start();
        let mut instances = Vec::new();
        for _ in 0..2 {
            let store = crate::redis_backend::connected(RedisBackend::builder(server.url())).await;
            instances.push(instance(store));
        }
        two_bursts(&instances).await;
        // Every counter of a budget is under its organisation's hash tag.
        let keys = server.must(&["KEYS", "rl:*"]);
        assert!(keys.lines().count() >= 7, "{keys}");
        for key in keys.lines() {
            assert!(key.contains("{acme}") || key.contains("{globex}"), "{key}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hundred_requests_of_four_users_over_two_instances_on_a_cluster() {
        let cluster = RedisCluster::start();
        let mut instances = Vec::new();
        for _ in 0..2 {
            let store =
                crate::redis_backend::connected(RedisBackend::cluster_builder(cluster.urls()))
                    .await;
            instances.push(instance(store));
        }
        two_bursts(&instances).await;
    }
}
