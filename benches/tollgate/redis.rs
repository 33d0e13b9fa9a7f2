//! Group `redis`: Redis decisions per second at 64 tasks vs `redis-benchmark -P 16`.

use std::process::Command;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use tollgate::{Limiter, RedisBackend};
use tollgate_testkit::redis::RedisServer;

use crate::report::{Row, median_ns, per_sec, ran, write_rows};
use crate::support::{
    CALLERS, SLOW_TEST_MACHINE, TASKS, big_window, callers, multi_thread_runtime,
};
use crate::wanted;

/// Redis decisions per second at 64 concurrent tasks, and `redis-benchmark -P 16` running
/// the same script against the same server.
pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "redis";
    if !wanted(GROUP) {
        return;
    }
    let server = RedisServer::start();
    let runtime = multi_thread_runtime(1);
    let limiter = {
        let _guard = runtime.enter();
        Limiter::builder()
            .store_timeout(SLOW_TEST_MACHINE)
            .backend(RedisBackend::builder(server.url()).build().unwrap())
            // A quota no caller reaches: every decision writes, as redis-benchmark's do.
            .policy(big_window())
            .build()
    };
    let callers = callers(CALLERS);

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    group.bench_function("tollgate_64_tasks", |b| {
        ran(GROUP, "tollgate_64_tasks");
        b.to_async(&runtime).iter_custom(|iters| {
            let limiter = limiter.clone();
            let callers = callers.clone();
            async move {
                let per_task = iters.div_ceil(TASKS);
                let start = Instant::now();
                let tasks: Vec<_> = (0..TASKS)
                    .map(|t| {
                        let limiter = limiter.clone();
                        let callers = callers.clone();
                        tokio::spawn(async move {
                            for i in 0..per_task {
                                let caller =
                                    &callers[((t * 7_919 + i * 104_729) % CALLERS as u64) as usize];
                                let decision = limiter.check(caller).await;
                                assert!(decision.is_allowed(), "{decision:?}");
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                // Report per requested iteration; the rounding up is within 64 of iters.
                start
                    .elapsed()
                    .mul_f64(iters as f64 / (per_task * TASKS) as f64)
            }
        });
    });
    group.finish();

    let Some(median) = median_ns(GROUP, "tollgate_64_tasks") else {
        return;
    };
    let tollgate = 1e9 / median;
    let peer = redis_benchmark(&server);
    let ratio = tollgate / peer;
    write_rows(
        "redis.tsv",
        &[
            (
                "redis/redis_benchmark",
                Row::new(
                    "Redis decisions per second, 64 concurrent tasks, one local redis-server",
                    per_sec(tollgate),
                )
                .peer(format!(
                    "`redis-benchmark -c 64 -P 16`, same script and server: {}",
                    per_sec(peer)
                ))
                .ratio(format!("{ratio:.2}x"))
                .target("≥ 0.80x", ratio >= 0.8),
            ),
            (
                "redis/tower_rate_limiter",
                Row::new(
                    "Redis decisions per second vs tower-rate-limiter's Redis GCRA",
                    per_sec(tollgate),
                )
                .peer("tower-rate-limiter: cannot be built on Rust 1.95 (see below)")
                .unmeasured_target("≥ 1.00x"),
            ),
        ],
    );
}

/// `redis-benchmark -P 16 -c 64` running tollgate's own script, keys spread over the same
/// number of callers.
fn redis_benchmark(server: &RedisServer) -> f64 {
    server.must(&["SCRIPT", "LOAD", RedisBackend::script_source()]);
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args([
            "-c",
            "64",
            "-P",
            "16",
            "-n",
            "400000",
            "-r",
            &CALLERS.to_string(),
            "-q",
        ])
        .args([
            "EVALSHA",
            RedisBackend::script_sha(),
            "1",
            "rl:{bench__rand_int__}:per-second",
        ])
        .args(["1", "1000000000", "1000", "0"])
        .output()
        .expect("redis-benchmark (apt-get install redis-tools)");
    let text = String::from_utf8_lossy(&output.stdout);
    // The last report line: "EVALSHA ...: 123456.79 requests per second, p50=..."
    text.rsplit(['\r', '\n'])
        .find_map(|line| {
            let (_, rest) = line.rsplit_once(": ")?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
}
