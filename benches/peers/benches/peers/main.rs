//! tollgate beside tower-rate-limiter, measured in one run. `scripts/bench` runs this
//! after benches/tollgate and folds the rows it leaves (`$TOLLGATE_BENCH_RESULTS/peers.tsv`)
//! into BENCHMARKS.md.
//!
//! One criterion entry point, one group per scenario, each the counterpart of a tollgate
//! scenario with tower-rate-limiter's GCRA (its only algorithm with both an in-memory and
//! a Redis policy) against tollgate's token bucket:
//!
//! 1. `peers_in_process`: one decision, 10,000 callers, one thread.
//! 2. `peers_layer`: the layer on an in-memory service, with and without RateLimit fields.
//! 3. `peers_redis`: Redis decisions per second at 64 tasks, one redis-server.
//! 4. `peers_frozen_store`: the same server under SIGSTOP: what 64 tasks get decided in
//!    two seconds.
//!
//! The row formatting and the helpers are tollgate's own bench modules, shared by path.

use std::time::Duration;

use criterion::{criterion_group, criterion_main};

mod frozen_store;
mod in_process;
mod layer;
mod redis;
#[path = "../../../tollgate/report.rs"]
#[allow(dead_code)] // what only tollgate's groups use
mod report;
#[path = "../../../tollgate/support.rs"]
#[allow(dead_code)]
mod support;

/// tower-rate-limiter's GCRA with the quota of tollgate's `support::big_bucket`: one
/// billion a second, a burst of one billion (its burst is a `u32`).
fn big_gcra() -> tower_rate_limiter::GcraQuota {
    tower_rate_limiter::GcraQuota::new(1_000_000_000, Duration::from_secs(1), 1_000_000_000)
        .expect("valid GCRA quota")
}

criterion_group! {
    name = scenarios;
    config = support::config();
    targets = in_process::bench, layer::bench, redis::bench, frozen_store::bench,
}
criterion_main!(scenarios);
