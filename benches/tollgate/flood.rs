//! Group `flood`: a decision's cost while distinct callers keep arriving, beside the same
//! limiter deciding for 100,000 callers it has seen, with a local share configured (so the
//! limiter keeps each caller's last answer from the store, where its share would start).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput};
use tollgate::{Caller, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota};
use tollgate_testkit::remote::Remote;

use crate::memory::rss_bytes;
use crate::report::{Row, median_ns, ns, ran, write_rows};
use crate::support::{check_in_turn, multi_thread_runtime, wanted};

const SEEN: usize = 100_000;
const ARRIVING: usize = 1_000_000;

/// A limiter in front of an in-process store dressed as a remote one, with a per-day
/// window (an answer kept for two days: none expires during the run) and a local share.
fn limiter(name: &str) -> Limiter {
    Limiter::builder()
        .name(name)
        .backend(Remote::new(InMemoryBackend::new().max_keys(2 * SEEN)))
        .policy(Policy::sliding_window("per-day", Quota::per_day(1_000_000)))
        .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(4)))
        .build()
}

fn named(prefix: &str, n: usize) -> Arc<[Caller]> {
    (0..n)
        .map(|i| Caller::new(format!("{prefix}-{i:07}")))
        .collect()
}

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "flood";
    if !wanted(GROUP) {
        return;
    }
    let runtime = multi_thread_runtime(1);
    let seen = named("customer", SEEN);
    let arriving = named("flood", ARRIVING);
    // Both limiters have kept the last answers of 100,000 callers (the store of answers
    // is full); the flooded one then meets a million callers it has never seen.
    let steady = limiter("flood-steady");
    let flooded = limiter("flood-arriving");
    runtime.block_on(async {
        for caller in seen.iter() {
            black_box(steady.check(caller).await);
            black_box(flooded.check(caller).await);
        }
    });
    let rss_before = rss_bytes();

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    for (id, limiter, callers) in [
        ("seen_100k", &steady, &seen),
        ("arriving_1m", &flooded, &arriving),
    ] {
        group.bench_function(id, |b| {
            ran(GROUP, id);
            b.to_async(&runtime).iter_custom(|iters| {
                let limiter = limiter.clone();
                let callers = callers.clone();
                async move {
                    // Where the last sample stopped: arriving callers stay new for a
                    // million decisions.
                    static NEXT: std::sync::atomic::AtomicUsize =
                        std::sync::atomic::AtomicUsize::new(0);
                    let from = NEXT.load(std::sync::atomic::Ordering::Relaxed);
                    let (elapsed, next) = check_in_turn(&limiter, &callers, from, iters).await;
                    NEXT.store(next, std::sync::atomic::Ordering::Relaxed);
                    elapsed
                }
            });
        });
    }
    group.finish();
    let grown = rss_bytes().saturating_sub(rss_before);
    let (Some(base), Some(flood)) = (
        median_ns(GROUP, "seen_100k"),
        median_ns(GROUP, "arriving_1m"),
    ) else {
        return;
    };
    let ratio = flood / base;
    let rows = vec![(
        "flood/arriving_1m",
        Row::new(
            "A flood of distinct callers, a local share configured: `Limiter::check` while 1,000,000 callers never seen arrive (answers of 100,000 already kept)",
            format!(
                "{} (RSS +{:.1} MiB over the flood)",
                ns(flood),
                grown as f64 / (1024.0 * 1024.0)
            ),
        )
        .peer(format!("the same limiter, 100,000 callers seen before: {}", ns(base)))
        .ratio(format!("{ratio:.2}x"))
        .target("≤ 1.5x", ratio <= 1.5),
    )];
    write_rows("flood.tsv", &rows);
}
