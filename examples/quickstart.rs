//! The README's first program: an axum app limited per client IP, counters in this process.
//! `cargo run --example quickstart [ADDR]` (default 127.0.0.1:3000).

use std::net::SocketAddr;

use axum::{Router, routing::get};
use tollgate::{Limiter, Policy, Quota, RateLimitLayer, key::ClientIp};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // 5 requests a second for each client IP, counted in this process.
    let limiter = Limiter::builder()
        .name("hello")
        .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
        .build();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route_layer(RateLimitLayer::new(limiter).key(ClientIp::new()))
        .route("/healthz", get(|| async { "ok" }));

    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    // ClientIp reads the peer address from axum's ConnectInfo.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
