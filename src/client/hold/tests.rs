//! The holds on a clock the tests move: what each signal holds, for how long, per
//! partition; waits on tokio's paused timer; the metric.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::client::error::{BoxError, HoldReason, NotSent};

/// What the tests ask of the service's boxed error.
trait Held {
    fn held_back(&self) -> Option<&NotSent>;

    fn is_held_back(&self) -> bool {
        self.held_back().is_some()
    }
}

impl Held for BoxError {
    fn held_back(&self) -> Option<&NotSent> {
        self.downcast_ref()
    }
}
use crate::store::ManualClock;
use crate::store::clock::Clock;

/// A backend that answers `status` with `headers` and counts the calls that reach it.
#[derive(Clone)]
struct Backend {
    calls: Arc<AtomicUsize>,
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
}

impl Backend {
    fn new(status: u16, headers: &[(&'static str, &str)]) -> Self {
        Self {
            calls: Arc::default(),
            status: StatusCode::from_u16(status).unwrap(),
            headers: headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<Request<()>> for Backend {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut response = Response::new(());
        *response.status_mut() = self.status;
        for (k, v) in &self.headers {
            response.headers_mut().append(*k, v.parse().unwrap());
        }
        std::future::ready(Ok(response))
    }
}

fn to(host: &str) -> Request<()> {
    Request::get(format!("http://{host}/orders"))
        .body(())
        .unwrap()
}

async fn send(client: &HoldBack<Backend>, host: &str) -> Result<StatusCode, BoxError> {
    client.clone().oneshot(to(host)).await.map(|r| r.status())
}

#[tokio::test]
async fn retry_after_holds_the_authority_until_it_has_passed() {
    let clock = ManualClock::new(1_000_000);
    let backend = Backend::new(429, &[("retry-after", "2")]);
    let layer = HoldBackLayer::new().clock(clock.clone());
    let client = layer.layer(backend.clone());

    assert_eq!(send(&client, "a.example").await.unwrap(), 429);
    let held = send(&client, "a.example").await.unwrap_err();
    let held = held.held_back().unwrap();
    assert_eq!(held.reason(), HoldReason::RetryAfter);
    assert_eq!(held.retry_after(), Some(Duration::from_secs(2)));
    assert_eq!(backend.calls(), 1, "the held call was not sent");

    // Another server is not held.
    assert_eq!(send(&client, "b.example").await.unwrap(), 429);
    assert_eq!(backend.calls(), 2);

    clock.advance(Duration::from_millis(1_999));
    assert_eq!(
        send(&client, "a.example")
            .await
            .unwrap_err()
            .held_back()
            .unwrap()
            .retry_after(),
        Some(Duration::from_millis(1))
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(layer.held_for("a.example"), None);
    assert_eq!(send(&client, "a.example").await.unwrap(), 429);
    assert_eq!(backend.calls(), 3);
}

#[tokio::test]
async fn an_exhausted_ratelimit_policy_holds_even_an_allowed_response() {
    let clock = ManualClock::new(0);
    let backend = Backend::new(
        200,
        &[("ratelimit", r#""per-second";r=0;t=1, "day";r=5;t=900"#)],
    );
    let layer = HoldBackLayer::new().clock(clock.clone());
    let client = layer.layer(backend.clone());
    assert_eq!(send(&client, "a.example").await.unwrap(), 200);
    assert_eq!(
        layer.hold_reason("a.example"),
        Some(HoldReason::RateLimitHeader)
    );
    assert_eq!(layer.held_for("a.example"), Some(Duration::from_secs(1)));
    assert!(send(&client, "a.example").await.unwrap_err().is_held_back());
    assert_eq!(backend.calls(), 1);
}

#[tokio::test]
async fn grpc_pushback_holds_for_its_milliseconds() {
    let clock = ManualClock::new(0);
    let backend = Backend::new(
        200,
        &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "750")],
    );
    let layer = HoldBackLayer::new().clock(clock.clone());
    let client = layer.layer(backend.clone());
    assert_eq!(send(&client, "grpc.example").await.unwrap(), 200);
    assert_eq!(
        layer.held_for("grpc.example"),
        Some(Duration::from_millis(750))
    );
    assert_eq!(
        layer.hold_reason("grpc.example"),
        Some(HoldReason::GrpcPushback)
    );
}

#[tokio::test]
async fn regression_grpc_do_not_retry_on_a_capacity_refusal_holds_for_max_hold() {
    let clock = ManualClock::new(0);
    let backend = Backend::new(
        200,
        &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")],
    );
    let layer = HoldBackLayer::new()
        .clock(clock.clone())
        .max_hold(Duration::from_secs(600));
    let client = layer.layer(backend.clone());
    assert_eq!(send(&client, "grpc.example").await.unwrap(), 200);
    assert_eq!(
        layer.held_for("grpc.example"),
        Some(Duration::from_secs(600))
    );
    let held = send(&client, "grpc.example").await.unwrap_err();
    assert_eq!(
        held.held_back().unwrap().retry_after(),
        Some(Duration::from_secs(600))
    );
    assert_eq!(backend.calls(), 1);
}

#[tokio::test]
async fn grpc_do_not_retry_is_its_own_reason_and_only_a_capacity_refusal_holds() {
    let clock = ManualClock::new(0);
    let refused = Backend::new(
        200,
        &[
            ("grpc-status", "14"),
            ("grpc-retry-pushback-ms", "not a number"),
        ],
    );
    let layer = HoldBackLayer::new().clock(clock.clone());
    assert_eq!(send(&layer.layer(refused), "a").await.unwrap(), 200);
    assert_eq!(layer.hold_reason("a"), Some(HoldReason::GrpcNoRetry));
    assert_eq!(layer.held_for("a"), Some(Duration::from_secs(3_600)));
    let held = send(&layer.layer(Backend::new(200, &[])), "a")
        .await
        .unwrap_err();
    assert!(held.to_string().contains("not to retry"), "{held}");

    // A bad argument is the call's own failure: nothing is held.
    let invalid = Backend::new(
        200,
        &[("grpc-status", "3"), ("grpc-retry-pushback-ms", "-1")],
    );
    assert_eq!(send(&layer.layer(invalid.clone()), "b").await.unwrap(), 200);
    assert_eq!(send(&layer.layer(invalid.clone()), "b").await.unwrap(), 200);
    assert_eq!(layer.held_for("b"), None);
    assert_eq!(invalid.calls(), 2);
}

#[tokio::test]
async fn regression_grpc_pushback_in_the_trailers_holds_from_when_they_arrive() {
    let clock = ManualClock::new(0);
    let layer = HoldBackLayer::new().clock(clock.clone());
    // A gRPC answer that is not Trailers-Only: a message, then the status and pushback.
    let backend = tower::service_fn(|_: Request<()>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "8".parse().unwrap());
        trailers.insert("grpc-retry-pushback-ms", "1500".parse().unwrap());
        let body = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
            .with_trailers(std::future::ready(Some(Ok(trailers))));
        Ok::<_, Infallible>(Response::new(body))
    });
    let response = layer
        .layer(backend)
        .oneshot(to("grpc.example"))
        .await
        .unwrap();
    let mut body = response.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    assert_eq!(layer.held_for("grpc.example"), None);

    clock.advance(Duration::from_millis(200));
    assert!(body.frame().await.unwrap().unwrap().is_trailers());
    assert_eq!(
        layer.held_for("grpc.example"),
        Some(Duration::from_millis(1_500))
    );
    assert_eq!(
        layer.hold_reason("grpc.example"),
        Some(HoldReason::GrpcPushback)
    );
}

#[tokio::test]
async fn holds_are_capped_and_never_shortened() {
    let clock = ManualClock::new(0);
    let long = Backend::new(503, &[("retry-after", "999999999")]);
    let layer = HoldBackLayer::new()
        .clock(clock.clone())
        .max_hold(Duration::from_secs(60));
    assert_eq!(send(&layer.layer(long), "a").await.unwrap(), 503);
    assert_eq!(layer.held_for("a"), Some(Duration::from_secs(60)));
    // A response of a call that was in flight says less: the hold stays.
    let shared = layer.shared.clone();
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after", "1".parse().unwrap());
    shared.observe("a", StatusCode::TOO_MANY_REQUESTS, &headers);
    assert_eq!(layer.held_for("a"), Some(Duration::from_secs(60)));
}

#[tokio::test]
async fn the_partition_closure_separates_api_keys() {
    let clock = ManualClock::new(0);
    let backend = Backend::new(429, &[("retry-after", "5")]);
    let layer = HoldBackLayer::new()
        .clock(clock.clone())
        .partition(|parts| {
            let key = parts
                .headers
                .get("x-api-key")
                .map_or("", |v| v.to_str().unwrap_or(""));
            format!("{}#{key}", super::config::authority(parts))
        });
    let client = layer.layer(backend.clone());
    let with_key = |key: &str| {
        Request::get("http://api.example/v1")
            .header("x-api-key", key)
            .body(())
            .unwrap()
    };
    assert_eq!(
        client
            .clone()
            .oneshot(with_key("k1"))
            .await
            .unwrap()
            .status(),
        429
    );
    assert!(
        client
            .clone()
            .oneshot(with_key("k1"))
            .await
            .unwrap_err()
            .is_held_back()
    );
    assert_eq!(
        client
            .clone()
            .oneshot(with_key("k2"))
            .await
            .unwrap()
            .status(),
        429
    );
    assert!(layer.held_for("api.example#k1").is_some());
    assert_eq!(backend.calls(), 2);
}

#[test]
fn the_default_partition_is_the_authority_or_the_host_header() {
    let (parts, ()) = Request::get("https://api.example:8443/x")
        .body(())
        .unwrap()
        .into_parts();
    assert_eq!(super::config::authority(&parts), "api.example:8443");
    let (parts, ()) = Request::get("/x")
        .header("host", "origin.example")
        .body(())
        .unwrap()
        .into_parts();
    assert_eq!(super::config::authority(&parts), "origin.example");
}

/// tokio's paused clock, in Unix milliseconds, so that waits advance the layer's clock.
#[derive(Debug)]
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now_millis(&self) -> u64 {
        1_000_000 + self.0.elapsed().as_millis() as u64
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_waits_for_a_hold_that_ends_within_max_wait() {
    let backend = Backend::new(429, &[("retry-after", "1")]);
    let layer = HoldBackLayer::new()
        .clock(TokioClock(tokio::time::Instant::now()))
        .max_wait(Duration::from_secs(2));
    let client = layer.layer(backend.clone());
    let started = tokio::time::Instant::now();
    assert_eq!(send(&client, "a").await.unwrap(), 429);
    // Held for 1 s: waits, then is sent.
    assert_eq!(send(&client, "a").await.unwrap(), 429);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(backend.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_hold_longer_than_max_wait_fails_at_once() {
    let backend = Backend::new(503, &[("retry-after", "10")]);
    let layer = HoldBackLayer::new()
        .clock(TokioClock(tokio::time::Instant::now()))
        .max_wait(Duration::from_secs(2));
    let client = layer.layer(backend.clone());
    assert_eq!(send(&client, "a").await.unwrap(), 503);
    let started = tokio::time::Instant::now();
    assert!(send(&client, "a").await.unwrap_err().is_held_back());
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(backend.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hold_lengthened_past_the_deadline_while_waiting_fails_the_wait() {
    let backend = Backend::new(429, &[("retry-after", "1")]);
    let layer = HoldBackLayer::new()
        .clock(TokioClock(tokio::time::Instant::now()))
        .max_wait(Duration::from_secs(2));
    let client = layer.layer(backend.clone());
    assert_eq!(send(&client, "a").await.unwrap(), 429);
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { send(&client, "a").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A response of a call in flight: wait 5 s more.
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after", "5".parse().unwrap());
    layer
        .shared
        .observe("a", StatusCode::TOO_MANY_REQUESTS, &headers);
    let held = waiting.await.unwrap().unwrap_err();
    assert_eq!(
        held.held_back().unwrap().retry_after(),
        Some(Duration::from_millis(4_500))
    );
    assert_eq!(backend.calls(), 1);
}

#[test]
fn held_calls_are_counted_by_reason_and_outcome() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let backend = Backend::new(429, &[("retry-after", "1")]);
            let layer = HoldBackLayer::new()
                .name("orders")
                .clock(TokioClock(tokio::time::Instant::now()));
            let client = layer.layer(backend);
            let _ = send(&client, "a").await;
            assert!(send(&client, "a").await.is_err());
            assert!(send(&client, "a").await.is_err());
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let (key, unit, help, value) = snapshot
        .iter()
        .find(|(key, ..)| key.key().name() == "tollgate_client_held_back_total")
        .expect("the counter");
    let labels: Vec<(&str, &str)> = key.key().labels().map(|l| (l.key(), l.value())).collect();
    assert_eq!(
        labels,
        [
            ("layer", "orders"),
            ("reason", "retry_after"),
            ("outcome", "failed")
        ]
    );
    assert_eq!(*value, metrics_util::debugging::DebugValue::Counter(2));
    assert_eq!(*unit, Some(metrics::Unit::Count));
    assert!(
        help.as_ref()
            .is_some_and(|h| h.contains("by layer, reason"))
    );
}
