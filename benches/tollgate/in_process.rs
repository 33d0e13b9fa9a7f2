//! Group `in_process`: `Limiter::check` and `Backend::check` on the in-process backend vs
//! governor's keyed `check_key`, at 1 key and at 100,000 keys, on one and two threads; and
//! one admitted decision of each counting algorithm at a steady full window, the sliding log
//! beside the sliding window counter.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Bencher, Criterion, SamplingMode, Throughput};
use tollgate::store::{Backend, CallerKey, ManualClock};
use tollgate::{Caller, InMemoryBackend, Limiter, Policy, Quota};

use crate::report::{Row, median_ns, ns, ran, write_rows};
use crate::support::{BIG, big_bucket, callers, in_rounds, ready_now};

const MANY_KEYS: usize = 100_000;

/// governor's counterpart of [`big_bucket`]: a GCRA no caller empties.
fn governor_quota() -> governor::Quota {
    let big = NonZeroU32::new(BIG as u32).expect("non-zero");
    governor::Quota::per_second(big).allow_burst(big)
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

pub(crate) fn bench(c: &mut Criterion) {
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
                .name("in-process")
                .backend(InMemoryBackend::new())
                .policy(big_bucket())
                .build();
            let decide = |caller: &Caller| {
                black_box(ready_now(limiter.check(caller)));
            };
            let backend = InMemoryBackend::new();
            let limits: Arc<[Policy]> = vec![big_bucket().clone()].into();
            let store = |caller: &Caller| {
                black_box(backend.check(caller.key(), &limits, 1).try_take_ready());
            };
            let governor = governor::RateLimiter::keyed(governor_quota());
            let check = |key: &CallerKey| {
                black_box(governor.check_key(key)).expect("admitted");
            };

            let rounds = in_rounds(
                &mut group,
                GROUP,
                &[&limiter_id, &backend_id, &governor_id],
                |b, name| match (name, threads) {
                    (name, 1) if name == limiter_id => one_thread(b, &callers, decide),
                    (name, _) if name == limiter_id => two_threads(b, &callers, decide),
                    (name, 1) if name == backend_id => one_thread(b, &callers, store),
                    (name, _) if name == backend_id => two_threads(b, &callers, store),
                    (_, 1) => one_thread(b, &caller_keys, check),
                    _ => two_threads(b, &caller_keys, check),
                },
            );
            let Some(peer) = rounds.time(&governor_id) else {
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
                let (Some(ours), Some(ratio)) = (rounds.time(id), rounds.ratio(id, &governor_id))
                else {
                    continue;
                };
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
    algorithms(&mut group, &mut rows);
    group.finish();
    if !rows.is_empty() {
        write_rows("in_process.tsv", &rows);
    }
}

/// One caller at its steady state under `limit` per second: a manual clock advanced by one
/// second over `limit` per decision, so every decision is admitted with the window full (a
/// sliding log of `limit` entries drops its oldest and adds one). The sliding log's cost
/// grows with its entries (an admission copies the log once); the counter's does not.
fn algorithms(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rows: &mut Vec<(String, Row)>,
) {
    const GROUP: &str = "in_process";
    for limit in [100u64, 1_000] {
        let step = std::time::Duration::from_millis(1_000 / limit);
        let mut ids = Vec::new();
        for (name, policy) in [
            (
                "sliding_window",
                Policy::sliding_window("per-second", Quota::per_second(limit)),
            ),
            (
                "sliding_log",
                Policy::sliding_log("per-second", Quota::per_second(limit)),
            ),
        ] {
            let id = format!("algorithm_{name}_{limit}");
            let clock = ManualClock::new(1_800_000_000_000);
            let backend = InMemoryBackend::new().clock(clock.clone());
            let limits: Arc<[Policy]> = vec![policy].into();
            let caller = CallerKey::new("acme");
            group.bench_function(&id, |b| {
                ran(GROUP, &id);
                b.iter(|| {
                    clock.advance(step);
                    black_box(backend.check(&caller, &limits, 1).try_take_ready());
                });
            });
            ids.push(id);
        }
        let (Some(window), Some(log)) = (median_ns(GROUP, &ids[0]), median_ns(GROUP, &ids[1]))
        else {
            continue;
        };
        rows.push((
            format!("{GROUP}/{}", ids[1]),
            Row::new(
                format!("In-process decision at a full window of {limit}: the sliding log"),
                ns(log),
            )
            .peer(format!("the sliding window counter: {}", ns(window)))
            .ratio(format!("{:.2}x", log / window)),
        ));
    }
}
