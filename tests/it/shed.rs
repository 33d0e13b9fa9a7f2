//! Load shedding by concurrency: request N+1 gets 503, Retry-After and a problem body;
//! capacity returns when held requests finish, when their futures are dropped and when a
//! client disconnects over real TCP; on axum and on plain tower services; clones share.
use std::collections::BTreeMap;
use std::convert::Infallible;
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
use tollgate::response::{ResponseBody, TEMPORARY_REDUCED_CAPACITY};
use tollgate::shed::ShedFuture;
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
    let before = gate.entered();
    let tasks = (0..count)
        .map(|_| {
            let mut service = service.clone();
            tokio::spawn(async move { send(&mut service, get_request("/hold", &[])).await })
        })
        .collect();
    eventually("held requests to reach the handler", || {
        gate.entered() == before + count
    })
    .await;
    tasks
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
    assert_eq!(problem["type"], TEMPORARY_REDUCED_CAPACITY);
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
                ("tollgate_shed_total{layer=orders}".to_owned(), 3.0),
                ("tollgate_shed_total{layer=shed}".to_owned(), 1.0),
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
        ("tollgate_shed_total{layer=orders}".to_owned(), 0.0),
        ("tollgate_shed_total{layer=shed}".to_owned(), 0.0),
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
