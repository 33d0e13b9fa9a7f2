//! The documented metrics, seen by a test recorder through a scripted run: requests,
//! refusals, cached refusals, an outage and the recovery.

use std::time::Duration;

use tollgate::decision::BreakerState;
use tollgate::store::LiveInstances;
use tollgate::{
    BreakerConfig, Caller, FailurePolicy, InstanceCount, InstanceRegistry, Limiter, Policy, Quota,
    RedisBackend,
};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::recorder::{counter, gauge, histogram_len, with_recorder};
use tollgate_testkit::redis::RedisServer;

#[test]
fn a_scripted_run_shows_every_documented_metric() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());

    let (during_outage, after) = with_recorder(|snapshotter| async move {
        let store = RedisBackend::builder(proxy.url())
            .prefix("orders")
            .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
            .build()
            .unwrap();
        store.ping().await.unwrap();
        let registry = InstanceRegistry::builder(&store)
            .heartbeat_every(Duration::from_millis(100))
            .start()
            .unwrap();
        let limiter = Limiter::builder()
            .name("orders")
            .backend(store)
            .store_timeout(Duration::from_millis(200))
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(3)))
            .on_store_failure(FailurePolicy::local_share(InstanceCount::live(
                registry.clone(),
            )))
            .breaker(
                BreakerConfig::default()
                    .failure_threshold(2)
                    .base_open(Duration::from_millis(300))
                    .max_open(Duration::from_millis(300)),
            )
            .build();
        // Let a few heartbeats (every 100 ms, the first at once) reach Redis.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(registry.live_instances(), 1);
        let (acme, globex) = (Caller::new("acme"), Caller::new("globex"));

        // 3 admitted by the store; the third leaves r=0, so the next 2 are refused
        // from the denial cache.
        for _ in 0..5 {
            limiter.check(&acme).await;
        }
        // The outage: 2 refused calls open the breaker, 3 more skip the store; all 5 go
        // to the local share (3 a minute for 1 live instance): 3 admitted, 2 refused.
        proxy.set(Fault::Refuse);
        for _ in 0..5 {
            limiter.check(&globex).await;
        }
        assert_eq!(limiter.breaker_state(), BreakerState::Open);
        let during_outage = snapshotter.snapshot().into_vec();

        // Recovery: once the breaker lets a probe through, it succeeds and closes it.
        proxy.set(Fault::Pass);
        tokio::time::sleep(Duration::from_millis(350)).await;
        limiter.check(&globex).await;
        assert_eq!(limiter.breaker_state(), BreakerState::Closed);
        during_outage
    });

    let layer = ("layer", "orders");
    assert_eq!(
        counter(
            &during_outage,
            "tollgate_decisions_total",
            &[layer, ("outcome", "allowed")]
        ),
        3 + 3
    );
    assert_eq!(
        counter(
            &during_outage,
            "tollgate_decisions_total",
            &[layer, ("outcome", "limited"), ("policy", "per-minute")]
        ),
        2 + 2
    );
    assert_eq!(
        counter(&during_outage, "tollgate_denial_cache_hits_total", &[layer]),
        2
    );
    // Two failed store calls: refused at once, or timed out while the connection manager
    // was still trying to reconnect; either way a fallback with its reason.
    let failed: u64 = ["refused", "timeout"]
        .iter()
        .map(|reason| {
            counter(
                &during_outage,
                "tollgate_fallbacks_total",
                &[layer, ("reason", reason), ("policy", "local_share")],
            )
        })
        .sum();
    assert_eq!(failed, 2);
    assert_eq!(
        counter(
            &during_outage,
            "tollgate_fallbacks_total",
            &[layer, ("reason", "breaker_open"), ("policy", "local_share")]
        ),
        3
    );
    assert_eq!(
        gauge(&during_outage, "tollgate_breaker_state", &[layer]),
        1.0
    );
    // One latency sample per store call: 3 answered, 2 refused.
    assert_eq!(
        histogram_len(&during_outage, "tollgate_store_latency_seconds", &[layer]),
        5
    );
    assert_eq!(
        gauge(
            &during_outage,
            "tollgate_live_instances",
            &[("registry", "orders:instances")]
        ),
        1.0
    );

    assert_eq!(gauge(&after, "tollgate_breaker_state", &[layer]), 0.0);
    assert_eq!(
        counter(
            &after,
            "tollgate_decisions_total",
            &[layer, ("outcome", "allowed")]
        ),
        1
    );
    for (key, ..) in during_outage.iter().chain(&after) {
        for label in key.key().labels() {
            assert!(
                !["acme", "globex"].contains(&label.value()),
                "a caller key in a label: {key:?}"
            );
        }
    }
}
