//! Counting only failed attempts (`RateLimitLayer::count_only`): every attempt is counted
//! when it is decided and given back when its response does not count, on Redis (a real
//! redis-server) and in process.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(feature = "redis")]
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::decision::DecisionSource;
use tollgate::{
    Caller, Decision, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota,
    RateLimitLayer,
};
#[cfg(feature = "redis")]
use tollgate::{RedisBackend, reload::Mode};
use tollgate_testkit::http::{Reply, get, send};
use tollgate_testkit::recorder::{counter, histogram_len, with_recorder};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::remote::Remote;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// A store timeout no healthy server on a loaded test machine reaches.
#[cfg(feature = "redis")]
const SLOW_TEST_MACHINE: Duration = Duration::from_secs(5);

type Login = BoxCloneService<
    Request<Full<Bytes>>,
    Response<tollgate::response::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// Five attempts a minute, counting only the 401s.
fn attempts() -> Policy {
    Policy::sliding_window("attempts", Quota::per_minute(5))
}

fn in_process() -> Limiter {
    Limiter::builder().name("login").policy(attempts()).build()
}

#[cfg(feature = "redis")]
async fn on_redis(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .name("login")
        .backend(crate::redis_backend::connected(RedisBackend::builder(server.url())).await)
        .store_timeout(SLOW_TEST_MACHINE)
        .policy(attempts())
        .build()
}

/// A login route: `?password=right` is 200, anything else 401. `calls` counts the requests
/// that reached the handler.
fn login(limiter: Limiter, calls: Arc<AtomicUsize>) -> Login {
    let layer = RateLimitLayer::new(limiter)
        .decision_on_every_response(true)
        .key(Caller::new("*"))
        .count_only(|response| response.status == StatusCode::UNAUTHORIZED);
    let handler = service_fn(move |request: Request<Full<Bytes>>| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let right = request.uri().query() == Some("password=right");
            let mut response = Response::new(Full::new(Bytes::from_static(b"")));
            if !right {
                *response.status_mut() = StatusCode::UNAUTHORIZED;
            }
            Ok::<_, Infallible>(response)
        }
    });
    BoxCloneService::new(ServiceBuilder::new().layer(layer).service(handler))
}

async fn attempt(service: &mut Login, right: bool) -> Reply {
    let password = if right { "right" } else { "wrong" };
    send(service, get(&format!("/login?password={password}"), &[])).await
}

/// 4 failures then 16 successes: the successes are given back, so one attempt is left: the
/// next failure is let through, and the one after it refused.
async fn twenty_logins_four_failed_leave_one(limiter: Limiter) {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = login(limiter, calls.clone());
    // The failures first: every success after them takes the last unit, which a cached
    // refusal then announces; the refund must lift it.
    for _ in 0..4 {
        assert_eq!(attempt(&mut service, false).await.status, 401);
    }
    for i in 0..16 {
        let reply = attempt(&mut service, true).await;
        assert_eq!(reply.status, 200, "success {i} was refused");
    }
    let last = attempt(&mut service, false).await;
    assert_eq!(last.status, 401, "the one attempt left");
    let refused = attempt(&mut service, true).await;
    assert_eq!(
        refused.status, 429,
        "no attempt left, even for the right password"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 21);
}

#[tokio::test]
async fn twenty_logins_four_failed_leave_one_attempt_in_process() {
    twenty_logins_four_failed_leave_one(in_process()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn twenty_logins_four_failed_leave_one_attempt_on_redis() {
    let server = RedisServer::start();
    twenty_logins_four_failed_leave_one(on_redis(&server).await).await;
}

/// Six wrong passwords: five reach the handler, the sixth is refused before it.
async fn sixth_failure_refused(limiter: Limiter) {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = login(limiter, calls.clone());
    for i in 0..5 {
        let reply = attempt(&mut service, false).await;
        assert_eq!(reply.status, 401, "failure {i}");
    }
    let sixth = attempt(&mut service, false).await;
    assert_eq!(sixth.status, 429);
    assert!(sixth.retry_after().is_some_and(|secs| secs >= 1));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "the sixth never reached the handler"
    );
}

#[tokio::test]
async fn the_sixth_failure_is_refused_in_process() {
    sixth_failure_refused(in_process()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn the_sixth_failure_is_refused_on_redis() {
    let server = RedisServer::start();
    sixth_failure_refused(on_redis(&server).await).await;
}

/// 50 concurrent wrong passwords: each is counted when decided, so exactly the quota (5)
/// reaches the handler.
async fn concurrent_failures(limiter: Limiter) {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = login(limiter, calls.clone());
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let mut service = service.clone();
            tokio::spawn(async move { attempt(&mut service, false).await })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("task"));
    }
    let unauthorized = replies.iter().filter(|r| r.status == 401).count();
    let refused = replies.iter().filter(|r| r.status == 429).count();
    // Which decision let each one through, should more than the quota have been.
    let admitted: Vec<_> = replies
        .iter()
        .filter(|r| r.status == 401)
        .map(|r| r.extensions.get::<Decision>())
        .collect();
    assert_eq!((unauthorized, refused), (5, 45), "admitted by {admitted:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_failures_admit_exactly_five_in_process() {
    concurrent_failures(in_process()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_failures_admit_exactly_five_on_redis() {
    let server = RedisServer::start();
    concurrent_failures(on_redis(&server).await).await;
}

/// A refund names the window it was counted in: on Redis the units come back to exactly
/// that counter, seen in the key itself.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_refund_on_redis_gives_back_to_the_counted_window() {
    let server = RedisServer::start();
    let limiter = on_redis(&server).await;
    let alice = Caller::new("alice");
    let first = limiter.check(&alice).await;
    let second = limiter.check(&alice).await;
    let key = "rl:{alice}:login:attempts:w60000";
    assert_eq!(server.must(&["HGET", key, "c"]).trim(), "2");
    limiter.refund(&alice, &second).await.expect("given back");
    assert_eq!(server.must(&["HGET", key, "c"]).trim(), "1");
    limiter.refund(&alice, &first).await.expect("given back");
    assert_eq!(server.must(&["HGET", key, "c"]).trim(), "0");
    // Never below 0: a second refund of the same decision gives back nothing more.
    limiter
        .refund(&alice, &first)
        .await
        .expect("nothing to give back");
    assert_eq!(server.must(&["HGET", key, "c"]).trim(), "0");
    // A caller whose keys are gone has nothing to give back, and no key is created.
    server.must(&["DEL", key]);
    limiter
        .refund(&alice, &first)
        .await
        .expect("nothing to give back");
    assert_eq!(server.must(&["EXISTS", key]).trim(), "0");
}

/// While the store is down and the local share decides, a request that does not count is
/// given back to the local share's counters; once the store is back, its own count never
/// saw it.
#[tokio::test]
async fn a_local_share_decision_is_given_back_to_the_local_share() {
    let store = Remote::new(InMemoryBackend::new());
    store.set_down(true);
    let limiter = Limiter::builder()
        .name("login")
        .backend(store.clone())
        .policy(attempts())
        .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(1)))
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = login(limiter, calls.clone());
    for i in 0..10 {
        let reply = attempt(&mut service, true).await;
        assert_eq!(reply.status, 200, "success {i} on the local share");
        let decision = reply.extensions.get::<Decision>().expect("decided");
        assert_eq!(
            decision.info().map(|i| i.source()),
            Some(DecisionSource::LocalShare)
        );
    }
    for _ in 0..5 {
        assert_eq!(attempt(&mut service, false).await.status, 401);
    }
    assert_eq!(attempt(&mut service, false).await.status, 429);
}

/// A refund the store cannot take is logged and counted, and the response goes out as the
/// handler made it; the unit stays consumed.
#[test]
fn a_failed_refund_is_counted_never_an_error() {
    let ((), snapshot) = with_recorder(|_| async {
        let store = Remote::new(InMemoryBackend::new());
        let limiter = Limiter::builder()
            .name("login-down")
            .backend(store.clone())
            .policy(attempts())
            .build();
        let down = store.clone();
        let layer = RateLimitLayer::new(limiter.clone())
            .decision_on_every_response(true)
            .key(Caller::new("*"))
            .count_only(|response| response.status == StatusCode::UNAUTHORIZED);
        // The store goes down while the handler runs: after the check, before the refund.
        let handler = service_fn(move |_request: Request<Full<Bytes>>| {
            let down = down.clone();
            async move {
                down.set_down(true);
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"welcome"))))
            }
        });
        let mut service = ServiceBuilder::new().layer(layer).service(handler);
        let reply = send(&mut service, get("/login?password=right", &[])).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "welcome");
        store.set_down(false);
        // The login's unit stayed consumed, and this check takes one more.
        let Decision::Allowed(info) = limiter.check(&Caller::new("*")).await else {
            panic!("the store is back");
        };
        assert_eq!(info.min_remaining(), Some(3));
    });
    let failed = [("layer", "login-down"), ("result", "failed")];
    assert_eq!(counter(&snapshot, "tollgate_refunds_total", &failed), 1);
    let given_back = [("layer", "login-down"), ("result", "given_back")];
    assert_eq!(counter(&snapshot, "tollgate_refunds_total", &given_back), 0);
}

/// Shadow mode counts as enforce mode does, so it gives back as enforce mode does: switched to
/// enforce after many successful logins in shadow mode, the caller still has every attempt.
#[cfg(feature = "redis")]
#[tokio::test]
async fn shadow_mode_gives_back_as_enforce_mode_would() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .name("login")
        .backend(crate::redis_backend::connected(RedisBackend::builder(server.url())).await)
        .store_timeout(SLOW_TEST_MACHINE)
        .policy(attempts())
        .mode(Mode::Shadow)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let switch = limiter.clone();
    let mut service = login(limiter, calls.clone());
    for _ in 0..10 {
        assert_eq!(attempt(&mut service, true).await.status, 200);
    }
    switch.set_mode(Mode::Enforce);
    for i in 0..5 {
        assert_eq!(
            attempt(&mut service, false).await.status,
            401,
            "failure {i}"
        );
    }
    assert_eq!(attempt(&mut service, false).await.status, 429);
}

/// `tollgate_store_latency_seconds` records every call made to a remote store, refunds
/// included: a decision and its refund are two values (the refund went unrecorded). An
/// in-process store's calls are not timed, its refunds no more than its decisions.
#[test]
fn regression_store_latency_records_refunds() {
    let ((), snapshot) = with_recorder(|_| async move {
        let store = InMemoryBackend::new();
        for (name, remote) in [("in-process", false), ("remote", true)] {
            let builder = Limiter::builder().name(name).policy(attempts());
            let limiter = if remote {
                builder.backend(Remote::new(store.clone())).build()
            } else {
                builder.backend(store.clone()).build()
            };
            let alice = Caller::new("alice");
            let decision = limiter.check(&alice).await;
            assert_eq!(
                decision.info().map(|i| i.source()),
                Some(DecisionSource::Store)
            );
            limiter.refund(&alice, &decision).await.expect("given back");
        }
    });
    for (layer, store_calls) in [("in-process", 0), ("remote", 2)] {
        assert_eq!(
            counter(
                &snapshot,
                "tollgate_refunds_total",
                &[("layer", layer), ("result", "given_back")]
            ),
            1
        );
        assert_eq!(
            histogram_len(
                &snapshot,
                "tollgate_store_latency_seconds",
                &[("layer", layer)]
            ),
            store_calls,
            "{layer}: the decision and its refund"
        );
    }
}
