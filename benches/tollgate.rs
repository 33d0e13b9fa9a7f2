//! tollgate beside its peers, measured in one run. `scripts/bench` runs this and rewrites
//! BENCHMARKS.md from the figures it leaves in `target/tollgate-bench/`.

#[path = "../tests/support/redis.rs"]
#[allow(dead_code, unreachable_pub)]
mod redis_support;

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redis_support::RedisServer;
use tollgate::{Caller, Limiter, Policy, Quota, RedisBackend};

/// This bench measures the store, not fallbacks: a store timeout no healthy server
/// reaches, so every request is decided by Redis.
const SLOW_TEST_MACHINE: std::time::Duration = std::time::Duration::from_secs(5);

const TASKS: u64 = 64;
const CALLERS: u64 = 10_000;

fn results_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tollgate-bench");
    fs::create_dir_all(&dir).expect("results dir");
    dir
}

/// Redis decisions per second at 64 concurrent tasks, and `redis-benchmark -P 16` running
/// the same script against the same server.
fn redis_decisions(c: &mut Criterion) {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let limiter = {
        let _guard = runtime.enter();
        Limiter::builder()
            .store_timeout(SLOW_TEST_MACHINE)
            .backend(RedisBackend::builder(server.url()).build().unwrap())
            // A quota no caller reaches: every decision writes, as redis-benchmark's do.
            .policy(Policy::sliding_window(
                "per-second",
                Quota::per_second(1_000_000_000),
            ))
            .build()
    };
    let callers: Arc<[Caller]> = (0..CALLERS)
        .map(|i| Caller::new(format!("bench{i:012}")))
        .collect();
    let decided = Arc::new(AtomicU64::new(0));
    let spent_ns = Arc::new(AtomicU64::new(0));

    let mut group = c.benchmark_group("redis");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("tollgate_64_tasks", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let limiter = limiter.clone();
            let callers = callers.clone();
            let decided = decided.clone();
            let spent_ns = spent_ns.clone();
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
                                    &callers[((t * 7_919 + i * 104_729) % CALLERS) as usize];
                                let decision = limiter.check(caller).await;
                                assert!(decision.is_allowed(), "{decision:?}");
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                let elapsed = start.elapsed();
                decided.fetch_add(per_task * TASKS, Ordering::Relaxed);
                spent_ns.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
                // Report per requested iteration; the rounding up is within 64 of iters.
                elapsed.mul_f64(iters as f64 / (per_task * TASKS) as f64)
            }
        });
    });
    group.finish();

    let tollgate =
        decided.load(Ordering::Relaxed) as f64 / (spent_ns.load(Ordering::Relaxed) as f64 / 1e9);
    let peer = redis_benchmark(&server);
    let line = format!("redis_decisions_per_sec\t{tollgate:.0}\t{peer:.0}\n");
    fs::write(results_dir().join("redis.tsv"), line).expect("write results");
    println!(
        "redis: tollgate {tollgate:.0} decisions/s, redis-benchmark -P 16 {peer:.0} requests/s, ratio {:.2}",
        tollgate / peer
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

criterion_group!(benches, redis_decisions);
criterion_main!(benches);
