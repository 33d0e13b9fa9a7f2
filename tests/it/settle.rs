//! Reserve, then settle (`RateLimitLayer::settle`, `Limiter::settle`): a request is admitted
//! for an estimate and settled at what its response says it cost, the rest given back or the
//! extra charged past the quota as a debt. Many completions of one customer settling at once
//! over two instances leave the store with exactly what the responses reported, in process,
//! on a redis-server and on a Redis Cluster; a debt refuses the next request, says how long,
//! and drains on time; a local share settles what it admitted; a byte quota charges each
//! download what it sent, a dropped one included; a soft limit lets the handler degrade.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate::decision::{DecisionSource, Settlement};
use tollgate::key::HeaderKey;
use tollgate::store::{Backend, ManualClock};
use tollgate::{
    Caller, Decision, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota,
    RateLimitLayer,
};
use tollgate_testkit::http::{Reply, get, send};
use tollgate_testkit::random::seeded;
use tollgate_testkit::recorder::{counter, with_recorder};
use tollgate_testkit::remote::Remote;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// 10,000 tokens a day: within the day, what remains is 10,000 less what was charged, to
/// the token (a token bucket's refunds give back less what it refilled meanwhile).
const TOKENS: u64 = 10_000;

fn tokens() -> Policy {
    Policy::sliding_window("tokens", Quota::per_day(TOKENS))
}

type Completions = BoxCloneService<
    Request<Full<Bytes>>,
    Response<tollgate::response::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// `POST /v1/completions` behind `limiter`: reserved at `x-max-tokens`, settled at the
/// `x-tokens-used` the handler answers, which the request names in `x-use` (the test
/// decides what each answer uses).
fn completions(limiter: Limiter) -> Completions {
    let layer = RateLimitLayer::new(limiter)
        .key(HeaderKey::new("x-customer-id"))
        .cost(|request| {
            request
                .headers
                .get("x-max-tokens")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .settle(|response| {
            response
                .headers
                .get("x-tokens-used")?
                .to_str()
                .ok()?
                .parse()
                .ok()
        });
    let handler = service_fn(|request: Request<Full<Bytes>>| async move {
        let used = request.headers()["x-use"].clone();
        let response = Response::builder()
            .header("x-tokens-used", used)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        Ok::<_, Infallible>(response)
    });
    BoxCloneService::new(ServiceBuilder::new().layer(layer).service(handler))
}

fn completion(customer: &str, max_tokens: u64, used: u64) -> Request<Full<Bytes>> {
    get(
        "/v1/completions",
        &[
            ("x-customer-id", customer),
            ("x-max-tokens", &max_tokens.to_string()),
            ("x-use", &used.to_string()),
        ],
    )
}

/// What remains of `caller`'s tokens, asked without counting anything.
async fn remaining(limiter: &Limiter, caller: &str) -> u64 {
    let decision = limiter.check_cost(&Caller::new(caller), 0).await;
    decision
        .info()
        .and_then(|info| info.min_remaining())
        .expect("a decision on the store")
}

/// 50 completions of acme at once, spread over `instances`, each reserving 100 to 180
/// tokens and using anything from none to 20 more than it reserved: every one is admitted
/// (the reservations fit the bucket together), and the store ends with exactly the sum
/// of what the answers reported, whichever instance settled what and in whichever order.
async fn fifty_at_once(instances: &[Limiter]) {
    let random = seeded(40);
    let services: Vec<Completions> = instances.iter().cloned().map(completions).collect();
    let mut tasks = Vec::new();
    let reported = Arc::new(AtomicU64::new(0));
    for i in 0..50 {
        let reserve = 100 + (random() * 81.0) as u64;
        let used = (random() * (reserve + 21) as f64) as u64;
        let mut service = services[i % services.len()].clone();
        let reported = reported.clone();
        tasks.push(tokio::spawn(async move {
            let reply = send(&mut service, completion("acme", reserve, used)).await;
            assert_eq!(reply.status, 200, "request {i}: {reply:?}");
            let settled = reply
                .extensions
                .get::<Settlement>()
                .expect("the settlement in the response's extensions");
            assert_eq!((settled.reserved(), settled.actual()), (reserve, used));
            reported.fetch_add(used, Ordering::Relaxed);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let reported = reported.load(Ordering::Relaxed);
    assert_eq!(
        remaining(&instances[0], "acme").await,
        TOKENS - reported,
        "the store holds what the answers reported: {reported}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_completions_settle_to_what_the_answers_used_in_process() {
    let limiter = Limiter::builder().name("llm").policy(tokens()).build();
    fifty_at_once(&[limiter.clone(), limiter]).await;
}

/// The response's fields say what remains once it was settled, and a settlement that
/// gives back or charges nothing is counted as exact, apart from the decisions.
#[test]
fn the_fields_and_the_metrics_say_what_was_settled() {
    let (replies, snapshot) = with_recorder(|_| async {
        let limiter = Limiter::builder()
            .name("llm")
            .backend(InMemoryBackend::new().clock(ManualClock::new(60_000)))
            .policy(Policy::sliding_window("tokens", Quota::per_minute(TOKENS)))
            .build();
        let mut service = completions(limiter);
        let mut replies: Vec<Reply> = Vec::new();
        for (reserve, used) in [(500, 120), (100, 100), (100, 350)] {
            replies.push(send(&mut service, completion("acme", reserve, used)).await);
        }
        replies
    });
    let remaining: Vec<i64> = replies
        .iter()
        .map(|reply| {
            let items = reply.policy_params("ratelimit");
            let (_, params) = items
                .iter()
                .find(|(name, _)| name == "tokens")
                .expect("tokens");
            params.iter().find(|(p, _)| p == "r").expect("r").1
        })
        .collect();
    assert_eq!(remaining, [9_880, 9_780, 9_430]);
    for (result, expected) in [("refunded", 1), ("exact", 1), ("charged", 1)] {
        assert_eq!(
            counter(
                &snapshot,
                "tollgate_settlements_total",
                &[("layer", "llm"), ("result", result)]
            ),
            expected,
            "{result}"
        );
    }
    assert_eq!(
        counter(
            &snapshot,
            "tollgate_decisions_total",
            &[("layer", "llm"), ("outcome", "allowed")]
        ),
        3,
        "a settlement is not a decision"
    );
}

/// A request reserved at 1 token that cost 25 against 10 a second (burst 10): 15 past the
/// bucket, a debt of 1.5 s of refill. The next request is refused, told to come back when
/// the debt and its own token have refilled, and admitted exactly then.
#[tokio::test]
async fn a_debt_refuses_the_next_request_and_drains_on_time() {
    let clock = ManualClock::new(1_000_000);
    let limiter = Limiter::builder()
        .name("llm")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .policy(Policy::token_bucket("tokens", Quota::per_second(10), 10))
        .build();
    let acme = Caller::new("acme");
    let admitted = limiter.check(&acme).await;
    let settled = limiter.settle(&acme, &admitted, 25).await.unwrap();
    assert_eq!(settled.charged(), 24);
    let after = settled.after_charge().expect("charged").limits()[0];
    assert_eq!((after.remaining, after.reset_ms), (0, 1_600));

    let Decision::Limited(refused) = limiter.check(&acme).await else {
        panic!("admitted while in debt");
    };
    assert_eq!(refused.retry_after_secs(), 2);
    clock.advance(Duration::from_millis(1_599));
    assert!(
        !limiter.check(&acme).await.is_allowed(),
        "admitted 1 ms early"
    );
    clock.advance(Duration::from_millis(1));
    assert!(
        limiter.check(&acme).await.is_allowed(),
        "still refused once the debt drained"
    );
    // Another caller never paid for acme's debt.
    assert!(limiter.check(&Caller::new("globex")).await.is_allowed());
}

/// A sliding window in debt: 100 a minute, a request reserved at 10 that cost 160. Nothing
/// is admitted until the 160 have slid out far enough, and the refusal says when.
#[tokio::test]
async fn a_sliding_window_debt_slides_out() {
    let clock = ManualClock::new(6_000_000);
    let limiter = Limiter::builder()
        .name("llm")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .policy(Policy::sliding_window("tokens", Quota::per_minute(100)))
        .build();
    let acme = Caller::new("acme");
    let admitted = limiter.check_cost(&acme, 10).await;
    limiter.settle(&acme, &admitted, 160).await.unwrap();
    let Decision::Limited(refused) = limiter.check(&acme).await else {
        panic!("admitted while in debt");
    };
    // One more fits once 160 * (60 - e) / 60 <= 99 into the next minute: e >= 22.875 s.
    let wait = refused.retry_after_secs();
    assert_eq!(wait, 83);
    clock.advance(Duration::from_secs(82));
    assert!(!limiter.check(&acme).await.is_allowed());
    clock.advance(Duration::from_secs(1));
    assert!(limiter.check(&acme).await.is_allowed());
}

/// While the store is down the local share decides, and settles what it admitted: with
/// its part of the quota, in its own counters.
#[tokio::test]
async fn a_local_share_settles_what_it_admitted() {
    let clock = ManualClock::new(1_000_000);
    let store = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    let limiter = Limiter::builder()
        .name("llm")
        .backend(store.clone())
        .clock(clock.clone())
        .policy(Policy::sliding_window("tokens", Quota::per_minute(1_000)))
        .on_store_failure(FailurePolicy::local_share(
            InstanceCount::fixed(2).at_place(0),
        ))
        .build();
    store.set_down(true);
    let acme = Caller::new("acme");
    let admitted = limiter.check_cost(&acme, 200).await;
    assert_eq!(
        admitted.info().map(|info| info.source()),
        Some(DecisionSource::LocalShare)
    );
    let settled = limiter.settle(&acme, &admitted, 450).await.unwrap();
    assert_eq!(settled.charged(), 250);
    // The share is 500 a minute: 450 of it used.
    assert_eq!(
        settled.after_charge().unwrap().limits()[0].remaining,
        50,
        "{settled:?}"
    );
    let refund = limiter.check_cost(&acme, 50).await;
    let settled = limiter.settle(&acme, &refund, 10).await.unwrap();
    assert_eq!(settled.refunded(), 40);
    assert!(limiter.check_cost(&acme, 40).await.is_allowed());
    assert!(!limiter.check(&acme).await.is_allowed());
}

/// A decision that counted nothing has nothing to settle: a refusal, or one let through
/// uncounted while the store was down.
#[tokio::test]
async fn nothing_counted_settles_nothing() {
    let store = Remote::new(InMemoryBackend::new());
    let limiter = Limiter::builder()
        .name("llm")
        .backend(store.clone())
        .policy(Policy::sliding_window("tokens", Quota::per_minute(10)))
        .on_store_failure(FailurePolicy::open())
        .build();
    let acme = Caller::new("acme");
    store.set_down(true);
    let open = limiter.check_cost(&acme, 5).await;
    let settled = limiter.settle(&acme, &open, 500).await.unwrap();
    assert!(!settled.counted());
    assert_eq!((settled.refunded(), settled.charged()), (0, 0));
    store.set_down(false);
    assert_eq!(
        store
            .check(acme.key(), &limiter.policies(), 0)
            .await
            .unwrap()
            .limits()[0]
            .remaining,
        10
    );
}

#[cfg(feature = "redis")]
mod on_redis {
    use tollgate::RedisBackend;
    use tollgate_testkit::redis::{RedisCluster, RedisServer};

    use super::*;

    fn instance(store: RedisBackend) -> Limiter {
        Limiter::builder()
            .name("llm")
            .backend(store)
            .store_timeout(Duration::from_secs(5))
            .policy(tokens())
            .build()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_completions_over_two_instances_settle_exactly_on_redis() {
        let server = RedisServer::start();
        let mut instances = Vec::new();
        for _ in 0..2 {
            let store = crate::redis_backend::connected(RedisBackend::builder(server.url())).await;
            instances.push(instance(store));
        }
        fifty_at_once(&instances).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_completions_over_two_instances_settle_exactly_on_a_cluster() {
        let cluster = RedisCluster::start();
        let mut instances = Vec::new();
        for _ in 0..2 {
            let store =
                crate::redis_backend::connected(RedisBackend::cluster_builder(cluster.urls()))
                    .await;
            instances.push(instance(store));
        }
        fifty_at_once(&instances).await;
    }

    /// On Redis's own clock: a charge of 15 past a bucket of 10 a second is refused with a
    /// Retry-After of 2 s, and admitted again once 1.6 s have passed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_debt_drains_on_redis() {
        let server = RedisServer::start();
        let store = crate::redis_backend::connected(RedisBackend::builder(server.url())).await;
        let limiter = Limiter::builder()
            .name("llm")
            .backend(store)
            .store_timeout(Duration::from_secs(5))
            .denial_cache(0)
            .policy(Policy::token_bucket("tokens", Quota::per_second(10), 10))
            .build();
        let acme = Caller::new("acme");
        let admitted = limiter.check(&acme).await;
        let started = std::time::Instant::now();
        let settled = limiter.settle(&acme, &admitted, 25).await.unwrap();
        let after = settled.after_charge().unwrap().limits()[0];
        assert_eq!(after.remaining, 0);
        assert!((1_500..=1_600).contains(&after.reset_ms), "{after:?}");
        let Decision::Limited(refused) = limiter.check(&acme).await else {
            panic!("admitted while in debt");
        };
        assert_eq!(refused.retry_after_secs(), 2);
        tokio::time::sleep(Duration::from_millis(1_300).saturating_sub(started.elapsed())).await;
        assert!(
            !limiter.check(&acme).await.is_allowed(),
            "admitted before the debt drained"
        );
        tokio::time::sleep(Duration::from_millis(1_700).saturating_sub(started.elapsed())).await;
        assert!(
            limiter.check(&acme).await.is_allowed(),
            "refused after the debt drained"
        );
    }
}

/// A soft limit lets the refused request through with the refusal in its extensions: the
/// handler degrades, nothing is counted, and the decision is counted as `soft_limited`.
#[test]
fn a_soft_limit_lets_the_handler_degrade() {
    let (seen, snapshot) = with_recorder(|_| async {
        let limiter = Limiter::builder()
            .name("answers")
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(2)))
            .build();
        let layer = RateLimitLayer::new(limiter.clone())
            .key(HeaderKey::new("x-customer-id"))
            .soft_limit(true);
        let handler = service_fn(|request: Request<Full<Bytes>>| async move {
            let model = match request.extensions().get::<Decision>() {
                Some(Decision::SoftLimited(info)) => {
                    format!("small:{}", info.violated().next().unwrap().name())
                }
                _ => "large".to_owned(),
            };
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(model))))
        });
        let mut service = ServiceBuilder::new().layer(layer).service(handler);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let reply = send(&mut service, get("/answers", &[("x-customer-id", "acme")])).await;
            assert_eq!(reply.status, 200);
            assert!(reply.retry_after().is_none());
            seen.push(String::from_utf8(reply.body.to_vec()).unwrap());
        }
        // The soft refusals counted nothing: acme has used its 2, no more.
        assert_eq!(remaining(&limiter, "acme").await, 0);
        seen
    });
    assert_eq!(
        seen,
        ["large", "large", "small:per-minute", "small:per-minute"]
    );
    assert_eq!(
        counter(
            &snapshot,
            "tollgate_decisions_total",
            &[
                ("layer", "answers"),
                ("outcome", "soft_limited"),
                ("policy", "per-minute")
            ]
        ),
        2
    );
}

/// A body of `chunks` chunks of 64 KiB, one frame each, as a download streams them.
struct Chunks(usize);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![
            7u8;
            65_536
        ])))))
    }
}

/// An export behind a byte quota of 1 MiB a minute (`count_response_bytes`): a download read
/// to its end is charged its bytes, one dropped after 3 of its 10 chunks is charged the 3 it
/// sent, and a caller over the quota is refused before its next body starts, while a body
/// in progress runs to its end.
async fn exports_are_charged_what_they_sent(limiter: Limiter, window_secs: u64) {
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};

    let layer = RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-customer-id"))
        .count_response_bytes();
    let mut export = ServiceBuilder::new().layer(layer).service(service_fn(
        |request: Request<Full<Bytes>>| async move {
            let chunks: usize = request.uri().query().unwrap_or("1").parse().unwrap();
            Ok::<_, Infallible>(Response::new(Chunks(chunks)))
        },
    ));
    let acme = |chunks: usize| get(&format!("/export?{chunks}"), &[("x-customer-id", "acme")]);
    let settled_to = |expected: u64| {
        let limiter = limiter.clone();
        async move {
            // A remote store is told from a task: give it a moment.
            for _ in 0..100 {
                if remaining(&limiter, "acme").await == expected {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(remaining(&limiter, "acme").await, expected);
        }
    };

    let whole = export.ready().await.unwrap().call(acme(4)).await.unwrap();
    assert_eq!(whole.status(), 200);
    let policy = whole.headers()["ratelimit-policy"].to_str().unwrap();
    assert_eq!(
        policy,
        format!(r#""egress";q=1048576;w={window_secs};qu="content-bytes""#)
    );
    let body = whole.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 4 * 65_536);
    settled_to(1_048_576 - 4 * 65_536).await;

    let mut dropped = export
        .ready()
        .await
        .unwrap()
        .call(acme(10))
        .await
        .unwrap()
        .into_body();
    for _ in 0..3 {
        let frame = dropped.frame().await.unwrap().unwrap();
        assert_eq!(frame.data_ref().map(Bytes::len), Some(65_536));
    }
    drop(dropped);
    settled_to(1_048_576 - 7 * 65_536).await;

    // 9 more chunks while 7 remain: the body runs to its end, and the caller is then over.
    let over = export.ready().await.unwrap().call(acme(9)).await.unwrap();
    assert_eq!(over.status(), 200);
    let body = over.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 9 * 65_536);
    settled_to(0).await;
    let refused = export.ready().await.unwrap().call(acme(1)).await.unwrap();
    assert_eq!(refused.status(), 429);
}

fn egress() -> Policy {
    Policy::sliding_window("egress", Quota::per_minute(1_048_576)).content_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_charged_what_they_sent_in_process() {
    let clock = ManualClock::new(60_000);
    let limiter = Limiter::builder()
        .name("exports")
        .backend(InMemoryBackend::new().clock(clock))
        .policy(egress())
        .build();
    exports_are_charged_what_they_sent(limiter, 60).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_charged_what_they_sent_on_redis() {
    use tollgate::RedisBackend;
    let server = tollgate_testkit::redis::RedisServer::start();
    let store = crate::redis_backend::connected(RedisBackend::builder(server.url())).await;
    let limiter = Limiter::builder()
        .name("exports")
        .backend(store)
        .store_timeout(Duration::from_secs(5))
        .denial_cache(0)
        .policy(Policy::sliding_window("egress", Quota::per_hour(1_048_576)).content_bytes())
        .build();
    exports_are_charged_what_they_sent(limiter, 3_600).await;
}
