//! Connections are made in the background, never inside a decision under its store timeout:
//! with every new connection's first bytes held 30 ms by the fault proxy (a slow handshake)
//! and the default store timeout of 20 ms, decisions still reach the store within a second
//! of it being reachable, on a single node and on a cluster. Until then each decision is a
//! fallback counted with its own reason.

use std::time::{Duration, Instant};

use metrics_util::debugging::Snapshotter;
use tollgate::decision::DecisionSource;
use tollgate::{Caller, Decision, FailurePolicy, Limiter, Policy, Quota, RedisBackend};
use tollgate_testkit::proxy::FaultProxy;
use tollgate_testkit::recorder::{Snapshot, counter, with_recorder};
use tollgate_testkit::redis::{RedisCluster, RedisServer};

/// What the fault proxy adds to each new connection's first bytes, each way.
const HANDSHAKE_DELAY: Duration = Duration::from_millis(30);
/// How long a scenario waits for decisions to reach the store.
const PATIENCE: Duration = Duration::from_secs(5);

/// What a run of decisions saw.
struct Reached {
    /// From the backend's build to the first decision the store made (`None`: never).
    first_from_store: Option<Duration>,
    /// Decisions the failure policy made before that.
    fallbacks_before: usize,
    /// Decisions from the store after the first one, of all decisions after it.
    store_after: (usize, usize),
    /// What was recorded up to the first decision from the store.
    before: Snapshot,
}

/// Builds a limiter on `store()` with the default store timeout, failing closed, and
/// decides one request every 10 ms for `PATIENCE` or until 50 decisions came from the store.
async fn decide_until_the_store_answers(
    store: impl FnOnce() -> RedisBackend,
    recorded: Snapshotter,
) -> Reached {
    let started = Instant::now();
    let limiter = Limiter::builder()
        .name("connect")
        .backend(store())
        .policy(Policy::sliding_window(
            "per-second",
            Quota::per_second(1_000_000),
        ))
        .on_store_failure(FailurePolicy::closed())
        .build();
    let acme = Caller::new("acme");
    let mut first_from_store = None;
    let mut before = Snapshot::new();
    let mut fallbacks_before = 0;
    let (mut store_after, mut all_after) = (0, 0);
    while started.elapsed() < PATIENCE && store_after < 50 {
        let decision = limiter.check(&acme).await;
        let from_store = matches!(
            &decision,
            Decision::Allowed(info) if info.source() == DecisionSource::Store
        );
        if first_from_store.is_none() && from_store {
            first_from_store = Some(started.elapsed());
            // Taking the snapshot resets the counters: what is recorded later is what
            // came after the connection.
            before = recorded.snapshot().into_vec();
        }
        match first_from_store {
            None => fallbacks_before += 1,
            Some(_) => {
                all_after += 1;
                store_after += usize::from(from_store);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Reached {
        first_from_store,
        fallbacks_before,
        store_after: (store_after, all_after),
        before,
    }
}

/// The store was reached within a second; every fallback until then was counted as
/// `not_connected`, and none after. (A decision after it may still time out on a loaded
/// 2-core machine under the 20 ms default: counted as a timeout, not as the connection's.)
fn assert_reached(reached: &Reached, after: &Snapshot) {
    let first = reached
        .first_from_store
        .expect("no decision ever reached the store");
    assert!(first <= Duration::from_secs(1), "{first:?}");
    let fallbacks = |snapshot: &Snapshot, reason: Option<&str>| {
        let mut labels = vec![("layer", "connect")];
        labels.extend(reason.map(|r| ("reason", r)));
        counter(snapshot, "tollgate_fallbacks_total", &labels)
    };
    assert_eq!(
        fallbacks(&reached.before, None),
        reached.fallbacks_before as u64
    );
    assert_eq!(
        fallbacks(&reached.before, Some("not_connected")),
        fallbacks(&reached.before, None),
        "fallbacks of another reason before the connection"
    );
    assert_eq!(
        fallbacks(after, Some("not_connected")),
        0,
        "not connected after the first decision on the store"
    );
    let (store, all) = reached.store_after;
    assert!(
        store * 10 >= all * 9,
        "{store} of {all} decisions on the store"
    );
}

fn report(what: &str, reached: &Reached) {
    eprintln!(
        "{what}, first bytes of each connection held {HANDSHAKE_DELAY:?} each way, default store \
         timeout: first decision from the store after {:?}, {} fallbacks before it, {} of {} \
         decisions from the store after it",
        reached.first_from_store,
        reached.fallbacks_before,
        reached.store_after.0,
        reached.store_after.1,
    );
}

#[test]
fn a_slow_handshake_on_a_single_node_still_connects_in_the_background() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    proxy.delay_first_bytes(HANDSHAKE_DELAY);
    let url = proxy.url();
    let (reached, after) = with_recorder(|recorded| {
        decide_until_the_store_answers(
            || RedisBackend::builder(url).build().expect("valid URL"),
            recorded,
        )
    });
    report("single node", &reached);
    assert_reached(&reached, &after);
}

#[test]
fn a_slow_handshake_on_a_cluster_seed_still_connects_in_the_background() {
    let cluster = RedisCluster::start();
    // The client meets the cluster through its seed, behind the proxy; it then connects
    // to every node at the address the cluster gives for it.
    let proxy = FaultProxy::start(cluster.nodes[0].port());
    proxy.delay_first_bytes(HANDSHAKE_DELAY);
    let seed = proxy.url();
    let (reached, after) = with_recorder(|recorded| {
        decide_until_the_store_answers(
            || {
                RedisBackend::cluster_builder([seed])
                    .build()
                    .expect("valid URL")
            },
            recorded,
        )
    });
    report("cluster", &reached);
    assert_reached(&reached, &after);
}

/// Decisions asked while the first connection is being made wait for it, however their
/// threads interleave with the moment it is published: none falls back. 64 at once on 4
/// threads, on 30 fresh stores, failing closed, so any fallback is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decisions_racing_the_first_connection_all_reach_the_store() {
    let server = RedisServer::start();
    let acme = Caller::new("acme");
    for round in 0..30 {
        let limiter = Limiter::builder()
            .name("first-connection")
            .backend(
                crate::redis_backend::patient(RedisBackend::builder(server.url()))
                    .prefix(format!("round{round}"))
                    .build()
                    .expect("valid URL"),
            )
            .store_timeout(crate::redis_backend::SLOW_TEST_MACHINE)
            .policy(Policy::sliding_window(
                "per-second",
                Quota::per_second(1_000),
            ))
            .on_store_failure(FailurePolicy::closed())
            .build();
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (limiter, acme) = (limiter.clone(), acme.clone());
                tokio::spawn(async move { limiter.check(&acme).await })
            })
            .collect();
        for task in tasks {
            let decision = task.await.expect("task");
            assert!(
                matches!(&decision, Decision::Allowed(info) if info.source() == DecisionSource::Store),
                "round {round}: {decision:?}"
            );
        }
    }
}
