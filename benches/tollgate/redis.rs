//! Group `redis`: Redis decisions per second at 64 tasks vs `redis-benchmark -P 16` on the
//! same script, and what each costs redis-server against a minimal sliding window.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tollgate::{Caller, Limiter, RedisBackend};
use tollgate_testkit::redis::RedisServer;

use crate::report::{Row, median, median_ns, per_sec, ran, write_rows};
use crate::support::{
    CALLERS, SLOW_TEST_MACHINE, TASKS, big_window, callers, multi_thread_runtime, scripts_run,
    wanted,
};

/// Redis decisions per second at 64 concurrent tasks, and `redis-benchmark -P 16` running
/// the same script against the same server; redis-server's CPU per decision, and per call
/// of a minimal sliding window.
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
            .name("redis")
            .store_timeout(SLOW_TEST_MACHINE)
            .backend(RedisBackend::builder(server.url()).build().unwrap())
            // A quota no caller reaches: every decision writes, as redis-benchmark's do.
            .policy(big_window())
            .build()
    };
    let callers = callers(CALLERS);
    // The peers, driven by redis-benchmark: the same script, and the least a sliding
    // window can do.
    let same_sha = server.must(&["SCRIPT", "LOAD", &lone_window_as_text()]);
    let minimal_sha = server.must(&["SCRIPT", "LOAD", MINIMAL_WINDOW]);

    // Tollgate's run and redis-benchmark's in alternated rounds, the order turned each
    // round: this machine's speed drifts by a fifth within a minute, which a ratio of runs
    // a minute apart would carry. What tollgate's decisions cost redis-server is read over
    // its own runs (the script of a lone sliding window, lua/lone.lua, its arguments
    // packed); the minimal window's cost is its best run (other work only ever adds).
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    let (mut rates, mut peer_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ours_cpu, mut ours_calls) = (0.0_f64, 0_u64);
    let mut minimal_cpu = f64::INFINITY;
    for round in 0..REDIS_ROUNDS {
        let peer_first = round % 2 == 1;
        let mut peer = None;
        if peer_first {
            peer = Some(redis_benchmark(&server, same_sha.trim(), LONE_WINDOW_ARGS));
        }
        let (cpu_before, calls_before) = (server_cpu_seconds(&server), scripts_run(&server));
        let id = format!("tollgate_64_tasks_r{round}");
        group.bench_function(&id, |b| {
            ran(GROUP, &id);
            b.to_async(&runtime)
                .iter_custom(|iters| decide_in_tasks(limiter.clone(), callers.clone(), iters));
        });
        ours_calls += scripts_run(&server).saturating_sub(calls_before);
        ours_cpu += server_cpu_seconds(&server) - cpu_before;
        let peer =
            peer.unwrap_or_else(|| redis_benchmark(&server, same_sha.trim(), LONE_WINDOW_ARGS));
        minimal_cpu = minimal_cpu
            .min(redis_benchmark(&server, minimal_sha.trim(), MINIMAL_ARGS).server_cpu_per_call);
        let Some(time) = median_ns(GROUP, &id) else {
            continue;
        };
        rates.push(1e9 / time);
        peer_rates.push(peer.per_sec);
        ratios.push(1e9 / time / peer.per_sec);
    }
    group.finish();
    let (Some(tollgate), Some(peer), Some(ratio)) =
        (median(rates), median(peer_rates), median(ratios))
    else {
        return;
    };
    let ours_cpu = ours_cpu / ours_calls.max(1) as f64;
    let script_ratio = minimal_cpu / ours_cpu;
    write_rows(
        "redis.tsv",
        &[
            (
                "redis/redis_benchmark",
                Row::new(
                    "Redis decisions per second, 64 concurrent tasks, one local redis-server, one sliding window",
                    per_sec(tollgate),
                )
                .peer(format!(
                    "`redis-benchmark -c 64 -P 16`, the same script (its numbers as text) and server, {REDIS_ROUNDS} rounds alternated with tollgate's (rates: medians; ratio: the median of the rounds' ratios): {}",
                    per_sec(peer)
                ))
                .ratio(format!("{ratio:.2}x"))
                .target("≥ 0.80x", ratio >= 0.8),
            ),
            (
                "redis/script_cost",
                Row::new(
                    "Redis CPU per decision: redis-server's CPU time per call over the 64-task run above (a caller's one sliding window)",
                    format!("{:.2} µs", ours_cpu * 1e6),
                )
                .peer(format!(
                    "the minimal sliding window (HMGET, HSET, PEXPIRE) under `redis-benchmark -c 64 -P 16`, same server, best of {REDIS_ROUNDS}: {:.2} µs",
                    minimal_cpu * 1e6
                ))
                .ratio(format!("{script_ratio:.2}x"))
                .target("≥ 0.90x", script_ratio >= 0.9),
            ),
        ],
    );
}

/// Rounds of tollgate's run and redis-benchmark's.
const REDIS_ROUNDS: usize = 5;

/// `iters` decisions by 64 tasks at once, each on callers spread over the table: the time
/// they took, per requested iteration.
async fn decide_in_tasks(limiter: Limiter, callers: Arc<[Caller]>, iters: u64) -> Duration {
    let per_task = iters.div_ceil(TASKS);
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let limiter = limiter.clone();
            let callers = callers.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let caller = &callers[((t * 7_919 + i * 104_729) % CALLERS as u64) as usize];
                    let decision = limiter.check(caller).await;
                    assert!(decision.is_allowed(), "{decision:?}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Reported per requested iteration; the rounding up is within 64 of iters.
    start
        .elapsed()
        .mul_f64(iters as f64 / (per_task * TASKS) as f64)
}

/// The minimal sliding window that prices tollgate's script in redis-server's CPU.
const MINIMAL_WINDOW: &str = include_str!("minimal_window.lua");

/// The script of tollgate's decisions above (lua/lone.lua for a sliding window, after
/// lua/clock.lua), as redis-benchmark can run it: its three numbers read as text, where
/// tollgate packs them in one binary argument that a command line cannot carry. Reading
/// them so takes three `tonumber` calls where tollgate's decisions take one unpack: about
/// 0.25 µs more per call.
fn lone_window_as_text() -> String {
    const PACKED: &str = "local limit, window, cost = struct.unpack('<ddd', ARGV[1])";
    const TEXT: &str =
        "local limit, window, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])";
    let script = concat!(
        include_str!("../../lua/clock.lua"),
        include_str!(concat!(env!("OUT_DIR"), "/lone_sliding_window.lua"))
    );
    assert!(
        script.contains(PACKED),
        "lua/algorithm/sliding_window.lua reads its arguments so"
    );
    script.replace(PACKED, TEXT)
}

/// Its arguments as text: the limiter's window above, and a cost of 1.
const LONE_WINDOW_ARGS: &[&str] = &["1000000000", "1000", "1"];

/// The minimal script's arguments: the same window.
const MINIMAL_ARGS: &[&str] = &["1000000000", "1000"];

/// One `redis-benchmark` run: the calls per second it saw, and redis-server's CPU seconds
/// per call over the run.
struct BenchmarkRun {
    per_sec: f64,
    server_cpu_per_call: f64,
}

/// Calls per `redis-benchmark` run.
const REQUESTS: u32 = 400_000;

/// `redis-benchmark -P 16 -c 64` running the script `sha` with `args`, keys spread over
/// the same number of callers as the backend's decisions.
fn redis_benchmark(server: &RedisServer, sha: &str, args: &[&str]) -> BenchmarkRun {
    let cpu_before = server_cpu_seconds(server);
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args([
            "-c",
            "64",
            "-P",
            "16",
            "-n",
            &REQUESTS.to_string(),
            "-r",
            &CALLERS.to_string(),
            "-q",
        ])
        .args(["EVALSHA", sha, "1", "rl:{bench__rand_int__}:per-second"])
        .args(args)
        .output()
        .expect("redis-benchmark (apt-get install redis-tools)");
    let server_cpu_per_call = (server_cpu_seconds(server) - cpu_before) / f64::from(REQUESTS);
    let text = String::from_utf8_lossy(&output.stdout);
    // The last report line: "EVALSHA ...: 123456.79 requests per second, p50=..."
    let per_sec = text
        .rsplit(['\r', '\n'])
        .find_map(|line| {
            let (_, rest) = line.rsplit_once(": ")?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"));
    BenchmarkRun {
        per_sec,
        server_cpu_per_call,
    }
}

/// redis-server's CPU time so far (user + system), from /proc/PID/stat.
fn server_cpu_seconds(server: &RedisServer) -> f64 {
    let pid = server.pid().expect("redis-server is running");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("a stat line")
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / clock_ticks_per_second()
}

/// The unit of /proc's CPU times (`getconf CLK_TCK`, 100 on Linux when unknown).
fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}
