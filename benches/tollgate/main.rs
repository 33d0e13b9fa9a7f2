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
//! 8. `leases`: a hot caller decided from leases over 4 instances on one redis-server vs
//!    the per-request path: throughput, store calls, p99 beside the in-process backend,
//!    accuracy and fairness under overload.
//! 7. `memory`: bytes per tracked key at 1,000,000 keys (in a fresh child process, by RSS).
//! 10. `flood`: a decision while 1,000,000 callers never seen arrive, a local share
//!     configured, beside the same limiter deciding for 100,000 callers it has seen.
//! 11. `settle`: a layered request reserved at an estimate and settled at what its
//!     response reports, beside a plain one.
//! 12. `regions`: one limit across three regions on the two-tier store, 80 ms each way to
//!     the global Redis: WAN calls and regional calls per request, and the limit under
//!     overload.
//!
//! Scenario 6 (HTTP end to end with wrk) runs in `scripts/bench` against
//! `examples/bench_server.rs`. Criterion's filter applies to every group; the parts that
//! are not criterion benchmarks (the latency rounds, the store-call counts, the memory
//! children) run when the filter, taken as a plain substring, matches their group name.
//!
//! No metrics recorder is installed unless `TOLLGATE_BENCH_PROMETHEUS` is set, which
//! installs the Prometheus one, as a served app has it (a diagnostic, not in the table).
//!
//! This file is the entry point: the criterion configuration and the process setup. Each
//! group is a module of its own; `report` turns criterion's estimates into the rows,
//! `support` holds what several groups share (the group filter among them). The peers
//! that need a newer Rust than this crate's are measured by benches/peers, which reuses
//! `report` and `support`.

use criterion::{criterion_group, criterion_main};

mod denial_cache;
mod flood;
mod frozen_store;
mod in_process;
mod layer;
mod leases;
mod limits;
mod memory;
mod redis;
mod regions;
mod report;
mod settle;
mod support;

/// Runs before any group. A memory child measures and exits here, running no group;
/// otherwise the Prometheus recorder goes in when asked for.
fn setup() {
    if let Ok(which) = std::env::var(memory::CHILD) {
        memory::measure(&which);
        std::process::exit(0);
    }
    if std::env::var_os(report::PROMETHEUS).is_some() {
        // The recorder a served app installs (orders_api does): decisions then pay for
        // real metrics. Off by default, as in the library without a recorder.
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("install the Prometheus recorder");
    }
}

criterion_group! {
    name = scenarios;
    config = support::config();
    targets = in_process::bench,
        layer::bench,
        redis::bench,
        frozen_store::bench,
        denial_cache::bench,
        leases::bench,
        limits::bench,
        memory::bench,
        flood::bench,
        settle::bench,
        regions::bench,
}
criterion_main!(setup, scenarios);
