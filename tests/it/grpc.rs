//! gRPC refusals against a real tonic server and client over HTTP/2 on loopback: a limited
//! call is RESOURCE_EXHAUSTED and a fail-closed one UNAVAILABLE, both with
//! `grpc-retry-pushback-ms` and the RateLimit fields as metadata, in a Trailers-Only
//! response (one HEADERS frame that ends the stream); key rejections are gRPC codes; plain
//! HTTP routes on the same listener keep their 429 and problem+json.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Request, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::key::KeyRejection;
#[cfg(feature = "redis")]
use tollgate::{BreakerConfig, FailurePolicy};
use tollgate::{
    Caller, Decision, Limiter, Policy, Quota, RateLimitLayer,
    key::{FnKey, HeaderKey, KeyExtractor, MissingKey},
};
use tollgate_testkit::http::{Reply, exchange, parse_response};
#[cfg(feature = "redis")]
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::rates::unix_millis;
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

const CUSTOMER: &str = "x-customer-id";
const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

fn per_second(limit: u64) -> Limiter {
    Limiter::builder()
        .policy(Policy::sliding_window(
            "per-second",
            Quota::per_second(limit),
        ))
        .build()
}

fn per_minute(limit: u64) -> Limiter {
    Limiter::builder()
        .policy(Policy::sliding_window(
            "per-minute",
            Quota::per_minute(limit),
        ))
        .build()
}

/// tonic's own server with the layer on it, as `Server::builder().layer(...)` takes it.
async fn serve_tonic<K: KeyExtractor>(layer: RateLimitLayer<K>) -> SocketAddr {
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

/// The health service and a plain `/orders` route in one axum router behind the layer,
/// served over HTTP/1.1 and HTTP/2 on one listener.
async fn serve_mixed<K: KeyExtractor>(layer: RateLimitLayer<K>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let app = Routes::new(health)
        .into_axum_router()
        .route("/orders", get(|| async { "[]" }))
        .layer(layer);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

async fn check(
    client: &mut HealthClient<Channel>,
    customer: Option<&str>,
) -> Result<HealthCheckResponse, Status> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(customer) = customer {
        request
            .metadata_mut()
            .insert(CUSTOMER, customer.parse().unwrap());
    }
    client.check(request).await.map(tonic::Response::into_inner)
}

/// A refused call's metadata read as a response's headers, to parse its fields back.
fn metadata(status: &Status) -> Reply {
    Reply {
        status: StatusCode::OK,
        headers: status.metadata().clone().into_headers(),
        body: Bytes::new(),
        extensions: http::Extensions::new(),
    }
}

fn pushback_ms(status: &Status) -> u64 {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap_or_else(|| panic!("no grpc-retry-pushback-ms in {status:?}"))
        .to_str()
        .unwrap()
        .parse()
        .expect("grpc-retry-pushback-ms is whole milliseconds")
}

/// Sleeps until a whole second of Unix time (which the store's clock follows) has just
/// begun: the per-second window starts on whole seconds, so a burst sent now is counted
/// in one window unless it takes the better part of a second.
async fn start_of_a_second() -> u64 {
    let now = unix_millis();
    tokio::time::sleep(Duration::from_millis(1_000 - now % 1_000 + 5)).await;
    unix_millis() / 1_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fifty_first_call_in_a_second_is_resource_exhausted() {
    let layer = RateLimitLayer::new(per_second(50)).key(HeaderKey::new(CUSTOMER));
    let addr = serve_tonic(layer).await;
    let mut client = client(addr).await;

    // A loaded machine may stretch the burst over a window boundary, where the sliding
    // window rightly admits more: such a round says nothing and is run again with a
    // fresh caller.
    for round in 0..5 {
        let customer = format!("acme-{round}");
        let second = start_of_a_second().await;
        for call in 1..=50 {
            let reply = check(&mut client, Some(&customer)).await;
            assert!(reply.is_ok(), "call {call} of 50 refused: {reply:?}");
        }
        let refused = check(&mut client, Some(&customer)).await;
        if unix_millis() / 1_000 != second {
            continue;
        }
        let status = refused.expect_err("the 51st call in a second was admitted");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert_eq!(status.message(), "quota exceeded: per-second");

        let pushback = pushback_ms(&status);
        assert!((1..=1_000).contains(&pushback), "pushback {pushback} ms");
        let fields = metadata(&status);
        assert_eq!(
            fields.policy_params("ratelimit-policy"),
            vec![(
                "per-second".to_owned(),
                vec![("q".to_owned(), 50), ("w".to_owned(), 1)]
            )]
        );
        let state = fields.policy_params("ratelimit");
        assert_eq!(state.len(), 1, "{state:?}");
        assert_eq!(state[0].0, "per-second");
        assert_eq!(state[0].1[0], ("r".to_owned(), 0));
        let (ref t_name, t) = state[0].1[1];
        assert_eq!(t_name, "t");
        // Retry-After and t are whole seconds never earlier than the pushback.
        assert!(
            t as u64 * 1_000 >= pushback,
            "t={t}, pushback {pushback} ms"
        );
        assert_eq!(fields.retry_after(), Some(t as u64));

        // Another caller is not affected.
        assert!(check(&mut client, Some("globex")).await.is_ok());
        return;
    }
    panic!("no burst of 51 calls fitted in one second in 5 rounds");
}

/// One call over HTTP/2 with hyper's client, to see the frames as they came: whether the
/// response headers ended the stream, what data and trailers followed.
struct RawCall {
    headers: HeaderMap,
    status: StatusCode,
    ended_with_headers: bool,
    data: Bytes,
    trailers: Option<HeaderMap>,
}

async fn raw_call(addr: SocketAddr, request: Request<Full<Bytes>>) -> RawCall {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let response = sender.send_request(request).await.unwrap();
    // True only when the HEADERS frame carried END_STREAM: a body sent after it, even an
    // empty DATA frame or a trailers frame, is still pending here.
    let ended_with_headers = response.body().is_end_stream();
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    RawCall {
        headers: parts.headers,
        status: parts.status,
        ended_with_headers,
        trailers: collected.trailers().cloned(),
        data: collected.to_bytes(),
    }
}

fn grpc_check_request(addr: SocketAddr, customer: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}{CHECK_PATH}"))
        .header(CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .header(CUSTOMER, customer)
        // One uncompressed message of length 0: the empty HealthCheckRequest.
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_trailers_only() {
    let layer = RateLimitLayer::new(per_minute(1)).key(HeaderKey::new(CUSTOMER));
    let addr = serve_tonic(layer).await;

    // The admitted call is a normal gRPC response: headers, a message, then trailers.
    let allowed = raw_call(addr, grpc_check_request(addr, "acme")).await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert!(!allowed.ended_with_headers);
    assert!(!allowed.data.is_empty());
    let trailers = allowed
        .trailers
        .expect("an admitted call ends with trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert!(allowed.headers.contains_key("ratelimit"));

    let refused = raw_call(addr, grpc_check_request(addr, "acme")).await;
    assert_eq!(refused.status, StatusCode::OK);
    assert!(
        refused.ended_with_headers,
        "the refusal's headers did not end the stream"
    );
    assert!(refused.data.is_empty());
    assert_eq!(refused.trailers, None);
    assert_eq!(refused.headers[CONTENT_TYPE], "application/grpc");
    assert_eq!(refused.headers["grpc-status"], "8");
    assert_eq!(
        refused.headers["grpc-message"],
        "quota exceeded: per-minute"
    );
    assert!(refused.headers.contains_key("grpc-retry-pushback-ms"));
    assert!(refused.headers.contains_key("retry-after"));
    assert!(!refused.headers.contains_key("content-length"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_routes_on_the_same_listener_keep_problem_json() {
    let layer = RateLimitLayer::new(per_minute(1)).key(HeaderKey::new(CUSTOMER));
    let addr = serve_mixed(layer).await;

    // gRPC through the axum router: refused as gRPC.
    let mut client = client(addr).await;
    assert!(check(&mut client, Some("grpc-caller")).await.is_ok());
    let status = check(&mut client, Some("grpc-caller")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(pushback_ms(&status) > 0);

    // HTTP/1.1 on the same port.
    let request = format!(
        "GET /orders HTTP/1.1\r\nhost: {addr}\r\n{CUSTOMER}: h1-caller\r\nconnection: close\r\n\r\n"
    );
    let first = parse_response(&exchange(addr, [127, 0, 0, 1].into(), &request).await);
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(&first.body[..], b"[]");
    let refused = parse_response(&exchange(addr, [127, 0, 0, 1].into(), &request).await);
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers[CONTENT_TYPE], "application/problem+json");
    assert!(!refused.headers.contains_key("grpc-status"));
    assert_eq!(refused.json()["status"], 429);
    assert_eq!(refused.policy_params("ratelimit")[0].0, "per-minute");

    // HTTP/2 on the same port, without a gRPC content-type.
    let get = || {
        Request::get(format!("http://{addr}/orders"))
            .header(CUSTOMER, "h2-caller")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    assert_eq!(raw_call(addr, get()).await.status, StatusCode::OK);
    let refused = raw_call(addr, get()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers[CONTENT_TYPE], "application/problem+json");
    let body: serde_json::Value = serde_json::from_slice(&refused.data).unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_closed_route_is_unavailable_during_an_outage() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let backend = RedisBackend::builder(proxy.url())
        .prefix("grpc")
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .name("grpc")
        .backend(backend)
        .store_timeout(Duration::from_millis(200))
        .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
        .on_store_failure(FailurePolicy::closed())
        .breaker(BreakerConfig::default().failure_threshold(2))
        .build();
    let addr = serve_mixed(RateLimitLayer::new(limiter).key(HeaderKey::new(CUSTOMER))).await;
    let mut client = client(addr).await;
    assert!(check(&mut client, Some("acme")).await.is_ok());

    proxy.set(Fault::Refuse);
    // Through the timeout, then with the breaker open: UNAVAILABLE every time.
    for call in 0..4 {
        let status = check(&mut client, Some("acme")).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "call {call}: {status:?}");
        let fields = metadata(&status);
        let retry_after = fields.retry_after().expect("Retry-After");
        assert!(retry_after >= 1);
        assert_eq!(pushback_ms(&status), retry_after * 1_000);
        assert_eq!(
            fields.policy_params("ratelimit-policy"),
            vec![(
                "per-second".to_owned(),
                vec![("q".to_owned(), 0), ("w".to_owned(), 1)]
            )]
        );
    }

    // The plain route on the same server keeps its HTTP answer.
    let request = format!(
        "GET /orders HTTP/1.1\r\nhost: {addr}\r\n{CUSTOMER}: acme\r\nconnection: close\r\n\r\n"
    );
    let refused = parse_response(&exchange(addr, [127, 0, 0, 1].into(), &request).await);
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers[CONTENT_TYPE], "application/problem+json");

    proxy.set(Fault::Pass);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rejections_are_grpc_codes() {
    // A missing key rejected with 401 is UNAUTHENTICATED, not an HTTP 401.
    let layer = RateLimitLayer::new(per_second(50))
        .key(HeaderKey::new(CUSTOMER))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let addr = serve_mixed(layer).await;
    let mut grpc = client(addr).await;
    let status = check(&mut grpc, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(status.message(), "the request does not say who is calling");
    let request = format!("GET /orders HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    let http = parse_response(&exchange(addr, [127, 0, 0, 1].into(), &request).await);
    assert_eq!(http.status, StatusCode::UNAUTHORIZED);
    assert_eq!(http.headers[CONTENT_TYPE], "application/problem+json");

    // The default (400) is INVALID_ARGUMENT.
    let layer = RateLimitLayer::new(per_second(50)).key(HeaderKey::new(CUSTOMER));
    let mut grpc = client(serve_tonic(layer).await).await;
    let status = check(&mut grpc, None).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // An extractor's own rejection: 403 is PERMISSION_DENIED, its detail the message,
    // percent-encoded on the wire and decoded by the client.
    let known = FnKey::new(|request: &Request<()>| {
        match request.headers().get(CUSTOMER).map(|v| v.as_bytes()) {
            Some(b"acme") => Ok(Some(Caller::new("acme"))),
            _ => Err(KeyRejection::new(
                StatusCode::FORBIDDEN,
                "unknown customer (100% sure): café",
            )),
        }
    });
    let mut grpc = client(serve_tonic(RateLimitLayer::new(per_second(50)).key(known)).await).await;
    assert!(check(&mut grpc, Some("acme")).await.is_ok());
    let status = check(&mut grpc, Some("initech")).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), "unknown customer (100% sure): café");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusal_hook_gets_the_grpc_response() {
    let layer = RateLimitLayer::new(per_minute(1))
        .key(HeaderKey::new(CUSTOMER))
        .on_refusal(|decision: &Decision, mut default: http::Response<Bytes>| {
            assert!(matches!(decision, Decision::Limited(_)));
            assert_eq!(default.headers()["grpc-status"], "8");
            assert!(default.body().is_empty());
            default.headers_mut().insert(
                "grpc-message",
                http::HeaderValue::from_static("slow down, acme"),
            );
            default
        });
    let mut grpc = client(serve_tonic(layer).await).await;
    assert!(check(&mut grpc, Some("acme")).await.is_ok());
    let status = check(&mut grpc, Some("acme")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "slow down, acme");
    assert!(pushback_ms(&status) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_call_carries_the_ratelimit_fields_as_metadata() {
    let layer = RateLimitLayer::new(per_second(50)).key(HeaderKey::new(CUSTOMER));
    let addr = serve_tonic(layer).await;
    let mut grpc = client(addr).await;
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    request
        .metadata_mut()
        .insert(CUSTOMER, "acme".parse().unwrap());
    let response = grpc.check(request).await.unwrap();
    let fields = Reply {
        status: StatusCode::OK,
        headers: response.metadata().clone().into_headers(),
        body: Bytes::new(),
        extensions: http::Extensions::new(),
    };
    let state = fields.policy_params("ratelimit");
    assert_eq!(state[0].0, "per-second");
    assert_eq!(state[0].1[0], ("r".to_owned(), 49));
    assert!(!response.metadata().contains_key("grpc-retry-pushback-ms"));
}

/// A gRPC call refused by an `InFlightLayer` (all of its caller's slots taken) is
/// RESOURCE_EXHAUSTED with a pushback, as the rate limit's refusals are; an HTTP 429 would
/// reach the client as UNAVAILABLE with no pushback. A health `Watch` stream holds the
/// caller's one slot while it is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_in_flight_refusal_is_resource_exhausted_with_pushback() {
    use tollgate::InMemoryBackend;
    use tollgate::in_flight::InFlightLayer;

    let layer =
        InFlightLayer::new("streams", 1, InMemoryBackend::new()).key(HeaderKey::new(CUSTOMER));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let mut client = client(addr).await;
    let mut watch = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    watch
        .metadata_mut()
        .insert(CUSTOMER, "acme".parse().unwrap());
    let mut stream = client.watch(watch).await.unwrap().into_inner();
    assert!(
        stream.message().await.unwrap().is_some(),
        "the stream is open"
    );

    let refused = check(&mut client, Some("acme")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(pushback_ms(&refused), 1_000);
    let fields = metadata(&refused);
    assert!(fields.sf_list("ratelimit-policy").is_some());
    // Another caller, and acme once its stream has ended, are served.
    assert!(check(&mut client, Some("globex")).await.is_ok());
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while check(&mut client, Some("acme")).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "acme's slot was not freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A request without a key is the gRPC code of the layer's 400.
    let rejected = check(&mut client, None).await.unwrap_err();
    assert_eq!(rejected.code(), Code::InvalidArgument, "{rejected:?}");
}
