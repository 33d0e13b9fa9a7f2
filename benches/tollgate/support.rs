//! Helpers more than one scenario uses: the criterion settings, the callers, the policies
//! no caller reaches, the runtimes, the layer driver, the comparisons in alternated rounds,
//! the sizes the scenarios share, and the scripts a redis-server has run.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use std::hint::black_box;
use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::{Bencher, BenchmarkGroup, Criterion};
use http::{HeaderName, HeaderValue, Request, Response};
use tokio::runtime::Runtime;
use tollgate::{Caller, Limiter, Policy, Quota};
use tollgate_testkit::redis::RedisServer;
use tower::{Service, ServiceExt};

/// Rounds of a comparison made in short alternated rounds ([`in_rounds`]). Nine, because a
/// row that reads thousands of callers' entries can run 1.6x slower for a few seconds on a
/// shared machine and then recover: a median of five can still land on a slow round.
const ROUNDS: usize = 9;

/// Criterion's warm-up in each of those rounds.
const ROUND_WARM_UP: Duration = Duration::from_millis(300);

/// Criterion's measurement in each of those rounds.
const ROUND_MEASUREMENT: Duration = Duration::from_secs(1);

/// Criterion's warm-up for every other benchmark.
const WARM_UP: Duration = Duration::from_secs(1);

/// Criterion's measurement for every other benchmark.
const MEASUREMENT: Duration = Duration::from_secs(3);

/// A quota no caller reaches in a benchmark: every decision admits and writes.
pub(crate) const BIG: u64 = 1_000_000_000;

/// The Redis benches measure the store, not fallbacks: a store timeout no healthy server
/// reaches, so every request is decided by Redis.
pub(crate) const SLOW_TEST_MACHINE: Duration = Duration::from_secs(5);

/// Concurrent tasks in the Redis and frozen-store scenarios.
pub(crate) const TASKS: u64 = 64;

/// Callers named in turn by the layer, Redis and frozen-store scenarios.
pub(crate) const CALLERS: usize = 10_000;

/// Takes the output of a future that is ready at once (every in-process decision is).
pub(crate) fn ready_now<F: Future + Unpin>(mut future: F) -> F::Output {
    match Pin::new(&mut future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a decision that should be ready at once was pending"),
    }
}

/// `n` callers, `customer-0000000` on.
pub(crate) fn callers(n: usize) -> Arc<[Caller]> {
    (0..n)
        .map(|i| Caller::new(format!("customer-{i:07}")))
        .collect()
}

/// A token bucket no caller empties: tollgate's counterpart of governor's GCRA.
pub(crate) fn big_bucket() -> Policy {
    Policy::token_bucket("per-second", Quota::per_second(BIG), BIG)
}

/// A sliding window no caller fills (the algorithm of the orders example).
pub(crate) fn big_window() -> Policy {
    Policy::sliding_window("per-second", Quota::per_second(BIG))
}

/// A multi-thread Tokio runtime with `workers` worker threads and every driver on.
pub(crate) fn multi_thread_runtime(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Criterion's `--list` and `--test` modes measure nothing: skip the custom parts then.
pub(crate) fn measuring() -> bool {
    !std::env::args().any(|a| a == "--list" || a == "--test")
}

/// Whether the custom (non-criterion) parts of `group` should run: criterion's filter,
/// read as a plain substring, matches the group's name, or there is no filter.
pub(crate) fn wanted(group: &str) -> bool {
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

/// The header that names the caller in the layer scenarios.
pub(crate) static CUSTOMER: HeaderName = HeaderName::from_static("x-customer-id");

/// A current-thread runtime for the layer scenarios, and the header values naming their
/// 10,000 callers.
pub(crate) fn layer_setup() -> (Runtime, Arc<[HeaderValue]>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let customers = (0..CALLERS)
        .map(|i| HeaderValue::try_from(format!("customer-{i:05}")).expect("header value"))
        .collect();
    (runtime, customers)
}

/// Drives `service` with `ready().await` then `call` in a loop, callers in turn.
pub(crate) fn drive<S, B>(
    b: &mut Bencher<'_>,
    runtime: &Runtime,
    service: &S,
    customers: &Arc<[HeaderValue]>,
) where
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

/// Decides `iters` requests of `callers` in turn on `limiter`, from the caller at `from`:
/// the time they took, and the caller the next sample starts from.
pub(crate) async fn check_in_turn(
    limiter: &Limiter,
    callers: &[Caller],
    from: usize,
    iters: u64,
) -> (Duration, usize) {
    let mut i = from % callers.len();
    let start = Instant::now();
    for _ in 0..iters {
        black_box(limiter.check(&callers[i]).await);
        i += 1;
        if i == callers.len() {
            i = 0;
        }
    }
    (start.elapsed(), i)
}

/// Every group's settings; command-line options override them.
pub(crate) fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(50)
        .nresamples(20_000)
        .output_directory(&crate::report::criterion_dir())
}

/// Scripts run by a redis-server so far (`EVALSHA` and `EVAL`).
pub(crate) fn scripts_run(server: &RedisServer) -> u64 {
    let stats = server.must(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            line.split([':', ','])
                .find_map(|field| field.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Each round's median times by name, of a comparison measured by [`in_rounds`].
pub(crate) struct Rounds<'n>(Vec<HashMap<&'n str, f64>>);

impl Rounds<'_> {
    /// The median over the rounds of what `of_round` makes of each round's times.
    pub(crate) fn median_of(
        &self,
        of_round: impl Fn(&HashMap<&str, f64>) -> Option<f64>,
    ) -> Option<f64> {
        crate::report::median(self.0.iter().filter_map(of_round))
    }

    /// The median of `name`'s times.
    pub(crate) fn time(&self, name: &str) -> Option<f64> {
        self.median_of(|round| round.get(name).copied())
    }

    /// The median of the rounds' ratios of `name`'s time to `other`'s.
    pub(crate) fn ratio(&self, name: &str, other: &str) -> Option<f64> {
        self.median_of(|round| Some(round.get(name)? / round.get(other)?))
    }
}

/// Measures each of `names` with `bench` in short rounds, the order turned by one each
/// round (criterion ids `<name>_r<round>` in `group`, named `group_name`): the machine's
/// speed drifts within a minute, and a row measured once, up to a minute after its peer,
/// carries that drift into its ratio. The group keeps the usual times for what follows.
pub(crate) fn in_rounds<'n>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    group_name: &str,
    names: &[&'n str],
    mut bench: impl FnMut(&mut Bencher<'_>, &'n str),
) -> Rounds<'n> {
    group
        .warm_up_time(ROUND_WARM_UP)
        .measurement_time(ROUND_MEASUREMENT);
    let mut rounds = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let mut times = HashMap::new();
        for turn in 0..names.len() {
            let name = names[(turn + round) % names.len()];
            let id = format!("{name}_r{round}");
            group.bench_function(&id, |b| {
                crate::report::ran(group_name, &id);
                bench(b, name);
            });
            if let Some(time) = crate::report::median_ns(group_name, &id) {
                times.insert(name, time);
            }
        }
        rounds.push(times);
    }
    group.warm_up_time(WARM_UP).measurement_time(MEASUREMENT);
    Rounds(rounds)
}
