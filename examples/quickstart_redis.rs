//! The quickstart with the counters in Redis, shared by every instance, as the guide's Redis
//! page shows it.
//! `cargo run --features redis --example quickstart_redis [ADDR] [REDIS_URL]`.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use tollgate::{Limiter, Policy, Quota, RateLimitLayer, RedisBackend, key::ClientIp};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let redis = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());

    // 5 requests a second for each client IP, counted in Redis; if Redis cannot answer,
    // requests pass (the default failure policy, `FailurePolicy::open()`).
    let store = RedisBackend::builder(redis).prefix("hello").build()?;
    store.ping().await?; // connect now rather than on the first request
    let limiter = Limiter::builder()
        .name("hello")
        .backend(store)
        .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
        .build();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route_layer(RateLimitLayer::new(limiter).key(ClientIp::new()))
        .route("/healthz", get(|| async { "ok" }));

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    // ClientIp reads the peer address from axum's ConnectInfo.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
