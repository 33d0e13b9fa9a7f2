//! Group `denial_cache`: acme at 2.4 times its limit, with and without the denial cache,
//! in virtual time on the in-process store and in real time on a redis-server.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use tollgate::store::ManualClock;
use tollgate::{Caller, Decision, InMemoryBackend, Limiter, Policy, Quota, RedisBackend};
use tollgate_testkit::counting::Counting;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::remote::Remote;

use crate::report::{Row, median_ns, per_sec, ran, write_rows};
use crate::support::wanted;
use crate::support::{SLOW_TEST_MACHINE, multi_thread_runtime, ready_now};

const ACME_REQUESTS: u64 = 1_200;
const EPOCH_MS: u64 = 1_800_000_000_000;

/// acme at 120 requests a second against 50 a second for 10 virtual seconds.
struct VirtualRun {
    clock: ManualClock,
    limiter: Limiter,
    calls: Arc<std::sync::atomic::AtomicU64>,
}

impl VirtualRun {
    fn new(cache: bool) -> Self {
        let clock = ManualClock::new(EPOCH_MS);
        let store = Counting::new(Remote::new(InMemoryBackend::new().clock(clock.clone())));
        let calls = store.counter();
        let limiter = Limiter::builder()
            .name("denial-cache")
            .backend(store)
            .clock(clock.clone())
            .denial_cache(if cache { 10_000 } else { 0 })
            .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
            .build();
        Self {
            clock,
            limiter,
            calls,
        }
    }

    /// Returns how many requests were admitted.
    fn run(&self, acme: &Caller) -> u64 {
        let mut admitted = 0;
        for i in 0..ACME_REQUESTS {
            self.clock.set(EPOCH_MS + i * 1_000 / 120);
            if ready_now(self.limiter.check(acme)).is_allowed() {
                admitted += 1;
            }
        }
        admitted
    }

    fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// acme at 120 requests a second against 50 a second on a real redis-server, paced in real
/// time; returns (admitted, store calls, requests, time spent deciding).
async fn acme_on_redis(
    store: RedisBackend,
    cache: bool,
    seconds: u64,
) -> (u64, u64, u64, Duration) {
    let store = Counting::new(store);
    let limiter = Limiter::builder()
        .name("denial-cache")
        .backend(store.clone())
        .store_timeout(SLOW_TEST_MACHINE)
        .denial_cache(if cache { 10_000 } else { 0 })
        .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
        .build();
    let acme = Caller::new("acme");
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / 120));
    let requests = 120 * seconds;
    let (mut admitted, mut deciding) = (0, Duration::ZERO);
    for _ in 0..requests {
        tick.tick().await;
        let start = Instant::now();
        let decision = limiter.check(&acme).await;
        deciding += start.elapsed();
        assert!(
            !matches!(
                decision,
                Decision::Unlimited(_) | Decision::Unavailable { .. }
            ),
            "the store failed: {decision:?}"
        );
        if decision.is_allowed() {
            admitted += 1;
        }
    }
    (admitted, store.calls(), requests, deciding)
}

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "denial_cache";
    let acme = Caller::new("acme");
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(ACME_REQUESTS));
    for (id, cache) in [
        ("virtual_with_cache", true),
        ("virtual_without_cache", false),
    ] {
        group.bench_function(id, |b| {
            ran(GROUP, id);
            b.iter_batched(
                || VirtualRun::new(cache),
                |run| black_box(run.run(&acme)),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
    if !wanted(GROUP) {
        return;
    }

    let mut rows = Vec::new();
    let with = VirtualRun::new(true);
    let without = VirtualRun::new(false);
    let (admitted, admitted_without) = (with.run(&acme), without.run(&acme));
    assert_eq!(admitted, admitted_without, "the cache changed decisions");
    let per_request = with.calls() as f64 / ACME_REQUESTS as f64;
    let per_request_without = without.calls() as f64 / ACME_REQUESTS as f64;
    rows.push((
        "denial_cache/virtual_calls",
        Row::new(
            "Denial cache, acme at 2.4x its limit (120 req/s vs 50/s, 10 virtual s): store calls per acme request",
            format!(
                "{per_request:.3} ({} calls, {admitted} of {ACME_REQUESTS} admitted)",
                with.calls()
            ),
        )
        .peer(format!(
            "same limiter without the cache: {per_request_without:.3}, same decisions"
        ))
        .ratio(format!("{:.2}x", per_request / per_request_without)),
    ));
    let get = |id| median_ns(GROUP, id);
    if let (Some(ours), Some(peer)) = (get("virtual_with_cache"), get("virtual_without_cache")) {
        let (ours, peer) = (
            ACME_REQUESTS as f64 * 1e9 / ours,
            ACME_REQUESTS as f64 * 1e9 / peer,
        );
        rows.push((
            "denial_cache/virtual_rate",
            Row::new(
                "Denial cache, virtual time (in-process store behind the remote path): decisions/s",
                per_sec(ours),
            )
            .peer(format!("without the cache: {}", per_sec(peer)))
            .ratio(format!("{:.2}x", ours / peer)),
        ));
    }

    // The same on a real redis-server, in real time.
    let server = RedisServer::start();
    let runtime = multi_thread_runtime(1);
    let results: Vec<_> = [("with", true), ("without", false)]
        .into_iter()
        .map(|(prefix, cache)| {
            runtime.block_on(async {
                let store = RedisBackend::builder(server.url())
                    .prefix(prefix)
                    .build()
                    .expect("backend");
                store.ping().await.expect("redis answers");
                acme_on_redis(store, cache, 5).await
            })
        })
        .collect();
    let [
        (admitted, calls, requests, spent),
        (admitted_without, calls_without, _, spent_without),
    ] = results[..]
    else {
        unreachable!()
    };
    let rate = |spent: Duration| requests as f64 / spent.as_secs_f64();
    rows.push((
        "denial_cache/redis_calls",
        Row::new(
            "Denial cache on redis-server, acme at 120 req/s vs 50/s for 5 s: store calls per acme request",
            format!(
                "{:.3} ({calls} calls, {admitted} of {requests} admitted)",
                calls as f64 / requests as f64
            ),
        )
        .peer(format!(
            "without the cache: {:.3} ({admitted_without} admitted)",
            calls_without as f64 / requests as f64
        ))
        .ratio(format!("{:.2}x", calls as f64 / calls_without as f64)),
    ));
    rows.push((
        "denial_cache/redis_rate",
        Row::new(
            "Denial cache on redis-server: decisions per second of time spent deciding",
            per_sec(rate(spent)),
        )
        .peer(format!(
            "without the cache: {}",
            per_sec(rate(spent_without))
        ))
        .ratio(format!("{:.2}x", rate(spent) / rate(spent_without))),
    ));
    write_rows("denial_cache.tsv", &rows);
}
