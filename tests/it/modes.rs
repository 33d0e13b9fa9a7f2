//! Enforce, shadow and off, switched on a live router through a clone of its limiter while traffic
//! runs; shadow mode counting would-be refusals exactly, during an outage too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{Request, StatusCode};
#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::store::ManualClock;
#[cfg(feature = "redis")]
use tollgate::{BreakerConfig, Caller, Decision, FailurePolicy};
use tollgate::{
    InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer, key::HeaderKey, reload::Mode,
};
use tollgate_testkit::counting::Counting;
#[cfg(feature = "redis")]
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::recorder::{counter, with_recorder};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tower::ServiceExt;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

fn router(limiter: Limiter) -> Router {
    Router::new()
        .route("/orders", get(|| async { "[]" }))
        .layer(RateLimitLayer::new(limiter).key(HeaderKey::new("x-customer-id")))
}

async fn status(app: &Router) -> (StatusCode, bool) {
    let request = Request::get("/orders")
        .header("x-customer-id", "acme")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    (
        response.status(),
        response.headers().contains_key("ratelimit"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_modes_on_a_live_router_under_traffic() {
    let clock = ManualClock::new(1_800_000_000_000);
    let store = Counting::new(InMemoryBackend::new().clock(clock.clone()));
    let calls = store.counter();
    let limiter = Limiter::builder()
        .name("modes")
        .backend(store)
        .policy(Policy::sliding_window("per-second", Quota::per_second(10)))
        .build();
    // The admin endpoint's clone: switching it switches the router's.
    let switch = limiter.clone();
    let app = router(limiter);

    // Traffic runs throughout; each phase's answers are collected while it is in force.
    let running = Arc::new(AtomicBool::new(true));
    let seen: Arc<[AtomicU64; 3]> =
        Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut senders = Vec::new();
    for _ in 0..4 {
        let (app, running, seen) = (app.clone(), running.clone(), seen.clone());
        senders.push(tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                let (status, _) = status(&app).await;
                let slot = match status {
                    StatusCode::OK => 0,
                    StatusCode::TOO_MANY_REQUESTS => 1,
                    _ => 2,
                };
                seen[slot].fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }));
    }
    let counts = |seen: &[AtomicU64; 3]| {
        seen.iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect::<Vec<_>>()
    };
    let phase = |seen: Arc<[AtomicU64; 3]>| async move {
        let before = counts(&seen);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = counts(&seen);
        [
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2],
        ]
    };

    // Enforce: the clock stands still, so 10 pass and the rest are refused.
    let enforce = phase(seen.clone()).await;
    assert!(enforce[1] > 0, "no refusals while enforcing: {enforce:?}");

    switch.set_mode(Mode::Shadow);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let shadow = phase(seen.clone()).await;
    assert_eq!(shadow[1], 0, "shadow mode refused: {shadow:?}");
    assert!(shadow[0] > 0);

    switch.set_mode(Mode::Off);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let calls_before_off = calls.load(Ordering::SeqCst);
    let off = phase(seen.clone()).await;
    assert_eq!(off[1], 0, "off refused: {off:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        calls_before_off,
        "off still called the store"
    );

    switch.set_mode(Mode::Enforce);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = phase(seen.clone()).await;
    assert!(again[1] > 0 && again[0] == 0, "enforcing again: {again:?}");

    running.store(false, Ordering::Relaxed);
    for sender in senders {
        sender.await.unwrap();
    }
    assert_eq!(counts(&seen)[2], 0, "a status other than 200 or 429");
    drop(clock);
}

#[test]
fn shadow_mode_refuses_nothing_and_counts_exactly_what_it_would_have_refused() {
    let ((), snapshot) = with_recorder(|_| async {
        let clock = ManualClock::new(1_800_000_000_000);
        let limiter = Limiter::builder()
            .name("orders")
            .backend(InMemoryBackend::new().clock(clock))
            .policy(Policy::sliding_window("per-second", Quota::per_second(10)))
            .mode(Mode::Shadow)
            .build();
        let app = router(limiter);
        for _ in 0..25 {
            let (status, headers) = status(&app).await;
            assert_eq!(status, StatusCode::OK);
            assert!(
                !headers,
                "shadow mode advertised a limit it does not enforce"
            );
        }
    });
    let shadow_limited = counter(
        &snapshot,
        "tollgate_decisions_total",
        &[
            ("layer", "orders"),
            ("outcome", "shadow_limited"),
            ("policy", "per-second"),
        ],
    );
    let shadow_allowed = counter(
        &snapshot,
        "tollgate_decisions_total",
        &[("layer", "orders"), ("outcome", "shadow_allowed")],
    );
    assert_eq!((shadow_allowed, shadow_limited), (10, 15));
}

#[cfg(feature = "redis")]
#[test]
fn shadow_mode_during_an_outage_counts_what_fail_closed_would_have_refused() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let ((), snapshot) = with_recorder(|_| async {
        let limiter = Limiter::builder()
            .name("login")
            .backend(RedisBackend::builder(proxy.url()).build().unwrap())
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
            .on_store_failure(FailurePolicy::closed())
            .breaker(BreakerConfig::default().failure_threshold(2))
            .mode(Mode::Shadow)
            .build();
        proxy.set(Fault::Refuse);
        for _ in 0..12 {
            let decision = limiter.check(&Caller::new("203.0.113.7")).await;
            assert!(decision.is_allowed());
            assert!(
                matches!(decision, Decision::Shadowed(ref inner) if matches!(**inner, Decision::Unavailable { .. }))
            );
        }
    });
    let would_refuse = counter(
        &snapshot,
        "tollgate_decisions_total",
        &[("layer", "login"), ("outcome", "shadow_unavailable")],
    );
    assert_eq!(would_refuse, 12);
    let fallbacks = counter(
        &snapshot,
        "tollgate_fallbacks_total",
        &[("layer", "login"), ("policy", "closed")],
    );
    assert_eq!(fallbacks, 12);
}
