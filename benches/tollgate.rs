//! tollgate beside its peers, measured in one run. `scripts/bench` runs this and rewrites
//! BENCHMARKS.md from the rows it leaves in `target/tollgate-bench/`.
//!
//! One criterion entry point, one group per scenario:
//!
//! 1. `in_process`: `Limiter::check` and `Backend::check` on the in-process backend vs
//!    governor's keyed `check_key`, at 1 key and at 100,000 keys, on one and two threads.
//! 2. `layer`: the tower layer on an in-memory service vs tower_governor, and the bare service.
//! 3. `redis`: Redis decisions per second at 64 tasks vs `redis-benchmark -P 16`.
//! 4. `frozen_store`: redis-server under SIGSTOP: latency until the breaker opens, then
//!    throughput with the breaker open vs the in-process backend.
//! 5. `denial_cache`: acme at 2.4 times its limit, with and without the denial cache.
//! 7. `memory`: bytes per tracked key at 1,000,000 keys (in a fresh child process, by RSS).
//!
//! Scenario 6 (HTTP end to end with wrk) runs in `scripts/bench` against
//! `examples/bench_server.rs`. Criterion's filter applies to every group; the parts that
//! are not criterion benchmarks (the latency rounds, the store-call counts, the memory
//! children) run when the filter, taken as a plain substring, matches their group name.
//!
//! No metrics recorder is installed unless `TOLLGATE_BENCH_PROMETHEUS` is set, which
//! installs the Prometheus one, as a served app has it (a diagnostic, not in the table).

use std::collections::HashSet;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::fs;
use std::future::Future;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Command;
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use criterion::{BatchSize, Bencher, Criterion, SamplingMode, Throughput};
use http::{HeaderName, HeaderValue, Request, Response};
use std::hint::black_box;
use tokio::runtime::Runtime;
use tollgate::decision::{BreakerState, DecisionSource};
use tollgate::store::{Backend, CallerKey, CheckFuture, ManualClock};
use tollgate::{
    Caller, Decision, FailurePolicy, HeaderKey, HeaderMode, InMemoryBackend, InstanceCount,
    Limiter, Policy, Quota, RateLimitLayer, RedisBackend,
};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;

use tollgate_testkit::counting::Counting;
use tollgate_testkit::redis::RedisServer;

/// A quota no caller reaches in a benchmark: every decision admits and writes.
const BIG: u64 = 1_000_000_000;

/// The store timeout of the frozen-store scenario (the limiter's default).
const STORE_TIMEOUT: Duration = Duration::from_millis(20);

/// The Redis throughput bench measures the store, not fallbacks: a store timeout no
/// healthy server reaches, so every request is decided by Redis.
const SLOW_TEST_MACHINE: Duration = Duration::from_secs(5);

const TASKS: u64 = 64;
const CALLERS: usize = 10_000;
const MANY_KEYS: usize = 100_000;
const MEMORY_KEYS: usize = 1_000_000;

/// Set to run every scenario with a Prometheus recorder installed (diagnostics; the
/// published figures run without one).
const PROMETHEUS: &str = "TOLLGATE_BENCH_PROMETHEUS";

/// Set in the child processes that measure memory.
const MEMORY_CHILD: &str = "TOLLGATE_BENCH_MEMORY_CHILD";

static CUSTOMER: HeaderName = HeaderName::from_static("x-customer-id");

fn main() {
    if let Ok(which) = std::env::var(MEMORY_CHILD) {
        measure_memory(&which);
        return;
    }
    if std::env::var_os(PROMETHEUS).is_some() {
        // The recorder a served app installs (orders_api does): decisions then pay for
        // real metrics. Off by default, as in the library without a recorder.
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("install the Prometheus recorder");
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
        .nresamples(20_000)
        .output_directory(&criterion_dir())
        .configure_from_args();
    in_process(&mut c);
    layer(&mut c);
    redis_decisions(&mut c);
    frozen_store(&mut c);
    denial_cache(&mut c);
    memory(&mut c);
    c.final_summary();
}

// ---------------------------------------------------------------------------------------
// Results: rows for BENCHMARKS.md, and criterion's estimates.
// ---------------------------------------------------------------------------------------

/// One line of the table in BENCHMARKS.md.
struct Row {
    scenario: String,
    tollgate: String,
    peer: String,
    ratio: String,
    target: String,
    met: &'static str,
}

impl Row {
    fn new(scenario: impl Into<String>, tollgate: impl Into<String>) -> Self {
        Self {
            scenario: scenario.into(),
            tollgate: tollgate.into(),
            peer: "—".into(),
            ratio: "—".into(),
            target: "—".into(),
            met: "—",
        }
    }

    fn peer(mut self, peer: impl Into<String>) -> Self {
        self.peer = peer.into();
        self
    }

    fn ratio(mut self, ratio: impl Into<String>) -> Self {
        self.ratio = ratio.into();
        self
    }

    fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = target.into();
        self.met = if met { "yes" } else { "no" };
        self
    }

    fn unmeasured_target(mut self, target: impl Into<String>) -> Self {
        self.target = target.into();
        self.met = "not measured";
        self
    }
}

fn results_dir() -> PathBuf {
    // Diagnostic runs with a recorder keep their rows apart from the published ones.
    let name = match std::env::var_os(PROMETHEUS) {
        Some(_) => "target/tollgate-bench-prometheus",
        None => "target/tollgate-bench",
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name);
    fs::create_dir_all(&dir).expect("results dir");
    dir
}

/// Writes a scenario's rows as `id <TAB> scenario <TAB> tollgate <TAB> peer <TAB> ratio
/// <TAB> target <TAB> met`, one per line, for `scripts/bench`.
fn write_rows(file: &str, rows: &[(impl AsRef<str>, Row)]) {
    let mut text = String::new();
    for (id, row) in rows {
        let id = id.as_ref();
        let _ = writeln!(
            text,
            "{id}\t{}\t{}\t{}\t{}\t{}\t{}",
            row.scenario, row.tollgate, row.peer, row.ratio, row.target, row.met
        );
        println!(
            "{id}: {} | tollgate {} | peer {} | ratio {} | target {} | met {}",
            row.scenario, row.tollgate, row.peer, row.ratio, row.target, row.met
        );
    }
    fs::write(results_dir().join(file), text).expect("write results");
}

/// Where criterion writes its estimates (as criterion itself decides, made explicit).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        PathBuf::from(home)
    } else if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        PathBuf::from(target).join("criterion")
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/criterion")
    }
}

/// Benchmarks that ran in this process, so that a filtered run never reads a figure left
/// over from an earlier one.
static RAN: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

fn ran(group: &str, id: &str) {
    RAN.lock().unwrap().insert(format!("{group}/{id}"));
}

/// The median time per iteration criterion estimated for `group/id`, in nanoseconds.
fn median_ns(group: &str, id: &str) -> Option<f64> {
    if !RAN.lock().unwrap().contains(&format!("{group}/{id}")) {
        return None;
    }
    let path = criterion_dir()
        .join(group)
        .join(id)
        .join("new/estimates.json");
    let text = fs::read_to_string(path).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(&text).ok()?;
    estimates["median"]["point_estimate"].as_f64()
}

/// Criterion's `--list` and `--test` modes measure nothing: skip the custom parts then.
fn measuring() -> bool {
    !std::env::args().any(|a| a == "--list" || a == "--test")
}

/// Whether the custom (non-criterion) parts of `group` should run: criterion's filter,
/// read as a plain substring, matches the group's name, or there is no filter.
fn wanted(group: &str) -> bool {
    const WITH_VALUE: &[&str] = &[
        "--color",
        "-c",
        "--save-baseline",
        "-s",
        "--baseline",
        "-b",
        "--baseline-lenient",
        "--format",
        "--profile-time",
        "--load-baseline",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
    ];
    let mut args = std::env::args().skip(1);
    let mut filter = None;
    while let Some(arg) = args.next() {
        if WITH_VALUE.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') {
            filter = Some(arg);
        }
    }
    measuring() && filter.is_none_or(|f| group.contains(f.as_str()) || f.contains(group))
}

fn ns(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0} ns")
    } else {
        format!("{value:.1} ns")
    }
}

fn per_sec(value: f64) -> String {
    let mut digits = format!("{value:.0}");
    let mut i = digits.len();
    while i > 3 {
        i -= 3;
        digits.insert(i, ',');
    }
    format!("{digits}/s")
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

// ---------------------------------------------------------------------------------------
// Shared helpers.
// ---------------------------------------------------------------------------------------

/// Takes the output of a future that is ready at once (every in-process decision is).
fn ready_now<F: Future + Unpin>(mut future: F) -> F::Output {
    match Pin::new(&mut future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a decision that should be ready at once was pending"),
    }
}

fn callers(n: usize) -> Arc<[Caller]> {
    (0..n)
        .map(|i| Caller::new(format!("customer-{i:07}")))
        .collect()
}

/// A token bucket no caller empties: tollgate's counterpart of governor's GCRA.
fn big_bucket() -> Policy {
    Policy::token_bucket("per-second", Quota::per_second(BIG), BIG)
}

/// A sliding window no caller fills (the algorithm of the orders example).
fn big_window() -> Policy {
    Policy::sliding_window("per-second", Quota::per_second(BIG))
}

fn governor_quota() -> governor::Quota {
    let big = NonZeroU32::new(BIG as u32).expect("non-zero");
    governor::Quota::per_second(big).allow_burst(big)
}

fn multi_thread_runtime(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// One thread decides for `items` in turn.
fn one_thread<T>(b: &mut Bencher<'_>, items: &[T], f: impl Fn(&T)) {
    let mut i = 0;
    b.iter(|| {
        f(&items[i]);
        i += 1;
        if i == items.len() {
            i = 0;
        }
    });
}

/// Two threads share the iterations, each starting half way into `items` from the other;
/// the time is the wall time of both, so it is the inverse of their joint throughput.
fn two_threads<T: Sync>(b: &mut Bencher<'_>, items: &[T], f: impl Fn(&T) + Sync) {
    b.iter_custom(|iters| {
        let per_thread = iters.div_ceil(2);
        let start = Instant::now();
        std::thread::scope(|scope| {
            for t in 0..2 {
                let f = &f;
                scope.spawn(move || {
                    let mut i = t * items.len() / 2;
                    for _ in 0..per_thread {
                        f(&items[i]);
                        i += 1;
                        if i == items.len() {
                            i = 0;
                        }
                    }
                });
            }
        });
        start.elapsed()
    });
}

// ---------------------------------------------------------------------------------------
// 1. In-process decision vs governor.
// ---------------------------------------------------------------------------------------

fn in_process(c: &mut Criterion) {
    const GROUP: &str = "in_process";
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    // Every sample the same length: the two-thread runs start their threads per sample.
    group.sampling_mode(SamplingMode::Flat);
    let mut rows = Vec::new();
    for (keys, key_label) in [(1, "1key"), (MANY_KEYS, "100k")] {
        let callers = callers(keys);
        let caller_keys: Vec<CallerKey> = callers.iter().map(|c| c.key().clone()).collect();
        for threads in [1, 2] {
            let suffix = format!("{key_label}_{threads}t");
            let limiter_id = format!("tollgate_limiter_{suffix}");
            let backend_id = format!("tollgate_backend_{suffix}");
            let governor_id = format!("governor_{suffix}");

            let limiter = Limiter::builder()
                .backend(InMemoryBackend::new())
                .policy(big_bucket())
                .build();
            let decide = |caller: &Caller| {
                black_box(ready_now(limiter.check(caller)));
            };
            group.bench_function(&limiter_id, |b| {
                ran(GROUP, &limiter_id);
                match threads {
                    1 => one_thread(b, &callers, decide),
                    _ => two_threads(b, &callers, decide),
                }
            });

            let backend = InMemoryBackend::new();
            let limits: Arc<[Policy]> = vec![big_bucket().clone()].into();
            let store = |caller: &Caller| {
                black_box(backend.check(caller.key(), &limits).try_take_ready());
            };
            group.bench_function(&backend_id, |b| {
                ran(GROUP, &backend_id);
                match threads {
                    1 => one_thread(b, &callers, store),
                    _ => two_threads(b, &callers, store),
                }
            });

            let governor = governor::RateLimiter::keyed(governor_quota());
            let check = |key: &CallerKey| {
                black_box(governor.check_key(key)).expect("admitted");
            };
            group.bench_function(&governor_id, |b| {
                ran(GROUP, &governor_id);
                match threads {
                    1 => one_thread(b, &caller_keys, check),
                    _ => two_threads(b, &caller_keys, check),
                }
            });

            let Some(peer) = median_ns(GROUP, &governor_id) else {
                continue;
            };
            let keys_text = if keys == 1 { "1 key" } else { "100,000 keys" };
            let threads_text = if threads == 1 {
                "1 thread"
            } else {
                "2 threads"
            };
            for (id, what) in [
                (&limiter_id, "`Limiter::check`"),
                (&backend_id, "`Backend::check`"),
            ] {
                let Some(ours) = median_ns(GROUP, id) else {
                    continue;
                };
                let ratio = ours / peer;
                rows.push((
                    format!("{GROUP}/{id}"),
                    Row::new(
                        format!("In-process decision, {keys_text}, {threads_text}: {what}"),
                        ns(ours),
                    )
                    .peer(format!("governor `check_key`: {}", ns(peer)))
                    .ratio(format!("{ratio:.2}x"))
                    .target("≤ 1.20x", ratio <= 1.2),
                ));
            }
        }
    }
    group.finish();
    if !rows.is_empty() {
        write_rows("in_process.tsv", &rows);
    }
}

// ---------------------------------------------------------------------------------------
// 2. The layer on an in-memory service vs tower_governor.
// ---------------------------------------------------------------------------------------

/// tower_governor's key extractor for the customer header, written as its docs suggest.
#[derive(Clone, Debug)]
struct CustomerHeader;

impl tower_governor::key_extractor::KeyExtractor for CustomerHeader {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, GovernorError> {
        request
            .headers()
            .get(&CUSTOMER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// Drives `service` with `ready().await` then `call` in a loop, callers in turn.
fn drive<S, B>(b: &mut Bencher<'_>, runtime: &Runtime, service: &S, customers: &Arc<[HeaderValue]>)
where
    S: Service<Request<()>, Response = Response<B>> + Clone + 'static,
    S::Error: std::fmt::Debug,
    B: 'static,
{
    b.to_async(runtime).iter_custom(|iters| {
        let mut service = service.clone();
        let customers = customers.clone();
        async move {
            let mut i = 0;
            let start = Instant::now();
            for _ in 0..iters {
                let mut request = Request::new(());
                request
                    .headers_mut()
                    .insert(CUSTOMER.clone(), customers[i].clone());
                i += 1;
                if i == customers.len() {
                    i = 0;
                }
                let response = service
                    .ready()
                    .await
                    .expect("ready")
                    .call(request)
                    .await
                    .expect("response");
                assert!(response.status().is_success());
                black_box(response);
            }
            start.elapsed()
        }
    });
}

fn layer(c: &mut Criterion) {
    const GROUP: &str = "layer";
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let customers: Arc<[HeaderValue]> = (0..CALLERS)
        .map(|i| HeaderValue::try_from(format!("customer-{i:05}")).expect("header value"))
        .collect();
    let orders = tower::service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Body::from("[]")))
    });
    let tollgate = |mode: HeaderMode| {
        let limiter = Limiter::builder()
            .backend(InMemoryBackend::new())
            .policy(big_bucket())
            .build();
        ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(limiter)
                    .key(HeaderKey::new("x-customer-id"))
                    .headers(mode),
            )
            .service(orders)
    };
    let governed = |builder: &mut GovernorConfigBuilder<_, _>| {
        builder
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .key_extractor(CustomerHeader)
    };

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    group.bench_function("bare", |b| {
        ran(GROUP, "bare");
        drive(b, &runtime, &orders, &customers)
    });
    let service = tollgate(HeaderMode::Always);
    group.bench_function("tollgate_headers", |b| {
        ran(GROUP, "tollgate_headers");
        drive(b, &runtime, &service, &customers)
    });
    let service = tollgate(HeaderMode::Never);
    group.bench_function("tollgate_no_headers", |b| {
        ran(GROUP, "tollgate_no_headers");
        drive(b, &runtime, &service, &customers)
    });
    let config = governed(&mut GovernorConfigBuilder::default())
        .use_headers()
        .finish()
        .expect("governor config");
    let service = ServiceBuilder::new()
        .layer(tower_governor::GovernorLayer::new(config))
        .service(orders);
    group.bench_function("tower_governor_headers", |b| {
        ran(GROUP, "tower_governor_headers");
        drive(b, &runtime, &service, &customers)
    });
    let config = governed(&mut GovernorConfigBuilder::default())
        .finish()
        .expect("governor config");
    let service = ServiceBuilder::new()
        .layer(tower_governor::GovernorLayer::new(config))
        .service(orders);
    group.bench_function("tower_governor_no_headers", |b| {
        ran(GROUP, "tower_governor_no_headers");
        drive(b, &runtime, &service, &customers)
    });
    group.finish();

    let get = |id| median_ns(GROUP, id);
    let mut rows = Vec::new();
    if let (Some(ours), Some(peer)) = (get("tollgate_headers"), get("tower_governor_headers")) {
        let ratio = ours / peer;
        rows.push((
            "layer/headers",
            Row::new(
                "Layer on an in-memory service, 10,000 callers, RateLimit headers on allowed responses (`HeaderMode::Always`)",
                format!("{}/request", ns(ours)),
            )
            .peer(format!(
                "tower_governor `.use_headers()`: {}/request",
                ns(peer)
            ))
            .ratio(format!("{ratio:.2}x"))
            .target("≤ 1.00x", ratio <= 1.0),
        ));
    }
    if let (Some(ours), Some(peer)) = (get("tollgate_no_headers"), get("tower_governor_no_headers"))
    {
        let ratio = ours / peer;
        rows.push((
            "layer/no_headers",
            Row::new(
                "Layer on an in-memory service, 10,000 callers, no headers (`HeaderMode::Never`)",
                format!("{}/request", ns(ours)),
            )
            .peer(format!(
                "tower_governor without headers: {}/request",
                ns(peer)
            ))
            .ratio(format!("{ratio:.2}x"))
            .target("≤ 1.50x", ratio <= 1.5),
        ));
    }
    if let (Some(ours), Some(bare)) = (get("tollgate_no_headers"), get("bare")) {
        let added = ours - bare;
        rows.push((
            "layer/overhead",
            Row::new(
                "Layer, no headers: time added to the bare service",
                format!("+{}/request", ns(added)),
            )
            .peer(format!("bare service: {}/request", ns(bare)))
            .ratio(format!("+{}", ns(added)))
            .target("≤ +300 ns", added <= 300.0),
        ));
    }
    if let (Some(ours), Some(bare), Some(peer)) = (
        get("tollgate_headers"),
        get("bare"),
        get("tower_governor_headers"),
    ) {
        rows.push((
            "layer/overhead_headers",
            Row::new(
                "Layer, RateLimit headers on: time added to the bare service",
                format!("+{}/request", ns(ours - bare)),
            )
            .peer(format!("tower_governor with headers: +{}", ns(peer - bare)))
            .ratio(format!("{:.2}x", (ours - bare) / (peer - bare))),
        ));
    }
    if !rows.is_empty() {
        write_rows("layer.tsv", &rows);
    }
}

// ---------------------------------------------------------------------------------------
// 3. Redis decisions per second vs redis-benchmark.
// ---------------------------------------------------------------------------------------

/// Redis decisions per second at 64 concurrent tasks, and `redis-benchmark -P 16` running
/// the same script against the same server.
fn redis_decisions(c: &mut Criterion) {
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

// ---------------------------------------------------------------------------------------
// 4. A frozen store: redis-server under SIGSTOP.
// ---------------------------------------------------------------------------------------

/// Rounds of "freeze the store, decide from 64 tasks until the breaker opens".
const FREEZE_ROUNDS: usize = 10;

/// Decides from 64 tasks while the breaker stays closed; returns every decision's latency.
async fn until_open(limiter: &Limiter, callers: &Arc<[Caller]>) -> Vec<Duration> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let tasks: Vec<_> = (0..TASKS as usize)
        .map(|t| {
            let limiter = limiter.clone();
            let callers = callers.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = t * 97;
                while limiter.breaker_state() == BreakerState::Closed {
                    assert!(Instant::now() < deadline, "the breaker never opened");
                    let start = Instant::now();
                    let decision = limiter.check(&callers[i % callers.len()]).await;
                    latencies.push(start.elapsed());
                    black_box(decision);
                    i += TASKS as usize;
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("task"));
    }
    all
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn frozen_store(c: &mut Criterion) {
    const GROUP: &str = "frozen_store";
    if !wanted(GROUP) {
        return;
    }
    let mut server = RedisServer::start();
    let runtime = multi_thread_runtime(2);
    let store = {
        let _guard = runtime.enter();
        RedisBackend::builder(server.url())
            .build()
            .expect("backend")
    };
    runtime.block_on(store.ping()).expect("redis answers");
    let callers = callers(CALLERS);
    let build = |name: &str, policy: FailurePolicy| {
        let _guard = runtime.enter();
        Limiter::builder()
            .name(name)
            .backend(store.clone())
            .store_timeout(STORE_TIMEOUT)
            .policy(big_window())
            .on_store_failure(policy)
            .build()
    };
    let local_share = || FailurePolicy::local_share(InstanceCount::fixed(1));

    // Until the breaker opens: fresh limiters (fresh breakers) on one connection.
    let mut latencies = Vec::new();
    for round in 0..FREEZE_ROUNDS {
        let limiter = build(&format!("freeze-{round}"), local_share());
        runtime.block_on(async {
            for caller in callers.iter().take(TASKS as usize) {
                let decision = limiter.check(caller).await;
                assert!(
                    matches!(&decision, Decision::Allowed(info) if info.source() == DecisionSource::Store),
                    "{decision:?}"
                );
            }
        });
        server.pause();
        latencies.extend(runtime.block_on(until_open(&limiter, &callers)));
        server.resume();
    }
    latencies.sort();
    let p50 = percentile(&latencies, 0.5);
    let p99 = percentile(&latencies, 0.99);
    let max = *latencies.last().expect("latencies");
    let bound = STORE_TIMEOUT + Duration::from_millis(5);
    println!(
        "frozen store: {} decisions until the breaker opened, p50 {p50:?}, p99 {p99:?}, max {max:?}",
        latencies.len()
    );

    // After it opens: the store stays frozen, the breaker open.
    server.pause();
    let share = build("frozen-local-share", local_share());
    let open = build("frozen-open", FailurePolicy::open());
    for limiter in [&share, &open] {
        runtime.block_on(until_open(limiter, &callers));
    }
    let Decision::Allowed(info) = runtime.block_on(share.check(&callers[0])) else {
        panic!("the local share refused")
    };
    assert_eq!(info.source(), DecisionSource::LocalShare);
    let in_process = Limiter::builder()
        .backend(InMemoryBackend::new())
        .policy(big_window())
        .build();

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    for (id, limiter) in [
        ("breaker_open_local_share", &share),
        ("breaker_open_fail_open", &open),
        ("in_process_backend", &in_process),
    ] {
        group.bench_function(id, |b| {
            ran(GROUP, id);
            // One loop per sample: what is timed is the decisions, not the runtime's
            // entry per iteration.
            b.to_async(&runtime).iter_custom(|iters| {
                let limiter = limiter.clone();
                let callers = callers.clone();
                async move {
                    let mut i = 0;
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(limiter.check(&callers[i]).await);
                        i += 1;
                        if i == callers.len() {
                            i = 0;
                        }
                    }
                    start.elapsed()
                }
            });
        });
    }
    group.finish();
    assert_ne!(share.breaker_state(), BreakerState::Closed);
    server.resume();

    let mut rows = vec![(
        "frozen_store/p99",
        Row::new(
            "Frozen store (SIGSTOP), 64 tasks: p99 decision latency until the breaker opens (store timeout 20 ms)",
            format!(
                "p99 {} (p50 {}, max {}, {} decisions)",
                ms(p99),
                ms(p50),
                ms(max),
                latencies.len()
            ),
        )
        .peer("tower-rate-limiter: cannot be built on Rust 1.95")
        .target(format!("≤ {} (timeout + 5 ms)", ms(bound)), p99 <= bound),
    )];
    let get = |id| median_ns(GROUP, id);
    if let (Some(base), Some(ours)) = (get("in_process_backend"), get("breaker_open_local_share")) {
        let ratio = base / ours;
        rows.push((
            "frozen_store/local_share",
            Row::new(
                "Frozen store, breaker open, fail to the local share: decisions/s",
                per_sec(1e9 / ours),
            )
            .peer(format!("in-process backend: {}", per_sec(1e9 / base)))
            .ratio(format!("{ratio:.2}x"))
            .target("≥ 0.90x", ratio >= 0.9),
        ));
    }
    if let (Some(base), Some(ours)) = (get("in_process_backend"), get("breaker_open_fail_open")) {
        let ratio = base / ours;
        rows.push((
            "frozen_store/fail_open",
            Row::new(
                "Frozen store, breaker open, fail open: decisions/s",
                per_sec(1e9 / ours),
            )
            .peer(format!("in-process backend: {}", per_sec(1e9 / base)))
            .ratio(format!("{ratio:.2}x"))
            .target("≥ 0.90x", ratio >= 0.9),
        ));
    }
    write_rows("frozen_store.tsv", &rows);
}

// ---------------------------------------------------------------------------------------
// 5. The denial cache.
// ---------------------------------------------------------------------------------------

/// The in-process store dressed as a remote one, so the limiter puts its denial cache in
/// front of it (as tests/it/denial_cache.rs does).
#[derive(Clone, Debug)]
struct Remote(InMemoryBackend);

impl Backend for Remote {
    fn check(&self, caller: &CallerKey, limits: &Arc<[Policy]>) -> CheckFuture {
        self.0.check(caller, limits)
    }
}

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
        let store = Counting::new(Remote(
            InMemoryBackend::builder().clock(clock.clone()).build(),
        ));
        let calls = store.counter();
        let limiter = Limiter::builder()
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

fn denial_cache(c: &mut Criterion) {
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

// ---------------------------------------------------------------------------------------
// 7. Memory per tracked key.
// ---------------------------------------------------------------------------------------

/// The resident set size of this process, from /proc/self/status.
fn rss_bytes() -> u64 {
    let status = fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmRSS")
        * 1024
}

/// In a fresh child process: tracks 1,000,000 keys and prints the RSS growth per key.
fn measure_memory(which: &str) {
    let key = |i: usize| format!("customer-{i:010}");
    let (before, after, tracked) = match which {
        "tollgate" => {
            // A cap above the key count, so that all of them stay tracked.
            let backend = InMemoryBackend::builder().max_keys(2 * MEMORY_KEYS).build();
            let limiter = Limiter::builder()
                .backend(backend.clone())
                .policy(Policy::sliding_window(
                    "per-minute",
                    Quota::per_minute(1_000),
                ))
                .build();
            let before = rss_bytes();
            for i in 0..MEMORY_KEYS {
                assert!(ready_now(limiter.check(&Caller::new(key(i)))).is_allowed());
            }
            (before, rss_bytes(), backend.tracked_keys())
        }
        "governor" => {
            let quota = governor::Quota::per_minute(NonZeroU32::new(1_000).expect("non-zero"));
            let limiter = governor::RateLimiter::keyed(quota);
            let before = rss_bytes();
            for i in 0..MEMORY_KEYS {
                limiter.check_key(&key(i)).expect("admitted");
            }
            (before, rss_bytes(), limiter.len())
        }
        other => panic!("unknown memory measurement {other}"),
    };
    println!(
        "{}\t{tracked}",
        after.saturating_sub(before) as f64 / tracked as f64
    );
}

fn memory_child(which: &str) -> (f64, usize) {
    let exe = std::env::current_exe().expect("the bench binary");
    let output = Command::new(exe)
        .env(MEMORY_CHILD, which)
        .output()
        .expect("run the memory child");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "memory child {which} failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut fields = text.trim().split('\t');
    let bytes = fields.next().and_then(|f| f.parse().ok());
    let tracked = fields.next().and_then(|f| f.parse().ok());
    bytes
        .zip(tracked)
        .unwrap_or_else(|| panic!("unexpected memory child output: {text}"))
}

fn memory(_c: &mut Criterion) {
    if !wanted("memory") {
        return;
    }
    let (ours, tracked) = memory_child("tollgate");
    let (peer, peer_tracked) = memory_child("governor");
    write_rows(
        "memory.tsv",
        &[(
            "memory/bytes_per_key",
            Row::new(
                "Memory: bytes per tracked key, in-process backend at 1,000,000 keys (RSS growth)",
                format!("{ours:.0} B ({tracked} keys tracked)"),
            )
            .peer(format!(
                "governor keyed (String keys): {peer:.0} B ({peer_tracked} keys)"
            ))
            .ratio(format!("{:.2}x", ours / peer))
            .target("≤ 128 B", ours <= 128.0),
        )],
    );
}
