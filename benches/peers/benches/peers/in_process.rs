//! Group `peers_in_process`: one decision on the in-process store, 10,000 callers, one
//! thread: tollgate's `Limiter::check` vs tower-rate-limiter's `MemoryGcra::check`.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use tollgate::{InMemoryBackend, Limiter};
use tower_rate_limiter::{MemoryGcra, RateLimitPolicy};

use crate::big_gcra;
use crate::report::{Row, median_ns, ns, ran, write_rows};
use crate::support::{CALLERS, big_bucket, callers, ready_now, wanted};

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "peers_in_process";
    if !wanted(GROUP) {
        return;
    }
    let callers = callers(CALLERS);
    // tower-rate-limiter's policies take the key as an owned `String`, as its layer
    // hands them over after extracting it: one copy per decision is part of its path.
    let keys: Vec<String> = (0..CALLERS).map(|i| format!("customer-{i:07}")).collect();
    let limiter = Limiter::builder()
        .name("in-process")
        .backend(InMemoryBackend::new())
        .policy(big_bucket())
        .build();
    let gcra = MemoryGcra::new(big_gcra());

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    group.bench_function("tollgate_limiter", |b| {
        ran(GROUP, "tollgate_limiter");
        let mut i = 0;
        b.iter(|| {
            black_box(ready_now(limiter.check(&callers[i])));
            i = (i + 1) % CALLERS;
        });
    });
    group.bench_function("tower_rate_limiter_memory_gcra", |b| {
        ran(GROUP, "tower_rate_limiter_memory_gcra");
        let mut i = 0;
        b.iter(|| {
            black_box(ready_now(gcra.check(keys[i].clone())).expect("decision"));
            i = (i + 1) % CALLERS;
        });
    });
    group.finish();

    let (Some(ours), Some(peer)) = (
        median_ns(GROUP, "tollgate_limiter"),
        median_ns(GROUP, "tower_rate_limiter_memory_gcra"),
    ) else {
        return;
    };
    write_rows(
        "peers_in_process.tsv",
        &[(
            "peers/in_process",
            Row::new(
                "`Limiter::check`, 10,000 callers, 1 thread, vs tower-rate-limiter's in-memory GCRA",
                ns(ours),
            )
            .peer(format!(
                "tower-rate-limiter `MemoryGcra::check`: {}",
                ns(peer)
            ))
            .ratio(format!("{:.2}x", ours / peer)),
        )],
    );
}
