//! The Redis backend on a real 3-master Redis Cluster made with `redis-cli --cluster create`.

mod support;

use std::collections::BTreeMap;

use support::redis::RedisCluster;
use tollgate::{Caller, CallerKey, Decision, Limiter, Policy, Quota, RedisBackend};

/// These tests are about decisions, not latency: a store timeout no healthy server on a
/// loaded test machine reaches, so every request is decided by Redis.
const SLOW_TEST_MACHINE: std::time::Duration = std::time::Duration::from_secs(5);

fn cluster_limiter(cluster: &RedisCluster) -> Limiter {
    Limiter::builder()
        .store_timeout(SLOW_TEST_MACHINE)
        .backend(
            RedisBackend::cluster_builder(cluster.urls())
                .build()
                .expect("valid URLs"),
        )
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(5)))
        .policy(Policy::sliding_window("per-day", Quota::per_day(3)))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_on_every_master() {
    let cluster = RedisCluster::start();
    let store = RedisBackend::cluster_builder(cluster.urls())
        .build()
        .unwrap();
    let limiter = cluster_limiter(&cluster);

    // Two callers on each of the three masters.
    let mut by_node: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for i in 0.. {
        let caller = format!("customer-{i}");
        let node = cluster.node_for_slot(
            cluster.keyslot(&store.key(&CallerKey::new(caller.as_str()), &limiter.policies()[0])),
        );
        let callers = by_node.entry(node).or_default();
        if callers.len() < 2 {
            callers.push(caller);
        }
        if by_node.len() == 3 && by_node.values().all(|c| c.len() == 2) {
            break;
        }
    }

    for (node, callers) in &by_node {
        for caller in callers {
            let who = Caller::new(caller.as_str());
            for _ in 0..3 {
                assert!(limiter.check(&who).await.is_allowed());
            }
            for _ in 0..3 {
                let Decision::Limited(info) = limiter.check(&who).await else {
                    panic!("{caller}: per-day should refuse")
                };
                assert_eq!(
                    info.violated().map(|p| p.name()).collect::<Vec<_>>(),
                    ["per-day"]
                );
                assert_eq!(
                    info.policies()[0].remaining(),
                    2,
                    "{caller}: a refusal consumed per-hour"
                );
            }
            // Both keys live on the master that owns the caller's slot.
            for policy in limiter.policies() {
                let key = store.key(&CallerKey::new(caller.as_str()), policy);
                let key = std::str::from_utf8(&key).unwrap();
                assert_eq!(
                    cluster.nodes[*node].must(&["EXISTS", key]).trim(),
                    "1",
                    "{key} not on node {node}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_tags_hold_with_braces_and_separators() {
    let cluster = RedisCluster::start();
    let store = RedisBackend::cluster_builder(cluster.urls())
        .build()
        .unwrap();
    let limiter = cluster_limiter(&cluster);
    let callers = [
        "acme",
        "acme}",
        "{acme}",
        "}{",
        "a:b:c",
        "rl:{acme}:per-hour",
        "{",
        "",
        "x".repeat(300).leak(),
    ];
    for caller in callers {
        let key = CallerKey::new(caller);
        let hour = cluster.keyslot(&store.key(&key, &limiter.policies()[0]));
        let day = cluster.keyslot(&store.key(&key, &limiter.policies()[1]));
        assert_eq!(hour, day, "{caller:?}: policies split across slots");
        // The script touches both keys in one call: a CROSSSLOT error would fail it.
        assert!(
            limiter.check(&Caller::new(caller)).await.is_allowed(),
            "{caller:?}"
        );
    }
    // Each caller has its own counters: one request each so far.
    for caller in callers {
        let Decision::Allowed(info) = limiter.check(&Caller::new(caller)).await else {
            panic!("{caller:?} refused early")
        };
        assert_eq!(
            info.policies()[1].remaining(),
            1,
            "{caller:?} shares a counter"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_limit_under_concurrency_on_a_cluster() {
    let cluster = RedisCluster::start();
    let limiters: Vec<Limiter> = (0..4)
        .map(|_| {
            Limiter::builder()
                .store_timeout(SLOW_TEST_MACHINE)
                .backend(
                    RedisBackend::cluster_builder(cluster.urls())
                        .build()
                        .unwrap(),
                )
                .policy(Policy::sliding_window("per-hour", Quota::per_hour(50)))
                .build()
        })
        .collect();
    let mut tasks = Vec::new();
    for i in 0..256 {
        let limiter = limiters[i % 4].clone();
        tasks.push(tokio::spawn(async move {
            limiter.check(&Caller::new("acme")).await
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Decision::Allowed(_) => admitted += 1,
            Decision::Limited(_) => {}
            other => panic!("the store failed: {other:?}"),
        }
    }
    assert_eq!(admitted, 50);
}
