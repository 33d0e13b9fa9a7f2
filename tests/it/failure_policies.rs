//! Failure policies per route on a real Redis behind a fault proxy: local share on
//! `/orders` and fail closed on `/login` in one router, fail static on a long quota, the
//! fallback counter, and one clock for every instance.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tollgate::decision::{BreakerState, DecisionSource};
use tollgate::store::ManualClock;
use tollgate::{
    BreakerConfig, Caller, Decision, FailurePolicy, InstanceCount, Limiter, Policy, Quota,
    RateLimitLayer, RedisBackend,
    key::{ClientIp, HeaderKey},
};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::recorder::{counter, with_recorder};
use tollgate_testkit::redis::RedisServer;
use tower::ServiceExt;

fn store(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .build()
        .unwrap()
}

fn breaker() -> BreakerConfig {
    BreakerConfig::default()
        .failure_threshold(2)
        .base_open(Duration::from_secs(30))
        .max_open(Duration::from_secs(30))
}

async fn send(
    app: &Router,
    method: &str,
    path: &str,
    customer: Option<&str>,
) -> (StatusCode, http::HeaderMap, serde_json::Value) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(customer) = customer {
        request = request.header("x-customer-id", customer);
    }
    let mut request = request.body(axum::body::Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([203, 0, 113, 7], 40_000))));
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (parts.status, parts.headers, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_keep_their_share_while_login_fails_closed() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    // The local share counts on the limiter's clock: held at the start of one of the
    // share's minute windows, the requests below never straddle two of them (the sliding
    // window would then admit one less).
    let now = tollgate_testkit::rates::unix_millis();
    let orders = Limiter::builder()
        .name("orders")
        .backend(store(&proxy.url(), "orders"))
        .clock(ManualClock::new(now - now % 120_000 + 1_000))
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(50)))
        .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(4)))
        .breaker(breaker())
        .build();
    let login = Limiter::builder()
        .name("login")
        .backend(store(&proxy.url(), "login"))
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
        .on_store_failure(FailurePolicy::closed())
        .breaker(breaker())
        .build();
    let app = Router::new()
        .route("/orders", get(|| async { "[]" }))
        .route_layer(RateLimitLayer::new(orders).key(HeaderKey::new("x-customer-id")))
        .route(
            "/login",
            post(|| async { "welcome" }).layer(RateLimitLayer::new(login).key(ClientIp::new())),
        );

    assert_eq!(
        send(&app, "GET", "/orders", Some("acme")).await.0,
        StatusCode::OK
    );
    assert_eq!(send(&app, "POST", "/login", None).await.0, StatusCode::OK);

    proxy.set(Fault::Blackhole);
    // The first calls pay the timeout and open both breakers; after that nobody waits.
    for _ in 0..2 {
        send(&app, "GET", "/orders", Some("globex")).await;
        send(&app, "POST", "/login", None).await;
    }

    // /orders: 50 a minute shared by 4 instances is 12 a minute here (no place given: the
    // remainder is not spread), in the limit's own window, and the headers say so. acme's
    // share starts where the store left it: 1 of 50 used is 1 of the 12 (rounded up).
    let mut admitted = 0;
    for i in 0..30 {
        let (status, headers, _) = send(&app, "GET", "/orders", Some("acme")).await;
        assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR);
        if status == StatusCode::OK {
            admitted += 1;
        }
        if i == 0 {
            let policy = headers.get("ratelimit-policy").unwrap().to_str().unwrap();
            assert_eq!(policy, "\"per-minute\";q=12;w=60");
        }
    }
    assert_eq!(admitted, 11);

    // /login: 503, Retry-After from the breaker's remaining open time, the problem type.
    let (status, headers, body) = send(&app, "POST", "/login", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let retry_after: u64 = headers
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=30).contains(&retry_after),
        "Retry-After: {retry_after}"
    );
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
    );
    assert_eq!(body["status"], 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_static_keeps_known_refusals_and_passes_the_rest() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let limiter = Limiter::builder()
        .name("failure-policies")
        .backend(store(&proxy.url(), "daily"))
        .store_timeout(Duration::from_millis(200))
        // A long quota: acme's refusal holds for the rest of the hour.
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(3)))
        .on_store_failure(FailurePolicy::fail_static())
        .breaker(breaker())
        .build();
    let (acme, globex) = (Caller::new("acme"), Caller::new("globex"));
    for _ in 0..3 {
        assert!(limiter.check(&acme).await.is_allowed());
    }
    assert!(matches!(limiter.check(&acme).await, Decision::Limited(_)));
    assert!(limiter.check(&globex).await.is_allowed());

    proxy.set(Fault::Refuse);
    for _ in 0..10 {
        match limiter.check(&acme).await {
            Decision::Limited(info) => assert_eq!(info.source(), DecisionSource::DenialCache),
            other => panic!("acme's known refusal did not hold: {other:?}"),
        }
        assert!(matches!(
            limiter.check(&globex).await,
            Decision::Unlimited(tollgate::decision::UnlimitedReason::StoreFailedOpen)
        ));
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
}

#[test]
fn every_fallback_is_counted_with_its_reason() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let ((), snapshot) = with_recorder(|_| async {
        let limiter = Limiter::builder()
            .name("orders")
            .backend(store(&proxy.url(), "metrics"))
            .store_timeout(Duration::from_millis(50))
            .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
            .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(4)))
            .breaker(breaker())
            .build();
        let acme = Caller::new("acme");
        assert!(limiter.check(&acme).await.is_allowed());
        proxy.set(Fault::Blackhole);
        for _ in 0..5 {
            limiter.check(&acme).await;
        }
    });
    let fallbacks = |reason| {
        counter(
            &snapshot,
            "tollgate_fallbacks_total",
            &[
                ("layer", "orders"),
                ("reason", reason),
                ("policy", "local_share"),
            ],
        )
    };
    // Two calls paid the timeout and opened the breaker; three skipped the store.
    assert_eq!(fallbacks("timeout"), 2);
    assert_eq!(fallbacks("breaker_open"), 3);
    assert_eq!(counter(&snapshot, "tollgate_fallbacks_total", &[]), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_skewed_clocks_agree_because_time_comes_from_redis() {
    let server = RedisServer::start();
    // Two instances whose own clocks are 5.5 s apart, each connected before it decides (a
    // decision made before the connection is there waits for it only within the store
    // timeout).
    let mut stores = Vec::new();
    for _ in 0..2 {
        let store = store(&server.url(), "clock");
        store.ping().await.expect("Redis answers");
        stores.push(store);
    }
    let limiters: Vec<Limiter> = [1_800_000_000_900u64, 1_800_000_006_400]
        .into_iter()
        .zip(stores)
        .map(|(millis, store)| {
            Limiter::builder()
                .name("failure-policies")
                .backend(store)
                .store_timeout(Duration::from_secs(5))
                .clock(ManualClock::new(millis))
                .policy(Policy::sliding_window("per-minute", Quota::per_minute(10)))
                .build()
        })
        .collect();
    let acme = Caller::new("acme");
    let mut remaining = Vec::new();
    for i in 0..14 {
        match limiters[i % 2].check(&acme).await {
            Decision::Allowed(info) => {
                remaining.push(info.policy(0).expect("a policy").remaining())
            }
            Decision::Limited(_) => remaining.push(u64::MAX),
            other => panic!("{other:?}"),
        }
    }
    // One sequence, as if one instance had served them all.
    let expected: Vec<u64> = (0..10).rev().chain([u64::MAX; 4]).collect();
    assert_eq!(remaining, expected);
}

/// A caller's share counters that the store's return left behind, and that the store then
/// decided alone while they refilled, do not decide the caller when the store goes away
/// again: its share starts from the store's last answer. (They used to be found still
/// tracked, refilled as if nobody had spent, and admitted a full part of the burst on top
/// of what the store had just admitted: the worst second at an outage's start went over.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_share_left_from_an_earlier_outage_starts_from_the_stores_last_answer() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let clock = ManualClock::new(tollgate_testkit::rates::unix_millis());
    let limiter = Limiter::builder()
        .name("orders")
        .backend(store(&proxy.url(), "orders"))
        .clock(clock.clone())
        // 40 per 10 s, a burst of 40: 10 per 10 s each of 4 instances.
        .policy(Policy::token_bucket(
            "bucket",
            Quota::per_seconds(40, 10),
            40,
        ))
        .on_store_failure(FailurePolicy::local_share(
            InstanceCount::fixed(4).at_place(0),
        ))
        // Every request asks the store: a failed call falls back by itself.
        .breaker(BreakerConfig::default().failure_threshold(1_000))
        .build();
    let acme = Caller::new("acme");
    let source = |decision: &Decision| decision.info().map(|info| info.source());
    let decide_until = |wanted: DecisionSource| {
        let limiter = limiter.clone();
        let acme = acme.clone();
        async move {
            for _ in 0..200 {
                let decision = limiter.check(&acme).await;
                if source(&decision) == Some(wanted) {
                    return decision;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("never decided by {wanted:?}");
        }
    };

    // The store answers once; then it goes away, and the share counts acme.
    assert!(decide_until(DecisionSource::Store).await.is_allowed());
    proxy.set(Fault::Refuse);
    assert!(decide_until(DecisionSource::LocalShare).await.is_allowed());
    // Back 5 s later (the share may decide once more while the connection comes back):
    // acme's share decides beside the store while what it counted weighs (10 s from its
    // last decision), its counters written until then and 10 s on.
    clock.advance(Duration::from_secs(5));
    proxy.set(Fault::Pass);
    assert!(decide_until(DecisionSource::Store).await.is_allowed());
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        source(&limiter.check(&acme).await),
        Some(DecisionSource::Store)
    );
    // The share's count no longer weighs, its counters are still kept: the store alone
    // decides acme, up to its limit.
    clock.advance(Duration::from_millis(8_500));
    let mut used_up = false;
    for _ in 0..60 {
        let decision = limiter.check(&acme).await;
        // The store's last admission left nothing: the refusal it announced is cached.
        if source(&decision) == Some(DecisionSource::DenialCache) {
            used_up = true;
            break;
        }
        assert_eq!(source(&decision), Some(DecisionSource::Store));
        if !decision.is_allowed() {
            used_up = true;
            break;
        }
    }
    assert!(used_up, "the store never refused acme");

    // Gone again, past the store's refusal: the share starts from the store's answer
    // (nothing left), not from its own counters of 9 s ago.
    clock.advance(Duration::from_millis(300));
    proxy.set(Fault::Refuse);
    let first = decide_until(DecisionSource::LocalShare).await;
    let mut admitted = usize::from(first.is_allowed());
    for _ in 0..10 {
        let decision = limiter.check(&acme).await;
        assert_eq!(source(&decision), Some(DecisionSource::LocalShare));
        admitted += usize::from(decision.is_allowed());
    }
    assert!(admitted <= 1, "the share admitted {admitted} of 11");
}
