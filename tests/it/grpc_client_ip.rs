//! `ClientIp` on tonic's own server, which records the peer as its `TcpConnectInfo`: the
//! peer is found, a trusted proxy's X-Forwarded-For names the client, an untrusted peer's
//! is ignored. A request without an address would be UNAUTHENTICATED here.

use std::net::SocketAddr;

use http::StatusCode;
use tokio::net::TcpListener;
use tollgate::{
    Limiter, Policy, Quota, RateLimitLayer,
    key::{ClientIp, MissingKey},
};
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// A tonic health server limited to one call an hour per client IP.
async fn serve(key: ClientIp) -> SocketAddr {
    let limiter = Limiter::builder()
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(1)))
        .build();
    let layer = RateLimitLayer::new(limiter)
        .key(key)
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    addr
}

/// The call's outcome: `Code::Ok` or the refusal's code.
async fn check(addr: SocketAddr, forwarded_for: Option<&str>) -> Code {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(client) = forwarded_for {
        request
            .metadata_mut()
            .insert("x-forwarded-for", client.parse().unwrap());
    }
    match HealthClient::new(channel).check(request).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_forwarded_client_is_its_own_caller() {
    let addr = serve(ClientIp::new().trusted_proxies(["127.0.0.1"]).unwrap()).await;
    assert_eq!(check(addr, Some("198.51.100.1")).await, Code::Ok);
    assert_eq!(
        check(addr, Some("198.51.100.1")).await,
        Code::ResourceExhausted,
        "the same forwarded client twice"
    );
    assert_eq!(
        check(addr, Some("203.0.113.5, 198.51.100.2")).await,
        Code::Ok
    );
    // The proxy's own address is never the client: a chain of trusted hops has no key.
    assert_eq!(check(addr, Some("127.0.0.1")).await, Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
    let addr = serve(ClientIp::new()).await;
    assert_eq!(check(addr, Some("198.51.100.1")).await, Code::Ok);
    // Another forwarded address from the same peer: still the peer, already counted.
    assert_eq!(
        check(addr, Some("198.51.100.2")).await,
        Code::ResourceExhausted
    );
    assert_eq!(check(addr, None).await, Code::ResourceExhausted);
}
