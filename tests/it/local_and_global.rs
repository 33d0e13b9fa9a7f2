//! A local bucket in front of the global one: a burst far over the limit is absorbed in
//! process, without a store call per request.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{Request, StatusCode};
use tollgate::{
    InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer, RedisBackend, key::HeaderKey,
};
use tollgate_testkit::counting::Counting;
use tollgate_testkit::redis::RedisServer;
use tower::ServiceExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_absorbed_without_a_store_call_per_request() {
    let server = RedisServer::start();
    let store = Counting::new(RedisBackend::builder(server.url()).build().unwrap());
    let calls = store.counter();
    let local = Limiter::builder()
        .name("orders-local")
        .backend(InMemoryBackend::new())
        .policy(Policy::token_bucket(
            "local-burst",
            Quota::per_minute(30),
            30,
        ))
        .build();
    let global = Limiter::builder()
        .name("orders")
        .backend(store)
        .store_timeout(Duration::from_secs(5))
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(50)))
        .build();
    let key = HeaderKey::new("x-customer-id");
    let app = Router::new()
        .route("/orders", get(|| async { "[]" }))
        .route_layer(RateLimitLayer::new(global).key(key.clone()))
        .route_layer(RateLimitLayer::new(local).key(key));

    let mut statuses = std::collections::BTreeMap::new();
    let mut refused_by = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let request = Request::get("/orders")
            .header("x-customer-id", "acme")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        *statuses.entry(response.status()).or_insert(0) += 1;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            let policy = response
                .headers()
                .get("ratelimit")
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            refused_by.insert(policy.split(';').next().unwrap().to_owned());
        }
    }
    assert_eq!(statuses[&StatusCode::OK], 30);
    assert_eq!(statuses[&StatusCode::TOO_MANY_REQUESTS], 170);
    // Only what the local bucket admitted reached Redis.
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 30);
    assert_eq!(
        refused_by.into_iter().collect::<Vec<_>>(),
        ["\"local-burst\""]
    );
}
