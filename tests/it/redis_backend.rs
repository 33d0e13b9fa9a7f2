//! The Redis backend on real redis-server processes: atomicity, all-or-nothing, key layout,
//! expiry and script reloading.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tollgate::store::{Backend, CallerKey, RedisBackendBuilder};
use tollgate::{Caller, Decision, Limiter, Policy, Quota, RedisBackend};
use tollgate_testkit::redis::RedisServer;

/// These tests are about decisions, not latency: a store timeout no healthy server on a
/// loaded test machine reaches, so every request is decided by Redis.
pub(crate) const SLOW_TEST_MACHINE: std::time::Duration = std::time::Duration::from_secs(5);

/// `builder` for a test whose requests must be decided by Redis, under a store timeout of
/// [`SLOW_TEST_MACHINE`]: the connection's own timeouts (1 s to connect, 500 ms per answer
/// by default) sit under it, so they are raised with it, or a slow answer on a loaded
/// machine still falls back.
pub(crate) fn patient(builder: RedisBackendBuilder) -> RedisBackendBuilder {
    builder
        .connect_timeout(SLOW_TEST_MACHINE)
        .response_timeout(SLOW_TEST_MACHINE)
}

/// [`patient`] `builder`'s store once Redis answers on its connection, so that a test's
/// first decisions are about the store, not about its connection being made.
pub(crate) async fn connected(builder: RedisBackendBuilder) -> RedisBackend {
    let store = patient(builder).build().expect("valid URL");
    store.ping().await.expect("Redis answers");
    store
}

/// A limiter on its own connection to `server`, once that connection answers: decisions
/// made before it is there wait for it only within the store timeout.
async fn limiter(server: &RedisServer, policies: &[Policy]) -> Limiter {
    let backend = connected(RedisBackend::builder(server.url())).await;
    policies
        .iter()
        .cloned()
        .fold(
            Limiter::builder()
                .name("redis-backend")
                .store_timeout(SLOW_TEST_MACHINE)
                .backend(backend),
            |b, p| b.policy(p),
        )
        .build()
}

/// 4 limiter instances, each with its own connection, 256 concurrent requests for one
/// fresh key: exactly the limit is admitted.
async fn admitted_under_contention(server: &RedisServer, policy: Policy, caller: &str) -> usize {
    let mut limiters = Vec::new();
    for _ in 0..4 {
        limiters.push(limiter(server, std::slice::from_ref(&policy)).await);
    }
    let mut tasks = Vec::new();
    for i in 0..256 {
        let limiter = limiters[i % 4].clone();
        let caller = Caller::new(caller);
        tasks.push(tokio::spawn(async move { limiter.check(&caller).await }));
    }
    let mut admitted = 0;
    for task in tasks {
        match task.await.expect("task") {
            Decision::Allowed(_) => admitted += 1,
            Decision::Limited(_) => {}
            other => panic!("the store failed: {other:?}"),
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_limit_under_concurrency_sliding_window() {
    let server = RedisServer::start();
    // An hour-long window: the test cannot straddle a window edge.
    let policy = Policy::sliding_window("per-hour", Quota::per_hour(50));
    assert_eq!(admitted_under_contention(&server, policy, "acme").await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_limit_under_concurrency_token_bucket() {
    let server = RedisServer::start();
    // One token an hour: no refill during the test, so the burst is all there is.
    let policy = Policy::token_bucket("bucket", Quota::per_hour(1), 50);
    assert_eq!(admitted_under_contention(&server, policy, "acme").await, 50);
}

#[tokio::test]
async fn a_refused_request_consumes_nothing() {
    let server = RedisServer::start();
    let limiter = limiter(
        &server,
        &[
            Policy::sliding_window("per-hour", Quota::per_hour(5)),
            Policy::sliding_window("per-day", Quota::per_day(3)),
        ],
    )
    .await;
    let acme = Caller::new("acme");
    for _ in 0..3 {
        assert!(limiter.check(&acme).await.is_allowed());
    }
    for _ in 0..5 {
        let Decision::Limited(info) = limiter.check(&acme).await else {
            panic!("per-day should refuse")
        };
        let violated: Vec<&str> = info.violated().map(|p| p.name()).collect();
        assert_eq!(violated, ["per-day"]);
        // per-hour keeps the 2 it had left: refused requests took nothing from it.
        assert_eq!(info.policy(0).expect("a policy").remaining(), 2);
        assert!(!info.policy(0).expect("a policy").is_exhausted());
    }
    let per_hour = limiter.policies()[0].clone();
    assert_eq!(per_hour.name(), "per-hour");
    let key = RedisBackend::builder(server.url())
        .build()
        .unwrap()
        .key(&CallerKey::new("acme"), &per_hour);
    let stored = server.must(&["HGET", std::str::from_utf8(&key).unwrap(), "c"]);
    assert_eq!(stored.trim(), "3");
}

#[tokio::test]
async fn keys_follow_the_documented_layout_and_expire() {
    let server = RedisServer::start();
    let store = RedisBackend::builder(server.url())
        .prefix("orders")
        .build()
        .unwrap();
    let limits: Arc<[Policy]> = vec![
        Policy::sliding_window("per-second", Quota::per_second(5)),
        Policy::token_bucket("bucket", Quota::per_second(10), 20),
    ]
    .into();
    store
        .check(&CallerKey::new("acme}"), &limits, 1)
        .await
        .expect("decided");

    let keys = server.must(&["KEYS", "*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "orders:{acme%7D}:bucket:b1000",
            "orders:{acme%7D}:per-second:w1000"
        ]
    );
    // Two windows for the sliding window, a full refill (2 s) for the bucket.
    for key in keys {
        let ttl: i64 = server.must(&["PTTL", key]).trim().parse().unwrap();
        assert!((1..=2_000).contains(&ttl), "{key} expires in {ttl} ms");
    }
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(
        server.must(&["DBSIZE"]).trim(),
        "0",
        "keys outlived two windows of silence"
    );
}

#[tokio::test]
async fn braces_and_separators_never_collide() {
    let server = RedisServer::start();
    let limiter = limiter(
        &server,
        &[Policy::sliding_window("per-hour", Quota::per_hour(1))],
    )
    .await;
    let callers = [
        "acme",
        "acme}",
        "{acme}",
        "acme:per-hour",
        "rl:{acme}",
        "acme%7D",
        "",
        "#",
        "?",
    ];
    for caller in callers {
        assert!(
            limiter.check(&Caller::new(caller)).await.is_allowed(),
            "{caller:?} shared a counter"
        );
    }
    for caller in callers {
        assert!(
            !limiter.check(&Caller::new(caller)).await.is_allowed(),
            "{caller:?} was not counted"
        );
    }
    let keys = server.must(&["KEYS", "*"]);
    assert_eq!(keys.lines().collect::<HashSet<_>>().len(), callers.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_traffic_costs_no_decision() {
    let server = RedisServer::start();
    let limiter = limiter(
        &server,
        &[Policy::sliding_window(
            "per-hour",
            Quota::per_hour(1_000_000),
        )],
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..400 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let caller = Caller::new(format!("caller-{}", i % 16));
            limiter.check(&caller).await
        }));
        if i % 10 == 5 {
            server.must(&["SCRIPT", "FLUSH"]);
        }
    }
    for task in tasks {
        let decision = task.await.expect("task");
        assert!(
            matches!(decision, Decision::Allowed(_)),
            "a decision was lost: {decision:?}"
        );
    }
}

#[tokio::test]
async fn the_script_can_be_run_by_hand() {
    let server = RedisServer::start();
    let sha = server.must(&["SCRIPT", "LOAD", RedisBackend::script_source()]);
    assert_eq!(sha.trim(), RedisBackend::script_sha());
    let reply = server.must(&[
        "EVALSHA",
        RedisBackend::script_sha(),
        "1",
        "rl:{acme}:per-second",
        "1",
        "50",
        "1000",
        "0",
    ]);
    let reply: Vec<&str> = reply.lines().collect();
    assert_eq!(&reply[..3], ["1", "1", "49"]);
}
