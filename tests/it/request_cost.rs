//! Request cost (`RateLimitLayer::cost`, `Limiter::check_cost`): a batch consumes its item
//! count from every policy at once, and a batch larger than a quota is refused for good
//! without being counted, on Redis (a real redis-server) and in process.

use std::convert::Infallible;
#[cfg(feature = "redis")]
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate::Caller;
#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::decision::DecisionSource;
use tollgate::response::{ProblemType, ResponseBody};
use tollgate::store::ManualClock;
use tollgate::{Decision, InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer};
use tollgate_testkit::http::{Reply, get, ok_handler, send};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// A store timeout no healthy server on a loaded test machine reaches.
#[cfg(feature = "redis")]
const SLOW_TEST_MACHINE: Duration = Duration::from_secs(5);

type Batch = BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

fn items() -> Policy {
    Policy::sliding_window("items", Quota::per_second(50))
}

/// The batch endpoint: `?items=N` costs N units.
fn batch(limiter: Limiter) -> Batch {
    let layer = RateLimitLayer::new(limiter)
        .decision_on_every_response(true)
        .key(Caller::new("*"))
        .cost(|request| {
            request
                .uri
                .query()
                .and_then(|query| query.strip_prefix("items="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1)
        });
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(ok_handler)),
    )
}

/// `r` of the RateLimit field, for the one policy.
fn remaining(reply: &Reply) -> i64 {
    let fields = reply.policy_params("ratelimit");
    let [(name, params)] = &fields[..] else {
        panic!("one policy expected: {fields:?}");
    };
    assert_eq!(name, "items");
    params
        .iter()
        .find(|(k, _)| k == "r")
        .map(|(_, v)| *v)
        .expect("r")
}

/// A batch of 60 against a quota of 50: refused with the cost-exceeds-quota problem, no
/// Retry-After, nothing counted.
fn assert_never_admitted(reply: &Reply) {
    assert_eq!(reply.status, 429);
    assert_eq!(reply.retry_after(), None, "waiting never helps");
    assert!(reply.headers.get("ratelimit").is_none(), "r is not known");
    let problem = reply.json();
    assert_eq!(problem["type"], ProblemType::CostExceedsQuota.uri());
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["policy"], "items");
    assert_eq!(problem["cost"], 60);
    assert_eq!(problem["quota"], 50);
    let detail = problem["detail"].as_str().expect("a detail");
    assert!(
        detail.contains("60") && detail.contains("50") && detail.contains("items"),
        "{detail}"
    );
    let decision = reply.extensions.get::<Decision>().expect("decided");
    assert_eq!(
        decision.info().map(|info| info.source()),
        Some(DecisionSource::Cost)
    );
}

#[tokio::test]
async fn a_batch_consumes_its_cost_in_process() {
    // A frozen clock: the window never moves during the test.
    let clock = ManualClock::new(1_800_000_000_000);
    let limiter = Limiter::builder()
        .name("request-cost")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .clock(clock.clone())
        .policy(items())
        .build();
    let mut service = batch(limiter);

    let thirty = send(&mut service, get("/batch?items=30", &[])).await;
    assert_eq!(thirty.status, 200);
    assert_eq!(remaining(&thirty), 20);

    let sixty = send(&mut service, get("/batch?items=60", &[])).await;
    assert_never_admitted(&sixty);

    // 21 would fit in the quota, not in what is left: an ordinary refusal, with the wait
    // until 21 units fit.
    let twenty_one = send(&mut service, get("/batch?items=21", &[])).await;
    assert_eq!(twenty_one.status, 429);
    assert_eq!(twenty_one.json()["type"], ProblemType::QuotaExceeded.uri());
    assert!(twenty_one.retry_after().is_some_and(|secs| secs >= 1));

    // Neither refusal consumed anything: exactly 20 are left.
    let twenty = send(&mut service, get("/batch?items=20", &[])).await;
    assert_eq!(twenty.status, 200);
    assert_eq!(remaining(&twenty), 0);
    let one = send(&mut service, get("/batch", &[])).await;
    assert_eq!(one.status, 429);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_batch_consumes_its_cost_on_redis() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .name("batch")
        .backend(crate::redis_backend::connected(RedisBackend::builder(server.url())).await)
        .store_timeout(SLOW_TEST_MACHINE)
        .policy(items())
        .build();
    let mut service = batch(limiter);

    let thirty = send(&mut service, get("/batch?items=30", &[])).await;
    assert_eq!(thirty.status, 200);
    assert_eq!(remaining(&thirty), 20);
    let key = "rl:{*}:batch:items:w1000";
    let stored = server.must(&["HGETALL", key]);

    let sixty = send(&mut service, get("/batch?items=60", &[])).await;
    assert_never_admitted(&sixty);
    // Redis was not even asked: the key is exactly as the batch of 30 left it.
    assert_eq!(server.must(&["HGETALL", key]), stored);
    assert_eq!(server.must(&["HGET", key, "c"]).trim(), "30");
}

/// The limiter itself: a cost of 0 is a peek, and a denial cached for a cost answers that
/// cost only: a smaller one the store would admit is asked about, and so is a larger one,
/// whose wait is longer.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_cost_of_zero_peeks_and_refusals_hold_for_their_cost() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .name("batch")
        .backend(crate::redis_backend::connected(RedisBackend::builder(server.url())).await)
        .store_timeout(SLOW_TEST_MACHINE)
        .policy(Policy::sliding_window("items", Quota::per_hour(50)))
        .build();
    let acme = Caller::new("acme");
    let Decision::Allowed(peek) = limiter.check_cost(&acme, 0).await else {
        panic!("a peek is admitted");
    };
    assert_eq!(peek.min_remaining(), Some(50));
    let Decision::Allowed(info) = limiter.check_cost(&acme, 45).await else {
        panic!("45 of 50 fit");
    };
    assert_eq!(info.min_remaining(), Some(5));
    // 10 do not fit; the refusal is cached for a cost of 10.
    assert!(matches!(
        limiter.check_cost(&acme, 10).await,
        Decision::Limited(_)
    ));
    let Decision::Limited(cached) = limiter.check_cost(&acme, 10).await else {
        panic!("10 still do not fit");
    };
    assert_eq!(cached.source(), DecisionSource::DenialCache);
    let Decision::Limited(asked) = limiter.check_cost(&acme, 12).await else {
        panic!("12 do not fit either");
    };
    assert_eq!(asked.source(), DecisionSource::Store);
    let Decision::Allowed(info) = limiter.check_cost(&acme, 5).await else {
        panic!("the 5 left fit");
    };
    assert_eq!(info.min_remaining(), Some(0));
    let Decision::Allowed(peek) = limiter.check_cost(&acme, 0).await else {
        panic!("a peek is admitted");
    };
    assert_eq!(peek.min_remaining(), Some(0));
}
