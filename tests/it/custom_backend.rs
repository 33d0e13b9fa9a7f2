//! A store written outside the crate, with nothing but its public API, plugged into the
//! limiter and the layer: it decides like the in-process store, its failures meet the
//! failure policy, and an asynchronous one works through the layer.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::decision::{BreakerState, UnlimitedReason};
use tollgate::future::StoreFuture;
use tollgate::response::{ProblemType, ResponseBody};
use tollgate::store::{
    Backend, CallerKey, CheckOutcome, Clock, ManualClock, PolicyState, Refund, StoreError,
};
use tollgate::{
    Caller, Decision, FailurePolicy, InMemoryBackend, Limiter, LimiterBuilder, Policy, Quota,
    RateLimitLayer,
    key::{FnKey, HeaderKey, KeyExtractor, MissingKey},
};
use tollgate_testkit::http::{Reply, get, ok_handler, send};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

type Svc = BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

const START_MS: u64 = 1_700_000_000_000;

// ---------------------------------------------------------------------------------------
// The stores

/// One global lock around a map of (caller, policy) to state, on its own clock, counting
/// the calls it gets. It implements only the required method, so it is a remote store as
/// far as the limiter knows (breaker, store timeout and denial cache apply).
#[derive(Debug)]
struct LockedMap {
    clock: ManualClock,
    states: Mutex<HashMap<(CallerKey, String), PolicyState>>,
    calls: AtomicUsize,
}

impl LockedMap {
    fn new(clock: &ManualClock) -> Arc<Self> {
        Arc::new(Self {
            clock: clock.clone(),
            states: Mutex::new(HashMap::new()),
            calls: AtomicUsize::new(0),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Every policy evaluated under one lock by the crate's shared all-or-nothing
    /// evaluation; stored only if all of them admit.
    fn decide(&self, caller: &CallerKey, policies: &[Policy], cost: u64) -> CheckOutcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.clock.now_millis();
        let mut states = self.states.lock().unwrap();
        // Keyed on the counter, never on the name alone.
        let key = |policy: &Policy| (caller.clone(), policy.counter().to_owned());
        let (outcome, admitted) = PolicyState::evaluate(
            policies,
            |policy| states.get(&key(policy)).cloned(),
            now,
            cost,
        );
        for (policy, state) in policies.iter().zip(admitted.into_iter().flatten()) {
            states.insert(key(policy), state);
        }
        outcome
    }

    /// Each policy's state with the units given back by the crate's refund arithmetic.
    fn give_back(&self, caller: &CallerKey, policies: &[Policy], refund: Refund) {
        let now = self.clock.now_millis();
        let mut states = self.states.lock().unwrap();
        for policy in policies {
            let key = (caller.clone(), policy.counter().to_owned());
            let stored = states.get(&key).cloned();
            let given_back =
                policy
                    .algorithm()
                    .refund(stored, refund.counted_at_ms(), refund.cost(), now);
            if let Some(state) = given_back {
                states.insert(key, state);
            }
        }
    }
}

impl Backend for LockedMap {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        StoreFuture::ready(Ok(self.decide(caller, limits, cost)))
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        self.give_back(caller, limits, refund);
        StoreFuture::ready(Ok(()))
    }
}

/// The same map, declared in-process: the limiter calls it directly.
#[derive(Debug)]
struct Local(Arc<LockedMap>);

impl Backend for Local {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        self.0.check(caller, limits, cost)
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        self.0.refund(caller, limits, refund)
    }

    fn is_remote(&self) -> bool {
        false
    }
}

/// The same map behind a real wait, as a networked store would answer.
#[derive(Debug)]
struct Slow {
    map: Arc<LockedMap>,
    delay: Duration,
}

impl Backend for Slow {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let (map, caller, limits, delay) =
            (self.map.clone(), caller.clone(), limits.clone(), self.delay);
        StoreFuture::boxed(async move {
            tokio::time::sleep(delay).await;
            Ok(map.decide(&caller, &limits, cost))
        })
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        let (map, caller, limits, delay) =
            (self.map.clone(), caller.clone(), limits.clone(), self.delay);
        StoreFuture::boxed(async move {
            tokio::time::sleep(delay).await;
            map.give_back(&caller, &limits, refund);
            Ok(())
        })
    }
}

/// The same map, declared in-process, doing its work when called (as a store that hands
/// it to a spawned task or a blocking pool does) and answering on the next poll.
#[derive(Debug)]
struct EagerLocal(Arc<LockedMap>);

impl Backend for EagerLocal {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let outcome = self.0.decide(caller, limits, cost);
        StoreFuture::boxed(async move {
            tokio::task::yield_now().await;
            Ok(outcome)
        })
    }

    fn is_remote(&self) -> bool {
        false
    }
}

/// A store that is down: every call fails, at once or after a wait.
#[derive(Debug)]
struct Down {
    error: StoreError,
    delay: Option<Duration>,
    calls: AtomicUsize,
}

impl Down {
    fn new(error: StoreError, delay: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            error,
            delay,
            calls: AtomicUsize::new(0),
        })
    }
}

impl Backend for Down {
    fn check(
        &self,
        _caller: &CallerKey,
        _limits: &Arc<[Policy]>,
        _cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let error = self.error.clone();
        match self.delay {
            None => StoreFuture::ready(Err(error)),
            Some(delay) => StoreFuture::boxed(async move {
                tokio::time::sleep(delay).await;
                Err(error)
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Helpers

fn layered<K: KeyExtractor>(limiter: Limiter, key: K) -> Svc {
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(limiter)
                    .decision_on_every_response(true)
                    .key(key)
                    .on_missing_key(MissingKey::Pass),
            )
            .service(service_fn(ok_handler)),
    )
}

fn by_customer(limiter: Limiter) -> Svc {
    layered(limiter, HeaderKey::new("x-customer-id"))
}

fn customer(name: &str) -> Request<Full<Bytes>> {
    get("/", &[("x-customer-id", name)])
}

fn decision(reply: &Reply) -> &Decision {
    reply
        .extensions
        .get::<Decision>()
        .expect("the decision is in the response's extensions")
}

fn header<'a>(reply: &'a Reply, name: &str) -> Option<&'a [u8]> {
    reply.headers.get(name).map(|v| v.as_bytes())
}

/// Two policies of different algorithms, and a tier with more of both.
fn policies(builder: LimiterBuilder) -> LimiterBuilder {
    builder
        .policy(Policy::sliding_window("per-second", Quota::per_second(3)))
        .policy(Policy::token_bucket("smooth", Quota::per_second(2), 4))
        .tier(
            "gold",
            [
                Policy::sliding_window("per-second", Quota::per_second(6)),
                Policy::token_bucket("smooth", Quota::per_second(4), 8),
            ],
        )
}

/// The customer from `x-customer-id`, the plan from `x-plan`.
fn customer_and_plan() -> impl KeyExtractor {
    FnKey::new(|request: &Request<()>| {
        let header = |name| request.headers().get(name).map(|v| v.as_bytes());
        Ok(header("x-customer-id").map(|customer| {
            let caller = Caller::new(customer);
            match header("x-plan").and_then(|p| std::str::from_utf8(p).ok()) {
                Some(plan) => caller.with_tier(plan),
                None => caller,
            }
        }))
    })
}

/// A few seconds of three customers on two plans, on a manual clock.
fn scenario() -> Vec<(u64, &'static str, Option<&'static str>)> {
    let gaps = [0, 0, 40, 120, 0, 310, 10, 700, 0, 90];
    let callers = [
        ("acme", None),
        ("acme", None),
        ("globex", Some("gold")),
        ("acme", None),
        ("initech", Some("silver")),
        ("globex", Some("gold")),
        ("acme", None),
    ];
    (0..120)
        .map(|i| {
            let (name, plan) = callers[i % callers.len()];
            (gaps[i % gaps.len()], name, plan)
        })
        .collect()
}

fn scenario_request(name: &str, plan: Option<&str>) -> Request<Full<Bytes>> {
    match plan {
        Some(plan) => get("/", &[("x-customer-id", name), ("x-plan", plan)]),
        None => customer(name),
    }
}

fn assert_same_reply(step: usize, ours: &Reply, theirs: &Reply) {
    assert_eq!(ours.status, theirs.status, "step {step}");
    for name in [
        "ratelimit-policy",
        "ratelimit",
        "retry-after",
        "content-type",
    ] {
        assert_eq!(
            header(ours, name),
            header(theirs, name),
            "step {step}: {name} differs"
        );
    }
    assert_eq!(ours.body, theirs.body, "step {step}");
}

// ---------------------------------------------------------------------------------------
// Deciding like the in-process store

#[tokio::test]
async fn a_custom_store_decides_like_the_in_process_one() {
    let clock = ManualClock::new(START_MS);
    let reference = policies(Limiter::builder().name("custom-backend"))
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .build();
    let map = LockedMap::new(&clock);
    let local = LockedMap::new(&clock);
    // A remote store (breaker, timeout and denial cache on the limiter's clock), and the
    // same store declared in-process.
    let remote_limiter = policies(Limiter::builder().name("custom-backend"))
        .backend(map.clone())
        .clock(clock.clone())
        .build();
    let local_limiter = policies(Limiter::builder().name("custom-backend"))
        .backend(Local(local.clone()))
        .build();
    let mut reference = layered(reference, customer_and_plan());
    let mut remote = layered(remote_limiter, customer_and_plan());
    let mut in_process = layered(local_limiter, customer_and_plan());

    let (mut allowed, mut limited) = (0, 0);
    for (step, (gap, name, plan)) in scenario().into_iter().enumerate() {
        clock.advance(Duration::from_millis(gap));
        let theirs = send(&mut reference, scenario_request(name, plan)).await;
        let ours = send(&mut remote, scenario_request(name, plan)).await;
        let direct = send(&mut in_process, scenario_request(name, plan)).await;
        assert_same_reply(step, &ours, &theirs);
        assert_same_reply(step, &direct, &theirs);
        assert_eq!(decision(&direct), decision(&theirs), "step {step}");
        match (decision(&ours), decision(&theirs)) {
            (Decision::Allowed(a), Decision::Allowed(b)) => {
                assert!(a.policies().eq(b.policies()), "step {step}: {a:?} vs {b:?}");
                allowed += 1;
            }
            (Decision::Limited(a), Decision::Limited(b)) => {
                let violated = |info: &tollgate::decision::RateLimitInfo| {
                    info.violated()
                        .map(|p| p.name().to_owned())
                        .collect::<Vec<_>>()
                };
                assert_eq!(violated(a), violated(b), "step {step}");
                assert_eq!(a.retry_after_secs(), b.retry_after_secs(), "step {step}");
                limited += 1;
            }
            (ours, theirs) => {
                panic!("step {step}: {ours:?} where the in-process store says {theirs:?}")
            }
        }
    }
    assert!(
        allowed > 20 && limited > 20,
        "{allowed} allowed, {limited} limited"
    );
    // The in-process declaration is called for every request; the remote one is spared
    // the refusals its denial cache already knows.
    assert_eq!(local.calls(), scenario().len());
    assert!(map.calls() <= scenario().len() && map.calls() >= allowed);
}

#[tokio::test]
async fn the_store_is_called_once_per_keyed_request_only() {
    let clock = ManualClock::new(START_MS);
    let map = LockedMap::new(&clock);
    let limiter = Limiter::builder()
        .name("custom-backend")
        .backend(map.clone())
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(2)))
        .denial_cache(0)
        .clock(clock.clone())
        .build();
    let mut svc = by_customer(limiter);
    for expected in [200, 200, 429, 429] {
        assert_eq!(send(&mut svc, customer("acme")).await.status, expected);
    }
    assert_eq!(map.calls(), 4);
    // Requests the layer lets pass without a key never reach the store.
    let keyless = send(&mut svc, get("/", &[])).await;
    assert_eq!(keyless.status, 200);
    assert_eq!(
        decision(&keyless),
        &Decision::Unlimited(UnlimitedReason::NoKey)
    );
    assert_eq!(map.calls(), 4);
    // The store's own clock decides: a minute later acme is admitted again.
    clock.advance(Duration::from_secs(120));
    assert_eq!(send(&mut svc, customer("acme")).await.status, 200);
    assert_eq!(map.calls(), 5);
}

// ---------------------------------------------------------------------------------------
// A store that is down

fn down_limiter(store: Arc<Down>, policy: Option<FailurePolicy>, clock: &ManualClock) -> Limiter {
    let builder = Limiter::builder()
        .name("custom-backend")
        .backend(store)
        .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
        .clock(clock.clone());
    match policy {
        Some(policy) => builder.on_store_failure(policy),
        None => builder,
    }
    .build()
}

#[tokio::test]
async fn a_failing_store_with_fail_open_lets_requests_through() {
    let clock = ManualClock::new(START_MS);
    for (store, policy) in [
        (
            Down::new(StoreError::unavailable("connection refused"), None),
            Some(FailurePolicy::Open),
        ),
        (
            Down::new(StoreError::other("a script error"), None),
            Some(FailurePolicy::open()),
        ),
        // Failing open is the default.
        (
            Down::new(StoreError::unavailable("connection refused"), None),
            None,
        ),
        (
            Down::new(
                StoreError::unavailable("connection refused"),
                Some(Duration::from_millis(2)),
            ),
            Some(FailurePolicy::Open),
        ),
    ] {
        let limiter = down_limiter(store.clone(), policy.clone(), &clock);
        let mut svc = by_customer(limiter.clone());
        // Far more requests than the limit of one: all through, none counted.
        for _ in 0..10 {
            let reply = send(&mut svc, customer("acme")).await;
            assert_eq!(reply.status, StatusCode::OK, "{store:?} {policy:?}");
            assert_eq!(reply.body, "ok");
            assert_eq!(
                decision(&reply),
                &Decision::Unlimited(UnlimitedReason::StoreFailedOpen)
            );
            assert!(reply.headers.get("ratelimit").is_none());
            assert!(reply.headers.get("retry-after").is_none());
        }
        let calls = store.calls.load(Ordering::SeqCst);
        assert!(calls >= 1, "the store was never asked");
        // The breaker stops calling a store that keeps failing.
        assert_eq!(limiter.breaker_state(), BreakerState::Open);
        assert!(calls < 10, "{calls} calls to a dead store");
    }
}

#[tokio::test]
async fn a_failing_store_with_fail_closed_answers_503() {
    let clock = ManualClock::new(START_MS);
    for store in [
        Down::new(StoreError::unavailable("connection refused"), None),
        Down::new(StoreError::timeout("no answer"), None),
        Down::new(
            StoreError::other("a script error"),
            Some(Duration::from_millis(2)),
        ),
    ] {
        let mut svc = by_customer(down_limiter(
            store.clone(),
            Some(FailurePolicy::closed()),
            &clock,
        ));
        for _ in 0..8 {
            let reply = send(&mut svc, customer("acme")).await;
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{store:?}");
            let retry_after = reply.retry_after().expect("Retry-After on a 503");
            assert!(retry_after >= 1);
            assert_eq!(
                reply.headers.get(http::header::CONTENT_TYPE).unwrap(),
                "application/problem+json"
            );
            let body = reply.json();
            assert_eq!(
                body["type"],
                "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
            );
            assert_eq!(body["type"], ProblemType::TemporaryReducedCapacity.uri());
            assert_eq!(body["status"], 503);
            match decision(&reply) {
                Decision::Unavailable {
                    retry_after_secs, ..
                } => {
                    assert_eq!(*retry_after_secs, retry_after);
                }
                other => panic!("{other:?}"),
            }
        }
    }
    // Another status where the route asks for one; never 500, whatever is asked for.
    let with_status = |status: StatusCode| -> Svc {
        let limiter = down_limiter(
            Down::new(StoreError::unavailable("connection refused"), None),
            Some(FailurePolicy::closed()),
            &clock,
        );
        BoxCloneService::new(
            ServiceBuilder::new()
                .layer(
                    RateLimitLayer::new(limiter)
                        .decision_on_every_response(true)
                        .key(HeaderKey::new("x-customer-id"))
                        .unavailable_status(status),
                )
                .service(service_fn(ok_handler)),
        )
    };
    for (asked, answered) in [
        (StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE),
        (StatusCode::FOUND, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let reply = send(&mut with_status(asked), customer("acme")).await;
        assert_eq!(reply.status, answered, "asked for {asked}");
        assert_eq!(reply.json()["status"], answered.as_u16());
        assert!(reply.retry_after().is_some());
    }
}

#[tokio::test]
async fn a_store_slower_than_the_timeout_meets_the_failure_policy() {
    let map = LockedMap::new(&ManualClock::new(START_MS));
    let slow = |policy| {
        Limiter::builder()
            .name("custom-backend")
            .backend(Slow {
                map: map.clone(),
                delay: Duration::from_millis(300),
            })
            .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
            .store_timeout(Duration::from_millis(20))
            .on_store_failure(policy)
            .build()
    };
    let started = Instant::now();
    let open = send(
        &mut by_customer(slow(FailurePolicy::Open)),
        customer("acme"),
    )
    .await;
    assert_eq!(open.status, StatusCode::OK);
    assert_eq!(
        decision(&open),
        &Decision::Unlimited(UnlimitedReason::StoreFailedOpen)
    );
    let closed = send(
        &mut by_customer(slow(FailurePolicy::closed())),
        customer("acme"),
    )
    .await;
    assert_eq!(closed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "the layer waited for the slow store: {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// An asynchronous store

fn slow_limiter(map: &Arc<LockedMap>, limit: u64) -> Limiter {
    Limiter::builder()
        .name("custom-backend")
        .backend(Slow {
            map: map.clone(),
            delay: Duration::from_millis(5),
        })
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(limit)))
        // Generous: the machine running the tests may be busy.
        .store_timeout(Duration::from_secs(2))
        .build()
}

#[tokio::test]
async fn an_async_store_works_through_the_layer() {
    let map = LockedMap::new(&ManualClock::new(START_MS));
    let mut svc = by_customer(slow_limiter(&map, 3));
    for remaining in [2, 1, 0] {
        let started = Instant::now();
        let reply = send(&mut svc, customer("acme")).await;
        assert!(started.elapsed() >= Duration::from_millis(5));
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.policy_params("ratelimit"),
            vec![(
                "per-hour".to_owned(),
                vec![
                    ("r".to_owned(), remaining),
                    ("t".to_owned(), reply_t(&reply))
                ]
            )]
        );
    }
    let refused = send(&mut svc, customer("acme")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(matches!(decision(&refused), Decision::Limited(_)));
    assert!(refused.retry_after().unwrap() >= 1);
    assert_eq!(refused.json()["violated-policies"][0], "per-hour");
    assert_eq!(
        send(&mut svc, customer("globex")).await.status,
        StatusCode::OK
    );
}

/// `t` of the first policy in the RateLimit field (whatever it is, at least 1).
fn reply_t(reply: &Reply) -> i64 {
    let params = reply.policy_params("ratelimit");
    let t = params[0]
        .1
        .iter()
        .find(|(k, _)| k == "t")
        .map(|(_, v)| *v)
        .unwrap();
    assert!(t >= 1);
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_store_admits_exactly_the_limit_under_concurrency() {
    let map = LockedMap::new(&ManualClock::new(START_MS));
    let svc = by_customer(slow_limiter(&map, 5));
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let mut svc = svc.clone();
            tokio::spawn(async move { send(&mut svc, customer("acme")).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((admitted, refused), (5, 35), "{statuses:?}");
}

#[tokio::test]
async fn an_async_store_behind_an_axum_router() {
    use axum::Router;
    use axum::routing::get as route_get;

    let map = LockedMap::new(&ManualClock::new(START_MS));
    let mut app: Router = Router::new()
        .route("/orders", route_get(|| async { "orders" }))
        .route_layer(
            RateLimitLayer::new(slow_limiter(&map, 1))
                .decision_on_every_response(true)
                .key(HeaderKey::new("x-customer-id"))
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .route("/healthz", route_get(|| async { "ok" }));
    let orders = || get("/orders", &[("x-customer-id", "acme")]);
    let first = send(&mut app, orders()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, "orders");
    assert_eq!(
        send(&mut app, orders()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&mut app, get("/orders", &[])).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&mut app, get("/healthz", &[])).await.status,
        StatusCode::OK
    );
    // The admission left r=0, so the refusal that followed came from the denial cache.
    assert_eq!(map.calls(), 1);
}

/// An in-process store whose answer is not ready at once is still asked once per
/// request: it did the work when called, so a second call would count the request twice.
#[tokio::test]
async fn regression_a_local_store_that_answers_on_the_next_poll_is_asked_once() {
    let clock = ManualClock::new(START_MS);
    let map = LockedMap::new(&clock);
    let limiter = Limiter::builder()
        .name("custom-backend")
        .backend(EagerLocal(map.clone()))
        .clock(clock.clone())
        .policy(Policy::sliding_window("per-second", Quota::per_second(3)))
        .build();
    let acme = Caller::new("acme");
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += u64::from(limiter.check(&acme).await.is_allowed());
    }
    assert_eq!(map.calls(), 5, "store calls for 5 requests");
    assert_eq!(admitted, 3, "admitted of 5 under a limit of 3");
}

// ---------------------------------------------------------------------------------------
// A failure at another part of the store

/// A store of two parts that sends every caller to part 1, where the calls for `redirected`
/// are passed on to part 2 and fail there: it says so with
/// `StoreError::with_failure_domain`.
#[derive(Debug)]
struct PassedOn;

impl Backend for PassedOn {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        _cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        if *caller == CallerKey::new("redirected") {
            return StoreFuture::ready(Err(StoreError::unavailable(
                "part 2 refused the connection",
            )
            .with_failure_domain(2)));
        }
        let admitted = tollgate::store::PolicyOutcome {
            admitted: true,
            remaining: 1,
            reset_ms: 1_000,
        };
        StoreFuture::ready(Ok(CheckOutcome::new(vec![admitted; limits.len()])))
    }

    fn failure_domain(&self, _caller: &CallerKey) -> tollgate::store::FailureDomain {
        tollgate::store::FailureDomain::new(1)
    }

    fn failure_domain_label(&self, id: u32) -> Option<String> {
        Some(format!("part-{id}"))
    }
}

#[tokio::test]
async fn a_failure_the_store_places_at_another_part_is_charged_to_that_part() {
    let limiter = Limiter::builder()
        .name("parts")
        .backend(PassedOn)
        .on_store_failure(FailurePolicy::open())
        .denial_cache(0)
        .policy(Policy::sliding_window("per-second", Quota::per_second(10)))
        .build();
    for _ in 0..5 {
        let decision = limiter.check(&Caller::new("redirected")).await;
        assert!(matches!(decision, Decision::Unlimited(_)), "{decision:?}");
    }
    let states = limiter.breaker_states();
    let state_of = |label: &str| {
        states
            .iter()
            .find(|(node, _)| node == label)
            .map(|(_, state)| *state)
    };
    assert_eq!(state_of("part-2"), Some(BreakerState::Open), "{states:?}");
    assert_eq!(state_of("part-1"), Some(BreakerState::Closed), "{states:?}");
    // Part 1 passed the failing calls on, and decides its other callers.
    let decision = limiter.check(&Caller::new("acme")).await;
    assert!(
        matches!(&decision, Decision::Allowed(info) if info.source() == tollgate::decision::DecisionSource::Store),
        "{decision:?}"
    );
}
