//! Client-side adaptive throttling (Google SRE, "Handling Overload"): against a backend that
//! can take a tenth of the offered load, the traffic that reaches it settles at about K times
//! what it accepts, and comes back when the backend does; the formula, the buckets, K, the
//! rejection statuses and the typed error, on a manual clock with deterministic randomness.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::client::{AdaptiveThrottleLayer, HoldReason, NotSent};
use tollgate::store::ManualClock;
use tower::{BoxError, Layer, Service, ServiceExt};

/// Aligned to whole seconds, so one-second buckets start on the clock's seconds.
const START: u64 = 1_800_000_000_000;

/// A random source the test sets by hand.
#[derive(Clone, Debug)]
struct Dial(Arc<AtomicU64>);

impl Dial {
    fn new(value: f64) -> Self {
        Self(Arc::new(AtomicU64::new(value.to_bits())))
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    fn source(&self) -> impl Fn() -> f64 + Send + Sync + 'static {
        let dial = self.0.clone();
        move || f64::from_bits(dial.load(Ordering::Relaxed))
    }
}

/// How the simulated backend answers the requests that reach it.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Accepts the first `n` requests of each clock second, answers 503 to the rest.
    CapacityPerSecond(u64),
    /// Accepts every `n`th request that reaches it, answers 503 to the others.
    EveryNth(u64),
    /// Accepts everything.
    Healthy,
}

#[derive(Debug)]
struct BackendState {
    behaviour: Behaviour,
    reached: u64,
    accepted: u64,
    second: u64,
    accepted_this_second: u64,
}

/// A backend in process (a tower `service_fn`, no network) that counts what reaches it.
#[derive(Clone, Debug)]
struct Backend {
    state: Arc<Mutex<BackendState>>,
    clock: ManualClock,
}

impl Backend {
    fn new(behaviour: Behaviour, clock: &ManualClock) -> Self {
        Self {
            state: Arc::new(Mutex::new(BackendState {
                behaviour,
                reached: 0,
                accepted: 0,
                second: 0,
                accepted_this_second: 0,
            })),
            clock: clock.clone(),
        }
    }

    fn set(&self, behaviour: Behaviour) {
        self.state.lock().unwrap().behaviour = behaviour;
    }

    /// (reached, accepted) so far.
    fn counts(&self) -> (u64, u64) {
        let state = self.state.lock().unwrap();
        (state.reached, state.accepted)
    }

    fn answer(&self) -> Response<()> {
        use tollgate::store::Clock;
        let second = self.clock.now_millis() / 1_000;
        let mut state = self.state.lock().unwrap();
        if state.second != second {
            state.second = second;
            state.accepted_this_second = 0;
        }
        state.reached += 1;
        let accept = match state.behaviour {
            Behaviour::CapacityPerSecond(n) => state.accepted_this_second < n,
            Behaviour::EveryNth(n) => state.reached.is_multiple_of(n),
            Behaviour::Healthy => true,
        };
        let mut response = Response::new(());
        if accept {
            state.accepted += 1;
            state.accepted_this_second += 1;
        } else {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        response
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<()>,
        Response = Response<()>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<()>, Infallible>> + use<>,
    > + Clone
    + use<> {
        let backend = self.clone();
        tower::service_fn(move |_request: Request<()>| {
            let response = backend.answer();
            async move { Ok::<_, Infallible>(response) }
        })
    }
}

/// What one stretch of traffic did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Tally {
    offered: u64,
    throttled: u64,
    reached: u64,
    accepted: u64,
}

impl Tally {
    fn reach_per_accept(&self) -> f64 {
        self.reached as f64 / self.accepted as f64
    }

    fn add(&mut self, other: Tally) {
        self.offered += other.offered;
        self.throttled += other.throttled;
        self.reached += other.reached;
        self.accepted += other.accepted;
    }
}

/// Offers `per_second` requests a second, evenly spaced, for `seconds` seconds of the
/// manual clock.
async fn offer<S>(
    client: &mut S,
    clock: &ManualClock,
    backend: &Backend,
    seconds: u64,
    per_second: u64,
) -> Tally
where
    S: Service<Request<()>, Response = Response<()>, Error = BoxError>,
{
    let before = backend.counts();
    let mut tally = Tally::default();
    let gap = Duration::from_millis(1_000 / per_second);
    for _ in 0..seconds * per_second {
        tally.offered += 1;
        let ready = client.ready().await.expect("the backend is always ready");
        match ready.call(Request::new(())).await {
            Ok(_) => {}
            Err(error) if error.is::<NotSent>() => tally.throttled += 1,
            Err(error) => panic!("the backend never fails: {error}"),
        }
        clock.advance(gap);
    }
    let after = backend.counts();
    tally.reached = after.0 - before.0;
    tally.accepted = after.1 - before.1;
    assert_eq!(tally.reached + tally.throttled, tally.offered);
    tally
}

#[tokio::test]
async fn traffic_reaching_an_overloaded_backend_settles_at_k_times_what_it_accepts_and_recovers() {
    let clock = ManualClock::new(START);
    // The client offers 100 requests a second; the backend can take 10 a second (a tenth
    // of the offered load) and answers 503 to the rest.
    let backend = Backend::new(Behaviour::CapacityPerSecond(10), &clock);
    let layer = AdaptiveThrottleLayer::new()
        .name("inventory")
        .clock(clock.clone())
        .random(tollgate_testkit::random::seeded(1));
    let mut client = layer.layer(backend.service());

    // Eight minutes for the window to fill and settle, then two measured minutes.
    let settling = offer(&mut client, &clock, &backend, 480, 100).await;
    assert!(settling.throttled > settling.offered / 2, "{settling:?}");
    let measured = offer(&mut client, &clock, &backend, 120, 100).await;
    let ratio = measured.reach_per_accept();
    eprintln!("overloaded, last two minutes: {measured:?}, reached/accepted = {ratio:.3}");
    // About K = 2 requests reach the backend for each it accepts...
    // (1.92 to 2.05 over a range of seeds for the random source.)
    assert!((ratio - 2.0).abs() < 0.15, "reached/accepted = {ratio}");
    // ...while it still gets as much work as it can take (10 a second)...
    assert!(measured.accepted >= 1_150, "{measured:?}");
    // ...and the rest, about 80% of the offered load, never leaves the client.
    let throttled_share = measured.throttled as f64 / measured.offered as f64;
    assert!((throttled_share - 0.8).abs() < 0.02, "{throttled_share}");
    let probability = layer.rejection_probability();
    assert!((probability - 0.8).abs() < 0.02, "{probability}");

    // The backend recovers. Second by second, the rejection probability only falls.
    backend.set(Behaviour::Healthy);
    let mut probabilities = vec![layer.rejection_probability()];
    let mut recovery = Vec::new();
    for _ in 0..180 {
        recovery.push(offer(&mut client, &clock, &backend, 1, 100).await);
        probabilities.push(layer.rejection_probability());
    }
    for pair in probabilities.windows(2) {
        assert!(pair[1] <= pair[0], "rose from {} to {}", pair[0], pair[1]);
    }
    let reached = |from: usize, to: usize| -> f64 {
        let mut tally = Tally::default();
        recovery[from..to].iter().for_each(|t| tally.add(*t));
        tally.reached as f64 / tally.offered as f64
    };
    eprintln!(
        "recovery: share reaching the backend in seconds 0-10 {:.3}, 60-70 {:.3}, \
         120-130 {:.3}, 150-180 {:.3}; probability after 60 s {:.3}, 120 s {:.3}, 150 s {:.3}",
        reached(0, 10),
        reached(60, 70),
        reached(120, 130),
        reached(150, 180),
        probabilities[60],
        probabilities[120],
        probabilities[150],
    );
    // More gets through as every success raises the accepts...
    assert!(reached(0, 10) > 0.15, "{}", reached(0, 10));
    assert!(reached(60, 70) > reached(0, 10) + 0.1);
    assert!(reached(120, 130) > 0.8, "{}", reached(120, 130));
    // ...and once the refusals have left the two-minute window, everything does.
    assert_eq!(probabilities[150], 0.0);
    assert_eq!(reached(150, 180), 1.0);
}

#[tokio::test]
async fn k_is_configurable() {
    for k in [1.5, 3.0] {
        let clock = ManualClock::new(START);
        let backend = Backend::new(Behaviour::CapacityPerSecond(10), &clock);
        let layer = AdaptiveThrottleLayer::new()
            .k(k)
            .clock(clock.clone())
            .random(tollgate_testkit::random::seeded(2));
        let mut client = layer.layer(backend.service());
        offer(&mut client, &clock, &backend, 360, 100).await;
        let measured = offer(&mut client, &clock, &backend, 120, 100).await;
        let ratio = measured.reach_per_accept();
        eprintln!("K = {k}: {measured:?}, reached/accepted = {ratio:.3}");
        assert!(
            (ratio - k).abs() < 0.1 * k,
            "K = {k}: reached/accepted = {ratio}"
        );
    }
}

/// The literal reading of "a server that accepts 10% of requests": one that accepts every
/// tenth request that reaches it, however few. Its reached/accepted ratio is 10 whatever the
/// client does, above K, so no rate of sending satisfies the throttle: it cuts the traffic
/// to a trickle (about 1 / (1 - K / 10) requests per window) until the backend recovers.
/// This is the SRE rule working as designed: a backend that refuses most of what it gets
/// even at a trickle is not one to keep sending to.
#[tokio::test]
async fn a_backend_refusing_a_fixed_share_of_whatever_reaches_it_gets_a_trickle() {
    let clock = ManualClock::new(START);
    let backend = Backend::new(Behaviour::EveryNth(10), &clock);
    let layer = AdaptiveThrottleLayer::new()
        .clock(clock.clone())
        .random(tollgate_testkit::random::seeded(3));
    let mut client = layer.layer(backend.service());
    let settling = offer(&mut client, &clock, &backend, 360, 100).await;
    let measured = offer(&mut client, &clock, &backend, 120, 100).await;
    eprintln!("every tenth accepted: first six minutes {settling:?}, then two {measured:?}");
    assert!(measured.reached <= 12, "{measured:?}");
    // It recovers when the backend does, if more slowly than from a backend at capacity:
    // each success lets about two more requests out.
    backend.set(Behaviour::Healthy);
    let mut seconds = 0;
    while layer.rejection_probability() > 0.0 {
        offer(&mut client, &clock, &backend, 1, 100).await;
        seconds += 1;
        assert!(
            seconds < 1_200,
            "no recovery in 20 minutes: {} of {} accepted",
            layer.accepts(),
            layer.requests()
        );
    }
    eprintln!("every tenth accepted: fully recovered {seconds} s after the backend");
}

/// A backend that answers, in turn, with the statuses (or error) the test queues.
#[derive(Clone, Debug, Default)]
struct Scripted {
    answers: Arc<Mutex<Vec<Result<StatusCode, &'static str>>>>,
    reached: Arc<AtomicU64>,
}

impl Scripted {
    fn queue(&self, answer: Result<StatusCode, &'static str>, times: usize) {
        let mut answers = self.answers.lock().unwrap();
        for _ in 0..times {
            answers.insert(0, answer);
        }
    }

    fn reached(&self) -> u64 {
        self.reached.load(Ordering::SeqCst)
    }
}

impl Service<Request<()>> for Scripted {
    type Response = Response<()>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<()>, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<()>) -> Self::Future {
        self.reached.fetch_add(1, Ordering::SeqCst);
        let answer = self
            .answers
            .lock()
            .unwrap()
            .pop()
            .unwrap_or(Ok(StatusCode::OK));
        std::future::ready(match answer {
            Ok(status) => {
                let mut response = Response::new(());
                *response.status_mut() = status;
                Ok(response)
            }
            Err(message) => Err(std::io::Error::other(message)),
        })
    }
}

async fn send<S>(client: &mut S, times: usize) -> Vec<Result<StatusCode, BoxError>>
where
    S: Service<Request<()>, Response = Response<()>, Error = BoxError>,
{
    let mut results = Vec::new();
    for _ in 0..times {
        let ready = client.ready().await.expect("ready");
        results.push(ready.call(Request::new(())).await.map(|r| r.status()));
    }
    results
}

#[tokio::test]
async fn the_probability_follows_the_formula() {
    let clock = ManualClock::new(START);
    let dial = Dial::new(0.999_999);
    let backend = Scripted::default();
    let layer = AdaptiveThrottleLayer::new()
        .clock(clock.clone())
        .random(dial.source());
    let mut client = layer.layer(backend.clone());
    assert_eq!((layer.requests(), layer.accepts()), (0, 0));
    assert_eq!(layer.rejection_probability(), 0.0);

    // Seven refusals, three acceptances: (10 - 2 * 3) / (10 + 1).
    backend.queue(Ok(StatusCode::SERVICE_UNAVAILABLE), 7);
    backend.queue(Ok(StatusCode::OK), 3);
    send(&mut client, 10).await;
    assert_eq!((layer.requests(), layer.accepts()), (10, 3));
    assert_eq!(layer.rejection_probability(), 4.0 / 11.0);

    // A draw below the probability rejects, and the rejected request counts in requests.
    dial.set(0.36);
    let rejected = send(&mut client, 1).await.remove(0).unwrap_err();
    let throttled = rejected.downcast_ref::<NotSent>().unwrap();
    assert_eq!(throttled.reason(), HoldReason::Throttled);
    assert_eq!(throttled.rejection_probability(), Some(4.0 / 11.0));
    // The window as the request found it.
    assert!(
        throttled
            .to_string()
            .contains("accepted 3 of the 10 requests"),
        "{throttled}"
    );
    assert_eq!(
        backend.reached(),
        10,
        "a rejected request never reaches the backend"
    );
    assert_eq!((layer.requests(), layer.accepts()), (11, 3));
    assert_eq!(layer.rejection_probability(), 5.0 / 12.0);
    // A draw at the probability goes through.
    dial.set(5.0 / 12.0);
    assert_eq!(
        send(&mut client, 1).await.remove(0).unwrap(),
        StatusCode::OK
    );
    assert_eq!(backend.reached(), 11);

    // At one accept per K requests or better, nothing is rejected, whatever the draw.
    dial.set(0.999_999);
    backend.queue(Ok(StatusCode::OK), 20);
    assert!(send(&mut client, 20).await.iter().all(Result::is_ok));
    assert_eq!((layer.requests(), layer.accepts()), (32, 24));
    assert_eq!(layer.rejection_probability(), 0.0); // (32 - 48) / 33 < 0
    dial.set(0.0);
    assert!(send(&mut client, 5).await.iter().all(Result::is_ok));
    assert_eq!(backend.reached(), 36);
}

#[tokio::test]
async fn k_changes_the_formula_and_is_at_least_one() {
    for (k, expected) in [
        (2.0, 4.0 / 11.0),
        (3.0, 1.0 / 11.0),
        (1.0, 7.0 / 11.0),
        (0.5, 7.0 / 11.0),
    ] {
        let backend = Scripted::default();
        let layer = AdaptiveThrottleLayer::new()
            .k(k)
            .clock(ManualClock::new(START))
            .random(|| 0.999_999);
        let mut client = layer.layer(backend.clone());
        backend.queue(Ok(StatusCode::SERVICE_UNAVAILABLE), 7);
        backend.queue(Ok(StatusCode::OK), 3);
        send(&mut client, 10).await;
        assert_eq!(layer.rejection_probability(), expected, "K = {k}");
    }
}

#[tokio::test]
async fn buckets_rotate_on_the_clock() {
    let clock = ManualClock::new(START);
    let backend = Scripted::default();
    // Ten seconds in ten one-second buckets.
    let layer = AdaptiveThrottleLayer::new()
        .window(Duration::from_secs(10), 10)
        .clock(clock.clone())
        .random(|| 0.999_999);
    let mut client = layer.layer(backend.clone());
    let counts = || (layer.requests(), layer.accepts());

    backend.queue(Ok(StatusCode::SERVICE_UNAVAILABLE), 5);
    send(&mut client, 5).await; // in the bucket of second 0
    clock.advance(Duration::from_millis(4_500));
    send(&mut client, 3).await; // second 4, accepted
    assert_eq!(counts(), (8, 3));
    clock.set(START + 9_999);
    assert_eq!(counts(), (8, 3));
    clock.set(START + 10_000); // second 0 leaves the window
    assert_eq!(counts(), (3, 3));
    assert_eq!(layer.rejection_probability(), 0.0);
    clock.set(START + 13_999);
    assert_eq!(counts(), (3, 3));
    clock.set(START + 14_000); // so does second 4
    assert_eq!(counts(), (0, 0));

    // A gap longer than the window leaves it empty.
    backend.queue(Ok(StatusCode::TOO_MANY_REQUESTS), 4);
    send(&mut client, 4).await;
    assert_eq!(counts(), (4, 0));
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(counts(), (0, 0));

    // The default window: two minutes in one-second buckets.
    let clock = ManualClock::new(START);
    let layer = AdaptiveThrottleLayer::new()
        .clock(clock.clone())
        .random(|| 0.999_999);
    let mut client = layer.layer(Scripted::default());
    send(&mut client, 2).await;
    clock.advance(Duration::from_millis(119_999));
    assert_eq!(layer.requests(), 2);
    clock.advance(Duration::from_millis(1));
    assert_eq!(layer.requests(), 0);
}

#[tokio::test]
async fn the_error_tells_a_local_rejection_from_an_inner_error() {
    let backend = Scripted::default();
    let layer = AdaptiveThrottleLayer::new()
        .clock(ManualClock::new(START))
        .random(|| 0.0);
    let mut client = layer.layer(backend.clone());

    backend.queue(Err("connection reset"), 1);
    let inner = send(&mut client, 1).await.remove(0).unwrap_err();
    assert!(!inner.is::<NotSent>());
    assert_eq!(inner.to_string(), "connection reset");
    // The inner error, boxed as it boxes itself.
    let io = inner.downcast_ref::<std::io::Error>().unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::Other);
    // An inner error counts as not accepted.
    assert_eq!((layer.requests(), layer.accepts()), (1, 0));

    // One request, none accepted: the next is rejected with probability 1/2 (the draw is 0).
    let throttled = send(&mut client, 1).await.remove(0).unwrap_err();
    assert_eq!(
        throttled
            .downcast_ref::<NotSent>()
            .unwrap()
            .rejection_probability(),
        Some(0.5)
    );
    assert!(
        throttled.to_string().contains("rejected locally"),
        "{throttled}"
    );
    assert!(throttled.source().is_none());
    assert_eq!(backend.reached(), 1);
}

#[tokio::test]
async fn an_error_already_boxed_stays_as_it_is() {
    // After tower's Buffer or Timeout, the inner error is already a box: it is not boxed
    // again, so what it holds still downcasts.
    let backend = tower::service_fn(|_: Request<()>| async {
        let error: BoxError = Box::new(std::io::Error::other("timed out"));
        Err::<Response<()>, _>(error)
    });
    let error = AdaptiveThrottleLayer::new()
        .clock(ManualClock::new(START))
        .layer(backend)
        .oneshot(Request::new(()))
        .await
        .unwrap_err();
    assert!(error.downcast_ref::<std::io::Error>().is_some());
    assert!(!error.is::<NotSent>());
}

#[tokio::test]
async fn readiness_errors_are_inner_errors() {
    #[derive(Clone, Debug)]
    struct NeverReady;
    impl Service<Request<()>> for NeverReady {
        type Response = Response<()>;
        type Error = &'static str;
        type Future = std::future::Ready<Result<Response<()>, &'static str>>;
        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Err("pool closed"))
        }
        fn call(&mut self, _request: Request<()>) -> Self::Future {
            unreachable!("never ready")
        }
    }
    let layer = AdaptiveThrottleLayer::new().clock(ManualClock::new(START));
    let error = layer
        .layer(NeverReady)
        .oneshot(Request::new(()))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "pool closed");
    assert_eq!(layer.requests(), 0, "never attempted");
}

#[tokio::test]
async fn status_429_and_503_count_as_not_accepted_and_others_as_accepted() {
    let backend = Scripted::default();
    let layer = AdaptiveThrottleLayer::new()
        .clock(ManualClock::new(START))
        .random(|| 0.999_999);
    let mut client = layer.layer(backend.clone());
    for (status, accepted) in [
        (StatusCode::TOO_MANY_REQUESTS, false),
        (StatusCode::SERVICE_UNAVAILABLE, false),
        (StatusCode::OK, true),
        (StatusCode::NOT_FOUND, true),
        // A server error that is not overload says nothing about capacity: accepted.
        (StatusCode::INTERNAL_SERVER_ERROR, true),
        (StatusCode::BAD_GATEWAY, true),
    ] {
        let before = (layer.requests(), layer.accepts());
        backend.queue(Ok(status), 1);
        let answered = send(&mut client, 1).await.remove(0).unwrap();
        assert_eq!(answered, status);
        let after = (layer.requests(), layer.accepts());
        assert_eq!(
            after,
            (before.0 + 1, before.1 + u64::from(accepted)),
            "{status}"
        );
    }
}

#[tokio::test]
async fn the_rejection_statuses_are_configurable() {
    let accepted = |statuses: Vec<StatusCode>, answer: StatusCode| async move {
        let backend = Scripted::default();
        let layer = AdaptiveThrottleLayer::new()
            .rejection_statuses(statuses)
            .clock(ManualClock::new(START))
            .random(|| 0.999_999);
        let mut client = layer.layer(backend.clone());
        backend.queue(Ok(answer), 1);
        send(&mut client, 1).await;
        layer.accepts() == 1
    };
    let gateway = vec![StatusCode::BAD_GATEWAY, StatusCode::GATEWAY_TIMEOUT];
    assert!(!accepted(gateway.clone(), StatusCode::BAD_GATEWAY).await);
    assert!(!accepted(gateway.clone(), StatusCode::GATEWAY_TIMEOUT).await);
    assert!(accepted(gateway.clone(), StatusCode::SERVICE_UNAVAILABLE).await);
    assert!(accepted(gateway, StatusCode::TOO_MANY_REQUESTS).await);
    // No statuses: every response is accepted; only errors count against the backend.
    assert!(accepted(vec![], StatusCode::SERVICE_UNAVAILABLE).await);
    assert!(accepted(vec![], StatusCode::TOO_MANY_REQUESTS).await);
}

#[tokio::test]
async fn a_call_dropped_before_it_answers_counts_as_not_accepted() {
    let layer = AdaptiveThrottleLayer::new()
        .clock(ManualClock::new(START))
        .random(|| 0.999_999);
    let hanging = tower::service_fn(|_request: Request<()>| {
        std::future::pending::<Result<Response<()>, Infallible>>()
    });
    let mut client = layer.layer(hanging);
    let mut call = client.ready().await.unwrap().call(Request::new(()));
    let waker = std::task::Waker::noop();
    assert!(
        Pin::new(&mut call)
            .poll(&mut Context::from_waker(waker))
            .is_pending()
    );
    drop(call); // a timeout outside the layer gave up
    assert_eq!((layer.requests(), layer.accepts()), (1, 0));
}

#[tokio::test]
async fn clones_and_every_wrapped_service_share_one_window() {
    let clock = ManualClock::new(START);
    let layer = AdaptiveThrottleLayer::new()
        .clock(clock.clone())
        .random(|| 0.999_999);
    let backend = Scripted::default();
    let mut first = layer.layer(backend.clone());
    let mut second = first.clone();
    let mut third = layer.clone().layer(backend.clone());
    send(&mut first, 1).await;
    send(&mut second, 2).await;
    send(&mut third, 3).await;
    // Every service counted into the one window the layer reads.
    assert_eq!(layer.requests(), 6);
    // A new layer has its own window.
    let other = AdaptiveThrottleLayer::new().clock(clock.clone());
    assert_eq!(other.requests(), 0);
}

#[test]
fn local_rejections_are_counted_in_metrics_by_layer() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let backend = Scripted::default();
    let layer = AdaptiveThrottleLayer::new()
        .name("payments")
        .clock(ManualClock::new(START))
        .random(tollgate_testkit::random::seeded(7));
    let mut client = layer.layer(backend.clone());
    backend.queue(Ok(StatusCode::SERVICE_UNAVAILABLE), 1_000);
    let mut throttled = 0;
    for _ in 0..200 {
        // The decision, and so the counter, happens in `call`.
        let call = metrics::with_local_recorder(&recorder, || client.call(Request::new(())));
        throttled += u64::from(runtime.block_on(call).is_err());
    }
    assert!(throttled > 150, "{throttled}");
    let mut counted = None;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() == "tollgate_client_throttled_total" {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            assert_eq!(labels, ["layer=payments"]);
            let DebugValue::Counter(count) = value else {
                panic!("not a counter: {value:?}")
            };
            counted = Some(count);
        }
    }
    assert_eq!(counted, Some(throttled));
    assert_eq!(backend.reached(), 200 - throttled);
}

#[test]
fn the_service_and_its_future_are_send_sync_and_clone() {
    fn send_sync_clone<T: Send + Sync + Clone>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let clock = ManualClock::new(START);
    let backend = Backend::new(Behaviour::Healthy, &clock);
    let layer = AdaptiveThrottleLayer::new().clock(clock);
    send_sync_clone(&layer);
    let mut client = layer.layer(backend.service());
    send_sync_clone(&client);
    let future = client.call(Request::new(()));
    send(&future);
    assert!(format!("{future:?}").contains("calling inner service"));
    assert!(format!("{layer:?}").contains("AdaptiveThrottleLayer"));
}
