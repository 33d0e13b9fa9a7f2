//! Load shedding by concurrency: request N+1 gets 503, Retry-After and a problem body;
//! capacity returns when held requests finish, when their futures are dropped and when a
//! client disconnects over real TCP; on axum and on plain tower services; clones share.
//! Priority classes: at saturation critical requests keep their reserve while the others
//! are shed, a critical request takes a reserved slot, normal and sheddable ones never
//! do, every ending gives its class's slot back, and a model of the ceilings agrees with
//! the layer over random arrival orders.
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tollgate::future::ShedFuture;
use tollgate::response::{ProblemType, ResponseBody};
use tollgate::shed::{ConcurrencyShed, ConcurrencyShedLayer};
use tollgate_testkit::http::{Reply, get as get_request, parse_response, send};
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

/// Holds requests until the test lets them go, and counts what happened to them.
#[derive(Clone)]
struct Gate {
    permits: Arc<Semaphore>,
    entered: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

/// Counts a held request as cancelled if it is dropped before the gate lets it go.
struct Waiting {
    cancelled: Arc<AtomicUsize>,
    armed: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.armed {
            self.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Gate {
    fn new() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(0)),
            entered: Arc::new(AtomicUsize::new(0)),
            finished: Arc::new(AtomicUsize::new(0)),
            cancelled: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Waits until the test releases one request.
    async fn pass(&self) {
        let mut waiting = Waiting {
            cancelled: self.cancelled.clone(),
            armed: true,
        };
        self.entered.fetch_add(1, Ordering::SeqCst);
        self.permits.acquire().await.expect("gate open").forget();
        waiting.armed = false;
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    fn release(&self, requests: usize) {
        self.permits.add_permits(requests);
    }

    fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }

    fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// A plain tower service: `/hold` waits at the gate, anything else answers at once.
fn holding_service(
    gate: &Gate,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static {
    let gate = gate.clone();
    service_fn(move |request: Request<Full<Bytes>>| {
        let gate = gate.clone();
        async move {
            if request.uri().path() == "/hold" {
                gate.pass().await;
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    })
}

/// An axum app: `/hold` waits at the gate, `/ok` answers at once.
fn holding_router(gate: &Gate) -> Router {
    let gate = gate.clone();
    Router::new()
        .route(
            "/hold",
            get(move || {
                let gate = gate.clone();
                async move {
                    gate.pass().await;
                    "held"
                }
            }),
        )
        .route("/ok", get(|| async { "ok" }))
}

/// Polls `condition` until it holds, for at most five seconds.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Starts `count` requests for `/hold` on clones of `service`, each in its own task, and
/// waits until all of them are at the gate.
async fn hold<S, B>(service: &S, gate: &Gate, count: usize) -> Vec<tokio::task::JoinHandle<Reply>>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    hold_class(service, gate, NORMAL, count).await
}

/// Checks a shed response: 503, Retry-After, the temporary-reduced-capacity problem.
fn assert_shed(reply: &Reply, retry_after: u64) {
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.retry_after(), Some(retry_after));
    assert_eq!(
        reply.headers[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let problem = reply.json();
    assert_eq!(problem["type"], ProblemType::TemporaryReducedCapacity.uri());
    assert_eq!(problem["status"], 503);
    assert_eq!(problem["retry-after-seconds"], retry_after);
    assert!(problem["title"].is_string(), "{problem}");
}

#[tokio::test]
async fn the_request_past_the_limit_is_shed_at_once() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(2);
    let service = layer.layer(holding_service(&gate));

    let held = hold(&service, &gate, 2).await;
    assert_eq!(layer.in_flight(), 2);

    // The third is answered without reaching the handler, and without waiting.
    let reply = tokio::time::timeout(
        Duration::from_secs(1),
        send(&mut service.clone(), get_request("/hold", &[])),
    )
    .await
    .expect("a shed request is answered at once");
    assert_shed(&reply, 1);
    assert_eq!(gate.entered(), 2);
    // A request that would not have waited is shed as well: the limit counts requests,
    // not what they ask for.
    assert_shed(
        &send(&mut service.clone(), get_request("/ok", &[])).await,
        1,
    );
    assert_eq!(layer.in_flight(), 2);

    gate.release(2);
    for task in held {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "ok");
    }
}

#[tokio::test]
async fn capacity_returns_when_held_requests_finish() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(3);
    let service = layer.layer(holding_service(&gate));

    let mut held = hold(&service, &gate, 3).await;
    assert_shed(
        &send(&mut service.clone(), get_request("/ok", &[])).await,
        1,
    );

    // One finishes: exactly one slot comes back.
    gate.release(1);
    let finished = loop {
        if let Some(i) = held.iter().position(|task| task.is_finished()) {
            break held.swap_remove(i);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    assert_eq!(finished.await.unwrap().status, StatusCode::OK);
    assert_eq!(layer.in_flight(), 2);
    held.extend(hold(&service, &gate, 1).await);
    assert_shed(
        &send(&mut service.clone(), get_request("/ok", &[])).await,
        1,
    );

    // All finish: the whole capacity is back.
    gate.release(3);
    for task in held {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(layer.in_flight(), 0);
    let held = hold(&service, &gate, 3).await;
    assert_eq!(gate.entered(), 7);
    gate.release(3);
    for task in held {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
}

#[tokio::test]
async fn dropping_the_response_future_gives_the_slot_back() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(1);
    let mut service = layer.layer(holding_service(&gate));

    // Dropped before it was ever polled.
    let future = service
        .ready()
        .await
        .unwrap()
        .call(get_request("/hold", &[]));
    assert_eq!(layer.in_flight(), 1);
    assert_shed(&send(&mut service, get_request("/ok", &[])).await, 1);
    drop(future);
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(
        send(&mut service, get_request("/ok", &[])).await.status,
        StatusCode::OK
    );

    // Dropped while the handler holds it: the task that drives it is aborted, as a
    // server does when its client goes away.
    let held = hold(&service, &gate, 1).await;
    assert_shed(&send(&mut service, get_request("/ok", &[])).await, 1);
    for task in held {
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    assert_eq!(gate.cancelled(), 1);
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(
        send(&mut service, get_request("/ok", &[])).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_handler_that_panics_gives_the_slot_back() {
    let layer = ConcurrencyShedLayer::new(1);
    let mut service = layer.layer(service_fn(|request: Request<Full<Bytes>>| async move {
        assert_ne!(request.uri().path(), "/panic", "the handler panics");
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    let mut panicking = service.clone();
    let task = tokio::spawn(async move { send(&mut panicking, get_request("/panic", &[])).await });
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(
        send(&mut service, get_request("/ok", &[])).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_slot_is_released_when_the_response_head_is_ready_not_when_the_body_ends() {
    let layer = ConcurrencyShedLayer::new(1);
    let mut service = layer.layer(service_fn(|_request: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"a body"))))
    }));
    let response = service
        .ready()
        .await
        .unwrap()
        .call(get_request("/", &[]))
        .await
        .unwrap();
    // The body has not been read, and the slot is free already.
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(
        send(&mut service, get_request("/", &[])).await.status,
        StatusCode::OK
    );
    drop(response);
}

#[tokio::test]
async fn retry_after_is_configurable_in_whole_seconds() {
    for (retry_after, expected) in [
        (Duration::from_secs(3), 3),
        (Duration::from_millis(2500), 3),
        (Duration::from_millis(10), 1),
        (Duration::ZERO, 1),
    ] {
        let layer = ConcurrencyShedLayer::new(0).retry_after(retry_after);
        assert_eq!(layer.retry_after_secs(), expected);
        let mut service = layer.layer(service_fn(tollgate_testkit::http::ok_handler));
        assert_shed(&send(&mut service, get_request("/", &[])).await, expected);
    }
}

#[tokio::test]
async fn clones_of_the_service_and_of_the_layer_share_one_limit() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(2);
    let first = layer.layer(holding_service(&gate));
    let clone = first.clone();
    // Another service wrapped by a clone of the layer counts in the same limit.
    let other = layer
        .clone()
        .layer(service_fn(tollgate_testkit::http::ok_handler));

    let mut held = hold(&first, &gate, 1).await;
    held.extend(hold(&clone, &gate, 1).await);
    assert_eq!(first.in_flight(), 2);
    assert_eq!(other.in_flight(), 2);
    assert_shed(&send(&mut first.clone(), get_request("/ok", &[])).await, 1);
    assert_shed(&send(&mut clone.clone(), get_request("/ok", &[])).await, 1);
    assert_shed(&send(&mut other.clone(), get_request("/ok", &[])).await, 1);

    gate.release(2);
    for task in held {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        send(&mut other.clone(), get_request("/ok", &[]))
            .await
            .status,
        StatusCode::OK
    );

    // A separate layer is a separate limit.
    let separate = ConcurrencyShedLayer::new(2).layer(holding_service(&gate));
    let held = hold(&first, &gate, 2).await;
    assert_eq!(
        send(&mut separate.clone(), get_request("/ok", &[]))
            .await
            .status,
        StatusCode::OK
    );
    gate.release(2);
    for task in held {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_concurrent_burst_exactly_the_limit_gets_through() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(4);
    let service = layer.layer(holding_service(&gate));
    let start = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let mut service = service.clone();
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                send(&mut service, get_request("/hold", &[])).await.status
            })
        })
        .collect();
    eventually("the shed requests to be answered", || {
        tasks.iter().filter(|task| task.is_finished()).count() == 60
    })
    .await;
    assert_eq!(gate.entered(), 4);
    assert_eq!(layer.in_flight(), 4);
    gate.release(4);
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let shed = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!((ok, shed), (4, 60));
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn on_an_axum_router_the_limit_is_router_wide() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(1);
    let app = holding_router(&gate).layer(layer.clone());

    let held = hold(&app, &gate, 1).await;
    // Another route is under the same limit: `Router::layer` wraps each route with one
    // layer, and the layer holds the count.
    let reply = send(&mut app.clone(), get_request("/ok", &[])).await;
    assert_shed(&reply, 1);
    gate.release(1);
    for task in held {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "held");
    }
    assert_eq!(layer.in_flight(), 0);
    let reply = send(&mut app.clone(), get_request("/ok", &[])).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "ok");
}

#[tokio::test]
async fn on_one_axum_route_the_others_are_not_limited() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(1).name("hold");
    let hold_route = {
        let gate = gate.clone();
        get(move || {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                "held"
            }
        })
    };
    let app: Router = Router::new()
        .route("/hold", hold_route.layer(layer.clone()))
        .route("/ok", get(|| async { "ok" }))
        .route_layer(ConcurrencyShedLayer::new(100));

    let held = hold(&app, &gate, 1).await;
    assert_shed(&send(&mut app.clone(), get_request("/hold", &[])).await, 1);
    assert_eq!(
        send(&mut app.clone(), get_request("/ok", &[])).await.status,
        StatusCode::OK
    );
    gate.release(1);
    for task in held {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
}

/// An error the inner service returns, to check it passes through unchanged.
#[derive(Debug, PartialEq)]
struct AppError;

/// Compiles only if the service has the bounds axum's `Router::layer` asks for, keeps the
/// inner error type and answers with `ResponseBody` around the inner body.
fn assert_axum_ready<S>(_: &S)
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<ResponseBody<Full<Bytes>>>,
            Error = AppError,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
}

#[tokio::test]
async fn inner_errors_pass_through_unchanged() {
    let layer = ConcurrencyShedLayer::new(1);
    let mut service = layer.layer(service_fn(|_request: Request<Full<Bytes>>| async {
        Err::<Response<Full<Bytes>>, _>(AppError)
    }));
    assert_axum_ready(&service);
    let _: &ConcurrencyShed<_> = &service;
    let future: ShedFuture<_, Full<Bytes>> =
        service.ready().await.unwrap().call(get_request("/", &[]));
    let error = future.await.unwrap_err();
    assert_eq!(error, AppError);
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn a_tower_service_builder_stack_works() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(1);
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(holding_service(&gate));
    let held = hold(&service, &gate, 1).await;
    assert_shed(
        &send(&mut service.clone(), get_request("/ok", &[])).await,
        1,
    );
    gate.release(1);
    for task in held {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        service
            .clone()
            .oneshot(get_request("/ok", &[]))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

/// Every counter and gauge, as `name{labels}` and value. The debugging recorder's
/// snapshots take the values: each one shows what changed since the previous one.
fn snapshot(snapshotter: &Snapshotter) -> BTreeMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let value = match value {
                DebugValue::Counter(count) => count as f64,
                DebugValue::Gauge(gauge) => gauge.into_inner(),
                DebugValue::Histogram(_) => panic!("{} is a histogram", key.name()),
            };
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

#[test]
fn sheds_and_requests_in_flight_are_measured() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let gate = Gate::new();
            let layer = ConcurrencyShedLayer::new(2).name("orders");
            let service = layer.layer(holding_service(&gate));
            let default_name = ConcurrencyShedLayer::new(0).layer(holding_service(&gate));

            let held = hold(&service, &gate, 2).await;
            for _ in 0..3 {
                assert_shed(
                    &send(&mut service.clone(), get_request("/ok", &[])).await,
                    1,
                );
            }
            assert_shed(
                &send(&mut default_name.clone(), get_request("/ok", &[])).await,
                1,
            );
            let expected: BTreeMap<String, f64> = [
                ("tollgate_in_flight{layer=orders}".to_owned(), 2.0),
                (
                    "tollgate_shed_total{layer=orders,class=normal}".to_owned(),
                    3.0,
                ),
                (
                    "tollgate_shed_total{layer=shed,class=normal}".to_owned(),
                    1.0,
                ),
            ]
            .into_iter()
            .collect();
            assert_eq!(snapshot(&snapshotter), expected);

            gate.release(2);
            for task in held {
                assert_eq!(task.await.unwrap().status, StatusCode::OK);
            }
            // One more request in and out: the gauge goes up and down again.
            assert_eq!(
                send(&mut service.clone(), get_request("/ok", &[]))
                    .await
                    .status,
                StatusCode::OK
            );
        });
    });
    // Since the previous snapshot: both held requests left, nothing more was shed.
    let expected: BTreeMap<String, f64> = [
        ("tollgate_in_flight{layer=orders}".to_owned(), -2.0),
        (
            "tollgate_shed_total{layer=orders,class=normal}".to_owned(),
            0.0,
        ),
        (
            "tollgate_shed_total{layer=shed,class=normal}".to_owned(),
            0.0,
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(snapshot(&snapshotter), expected);
}

/// Serves `app` on 127.0.0.1:0 with `axum::serve`.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// Sends a GET over a fresh connection, asks the server to close it after the response,
/// and reads the response until it does.
async fn wire_get(server: SocketAddr, path: &str) -> Reply {
    let mut stream = TcpStream::connect(server).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .expect("the server answers")
        .unwrap();
    parse_response(&raw)
}

#[tokio::test]
async fn a_client_that_disconnects_over_tcp_gives_its_slot_back() {
    let gate = Gate::new();
    let layer = ConcurrencyShedLayer::new(1);
    let server = serve(holding_router(&gate).layer(layer.clone())).await;

    // A client sends a request that the handler holds.
    let mut client = TcpStream::connect(server).await.unwrap();
    client
        .write_all(format!("GET /hold HTTP/1.1\r\nHost: {server}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    eventually("the request to reach the handler", || gate.entered() == 1).await;
    assert_eq!(layer.in_flight(), 1);

    // Meanwhile, another client is shed, over the wire too.
    assert_shed(&wire_get(server, "/ok").await, 1);

    // The first client goes away mid-request. The server notices, drops the request,
    // and the slot comes back without the handler ever finishing.
    drop(client);
    eventually("the server to notice the disconnect", || {
        layer.in_flight() == 0
    })
    .await;
    assert_eq!(gate.cancelled(), 1);
    assert_eq!(gate.finished(), 0);

    let reply = wire_get(server, "/ok").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "ok");
    let held_again = tokio::spawn(wire_get(server, "/hold"));
    eventually("a new request to be held", || gate.entered() == 2).await;
    gate.release(1);
    let reply = held_again.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "held");
}

/// Whose request it is: the `x-priority` header the classed layers below read.
const CRITICAL: &str = "critical";
const NORMAL: &str = "normal";
const SHEDDABLE: &str = "sheddable";

/// Is `request`'s `x-priority` header `class`?
fn priority_is(request: &http::request::Parts, class: &str) -> bool {
    request
        .headers
        .get("x-priority")
        .is_some_and(|value| value == class)
}

/// A layer letting `max` through, `reserve` of them kept for critical requests, with the
/// class read from `x-priority`.
fn classed(max: usize, reserve: usize) -> ConcurrencyShedLayer {
    ConcurrencyShedLayer::new(max)
        .critical_when(|request| priority_is(request, CRITICAL))
        .sheddable_when(|request| priority_is(request, SHEDDABLE))
        .reserve(reserve)
}

/// A request for `path` of `class` (a normal one carries no header).
fn request_of(path: &str, class: &str) -> Request<Full<Bytes>> {
    match class {
        NORMAL => get_request(path, &[]),
        class => get_request(path, &[("x-priority", class)]),
    }
}

/// Starts `count` requests of `class` for `/hold` on clones of `service`, each in its
/// own task, and waits until all of them are at the gate.
async fn hold_class<S, B>(
    service: &S,
    gate: &Gate,
    class: &'static str,
    count: usize,
) -> Vec<tokio::task::JoinHandle<Reply>>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    let before = gate.entered();
    let tasks = (0..count)
        .map(|_| {
            let mut service = service.clone();
            tokio::spawn(async move { send(&mut service, request_of("/hold", class)).await })
        })
        .collect();
    eventually("held requests to reach the handler", || {
        gate.entered() == before + count
    })
    .await;
    tasks
}

/// Lets every held request go and checks each was answered 200.
async fn finish(gate: &Gate, held: Vec<tokio::task::JoinHandle<Reply>>) {
    gate.release(held.len());
    for task in held {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
}

#[tokio::test]
async fn at_saturation_critical_requests_keep_their_reserve_while_the_others_are_shed() {
    let gate = Gate::new();
    let layer = classed(5, 2).sheddable_limit(1);
    let service = layer.layer(holding_service(&gate));

    // Normal and sheddable requests fill every slot outside the reserve.
    let mut held = hold_class(&service, &gate, NORMAL, 2).await;
    held.extend(hold_class(&service, &gate, SHEDDABLE, 1).await);
    assert_eq!(layer.in_flight(), 3);
    // Two slots are free, both reserved: the other classes are shed, however many come.
    for _ in 0..3 {
        for class in [NORMAL, SHEDDABLE] {
            assert_shed(
                &send(&mut service.clone(), request_of("/ok", class)).await,
                1,
            );
        }
    }
    assert_eq!(gate.entered(), 3);
    // Critical requests get both reserved slots.
    held.extend(hold_class(&service, &gate, CRITICAL, 2).await);
    assert_eq!(layer.in_flight(), 5);
    // Every slot is taken now: a critical request is shed too.
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", CRITICAL)).await,
        1,
    );
    finish(&gate, held).await;
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn sheddable_requests_are_shed_first() {
    let gate = Gate::new();
    let layer = classed(6, 1).sheddable_limit(2);
    let service = layer.layer(holding_service(&gate));

    let mut held = hold_class(&service, &gate, SHEDDABLE, 2).await;
    // At their limit, sheddable requests are shed while normal ones still get in.
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", SHEDDABLE)).await,
        1,
    );
    held.extend(hold_class(&service, &gate, NORMAL, 3).await);
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", NORMAL)).await,
        1,
    );
    held.extend(hold_class(&service, &gate, CRITICAL, 1).await);
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", CRITICAL)).await,
        1,
    );
    finish(&gate, held).await;

    // Unset, the limit is half of what normal requests may hold: (6 - 1) / 2.
    let layer = classed(6, 1);
    let service = layer.layer(holding_service(&gate));
    let held = hold_class(&service, &gate, SHEDDABLE, 2).await;
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", SHEDDABLE)).await,
        1,
    );
    assert_eq!(
        send(&mut service.clone(), request_of("/ok", NORMAL))
            .await
            .status,
        StatusCode::OK
    );
    finish(&gate, held).await;
}

#[tokio::test]
async fn a_critical_request_is_admitted_when_only_reserved_slots_are_free() {
    let gate = Gate::new();
    let layer = classed(3, 1);
    let service = layer.layer(holding_service(&gate));

    let mut held = hold_class(&service, &gate, NORMAL, 2).await;
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", NORMAL)).await,
        1,
    );
    // The one free slot is the reserve's; a critical request that does not wait takes it
    // and gives it back.
    for _ in 0..3 {
        let reply = send(&mut service.clone(), request_of("/ok", CRITICAL)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "ok");
    }
    held.extend(hold_class(&service, &gate, CRITICAL, 1).await);
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", CRITICAL)).await,
        1,
    );
    finish(&gate, held).await;
}

#[tokio::test]
async fn normal_requests_never_take_reserved_slots() {
    let gate = Gate::new();
    let layer = classed(4, 2);
    let service = layer.layer(holding_service(&gate));

    let normal = hold_class(&service, &gate, NORMAL, 2).await;
    // Half the slots are free, and all of them are reserved.
    for _ in 0..5 {
        assert_shed(
            &send(&mut service.clone(), request_of("/ok", NORMAL)).await,
            1,
        );
        assert_shed(
            &send(&mut service.clone(), request_of("/ok", SHEDDABLE)).await,
            1,
        );
    }
    assert_eq!(layer.in_flight(), 2);

    // Critical requests may also use the slots outside the reserve: with the normal ones
    // gone, four critical requests fill the layer.
    finish(&gate, normal).await;
    let critical = hold_class(&service, &gate, CRITICAL, 4).await;
    assert_eq!(layer.in_flight(), 4);
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", NORMAL)).await,
        1,
    );
    // As they finish, the first two slots given back count against the reserve's share
    // that critical requests no longer need: normal requests may take them, and not more.
    gate.release(2);
    eventually("two critical requests to finish", || gate.finished() == 4).await;
    let mut held = hold_class(&service, &gate, NORMAL, 2).await;
    assert_shed(
        &send(&mut service.clone(), request_of("/ok", NORMAL)).await,
        1,
    );
    for task in critical {
        if task.is_finished() {
            assert_eq!(task.await.unwrap().status, StatusCode::OK);
        } else {
            held.push(task);
        }
    }
    assert_eq!(held.len(), 4);
    finish(&gate, held).await;
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn the_critical_predicate_wins_and_sees_the_method_uri_and_headers() {
    let layer = ConcurrencyShedLayer::new(1)
        .critical_when(|request| {
            request.method == http::Method::POST && request.uri.path() == "/login"
        })
        .sheddable_when(|request| {
            request.uri.path() == "/login" || request.headers.contains_key("x-batch")
        })
        .reserve(1);
    let mut service = layer.layer(service_fn(tollgate_testkit::http::ok_handler));
    let post = Request::post("/login")
        .body(Full::new(Bytes::new()))
        .unwrap();
    // Both predicates hold: it is critical, and gets the reserved (only) slot.
    assert_eq!(send(&mut service, post).await.status, StatusCode::OK);
    assert_shed(&send(&mut service, get_request("/login", &[])).await, 1);
    assert_shed(&send(&mut service, get_request("/orders", &[])).await, 1);
    assert_shed(
        &send(&mut service, get_request("/orders", &[("x-batch", "1")])).await,
        1,
    );
}

/// How a held request ends in [`every_ending_gives_its_class_slot_back`].
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// Answers, and the body is read to the end.
    Body,
    /// Answers; the response is dropped with its body unread.
    Head,
    /// The response future is dropped while the handler waits (a client gone away).
    Dropped,
    /// The handler returns an error.
    Error,
    /// The handler panics.
    Panic,
}

/// What a held handler of [`controlled`] is told to do.
type Control = Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<Ending>>>>;

/// A service whose handlers wait for the `Control` in their request's extensions (if
/// any) and then end as it says.
fn controlled() -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = AppError,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, AppError>> + Send + 'static,
> + Clone
+ Send
+ 'static {
    service_fn(|request: Request<Full<Bytes>>| async move {
        let control = request.extensions().get::<Control>().cloned();
        let receiver = control.and_then(|control| control.lock().unwrap().take());
        let ending = match receiver {
            Some(receiver) => receiver.await.expect("the test says how to end"),
            None => Ending::Body,
        };
        match ending {
            Ending::Body | Ending::Head => {
                Ok(Response::new(Full::new(Bytes::from_static(b"a body"))))
            }
            Ending::Error => Err(AppError),
            Ending::Panic => panic!("the handler panics"),
            Ending::Dropped => unreachable!("a dropped request's handler never runs on"),
        }
    })
}

/// A request of `class` whose handler waits until the returned sender says how to end.
fn controlled_request(class: &str) -> (Request<Full<Bytes>>, tokio::sync::oneshot::Sender<Ending>) {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let mut request = request_of("/", class);
    let control: Control = Arc::new(std::sync::Mutex::new(Some(receiver)));
    request.extensions_mut().insert(control);
    (request, sender)
}

/// Runs one request of `class` through `service` to `ending`, on a task as a server
/// would, and checks what the caller saw.
async fn run_to<S>(service: &mut S, class: &str, ending: Ending)
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<ResponseBody<Full<Bytes>>>,
            Error = AppError,
        >,
    S::Future: Send + 'static,
{
    let (request, sender) = controlled_request(class);
    let future = service.ready().await.unwrap().call(request);
    let task = tokio::spawn(async move {
        match future.await {
            Ok(response) => {
                let status = response.status();
                if matches!(ending, Ending::Body) {
                    use http_body_util::BodyExt;
                    let body = response.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(body, "a body");
                }
                Ok(status)
            }
            Err(error) => Err(error),
        }
    });
    match ending {
        Ending::Dropped => {
            tokio::task::yield_now().await;
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            drop(sender);
        }
        Ending::Panic => {
            sender.send(ending).unwrap();
            assert!(task.await.unwrap_err().is_panic());
        }
        Ending::Error => {
            sender.send(ending).unwrap();
            assert_eq!(task.await.unwrap(), Err(AppError));
        }
        Ending::Body | Ending::Head => {
            sender.send(ending).unwrap();
            assert_eq!(task.await.unwrap(), Ok(StatusCode::OK));
        }
    }
}

/// Checks that the whole of `layer`'s capacity is free: `max - reserve` normal requests
/// and then `reserve` critical ones get in, and the next of either class is shed.
async fn assert_capacity_is_whole<S>(
    layer: &ConcurrencyShedLayer,
    service: &mut S,
    max: usize,
    reserve: usize,
) where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<ResponseBody<Full<Bytes>>>,
            Error = AppError,
        >,
{
    assert_eq!(layer.in_flight(), 0);
    let mut held = Vec::new();
    for (class, count) in [(NORMAL, max - reserve), (CRITICAL, reserve)] {
        for _ in 0..count {
            let (request, sender) = controlled_request(class);
            held.push((service.ready().await.unwrap().call(request), sender));
        }
    }
    assert_eq!(layer.in_flight(), max);
    for class in [NORMAL, CRITICAL, SHEDDABLE] {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request_of("/", class))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    drop(held);
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn every_ending_gives_its_class_slot_back() {
    let (max, reserve) = (3, 1);
    for class in [CRITICAL, NORMAL, SHEDDABLE] {
        for ending in [
            Ending::Body,
            Ending::Head,
            Ending::Dropped,
            Ending::Error,
            Ending::Panic,
        ] {
            let layer = classed(max, reserve);
            let mut service = layer.layer(controlled());
            // Twice each, so a count left taken would show in the second run already.
            for _ in 0..2 {
                run_to(&mut service, class, ending).await;
                assert_eq!(layer.in_flight(), 0, "{class} {ending:?}");
            }
            assert_capacity_is_whole(&layer, &mut service, max, reserve).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_concurrent_burst_of_every_class_the_ceilings_hold() {
    let gate = Gate::new();
    let (max, reserve, sheddable_limit) = (8, 3, 2);
    let layer = classed(max, reserve).sheddable_limit(sheddable_limit);
    let service = layer.layer(holding_service(&gate));
    let per_class = 16;
    let start = Arc::new(tokio::sync::Barrier::new(3 * per_class));
    let tasks: Vec<_> = [CRITICAL, NORMAL, SHEDDABLE]
        .into_iter()
        .flat_map(|class| std::iter::repeat_n(class, per_class))
        .map(|class| {
            let mut service = service.clone();
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                (
                    class,
                    send(&mut service, request_of("/hold", class)).await.status,
                )
            })
        })
        .collect();
    eventually("the shed requests to be answered", || {
        tasks.iter().filter(|task| task.is_finished()).count() == 3 * per_class - max
    })
    .await;
    assert_eq!(gate.entered(), max);
    assert_eq!(layer.in_flight(), max);
    gate.release(max);
    let mut admitted = BTreeMap::<&str, usize>::new();
    for task in tasks {
        let (class, status) = task.await.unwrap();
        if status == StatusCode::OK {
            *admitted.entry(class).or_default() += 1;
        } else {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    let of = |class| admitted.get(class).copied().unwrap_or(0);
    assert_eq!(
        of(CRITICAL) + of(NORMAL) + of(SHEDDABLE),
        max,
        "{admitted:?}"
    );
    assert!(of(CRITICAL) >= reserve, "{admitted:?}");
    assert!(of(NORMAL) + of(SHEDDABLE) <= max - reserve, "{admitted:?}");
    assert!(of(SHEDDABLE) <= sheddable_limit, "{admitted:?}");
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn over_tcp_logins_get_the_reserve_of_an_axum_router() {
    let gate = Gate::new();
    let login = {
        let gate = gate.clone();
        get(move || {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                "welcome"
            }
        })
    };
    let layer = ConcurrencyShedLayer::new(3)
        .critical_when(|request| request.uri.path() == "/login")
        .reserve(1);
    let server = serve(
        holding_router(&gate)
            .route("/login", login)
            .layer(layer.clone()),
    )
    .await;

    let mut held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(wire_get(server, "/hold")))
        .collect();
    eventually("two requests to be held", || gate.entered() == 2).await;
    assert_shed(&wire_get(server, "/ok").await, 1);
    // The reserved slot is a login's.
    held.push(tokio::spawn(wire_get(server, "/login")));
    eventually("the login to be held", || gate.entered() == 3).await;
    assert_eq!(layer.in_flight(), 3);
    assert_shed(&wire_get(server, "/login").await, 1);
    gate.release(3);
    let mut bodies: Vec<_> = Vec::new();
    for task in held {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        bodies.push(reply.body);
    }
    bodies.sort();
    assert_eq!(bodies, ["held", "held", "welcome"]);
}

#[test]
fn shed_requests_are_counted_by_class() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let gate = Gate::new();
            let layer = classed(2, 1).name("orders");
            let service = layer.layer(holding_service(&gate));
            let mut held = hold_class(&service, &gate, NORMAL, 1).await;
            for (class, count) in [(NORMAL, 3), (SHEDDABLE, 2)] {
                for _ in 0..count {
                    assert_shed(
                        &send(&mut service.clone(), request_of("/ok", class)).await,
                        1,
                    );
                }
            }
            held.extend(hold_class(&service, &gate, CRITICAL, 1).await);
            assert_shed(
                &send(&mut service.clone(), request_of("/ok", CRITICAL)).await,
                1,
            );
            let expected: BTreeMap<String, f64> = [
                ("tollgate_in_flight{layer=orders}".to_owned(), 2.0),
                (
                    "tollgate_shed_total{layer=orders,class=critical}".to_owned(),
                    1.0,
                ),
                (
                    "tollgate_shed_total{layer=orders,class=normal}".to_owned(),
                    3.0,
                ),
                (
                    "tollgate_shed_total{layer=orders,class=sheddable}".to_owned(),
                    2.0,
                ),
            ]
            .into_iter()
            .collect();
            assert_eq!(snapshot(&snapshotter), expected);
            finish(&gate, held).await;
        });
    });
}

/// One step of [`random_arrivals_and_endings_keep_every_ceiling`]: a request of a class
/// arrives, or the held request at an index (modulo how many are held) ends.
#[derive(Clone, Debug)]
enum Step {
    Arrive(&'static str),
    End(usize, Ending),
}

fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    let arrive = prop_oneof![Just(CRITICAL), Just(NORMAL), Just(SHEDDABLE)].prop_map(Step::Arrive);
    // Panics are left to the test of endings: each would print a backtrace here.
    let ending = prop_oneof![
        Just(Ending::Body),
        Just(Ending::Head),
        Just(Ending::Dropped),
        Just(Ending::Error),
    ];
    let end = (any::<usize>(), ending).prop_map(|(index, ending)| Step::End(index, ending));
    prop::collection::vec(prop_oneof![3 => arrive, 2 => end], 1..60)
}

/// The requests a classed layer holds, counted by class, and whether it must admit one
/// more of a class.
#[derive(Debug, Default)]
struct Model {
    critical: usize,
    normal: usize,
    sheddable: usize,
}

impl Model {
    fn admits(&self, class: &str, max: usize, reserve: usize, sheddable_limit: usize) -> bool {
        let all = self.critical + self.normal + self.sheddable;
        let below_critical = self.normal + self.sheddable;
        match class {
            CRITICAL => all < max,
            NORMAL => all < max && below_critical < max - reserve,
            _ => all < max && below_critical < max - reserve && self.sheddable < sheddable_limit,
        }
    }

    fn count(&mut self, class: &str) -> &mut usize {
        match class {
            CRITICAL => &mut self.critical,
            NORMAL => &mut self.normal,
            _ => &mut self.sheddable,
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 128,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    /// Requests of random classes arrive and end (answered, dropped, failed) in random
    /// orders: the layer admits exactly what the ceilings allow, so critical requests
    /// always find the reserve, normal and sheddable ones never hold more than the slots
    /// outside it, sheddable ones never more than their limit, and every ending gives
    /// its slot back.
    #[test]
    fn random_arrivals_and_endings_keep_every_ceiling(
        max in 0usize..7,
        reserve in 0usize..4,
        sheddable_limit in proptest::option::of(0usize..7),
        steps in steps(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut layer = classed(max, reserve);
            if let Some(limit) = sheddable_limit {
                layer = layer.sheddable_limit(limit);
            }
            let reserve = reserve.min(max);
            let limit = sheddable_limit.unwrap_or((max - reserve) / 2).min(max - reserve);
            let mut service = layer.layer(controlled());
            let mut model = Model::default();
            let mut held = Vec::new();
            for step in steps {
                match step {
                    Step::Arrive(class) => {
                        let admits = model.admits(class, max, reserve, limit);
                        let (request, sender) = controlled_request(class);
                        let future = service.ready().await.unwrap().call(request);
                        if admits {
                            *model.count(class) += 1;
                            held.push((class, tokio::spawn(future), sender));
                        } else {
                            // Checked before waiting: an admitted request would wait on
                            // its handler for good.
                            assert_eq!(
                                layer.in_flight(),
                                model.critical + model.normal + model.sheddable,
                                "{class} admitted past its ceiling: {model:?}"
                            );
                            let response = future.await.unwrap();
                            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{class} {model:?}");
                            assert_eq!(response.headers()["retry-after"], "1");
                        }
                    }
                    Step::End(_, _) if held.is_empty() => {}
                    Step::End(index, ending) => {
                        let (class, task, sender) = held.swap_remove(index % held.len());
                        *model.count(class) -= 1;
                        match ending {
                            Ending::Dropped => {
                                task.abort();
                                assert!(task.await.unwrap_err().is_cancelled());
                            }
                            Ending::Error => {
                                sender.send(ending).unwrap();
                                assert_eq!(task.await.unwrap().unwrap_err(), AppError);
                            }
                            _ => {
                                sender.send(ending).unwrap();
                                let response = task.await.unwrap().unwrap();
                                assert_eq!(response.status(), StatusCode::OK);
                                if matches!(ending, Ending::Body) {
                                    use http_body_util::BodyExt;
                                    let body = response.into_body().collect().await.unwrap().to_bytes();
                                    assert_eq!(body, "a body");
                                }
                            }
                        }
                    }
                }
                let all = model.critical + model.normal + model.sheddable;
                assert_eq!(layer.in_flight(), all, "{model:?}");
            }
            for (_, task, _) in held {
                task.abort();
                let _ = task.await;
            }
            assert_eq!(layer.in_flight(), 0);
        });
    }
}
