//! Group `frozen_store`: redis-server under SIGSTOP: latency until the breaker opens, then
//! throughput with the breaker open vs the in-process backend.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tollgate::decision::{BreakerState, DecisionSource};
use tollgate::{
    Caller, Decision, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota,
    RedisBackend,
};
use tollgate_testkit::redis::RedisServer;

use crate::report::{Row, ms, per_sec, write_rows};
use crate::support::wanted;
use crate::support::{
    CALLERS, TASKS, big_window, callers, check_in_turn, in_rounds, multi_thread_runtime,
};

/// The store timeout of the frozen-store scenario (the limiter's default).
const STORE_TIMEOUT: Duration = Duration::from_millis(20);

/// A sliding window the in-process store decides by one compare-and-swap (a count that
/// packs in one word), which no caller of this bench fills: its 10,000 callers take
/// turns, each a few hundred requests a second.
fn packed_window() -> Policy {
    Policy::sliding_window("per-second", Quota::per_second(100_000))
}

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

pub(crate) fn bench(c: &mut Criterion) {
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
    let build_with = |name: &str, policy: FailurePolicy, limit: Policy| {
        let _guard = runtime.enter();
        Limiter::builder()
            .name(name)
            .backend(store.clone())
            .store_timeout(STORE_TIMEOUT)
            .policy(limit)
            .on_store_failure(policy)
            .build()
    };
    let build = |name: &str, policy: FailurePolicy| build_with(name, policy, big_window());
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
    let packed_share = build_with("frozen-packed-share", local_share(), packed_window());
    for limiter in [&share, &open, &packed_share] {
        runtime.block_on(until_open(limiter, &callers));
    }
    let Decision::Allowed(info) = runtime.block_on(share.check(&callers[0])) else {
        panic!("the local share refused")
    };
    assert_eq!(info.source(), DecisionSource::LocalShare);
    let in_process_with = |limit: Policy| {
        Limiter::builder()
            .name("frozen-store")
            .backend(InMemoryBackend::new())
            .policy(limit)
            .build()
    };
    let in_process = in_process_with(big_window());
    let packed_in_process = in_process_with(packed_window());

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    let limiters = [
        ("breaker_open_local_share", &share),
        ("breaker_open_fail_open", &open),
        ("in_process_backend", &in_process),
        ("packed_breaker_open_local_share", &packed_share),
        ("packed_in_process_backend", &packed_in_process),
    ];
    let names = limiters.map(|(name, _)| name);
    let rounds = in_rounds(&mut group, GROUP, &names, |b, name| {
        let Some(&(_, limiter)) = limiters.iter().find(|(named, _)| *named == name) else {
            unreachable!("{name} is one of the limiters");
        };
        // One loop per sample: what is timed is the decisions, not the runtime's entry per
        // iteration.
        b.to_async(&runtime).iter_custom(|iters| {
            let limiter = limiter.clone();
            let callers = callers.clone();
            async move { check_in_turn(&limiter, &callers, 0, iters).await.0 }
        });
    });
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
        .peer("tower-rate-limiter: see its frozen-store row")
        .target(format!("≤ {} (timeout + 5 ms)", ms(bound)), p99 <= bound),
    )];
    for (row_id, id, base_id, what) in [
        (
            "frozen_store/local_share",
            "breaker_open_local_share",
            "in_process_backend",
            "fail to the local share",
        ),
        (
            "frozen_store/fail_open",
            "breaker_open_fail_open",
            "in_process_backend",
            "fail open",
        ),
        (
            "frozen_store/packed_local_share",
            "packed_breaker_open_local_share",
            "packed_in_process_backend",
            "fail to the local share, a window of 100,000 a second (one compare-and-swap, on both sides)",
        ),
    ] {
        // Decisions per second: the base's time over ours.
        let (Some(base), Some(ours), Some(ratio)) = (
            rounds.time(base_id),
            rounds.time(id),
            rounds.ratio(base_id, id),
        ) else {
            continue;
        };
        rows.push((
            row_id,
            Row::new(
                format!("Frozen store, breaker open, {what}: decisions/s"),
                per_sec(1e9 / ours),
            )
            .peer(format!("in-process backend: {}", per_sec(1e9 / base)))
            .ratio(format!("{ratio:.2}x"))
            .target("≥ 0.95x", ratio >= 0.95),
        ));
    }
    write_rows("frozen_store.tsv", &rows);
}
