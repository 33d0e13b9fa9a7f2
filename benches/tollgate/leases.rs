//! Group `leases`: a hot caller decided from leases of its quota on a redis-server, beside
//! the per-request Redis path in the same run: throughput over 4 instances at 64 tasks,
//! store calls per request, p99 decision time beside the in-process backend, and accuracy
//! and fairness under steady overload.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use tollgate::decision::DecisionSource;
use tollgate::{
    Caller, Decision, InMemoryBackend, InstanceCount, Leases, Limiter, Policy, Quota, RedisBackend,
};
use tollgate_testkit::counting::Counting;
use tollgate_testkit::redis::RedisServer;

use crate::report::{Row, median, ns, per_sec, write_rows};
use crate::support::{SLOW_TEST_MACHINE, TASKS, big_window, multi_thread_runtime, wanted};

const INSTANCES: u64 = 4;
const ACCURACY: f64 = 0.037;
const THROUGHPUT_RUN: Duration = Duration::from_secs(3);
const OVERLOAD_SECONDS: u64 = 6;

fn leases() -> Leases {
    Leases::new()
        .threshold_per_sec(20)
        .period(Duration::from_millis(100))
        .instances(InstanceCount::fixed(INSTANCES))
}

/// `INSTANCES` limiters on `url`, each with its own connection, and the handles that count
/// their store calls (decisions and leases).
fn instances(
    url: &str,
    prefix: &str,
    policies: &[Policy],
    leased: bool,
) -> (Vec<Limiter>, Vec<Arc<AtomicU64>>) {
    (0..INSTANCES)
        .map(|_| {
            let store = Counting::new(
                RedisBackend::builder(url)
                    .prefix(prefix)
                    .response_timeout(SLOW_TEST_MACHINE)
                    .build()
                    .expect("backend"),
            );
            let calls = store.counter();
            let mut builder = Limiter::builder()
                .name("leases")
                .backend(store)
                .store_timeout(SLOW_TEST_MACHINE);
            for policy in policies {
                builder = builder.policy(policy.clone());
            }
            if leased {
                builder = builder.leases(leases());
            }
            (builder.build(), calls)
        })
        .unzip()
}

fn total(calls: &[Arc<AtomicU64>]) -> u64 {
    calls.iter().map(|c| c.load(Ordering::SeqCst)).sum()
}

/// One hot caller over the instances from `TASKS` tasks for `THROUGHPUT_RUN`: decisions
/// per second, and store calls per decision.
async fn hot_caller_rate(limiters: &[Limiter], calls: &[Arc<AtomicU64>]) -> (f64, f64) {
    let decisions = Arc::new(AtomicU64::new(0));
    let before = total(calls);
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let limiter = limiters[(t % INSTANCES) as usize].clone();
            let decisions = decisions.clone();
            tokio::spawn(async move {
                let acme = Caller::new("acme");
                while started.elapsed() < THROUGHPUT_RUN {
                    let decision = limiter.check(&acme).await;
                    assert!(decision.is_allowed(), "{decision:?}");
                    decisions.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let decisions = decisions.load(Ordering::SeqCst) as f64;
    let calls = (total(calls) - before) as f64;
    (decisions / elapsed, calls / decisions)
}

/// Rounds of the latency comparison, the two limiters in turn.
const LATENCY_ROUNDS: usize = 5;

/// Decisions per limiter and round of the latency comparison.
const LATENCY_DECISIONS: usize = 40_000;

/// Warms `limiter` for the latency comparison: connections made, the caller hot and leased.
async fn warm(limiter: &Limiter) {
    let acme = Caller::new("acme");
    for _ in 0..2_000 {
        limiter.check(&acme).await;
    }
}

/// The 99th percentile of `rounds` decisions of one caller made one after another.
async fn p99(limiter: &Limiter, rounds: usize) -> Duration {
    let acme = Caller::new("acme");
    let mut times: Vec<Duration> = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let decision = limiter.check(&acme).await;
        times.push(start.elapsed());
        assert!(decision.is_allowed(), "{decision:?}");
    }
    times.sort_unstable();
    times[rounds * 99 / 100]
}

/// What one caller saw in the overload run.
#[derive(Default)]
struct Seen {
    /// When the store counted each admission (its clock, ms).
    counted: Vec<u64>,
    requests: u64,
    from_store: u64,
}

/// `caller` at `per_sec` over all instances (spread evenly) for `OVERLOAD_SECONDS`.
async fn paced(limiters: &[Limiter], caller: &'static str, per_sec: u64) -> Seen {
    let started = Instant::now();
    let every = Duration::from_nanos(1_000_000_000 * INSTANCES / per_sec);
    let tasks: Vec<_> = limiters
        .iter()
        .cloned()
        .map(|limiter| {
            tokio::spawn(async move {
                let who = Caller::new(caller);
                let mut seen = Seen::default();
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while started.elapsed() < Duration::from_secs(OVERLOAD_SECONDS) {
                    ticks.tick().await;
                    seen.requests += 1;
                    let decision = limiter.check(&who).await;
                    if let Decision::Allowed(info) = &decision {
                        seen.counted.extend(info.counted_at_ms());
                        seen.from_store += u64::from(info.source() == DecisionSource::Store);
                    } else {
                        assert!(matches!(decision, Decision::Limited(_)), "{decision:?}");
                    }
                }
                seen
            })
        })
        .collect();
    let mut all = Seen::default();
    for task in tasks {
        let seen = task.await.expect("task");
        all.counted.extend(seen.counted);
        all.requests += seen.requests;
        all.from_store += seen.from_store;
    }
    all
}

/// The worst whole window's admissions against `limit` per second: (most under the limit
/// as a fraction, most admitted in a window).
fn worst_window(counted: &[u64], limit: u64) -> (f64, u64) {
    let first = counted.iter().min().copied().unwrap_or(0) / 1_000 + 1;
    let last = counted.iter().max().copied().unwrap_or(0) / 1_000;
    let mut worst = (0.0f64, 0);
    for window in first..last {
        let admitted = counted.iter().filter(|t| **t / 1_000 == window).count() as u64;
        let under = limit.saturating_sub(admitted) as f64 / limit as f64;
        worst = (worst.0.max(under), worst.1.max(admitted));
    }
    worst
}

pub(crate) fn bench(_c: &mut Criterion) {
    const GROUP: &str = "leases";
    if !wanted(GROUP) {
        return;
    }
    let server = RedisServer::start();
    let runtime = multi_thread_runtime(1);
    let mut rows = Vec::new();

    // Throughput and store calls: the same hot caller, leased and per request.
    let (leased_rate, leased_calls, plain_rate) = runtime.block_on(async {
        let (leased, leased_calls) = instances(&server.url(), "leased", &[big_window()], true);
        let (plain, plain_calls) = instances(&server.url(), "plain", &[big_window()], false);
        let (leased_rate, leased_calls) = hot_caller_rate(&leased, &leased_calls).await;
        let (plain_rate, _) = hot_caller_rate(&plain, &plain_calls).await;
        (leased_rate, leased_calls, plain_rate)
    });
    let ratio = leased_rate / plain_rate;
    rows.push((
        "leases/throughput",
        Row::new(
            "Leases: one hot caller over 4 limiter instances on one redis-server, 64 tasks: decisions/s",
            per_sec(leased_rate),
        )
        .peer(format!("per-request Redis path, same run: {}", per_sec(plain_rate)))
        .ratio(format!("{ratio:.2}x"))
        .target("≥ 5x", ratio >= 5.0),
    ));
    rows.push((
        "leases/store_calls",
        Row::new(
            "Leases: store calls (leases and decisions) per hot-caller request, same run",
            format!("{leased_calls:.4}"),
        )
        .peer("per-request Redis path: 1")
        .target("≤ 0.1", leased_calls <= 0.1),
    ));

    // Latency: a leased caller beside the in-process backend, in alternated rounds (a p99
    // on a shared machine moves from run to run): the medians of the rounds' p99s, and the
    // median of the rounds' ratios.
    let rounds = runtime.block_on(async {
        let (leased, _) = instances(&server.url(), "latency", &[big_window()], true);
        let local = Limiter::builder()
            .name("leases")
            .backend(InMemoryBackend::new())
            .policy(big_window())
            .build();
        warm(&leased[0]).await;
        warm(&local).await;
        let mut rounds = Vec::with_capacity(LATENCY_ROUNDS);
        for _ in 0..LATENCY_ROUNDS {
            let leased = p99(&leased[0], LATENCY_DECISIONS).await;
            let local = p99(&local, LATENCY_DECISIONS).await;
            rounds.push((leased, local));
        }
        rounds
    });
    let rounds_median = |values: Vec<f64>| median(values).expect("at least one round");
    let leased_p99 = rounds_median(rounds.iter().map(|r| r.0.as_nanos() as f64).collect());
    let local_p99 = rounds_median(rounds.iter().map(|r| r.1.as_nanos() as f64).collect());
    let latency_ratio = rounds_median(
        rounds
            .iter()
            .map(|(leased, local)| leased.as_secs_f64() / local.as_secs_f64())
            .collect(),
    );
    rows.push((
        "leases/p99",
        Row::new(
            "Leases: p99 decision time of a leased caller on redis-server, one task, 5 alternated rounds of 40,000 (p99s: medians; ratio: the median of the rounds' ratios)",
            ns(leased_p99),
        )
        .peer(format!("the in-process backend: {}", ns(local_p99)))
        .ratio(format!("{latency_ratio:.2}x"))
        .target("≤ 2x", latency_ratio <= 2.0),
    ));

    // Accuracy and fairness: acme and globex at 2.4x their limit, initech cold.
    const LIMIT: u64 = 250;
    let (acme, globex, initech) = runtime.block_on(async {
        let window = [Policy::sliding_window(
            "per-second",
            Quota::per_second(LIMIT),
        )];
        let (limiters, _) = instances(&server.url(), "overload", &window, true);
        tokio::join!(
            paced(&limiters, "acme", LIMIT * 24 / 10),
            paced(&limiters, "globex", LIMIT * 24 / 10),
            paced(&limiters, "initech", 8),
        )
    });
    let (acme_under, acme_most) = worst_window(&acme.counted, LIMIT);
    let (globex_under, globex_most) = worst_window(&globex.counted, LIMIT);
    let accurate = acme_under <= ACCURACY && acme_most <= LIMIT;
    rows.push((
        "leases/accuracy",
        Row::new(
            "Leases: acme at 2.4x its limit (600 req/s vs 250/s) over 4 instances for 6 s: worst whole window",
            format!(
                "{:.2}% under the limit, at most {acme_most} of {LIMIT} admitted in a window",
                acme_under * 100.0
            ),
        )
        .target("within 3.7%, never above", accurate),
    ));
    let cold_trips = initech.from_store as f64 / initech.requests as f64;
    let fair = accurate
        && globex_under <= ACCURACY
        && globex_most <= LIMIT
        && initech.counted.len() as u64 == initech.requests
        && cold_trips == 1.0;
    rows.push((
        "leases/fairness",
        Row::new(
            "Leases: two hot callers at 2.4x and a cold one (8 req/s), same run: worst window of each hot caller; the cold caller's store round trips per request",
            format!(
                "acme {:.2}% under, globex {:.2}% under (at most {globex_most} of {LIMIT}); initech {} of {} admitted, {cold_trips:.2} round trips per request",
                acme_under * 100.0,
                globex_under * 100.0,
                initech.counted.len(),
                initech.requests
            ),
        )
        .target("each within 3.7%; cold: 1 round trip", fair),
    ));
    write_rows("leases.tsv", &rows);
}
