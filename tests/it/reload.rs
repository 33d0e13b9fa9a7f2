//! Limits swapped while a limiter runs: under concurrent traffic, in process and on Redis,
//! the count carried over as `Limiter::set_limits` documents (on Redis also between
//! instances whose sets differ, so that different scripts decide one key), the denial
//! cache, the RateLimit-Policy field and the refusal counters following the swap.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::{
    Caller, Decision, InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer,
    decision::UnlimitedReason, reload::Limits,
};
use tollgate_testkit::http::{get, ok_handler, send};
use tollgate_testkit::recorder::{counter, with_recorder};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tower::{ServiceBuilder, service_fn};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

const TASKS: usize = 4;

/// A day's window: a test never straddles two of them (unless run at midnight UTC, when
/// the weighted previous window would still only refuse more, never admit more).
fn per_day(limit: u64) -> Policy {
    Policy::sliding_window("per-day", Quota::per_day(limit))
}

fn limits(policy: Policy) -> Limits {
    Limits::new().policy(policy)
}

/// Sends `per_task` requests from each of `TASKS` concurrent tasks; returns how many were
/// admitted.
async fn burst(limiter: &Limiter, caller: &Caller, per_task: usize) -> usize {
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (limiter, caller) = (limiter.clone(), caller.clone());
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..per_task {
                    let decision = limiter.check(&caller).await;
                    // Let through by the failure policy, the request was never counted: say
                    // so, rather than as one admission too many.
                    assert!(
                        !matches!(
                            decision,
                            Decision::Unlimited(UnlimitedReason::StoreFailedOpen)
                        ),
                        "the store did not answer within the timeout: {decision:?}"
                    );
                    admitted += usize::from(decision.is_allowed());
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    admitted
}

/// What the traffic of [`swap_under_traffic`] saw.
#[derive(Default)]
struct Traffic {
    /// Decided requests.
    decided: AtomicUsize,
    /// Decided requests that started after the swap returned.
    after: AtomicUsize,
    /// Admitted requests, by the quota of the limits they were decided under.
    admitted: Mutex<BTreeMap<u64, usize>>,
}

/// Traffic from `TASKS` tasks as fast as the limiter answers, with `new` swapped in once
/// `before_swap` requests have been decided and kept until `after_swap` more have started
/// after it.
async fn swap_under_traffic(
    limiter: &Limiter,
    caller: &Caller,
    new: Limits,
    before_swap: usize,
    after_swap: usize,
) -> Arc<Traffic> {
    let traffic = Arc::new(Traffic::default());
    let swapped = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (limiter, caller) = (limiter.clone(), caller.clone());
            let (traffic, swapped, stop) = (traffic.clone(), swapped.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let started_after = swapped.load(Ordering::SeqCst);
                    let decision = limiter.check(&caller).await;
                    if let Decision::Allowed(info) = &decision {
                        let quota = info.policy(0).expect("a policy").quota();
                        *traffic.admitted.lock().unwrap().entry(quota).or_default() += 1;
                    }
                    assert!(
                        matches!(decision, Decision::Allowed(_) | Decision::Limited(_)),
                        "{decision:?}"
                    );
                    traffic.decided.fetch_add(1, Ordering::SeqCst);
                    if started_after {
                        traffic.after.fetch_add(1, Ordering::SeqCst);
                    }
                    // Lets the other tasks and the swapping one run on a busy machine.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    wait_for(|| traffic.decided.load(Ordering::SeqCst) >= before_swap).await;
    limiter.set_limits(new).unwrap();
    swapped.store(true, Ordering::SeqCst);
    wait_for(|| traffic.after.load(Ordering::SeqCst) >= after_swap).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    traffic
}

async fn wait_for(mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "traffic stalled");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The whole story on one limiter, which starts at 50 a day.
async fn limits_change_under_traffic(limiter: Limiter) {
    let acme = Caller::new("acme");
    // 100 requests at once against 50 a day: exactly 50 admitted.
    assert_eq!(burst(&limiter, &acme, 25).await, 50);

    // Raised to 100 a day while refused traffic keeps coming: the policy keeps its name and
    // window, so acme keeps the 50 it used and gets exactly 50 more, each decided under the
    // new limits (its quota says so), none under the old ones. A refusal cached under the
    // old limits (the denial cache, on Redis) would have refused them all.
    let traffic = swap_under_traffic(&limiter, &acme, limits(per_day(100)), 40, 200).await;
    assert_eq!(
        *traffic.admitted.lock().unwrap(),
        BTreeMap::from([(100, 50)])
    );
    assert_eq!(limiter.policies()[0].quota(), 100);

    // Lowered below what acme used: refused until its count falls below 30.
    limiter.set_limits(limits(per_day(30))).unwrap();
    assert_eq!(burst(&limiter, &acme, 10).await, 0);

    // Another window under the same name is another counter: a fresh count of 30.
    let half_day = Policy::sliding_window("per-day", Quota::new(30, Duration::from_secs(43_200)));
    limiter.set_limits(limits(half_day)).unwrap();
    assert_eq!(burst(&limiter, &acme, 20).await, 30);
    // So is another algorithm: a bucket of 10.
    let bucket = Policy::token_bucket("per-day", Quota::per_day(10), 10);
    limiter.set_limits(limits(bucket)).unwrap();
    assert_eq!(burst(&limiter, &acme, 10).await, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_change_under_traffic_in_process() {
    let limiter = Limiter::builder()
        .name("reload")
        .backend(InMemoryBackend::new())
        .policy(per_day(50))
        .build();
    limits_change_under_traffic(limiter).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_change_under_traffic_on_redis() {
    let server = RedisServer::start();
    // Once connected: the first burst's calls would otherwise wait for the connection
    // within the store timeout, which a loaded machine can run out of (the decision then
    // fails open, and counts as one admission too many).
    let limiter = connected_instance(&server, &[per_day(50)]).await;
    limits_change_under_traffic(limiter).await;
}

#[tokio::test]
async fn the_ratelimit_policy_field_follows_the_swap() {
    let limiter = Limiter::builder().policy(per_day(50)).build();
    let handle = limiter.clone();
    let mut service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter).key(Caller::new("*")))
        .service(service_fn(ok_handler));
    let q = |reply: &tollgate_testkit::http::Reply| reply.policy_params("RateLimit-Policy");
    let before = send(&mut service, get("/", &[])).await;
    assert_eq!(q(&before)[0].1[0], ("q".to_owned(), 50));
    handle.set_limits(limits(per_day(100))).unwrap();
    let after = send(&mut service, get("/", &[])).await;
    assert_eq!(q(&after)[0].1[0], ("q".to_owned(), 100));
    handle.set_limits(limits(per_day(50))).unwrap();
    let again = send(&mut service, get("/", &[])).await;
    assert_eq!(q(&again)[0].1[0], ("q".to_owned(), 50));
}

#[test]
fn refusals_by_a_policy_swapped_in_are_counted_under_its_name() {
    let ((), snapshot) = with_recorder(|_| async {
        let limiter = Limiter::builder()
            .name("reload-metrics")
            .policy(per_day(1))
            .build();
        let acme = Caller::new("acme");
        assert!(limiter.check(&acme).await.is_allowed());
        assert!(!limiter.check(&acme).await.is_allowed());
        let per_hour = Policy::sliding_window("per-hour", Quota::per_hour(1));
        limiter.set_limits(limits(per_hour)).unwrap();
        assert!(limiter.check(&acme).await.is_allowed());
        assert!(!limiter.check(&acme).await.is_allowed());
        assert!(!limiter.check(&acme).await.is_allowed());
    });
    let limited = |policy| {
        counter(
            &snapshot,
            "tollgate_decisions_total",
            &[
                ("layer", "reload-metrics"),
                ("outcome", "limited"),
                ("policy", policy),
            ],
        )
    };
    assert_eq!(limited("per-day"), 1);
    assert_eq!(limited("per-hour"), 2);
}

/// The events tollgate logs, with their levels.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<(tracing::Level, String)>>>);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Logged {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let metadata = event.metadata();
        if metadata.target().starts_with("tollgate") {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push((*metadata.level(), message.0));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A swap is what the service asked for (a plan reload, say): an INFO line, never a
/// warning an operator would be paged for. A swap that cannot work logs nothing; its
/// error goes back to the caller.
#[test]
fn a_swap_is_logged_at_info() {
    let logged = Logged::default();
    tracing::subscriber::with_default(logged.clone(), || {
        // Whether an event is wanted is cached per callsite for the whole process: a test
        // on another thread that reached one first, with no subscriber, may have left it off.
        tracing::callsite::rebuild_interest_cache();
        let limiter = Limiter::builder().name("plans").policy(per_day(50)).build();
        limiter.set_limits(limits(per_day(100))).unwrap();
        limiter.set_limits(limits(per_day(50))).unwrap();
        assert!(limiter.set_limits(Limits::new()).is_err());
    });
    let events = logged.0.lock().unwrap().clone();
    let swaps: Vec<_> = events
        .iter()
        .filter(|(_, message)| message.contains("rate limits replaced"))
        .collect();
    assert_eq!(swaps.len(), 2, "{events:?}");
    for (level, _) in &swaps {
        assert_eq!(*level, tracing::Level::INFO, "{events:?}");
    }
    assert!(
        events
            .iter()
            .all(|(level, _)| *level > tracing::Level::WARN),
        "{events:?}"
    );
}

/// Two instances on one Redis decide the same caller's per-day policy, one with it alone
/// (decided by the script of a lone policy) and one with a second policy beside it
/// (decided by the general script), as while limits are swapped on some instances and not
/// yet on others: racing on the same key, together they admit exactly the quota, for a
/// sliding window and for a token bucket.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_of_one_policy_and_of_several_share_a_count_under_traffic() {
    let server = RedisServer::start();
    let roomy = Policy::sliding_window(
        "per-hour",
        Quota::new(1_000_000, Duration::from_secs(3_600)),
    );
    let bucket = Policy::token_bucket("per-day", Quota::per_day(10), 10);
    for (policy, quota) in [(per_day(50), 50), (bucket, 10)] {
        let alone = connected_instance(&server, std::slice::from_ref(&policy)).await;
        let beside = connected_instance(&server, &[policy, roomy.clone()]).await;
        let acme = Caller::new(format!("acme-{quota}"));
        let (by_alone, by_beside) =
            tokio::join!(burst(&alone, &acme, 25), burst(&beside, &acme, 25));
        assert_eq!(by_alone + by_beside, quota, "{by_alone} + {by_beside}");
    }
}

/// A limiter named as the others here, on `server`, with `policies`, once its connection
/// is there. The default timeouts are tight for a loaded machine, where a fallback would
/// admit more than the limits allow: the store timeout is one no healthy server on a
/// loaded test machine reaches, and the connection's own are raised with it.
#[cfg(feature = "redis")]
async fn connected_instance(server: &RedisServer, policies: &[Policy]) -> Limiter {
    let store = crate::redis_backend::connected(RedisBackend::builder(server.url())).await;
    policies
        .iter()
        .fold(
            Limiter::builder()
                .name("reload")
                .backend(store)
                .store_timeout(crate::redis_backend::SLOW_TEST_MACHINE),
            |builder, policy| builder.policy(policy.clone()),
        )
        .build()
}
