//! The layer on a plain hyper service (no axum): a `Full<Bytes>` body, a custom error type,
//! and client IPs from the peer address that the accept loop puts in the extensions.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tollgate::response::ResponseBody;
use tollgate::store::ManualClock;
use tollgate::{
    Decision, InMemoryBackend, Limiter, Policy, Quota, RateLimit, RateLimitLayer,
    key::{ClientIp, MissingKey},
};
use tollgate_testkit::http::{Reply, exchange, get, parse_response, send};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

/// The inner service's own error type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AppError {
    code: u32,
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "application error {}", self.code)
    }
}

impl std::error::Error for AppError {}

/// 200 "hello from hyper", or the application's error for `/fail`.
async fn app<B>(request: Request<B>) -> Result<Response<Full<Bytes>>, AppError> {
    if request.uri().path() == "/fail" {
        return Err(AppError { code: 418 });
    }
    let mut response = Response::new(Full::new(Bytes::from_static(b"hello from hyper")));
    response
        .headers_mut()
        .insert("x-inner", http::HeaderValue::from_static("yes"));
    Ok(response)
}

fn login_limiter(limit: u64) -> Limiter {
    let backend = InMemoryBackend::new().clock(ManualClock::new(1_000_000));
    Limiter::builder()
        .name("hyper-service")
        .backend(backend)
        .policy(Policy::sliding_window(
            "per-minute",
            Quota::per_minute(limit),
        ))
        .build()
}

/// Compiles only if the layered service's error is exactly the inner service's.
fn assert_error_is_app_error<S, R>(_: &S)
where
    S: Service<R, Error = AppError>,
{
}

/// Serves `limit` requests per minute per client IP on 127.0.0.1:0 with hyper alone.
async fn serve(limit: u64) -> SocketAddr {
    let limited = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(login_limiter(limit))
                .decision_on_every_response(true)
                .key(ClientIp::new()),
        )
        .service(service_fn(app::<Incoming>));
    // The layer keeps the inner error type and answers with its own body type around the
    // inner `Full<Bytes>`.
    assert_error_is_app_error::<_, Request<Incoming>>(&limited);
    let _: &RateLimit<_, ClientIp> = &limited;
    fn body_type<S>(_: &S)
    where
        S: Service<Request<Incoming>, Response = Response<ResponseBody<Full<Bytes>>>>,
    {
    }
    body_type(&limited);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            // Each connection tells the service who its peer is.
            let service = limited
                .clone()
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(peer);
                    request
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    addr
}

/// Sends one HTTP/1.1 GET over a fresh connection from `source` and reads the reply.
async fn wire_get(
    server: SocketAddr,
    source: IpAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    parse_response(&exchange(server, source, &request).await)
}

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const OTHER_LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

#[tokio::test]
async fn a_plain_hyper_server_answers_200_then_429_over_the_wire() {
    let server = serve(2).await;

    for remaining in [1, 0] {
        let reply = wire_get(server, LOCALHOST, "/", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        // The inner service's body and headers come through untouched.
        assert_eq!(reply.body, "hello from hyper");
        assert_eq!(reply.headers["x-inner"], "yes");
        assert_eq!(
            reply.policy_params("ratelimit-policy"),
            [(
                "per-minute".to_owned(),
                vec![("q".to_owned(), 2), ("w".to_owned(), 60)]
            )]
        );
        let state = reply.policy_params("ratelimit");
        assert_eq!(state.len(), 1);
        assert_eq!(state[0].0, "per-minute");
        assert_eq!(state[0].1[0], ("r".to_owned(), remaining));
    }

    let reply = wire_get(server, LOCALHOST, "/", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        reply.headers[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(reply.headers.get("x-inner").is_none());
    let retry_after = reply.retry_after().expect("Retry-After");
    assert!(retry_after >= 1);
    let state = reply.policy_params("ratelimit");
    assert_eq!(state.len(), 1);
    assert_eq!(state[0].1[0], ("r".to_owned(), 0));
    let body = reply.json();
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["per-minute"]));
    assert_eq!(body["retry-after-seconds"], retry_after);
}

#[tokio::test]
async fn the_key_is_the_peer_address_from_the_accept_loop() {
    let server = serve(1).await;

    assert_eq!(
        wire_get(server, LOCALHOST, "/", &[]).await.status,
        StatusCode::OK
    );
    // A new connection (new source port) from the same address: the same client.
    assert_eq!(
        wire_get(server, LOCALHOST, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The peer is no trusted proxy: a forged X-Forwarded-For changes nothing.
    assert_eq!(
        wire_get(
            server,
            LOCALHOST,
            "/",
            &[("x-forwarded-for", "198.51.100.1")]
        )
        .await
        .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another peer address is another client.
    assert_eq!(
        wire_get(server, OTHER_LOOPBACK, "/", &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        wire_get(server, OTHER_LOOPBACK, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_inner_error_passes_through_unchanged() {
    let service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(login_limiter(5))
                .decision_on_every_response(true)
                .key(ClientIp::new()),
        )
        .service(service_fn(app::<Full<Bytes>>));
    assert_error_is_app_error::<_, Request<Full<Bytes>>>(&service);

    let mut request = get("/fail", &[]);
    request
        .extensions_mut()
        .insert("203.0.113.7:5000".parse::<SocketAddr>().unwrap());
    let error = service
        .clone()
        .oneshot(request)
        .await
        .expect_err("the inner service's error");
    assert_eq!(error, AppError { code: 418 });

    // The error was an admitted request; the next one gets through normally.
    let mut request = get("/", &[]);
    request
        .extensions_mut()
        .insert("203.0.113.7:5000".parse::<SocketAddr>().unwrap());
    let mut service = service;
    let reply = send(&mut service, request).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(matches!(
        reply.extensions.get::<Decision>(),
        Some(Decision::Allowed(_))
    ));
}

#[tokio::test]
async fn an_inner_error_over_the_wire_is_hypers_to_handle_not_a_500_from_the_layer() {
    let server = serve(5).await;
    // hyper closes the connection on a service error; the layer never turns it into a
    // response of its own.
    let request = format!("GET /fail HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n\r\n");
    let raw = exchange(server, LOCALHOST, &request).await;
    assert!(
        raw.is_empty(),
        "expected the connection to close without a response, got {:?}",
        String::from_utf8_lossy(&raw)
    );
    // The server is still up for the next client.
    assert_eq!(
        wire_get(server, LOCALHOST, "/", &[]).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn without_a_peer_address_the_request_is_refused_with_a_4xx() {
    let mut service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(login_limiter(5))
                .decision_on_every_response(true)
                .key(ClientIp::new())
                .on_missing_key(MissingKey::Reject(StatusCode::FORBIDDEN)),
        )
        .service(service_fn(app::<Full<Bytes>>));
    let reply = send(&mut service, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.json()["status"], 403);
}

/// A service that counts its clones, and that must be called on the very instance driven to
/// readiness (as tower's contract asks: a `Buffer` or `ConcurrencyLimit` holds its permit
/// in the instance that was polled).
#[derive(Debug)]
struct ReadyOnce {
    clones: Arc<AtomicUsize>,
    ready: bool,
}

impl ReadyOnce {
    /// A service not yet driven to readiness, and the count of its clones.
    fn new() -> (Self, Arc<AtomicUsize>) {
        let clones = Arc::new(AtomicUsize::new(0));
        let service = Self {
            clones: clones.clone(),
            ready: false,
        };
        (service, clones)
    }
}

impl Clone for ReadyOnce {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, SeqCst);
        Self {
            clones: self.clones.clone(),
            ready: false,
        }
    }
}

impl<B> Service<Request<B>> for ReadyOnce {
    type Response = Response<Full<Bytes>>;
    type Error = AppError;
    type Future = std::future::Ready<Result<Self::Response, AppError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), AppError>> {
        self.ready = true;
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        assert!(self.ready, "called without being driven to readiness");
        self.ready = false;
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

#[tokio::test]
async fn a_request_decided_at_once_calls_the_ready_service_without_cloning_it() {
    let (inner, clones) = ReadyOnce::new();
    let mut service = RateLimitLayer::new(login_limiter(2))
        .key(tollgate::Caller::new("*"))
        .layer(inner);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let response = ServiceExt::<Request<()>>::ready(&mut service)
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(clones.load(SeqCst), 0);
}

#[tokio::test]
async fn a_request_whose_key_waits_takes_the_ready_service_along_and_leaves_a_clone() {
    let (inner, clones) = ReadyOnce::new();
    let key = tollgate::key::AsyncFnKey::new(|_: &Request<()>| async {
        tokio::task::yield_now().await;
        tollgate::Caller::new("*").into()
    });
    let mut service = RateLimitLayer::new(login_limiter(2)).key(key).layer(inner);
    for _ in 0..2 {
        let waiting = ServiceExt::<Request<()>>::ready(&mut service)
            .await
            .unwrap()
            .call(Request::new(()));
        // The service that was driven to readiness is the one called, once the key is
        // known; the layer keeps the clone, and drives it to readiness for the next.
        let response = waiting.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(clones.load(SeqCst), 2);
}
