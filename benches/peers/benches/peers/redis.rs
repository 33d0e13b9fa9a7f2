//! Group `peers_redis`: Redis decisions per second at 64 concurrent tasks on one
//! redis-server: tollgate's `RedisBackend` (token bucket) vs tower-rate-limiter's
//! `RedisGcra`, each on one multiplexed connection.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tokio::runtime::Runtime;
use tollgate::{Limiter, RedisBackend};
use tollgate_testkit::redis::RedisServer;
use tower_rate_limiter::{RateLimitPolicy, RedisGcra};

use crate::big_gcra;
use crate::report::{Row, per_sec, write_rows};
use crate::support::{
    CALLERS, SLOW_TEST_MACHINE, TASKS, big_bucket, callers, in_rounds, multi_thread_runtime, wanted,
};

/// `iters` decisions from 64 tasks, callers spread as in tollgate's own Redis group;
/// returns the time per requested iteration.
pub(crate) async fn from_64_tasks<F, Fut>(iters: u64, decide: F) -> Duration
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = iters.div_ceil(TASKS);
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let decide = decide.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    decide(((t * 7_919 + i * 104_729) % CALLERS as u64) as usize).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    start
        .elapsed()
        .mul_f64(iters as f64 / (per_task * TASKS) as f64)
}

/// tower-rate-limiter's Redis GCRA on its own multiplexed connection to `server`.
pub(crate) fn gcra(runtime: &Runtime, server: &RedisServer, namespace: &str) -> RedisGcra {
    let client = redis::Client::open(server.url()).expect("redis URL");
    let connection = runtime
        .block_on(client.get_multiplexed_async_connection())
        .expect("connect");
    RedisGcra::new(connection, big_gcra()).with_namespace(namespace)
}

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "peers_redis";
    if !wanted(GROUP) {
        return;
    }
    let server = RedisServer::start();
    let runtime = multi_thread_runtime(1);
    let limiter = {
        let _guard = runtime.enter();
        Limiter::builder()
            .name("redis")
            .store_timeout(SLOW_TEST_MACHINE)
            .backend(
                RedisBackend::builder(server.url())
                    .build()
                    .expect("backend"),
            )
            .policy(big_bucket())
            .build()
    };
    let gcra = gcra(&runtime, &server, "bench");
    let callers = callers(CALLERS);
    let keys: Arc<[String]> = (0..CALLERS).map(|i| format!("customer-{i:07}")).collect();

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    let names = ["tollgate_64_tasks", "tower_rate_limiter_64_tasks"];
    let rounds = in_rounds(&mut group, GROUP, &names, |b, name| {
        if name == names[0] {
            b.to_async(&runtime).iter_custom(|iters| {
                let (limiter, callers) = (limiter.clone(), callers.clone());
                from_64_tasks(iters, move |i| {
                    let check = limiter.check(&callers[i]);
                    async move {
                        let decision = check.await;
                        assert!(decision.is_allowed(), "{decision:?}");
                    }
                })
            });
        } else {
            b.to_async(&runtime).iter_custom(|iters| {
                let (gcra, keys) = (gcra.clone(), keys.clone());
                from_64_tasks(iters, move |i| {
                    let check = gcra.check(keys[i].clone());
                    async move {
                        let decision = check.await.expect("tower-rate-limiter decision");
                        assert!(!decision.is_rate_limited());
                    }
                })
            });
        }
    });
    group.finish();

    let (Some(ours), Some(peer), Some(ratio)) = (
        rounds.time(names[0]),
        rounds.time(names[1]),
        // Decisions per second: the peer's time over ours.
        rounds.ratio(names[1], names[0]),
    ) else {
        return;
    };
    let (ours, peer) = (1e9 / ours, 1e9 / peer);
    write_rows(
        "peers_redis.tsv",
        &[(
            "redis/tower_rate_limiter",
            Row::new(
                "Redis decisions per second, 64 concurrent tasks, one local redis-server, token bucket, vs tower-rate-limiter's Redis GCRA",
                per_sec(ours),
            )
            .peer(format!(
                "tower-rate-limiter `RedisGcra`, same server: {}",
                per_sec(peer)
            ))
            .ratio(format!("{ratio:.2}x"))
            .target("≥ 1.00x", ratio >= 1.0),
        )],
    );
}
