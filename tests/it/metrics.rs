//! The documented metrics, seen by a test recorder through a scripted run: requests,
//! refusals, cached refusals, an outage and the recovery; their help text in a Prometheus
//! scrape; and the `tracing` span each decision gets.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tollgate::client::{AdaptiveThrottleLayer, HoldBackLayer};
use tollgate::decision::BreakerState;
use tollgate::shed::ConcurrencyShedLayer;
use tollgate::{
    BreakerConfig, Caller, FailurePolicy, InstanceCount, InstanceRegistry, Limiter, Policy, Quota,
    RedisBackend,
};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::recorder::{counter, gauge, histogram_len, with_recorder};
use tollgate_testkit::redis::RedisServer;
use tower::{Layer, Service, ServiceExt, service_fn};

use crate::dashboard::FAMILIES;

#[test]
fn a_scripted_run_shows_every_documented_metric() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());

    let (during_outage, after) = with_recorder(|snapshotter| async move {
        let store = RedisBackend::builder(proxy.url())
            .prefix("orders")
            .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
            .instance_heartbeat(Duration::from_millis(100))
            .build()
            .unwrap();
        store.ping().await.unwrap();
        let registry = InstanceRegistry::start(&store, 1).unwrap();
        let limiter = Limiter::builder()
            .name("orders")
            .backend(store)
            .store_timeout(Duration::from_millis(200))
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(3)))
            .on_store_failure(FailurePolicy::local_share(InstanceCount::registry(
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
        // Globex's share still counts its 3 of the minute, which the store did not see:
        // the probe asks the store for nothing, and the share refuses it.
        proxy.set(Fault::Pass);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(!limiter.check(&globex).await.is_allowed());
        assert_eq!(limiter.breaker_state(), BreakerState::Closed);
        assert!(limiter.check(&Caller::new("initech")).await.is_allowed());
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
    // Two failed store calls: refused at once, timed out while the connection manager
    // was still trying to reconnect, or not made because the client already knew the
    // connection lost (`not_connected`); either way a fallback with its reason.
    let failed: u64 = ["refused", "timeout", "not_connected"]
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
    // One latency sample per store call: 3 answered, 2 failed. A failure the client
    // already knew of (`not_connected` with the connection down) was not a call, and has
    // no sample; one that waited for the connection and timed out has one.
    let without_a_call = counter(
        &during_outage,
        "tollgate_fallbacks_total",
        &[
            layer,
            ("reason", "not_connected"),
            ("policy", "local_share"),
        ],
    );
    let samples = histogram_len(&during_outage, "tollgate_store_latency_seconds", &[layer]);
    assert!(
        (5 - without_a_call as usize..=5).contains(&samples),
        "{samples} latency samples, {without_a_call} calls not made"
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

/// The store latency buckets the scrape below (and the `orders_api` example) gives the
/// Prometheus exporter, so the latency is a histogram with `_bucket` series.
pub(crate) const LATENCY_BUCKETS: [f64; 8] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5];

/// What a Prometheus exporter renders after a scripted run that records every family: a
/// limiter on Redis through an outage (fallbacks, breaker, latency, denial cache), an
/// instance registry, a shed request and a locally throttled outgoing call. Run once per
/// test binary and shared.
pub(crate) fn prometheus_scrape() -> &'static str {
    static SCRAPE: OnceLock<String> = OnceLock::new();
    SCRAPE.get_or_init(scripted_scrape)
}

fn scripted_scrape() -> String {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("tollgate_store_latency_seconds".into()),
            &LATENCY_BUCKETS,
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A local recorder: this thread's, and the runtime's tasks (the heartbeat) run on it.
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let store = RedisBackend::builder(proxy.url())
                .prefix("orders")
                .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
                .instance_heartbeat(Duration::from_millis(100))
                .build()
                .unwrap();
            store.ping().await.unwrap();
            let registry = InstanceRegistry::start(&store, 1).unwrap();
            let limiter = Limiter::builder()
                .name("orders")
                .backend(store)
                .store_timeout(Duration::from_millis(200))
                .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
                .on_store_failure(FailurePolicy::local_share(InstanceCount::registry(
                    registry.clone(),
                )))
                .breaker(BreakerConfig::default().failure_threshold(1))
                .build();
            tokio::time::sleep(Duration::from_millis(150)).await;
            let acme = Caller::new("acme");
            // Admitted, then refused from the denial cache.
            assert!(limiter.check(&acme).await.is_allowed());
            assert!(!limiter.check(&acme).await.is_allowed());
            // A lockout: the attempt that uses its quota up starts a block.
            let otp = Limiter::builder()
                .name("otp")
                .backend(
                    RedisBackend::builder(server.url())
                        .prefix("otp")
                        .build()
                        .unwrap(),
                )
                .store_timeout(Duration::from_secs(5))
                .policy(
                    Policy::sliding_window("wrong-codes", Quota::per_minute(1))
                        .lock_out_for(Duration::from_secs(60)),
                )
                .build();
            assert!(otp.check(&acme).await.is_allowed());
            assert!(!otp.check(&acme).await.is_allowed());
            // The outage: a failed call opens the breaker, the next skips the store.
            proxy.set(Fault::Refuse);
            let globex = Caller::new("globex");
            limiter.check(&globex).await;
            limiter.check(&globex).await;
            assert_eq!(limiter.breaker_state(), BreakerState::Open);

            // One request held in the only slot, so the next is shed.
            let mut shed = ConcurrencyShedLayer::new(1)
                .name("orders")
                .layer(service_fn(|_: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                }));
            let held = shed.ready().await.unwrap().call(Request::new(()));
            let refused = shed.ready().await.unwrap().call(Request::new(())).await;
            assert_eq!(refused.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
            drop(held);

            // A backend that answers 503: the second call is refused locally.
            let mut client = AdaptiveThrottleLayer::new()
                .name("payments")
                .random(|| 0.0)
                .layer(service_fn(|_: Request<()>| async {
                    let mut response = Response::new(());
                    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    Ok::<_, Infallible>(response)
                }));
            for _ in 0..2 {
                let _ = client.ready().await.unwrap().call(Request::new(())).await;
            }

            // A server that says to wait: the second call is held back.
            let mut client =
                HoldBackLayer::new()
                    .name("payments")
                    .layer(service_fn(|_: Request<()>| async {
                        let response = Response::builder()
                            .status(StatusCode::TOO_MANY_REQUESTS)
                            .header("retry-after", "60")
                            .body(())
                            .unwrap();
                        Ok::<_, Infallible>(response)
                    }));
            for _ in 0..2 {
                let _ = client.ready().await.unwrap().call(Request::new(())).await;
            }
        })
    });
    handle.render()
}

/// The `# HELP` and `# TYPE` lines of `scrape`, by family name.
fn headers(scrape: &str, kind: &str) -> HashMap<String, String> {
    let prefix = format!("# {kind} ");
    scrape
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, text)| (name.to_owned(), text.to_owned()))
        .collect()
}

#[test]
fn every_tollgate_metric_in_a_prometheus_scrape_has_help_and_a_type() {
    let scrape = prometheus_scrape();
    let help = headers(scrape, "HELP");
    let types = headers(scrape, "TYPE");
    let mut recorded: Vec<&str> = types
        .keys()
        .map(String::as_str)
        .filter(|name| name.starts_with("tollgate_"))
        .collect();
    recorded.sort_unstable();
    let mut documented = FAMILIES.to_vec();
    documented.sort_unstable();
    assert_eq!(recorded, documented, "{scrape}");
    for family in FAMILIES {
        let text = help.get(family).map(String::as_str).unwrap_or_default();
        assert!(text.len() > 20, "{family} has no help text:\n{scrape}");
    }
    let kind = |family: &str| types[family].as_str();
    assert_eq!(kind("tollgate_decisions_total"), "counter");
    assert_eq!(kind("tollgate_breaker_state"), "gauge");
    assert_eq!(kind("tollgate_live_instances"), "gauge");
    assert_eq!(kind("tollgate_store_latency_seconds"), "histogram");
    assert!(scrape.contains("tollgate_store_latency_seconds_bucket{layer=\"orders\",le=\"0.5\"}"));
}
