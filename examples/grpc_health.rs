//! The layer on a tonic server: the standard gRPC health service, limited to 5 calls a
//! second per customer (the `x-customer-id` metadata entry), counters in this process.
//!
//! Serve: `cargo run --example grpc_health [ADDR]` (default 127.0.0.1:50051).
//!
//! Try it with the example's own client, which makes 8 quick calls as one customer and
//! prints each outcome (5 SERVING, then RESOURCE_EXHAUSTED with the pushback):
//! `cargo run --example grpc_health -- client [ADDR] [CUSTOMER]`.
//!
//! Or with grpcurl (the service has no reflection, so give it the health proto):
//! `grpcurl -plaintext -proto health.proto -H 'x-customer-id: acme' 127.0.0.1:50051
//! grpc.health.v1.Health/Check`. Without the metadata entry the call is UNAUTHENTICATED.

use std::time::Duration;

use http::StatusCode;
use tollgate::{
    Limiter, Policy, Quota, RateLimitLayer,
    key::{HeaderKey, MissingKey},
};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const DEFAULT_ADDR: &str = "127.0.0.1:50051";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    match args.next() {
        Some(mode) if mode == "client" => {
            let addr = args.next().unwrap_or_else(|| DEFAULT_ADDR.to_owned());
            let customer = args.next().unwrap_or_else(|| "acme".to_owned());
            client(&addr, &customer).await
        }
        addr => serve(addr.as_deref().unwrap_or(DEFAULT_ADDR)).await,
    }
}

async fn serve(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::builder()
        .name("health")
        .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
        .build();
    // gRPC metadata are HTTP/2 headers, so HeaderKey reads them. (ClientIp reads the peer
    // address tonic's server records, its TcpConnectInfo, with tollgate's `tonic` feature.)
    let layer = RateLimitLayer::new(limiter)
        .key(HeaderKey::new("x-customer-id"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let (_reporter, health) = tonic_health::server::health_reporter();
    // Bound first, so that port 0 prints the port the system chose.
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "serving grpc.health.v1.Health on {}",
        listener.local_addr()?
    );
    Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}

async fn client(addr: &str, customer: &str) -> Result<(), Box<dyn std::error::Error>> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let mut health = HealthClient::new(channel);
    for call in 1..=8 {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request
            .metadata_mut()
            .insert("x-customer-id", customer.parse()?);
        match health.check(request).await {
            Ok(response) => {
                let status = response.get_ref().status();
                println!("call {call}: {status:?}");
            }
            Err(status) => {
                let pushback = status
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none");
                println!(
                    "call {call}: {:?} ({}), retry in {pushback} ms",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    Ok(())
}
