//! A first request through the layer, end to end.
mod support;

use support::http::{get, ok_handler, send};
use tollgate::{GlobalKey, Limiter, Policy, Quota, RateLimitLayer};
use tower::{ServiceBuilder, service_fn};

#[tokio::test]
async fn smoke() {
    let limiter = Limiter::builder()
        .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
        .policy(Policy::sliding_window("per-day", Quota::per_day(1_000_000)))
        .build();
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter).key(GlobalKey))
        .service(service_fn(ok_handler));
    let a = send(&mut svc, get("/", &[])).await;
    let b = send(&mut svc, get("/", &[])).await;
    println!("{:?}\n{:?}\n{}", a.headers, b.headers, String::from_utf8_lossy(&b.body));
    println!("{:?}", b.policy_params("ratelimit-policy"));
}
